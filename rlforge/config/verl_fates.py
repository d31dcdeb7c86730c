"""The fate of each verl key (mapped, refused or ignored) and the context the translation's rules give them in:
``verl.translate`` fills a :class:`Translation` through a :class:`Context`; the rule modules (``verl_derived``,
``verl_layout``, ``verl_training``, ``verl_loop``, ``verl_reward``, ``verl_rollout``, ``verl_sft``) see only this
module, not the translation's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlforge.config.verl_rules import Checked, nest

DOC = "docs/migration-from-verl.md"
MAPPED, REFUSED, IGNORED = "mapped", "refused", "ignored"
STOPS_ON_VALUE = "a run would stop on this value"  # the text of a mapped key refused for its value (Translation.stopped)
MIGRATING_TRAINERS = ("dapo", "fully_async")  # the trainers that move verl's legacy reward keys (verl.TRAINERS)
# the trainers on verl's SeparateRayPPOTrainer (the legacy trainer's step): no dynamic sampling
SEPARATE_TRAINERS = ("fully_async", "one_step_off")
# the trainers other than main_ppo's, as the reports name them
TRAINER_NAMES = {"dapo": "the DAPO recipe's main_dapo", "fully_async": "verl's fully-async trainer",
                 "one_step_off": "verl's one-step-off trainer"}


@dataclass
class Fate:
    """What became of one verl key: ``kind`` is mapped, refused or ignored."""

    key: str
    value: Any
    kind: str
    target: str = ""  # mapped: the rlforge key ("" when the value states what rlforge always does)
    text: str = ""  # mapped: a stated difference or what rlforge does; refused: the missing feature; ignored: why
    stops: bool = False  # refused because verl 0.9.1 itself stops on it (``text`` says why), not for a missing feature

    def line(self) -> str:
        if self.kind == MAPPED:
            to = f" -> {self.target} = {self.mapped_value!r}" if self.target else f": {self.text}"
            note = f" ({self.text})" if self.target and self.text else ""
            return f"mapped      {self.key}{to}{note}"
        if self.kind == REFUSED:
            end = "" if self.stops else " is not in rlforge"
            return f"REFUSED     {self.key} = {self.value!r}: {self.text}{end}"
        return f"{'unread' if self.unread else 'ignored':<12}{self.key}: {self.text}"

    mapped_value: Any = None
    unread: bool = False  # ignored because verl 0.9.1 does not read the key here either (its value changes nothing there)


@dataclass
class Translation:
    """The rlforge overrides of a verl config and the fate of every key."""

    algorithm: str = "grpo"
    command: str = "fit"  # fit, or eval (trainer.val_only)
    config: str = "ppo_trainer"  # the shipped verl config it was read as, which says which trainer runs it
    config_from: str = ""  # how that config was found (a config file's defaults, its hydra.yaml, its sections)
    overrides: dict[str, Any] = field(default_factory=dict)
    fates: list[Fate] = field(default_factory=list)
    given: set[str] = field(default_factory=set)  # the keys the launch (or the config file) sets itself

    def of(self, kind: str) -> list[Fate]:
        return [f for f in self.fates if f.kind == kind]

    @property
    def refused(self) -> list[Fate]:
        return self.of(REFUSED)

    def stopped(self, fates: list[Fate], why: str) -> None:
        """Refuse ``fates`` (mapped ones) for the value rlforge's composition stops on (``why``: its message), so the
        report counts and shows them as the run would meet them."""
        for f in fates:
            f.kind, f.stops, f.text = REFUSED, True, f"{STOPS_ON_VALUE}: {why}"

    def fates_for(self, key: str) -> list[Fate]:
        """The fates of ``key`` and of every key below it (an override may set a whole section)."""
        return [f for f in self.fates if f.key == key or f.key.startswith(key + ".")]

    def nested(self) -> dict[str, Any]:
        """The overrides as a nested mapping (a YAML config for ``--config``), with ``algorithm.name``."""
        return nest({"algorithm.name": self.algorithm, **dict(sorted(self.overrides.items()))})

    def report(self) -> list[str]:
        what = "rlforge sft" if self.command == "sft" else f"algorithm {self.algorithm}"
        if any(f.key == "algorithm.adv_estimator" for f in self.refused):
            what = "no algorithm (algorithm.adv_estimator is refused)"
        source = f" ({self.config_from})" if self.config_from else ""
        unread = sum(f.unread for f in self.fates)
        head = (f"{what}; read as verl's {self.config}{source}; {len(self.of(MAPPED))} mapped, "
                f"{len(self.of(REFUSED))} refused, {len(self.of(IGNORED))} ignored ({unread} of them 'unread': not read "
                f"by verl 0.9.1 either; see {DOC})")
        order = sorted(self.fates, key=lambda f: (f.kind != REFUSED, f.kind, f.key))
        own = [f for f in order if self.set_by_launch(f.key)]
        rest = [f for f in order if not self.set_by_launch(f.key)]
        if not own or not rest:
            return [head] + [f.line() for f in order]
        return [head, f"-- the launch's own keys ({len(own)}):", *(f.line() for f in own),
                f"-- verl's defaults, the keys the launch leaves as they are ({len(rest)}):", *(f.line() for f in rest)]

    def set_by_launch(self, key: str) -> bool:
        """Whether the launch set ``key`` itself, or a section above it."""
        parts = key.split(".")
        return any(".".join(parts[:i]) in self.given for i in range(1, len(parts) + 1))


def flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` -> ``("a.b", 1)``; an empty mapping is a leaf."""
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from flatten(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], tree


