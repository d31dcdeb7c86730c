"""The three fates of a verl config key, as data: the rule kinds the key tables (``verl_keys``) are made of, and the
lookup from a dotted verl key to its rule.

- :class:`Map`: rlforge has the setting, with the same meaning: the value goes to ``target`` (converted).
- :class:`Keep`: rlforge has no setting because it always behaves one way; a value that asks for that behaviour is
  mapped (it means what rlforge does), any other is refused, naming the missing feature.
- :class:`Ignore`: the key does not change what is computed (infrastructure rlforge does itself, memory and speed
  knobs, copies of other keys); the reason says which.
- :class:`Unread`: ignored because verl 0.9.1 itself does not read the key in such a config (a field no code reads,
  or one read only by a feature that is off, or refused where on): it means there what it means here, nothing.
- :class:`Derived`: the key is one input of a setting computed from several keys (``verl_derived``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

def same(value: Any) -> Any:
    return value


def same_value(a: Any, b: Any) -> bool:
    """``a == b``, NaN equal to NaN (a key whose default interpolates another holds the same NaN)."""
    return bool(a == b) or (a != a and b != b)


@dataclass(frozen=True)
class Map:
    target: str
    convert: Callable[[Any], Any] = same
    note: str = ""  # a difference from verl the report states (empty: none)
    # where verl reads the key only with a feature on (``gate``): whether this config turns it on; off, the key is
    # unread (``unread``: why), its value neither carried over nor checked, as verl neither reads nor checks it
    read_if: Reads | None = None
    unread: str = ""


@dataclass(frozen=True)
class Keep:
    ok: Callable[[Any], bool]  # the values that ask for what rlforge always does
    does: str  # what rlforge always does (the mapped case)
    missing: str  # the feature a value outside ``ok`` asks for (the refused case)
    valid: Callable[[Any], bool] = lambda _: True  # the values verl 0.9.1 accepts (another stops it: refused so)
    takes: str = ""  # those values, in words


@dataclass(frozen=True)
class Ignore:
    why: str


# (get, key) -> whether verl reads ``key`` in this config after all: its feature's gate is on (get: a key's value)
Reads = Callable[[Callable[[str], Any], str], bool]


@dataclass(frozen=True)
class Unread(Ignore):
    """An :class:`Ignore` whose key verl 0.9.1 does not read either (``why`` says when it would). ``reads``: where
    that depends on a feature's gate (rlforge refuses the feature), whether this config turns it on: then verl reads
    the key, and it is a plain :class:`Ignore` in a launch refused for that feature."""

    reads: Reads | None = None


@dataclass(frozen=True)
class Checked(Ignore):
    """An :class:`Ignore` whose value verl 0.9.1 checks all the same: a value outside ``valid`` stops verl
    (``takes``: the values it accepts), and is refused so."""

    valid: Callable[[Any], bool] = lambda _: True
    takes: str = ""


def gate(key: str, on: Callable[[Any], bool] = bool) -> Reads:
    """``reads`` for a feature switched on by ``key``'s value (``on``: by default any true value)."""
    return lambda get, _: on(get(key))


def custom_sampler(get: Callable[[str], Any]) -> bool:
    """main_ppo's v1 trainer plugs in a sampler class of the launch's only with both its path and its name."""
    return bool(get("trainer.v1.sampler.custom_sampler.path") and get("trainer.v1.sampler.custom_sampler.name"))


def integral(value: Any) -> Any:
    """A count written as a float with nothing after the point (2.0, as YAML reads ``2.0`` or ``2e3``) as the int it
    is, where verl's code compares or counts with it unconverted; any other value as it is (rlforge's schema refuses
    a fractional count, naming the key)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def above_one(value: Any) -> bool:
    return (value or 1) > 1


def converts(kind: Any, check: Callable[[Any], bool] = lambda _: True) -> Callable[[Any], bool]:
    """Whether a field of type ``kind`` in one of verl's structured configs takes the value: OmegaConf converts it
    first (5 -> '5' for a str, '1' -> 1 for an int), as verl's omega_conf_to_dataclass does, then ``check`` (the
    class's ``__post_init__``) sees the converted value."""
    def valid(value: Any) -> bool:
        from dataclasses import make_dataclass

        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            field = OmegaConf.merge(OmegaConf.structured(make_dataclass("Field", [("v", kind)])), {"v": value}).v
        except OmegaConfBaseException:
            return False
        return check(OmegaConf.to_object(field) if OmegaConf.is_config(field) else field)
    return valid


# Hydra's own settings (hydra.run.dir, hydra/job_logging=...), which verl_hydra checks against Hydra's config: the
# same rule in the PPO and SFT tables
HYDRA_OWN = Ignore("Hydra's own settings: its output folder, logging and working directory (rlforge writes the run's "
                   "config and logs to its run folder)")


@dataclass(frozen=True)
class Derived:
    owner: str  # the name of the rule in verl_derived that reads this key


Rule = Map | Keep | Ignore | Unread | Checked | Derived


def joined(*notes: str) -> str:
    """The non-empty notes of one fate, in one text."""
    return "; ".join(n for n in notes if n)