class Context:
    """What a derived rule sees: the resolved keys, and ways to give each of its keys a fate."""

    def __init__(self, flat: dict[str, Any], given: set[str], out: Translation, trainer: str = "v1") -> None:
        self.flat, self.given, self.out = flat, given, out
        self.owned: list[str] = []
        self.reads: list[str] = []  # the keys read (get) since the current derived rule began, in order
        self.algorithm, self.command, self.dp_size = "grpo", "fit", 1
        self.gpus = 1  # nnodes x n_gpus_per_node (set by the parallel rule, which refuses what is not a count)
        self.trainer = trainer  # the verl trainer that runs the launch (verl.TRAINERS)
        self._done: set[str] = set()
        manager = self.get("reward_model.reward_manager") or self.get("reward.reward_manager.name")
        self.reward_manager = manager
        # a legacy reward_model.reward_kwargs section replaces reward.reward_kwargs whole where the trainer moves it
        # (migrate_legacy_reward_impl); under main_ppo, which reads only reward.*, rlforge reads its keys one by one
        self.legacy_reward_kwargs = trainer in MIGRATING_TRAINERS and any(
            k.startswith("reward_model.reward_kwargs.") and v is not None for k, v in flat.items())
        legacy_enable = self.get("reward_model.reward_kwargs.overlong_buffer_cfg.enable")
        enable = (legacy_enable if self.legacy_reward_kwargs or legacy_enable is not None
                  else self.get("reward.reward_kwargs.overlong_buffer_cfg.enable"))
        self.overlong_on = manager == "dapo" and bool(enable)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.flat:
            self.reads.append(key)
        value = self.flat.get(key, default)
        return default if value is None and default is not None else value

    def culprit(self, exc: Exception) -> str | None:
        """The key whose value a derived rule stopped on with ``exc`` (a value of the wrong type: ``int('abc')``), of
        the keys it read, the latest first: one whose string value the message quotes, else one whose type the
        message names that is not a number's (``'str'``, ``'NoneType'``), else the latest read."""
        read = list(dict.fromkeys(reversed(self.reads)))
        text = str(exc)
        quoted = [k for k in read if isinstance(self.flat[k], str) and repr(self.flat[k]) in text]
        typed = [k for k in read if type(self.flat[k]) not in (int, float, bool)
                 and f"'{type(self.flat[k]).__name__}'" in text]
        return next(iter(quoted or typed or read), None)

    def stop_value(self, key: str, why: str) -> None:
        """:meth:`stop`, also where an earlier rule gave ``key`` its fate (a value found wrong where a later rule
        reads it): that fate becomes the refusal, its rlforge key unset."""
        fate = next((f for f in self.out.fates if f.key == key), None) if key in self._done else None
        if fate is None:
            self.stop(key, why)
        elif fate.kind != REFUSED:
            if fate.target:
                self.out.overrides.pop(fate.target, None)
            fate.kind, fate.stops, fate.text, fate.target = REFUSED, True, why, ""

    def has(self, key: str) -> bool:
        return key in self.flat

    def done(self, key: str) -> bool:
        return key in self._done

    def _fate(self, key: str, kind: str, target: str = "", text: str = "", value: Any = None, stops: bool = False,
              unread: bool = False) -> None:
        if key not in self.flat or key in self._done:
            return
        self._done.add(key)
        self.out.fates.append(Fate(key, self.flat[key], kind, target, text, stops, mapped_value=value, unread=unread))

    def map(self, key: str, target: str, value: Any, note: str = "") -> None:
        if key in self.flat and key not in self._done and not target.startswith(("--", "rlforge ")):
            self.out.overrides[target] = value
        self._fate(key, MAPPED, target, note, value=value)

    def same(self, key: str, does: str) -> None:
        self._fate(key, MAPPED, "", does)

    def ignore(self, key: str, why: str) -> None:
        self._fate(key, IGNORED, "", why)

    def unread(self, key: str, why: str) -> None:
        """Ignored because verl 0.9.1 does not read ``key`` in this config either (``why``: when it would)."""
        self._fate(key, IGNORED, "", why, unread=True)

    def refuse(self, key: str, missing: str) -> None:
        self._fate(key, REFUSED, "", missing)

    def stop(self, key: str, why: str) -> None:
        """Refused as verl 0.9.1 refuses it (``why``: verl's own check and what to set instead)."""
        self._fate(key, REFUSED, "", why, stops=True)

    def checked(self, key: str, rule: Checked) -> None:
        """Ignored for ``rule.why``, but refused as verl refuses it where verl's own check of the value fails."""
        (self.ignore(key, rule.why) if rule.valid(self.get(key)) else
         self.stop(key, f"verl 0.9.1 checks this key even where it does not use it: it takes {rule.takes} and stops "
                        f"on another value"))

    def set(self, target: str, value: Any) -> None:
        """An rlforge key that follows from keys already mapped (strategy.name=fsdp -> trainer.controller=ray)."""
        self.out.overrides[target] = value