# verl asserts that the path names one of its checkpoints (global_step_N), which rlforge cannot read (a launch naming
# one stops, rlforge.tools.verl_resume): rlforge resumes its own checkpoint or run folder from it
RESUME_PATH = ("verl takes only its own checkpoints here (a global_step_N path: rlforge cannot read those and stops); "
               "rlforge takes a checkpoint or run folder of its own")


# --- value tests ----------------------------------------------------------------------------------------------------
def is_(*values: Any) -> Callable[[Any], bool]:
    """The value equals one of ``values`` (``True`` is not ``1`` here)."""
    return lambda v: any(v == x and isinstance(v, bool) == isinstance(x, bool) for x in values)


def off(value: Any) -> bool:
    return value in (None, False, 0, "", "none", "disabled") or value == [] or value == {}


def count(low: int, none: bool = False) -> Callable[[Any], bool]:
    """An integer of at least ``low`` (``none``: or null), as torch's DataLoader checks its batch size and workers."""
    return lambda v: (none and v is None) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)


def at_most_one(value: Any) -> bool:
    return value is None or (isinstance(value, int) and value <= 1)


def never(_: Any) -> bool:
    return False


# hydra.job.chdir=True runs the job in Hydra's output folder, where its relative paths then point (both tables)
HYDRA_CHDIR = Keep(lambda v: not v, "the launch's folder stays the working directory", "running the job in Hydra's "
                   "output folder (hydra.job.chdir=True: relative paths would point there)")
# Hydra's hydra.job.env_set: the job's environment, which the run does not set (the same rule in both tables)
HYDRA_ENV = Keep(never, "", "environment variables set through Hydra's hydra.job.env_set (export them "
                 "before the command: the run and its workers inherit them)")


# --- value conversions ----------------------------------------------------------------------------------------------
def non_negative(value: Any) -> Any:
    """verl's -1 / None for "off" or "every" -> rlforge's 0."""
    return 0 if value is None or value < 0 else value


def project_name(c: Any, note: str = "") -> None:
    """verl's ``trainer.project_name`` -> rlforge's ``trainer.project`` (``note``: what it names there); null or empty
    (verl hands its loggers no project name, and each files the run under its own default) becomes rlforge's default
    name, said on the line."""
    key = "trainer.project_name"
    value = c.get(key)
    if value in (None, ""):
        shown = "null" if value is None else "empty"
        c.map(key, "trainer.project", "rlforge", joined(note, f"{shown}: rlforge's default project name (verl hands "
                                                             "the loggers no name, and e.g. wandb then files the run "
                                                             "under its own default project)"))
    else:
        c.map(key, "trainer.project", value, note)


def top_k(value: Any) -> Any:
    """verl's top_k (-1 or 0: off) as rlforge's (0: off); below -1 vLLM refuses it."""
    if value is not None and value < -1:
        raise ValueError(f"top_k {value}: vLLM takes -1 or 0 (off) or a positive integer")
    return 0 if value is None or value <= 0 else value


def critic_path(value: Any) -> Any:
    """The critic's model folder: verl's critic loads it, so it is not null (rlforge would start the critic from the
    policy's body instead)."""
    if value is None:
        raise ValueError("null: verl's critic loads its model from this path")
    return value


def file_list(value: Any) -> list[str]:
    import os

    items = [value] if isinstance(value, str) else list(value or [])
    return [os.path.expanduser(str(v)) for v in items]


def str_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def float_list(value: Any) -> list[float]:
    """A list of numbers; one written as text (a launch's quoted '[0.9,0.95]', which a shell unquotes) is read as YAML."""
    import yaml

    return [float(v) for v in (yaml.safe_load(value) if isinstance(value, str) else value)]


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "a.c": 2}`` -> ``{"a": {"b": 1, "c": 2}}``."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def merge_into(base: dict[str, Any], layer: dict[str, Any]) -> None:
    """OmegaConf's merge on plain trees: mappings merge key by key, anything else replaces."""
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = value


class Table:
    """Exact keys first, then patterns (fnmatch, ``*`` spans dots) in the order given: the first match wins."""

    def __init__(self, *parts: dict[str, Rule]) -> None:
        self.exact: dict[str, Rule] = {}
        self.patterns: list[tuple[str, Rule]] = []
        for part in parts:
            for key, rule in part.items():
                if any(c in key for c in "*?["):
                    self.patterns.append((key, rule))
                else:
                    self.exact.setdefault(key, rule)
        self._compiled = [(re.compile(fnmatch.translate(p)), rule) for p, rule in self.patterns]
        self._seen: dict[str, Rule | None] = {}  # verl's trees repeat the same keys launch after launch

    def rule(self, key: str) -> Rule | None:
        if key not in self._seen:
            found = self.exact.get(key)
            if found is None:
                found = next((rule for pattern, rule in self._compiled if pattern.match(key)), None)
            self._seen[key] = found
        return self._seen[key]

    def items(self) -> list[tuple[str, Rule]]:
        return [*self.exact.items(), *self.patterns]
