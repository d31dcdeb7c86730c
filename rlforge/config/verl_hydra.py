"""A verl launch's config, composed as verl's Hydra entry point composes it: the named default tree
(``--config-name``, shipped in ``verl_defaults/``), a config file of the user's (``--config-path``) merged at its
``_self_``, then the overrides in Hydra's grammar (``key=v``, ``+key=v``, ``++key=v``, ``~key``), parsed by Hydra's
own ``OverridesParser``, and finally every ``${...}`` interpolation resolved (verl calls ``OmegaConf.resolve``).

Errors are ``ConfigError``s that name the argument, the key and, for a file, the file.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlforge.config import verl_stale
from rlforge.config import verl_hydra_own, verl_switches
from rlforge.config.verl_interpolation import Cycle, Simple, raw
from rlforge.config.verl_rules import merge_into, nest
from rlforge.config.verl_tree import (
    ENGINE_VARIANTS,
    LEGACY_SFT,
    PPO,
    SFT,
    default_tree,
    load_default,
    shipped,
)
from rlforge.errors import ConfigError

# verl's trainer modules and the config each composes by default
ENTRY_CONFIGS = {
    "verl.trainer.main_ppo": PPO, "recipe.dapo.main_dapo": "dapo_trainer",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_trainer",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_trainer",
    "verl.trainer.sft_trainer": SFT, "verl.trainer.fsdp_sft_trainer": LEGACY_SFT,
}
# config groups a launch may select (verl's defaults lists): name -> group -> default option
GROUPS = {"model_engine": "dp"}
SFT_GROUPS = {"engine": "fsdp", "optim": "fsdp", "model": "hf_model", "profiler": "profiler"}


@dataclass
class Launch:
    """The arguments of a verl launch: the config it names and its overrides (Hydra's syntax)."""

    config_name: str = PPO
    config_path: str | None = None
    overrides: list[str] = field(default_factory=list)
    why: str = ""  # why config_name, where the launch did not name it: v0.7 SFT keys given to 0.9.1's SFT entry


def parse_args(args: list[str], default_config: str = PPO) -> Launch:
    """``--config-path/-cp``, ``--config-name/-cn`` (``--x=v`` or ``--x v``) and the overrides, as verl takes them."""
    launch, i = Launch(config_name=default_config), 0
    flags = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name", "-cn": "config_name"}
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in flags:
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigError(f"'{arg}' needs a value (e.g. {name}=ppo_megatron_trainer).")
                value, i = args[i + 1], i + 1
            setattr(launch, flags[name], value.removesuffix(".yaml") if flags[name] == "config_name" else value)
        elif arg.startswith("-"):
            raise ConfigError(f"Unsupported option '{arg}': a verl launch takes --config-path, --config-name and "
                              f"Hydra overrides (key=value, +key=value, ++key=value, ~key).")
        else:
            launch.overrides.append(arg)
        i += 1
    old = legacy_sft_keys(launch.overrides) if default_config == SFT and launch.config_name == SFT else []
    if old and not any(a.split("=", 1)[0] in ("--config-name", "-cn") for a in args):
        launch.config_name = LEGACY_SFT
        launch.why = f"keys only verl's v0.7 fsdp_sft_trainer has: {', '.join(old[:3])}"
    elif launch.config_path and not Path(launch.config_path).is_dir():  # said, as verl's Hydra would stop
        launch.why = f"--config-path={launch.config_path} is not a folder here: the config of that name verl ships"
    return launch


def legacy_sft_keys(overrides: list[str]) -> list[str]:
    """The keys a launch sets plainly (``key=value``: the key must exist) that verl's v0.7 SFT config (its
    fsdp_sft_trainer's) has and 0.9.1's lacks: a launch written for fsdp_sft_trainer, which 0.9.1 no longer ships."""
    old, new = default_tree(LEGACY_SFT), default_tree(SFT)
    keys = [o.split("=", 1)[0] for o in overrides if not o.startswith(("+", "~"))]
    return [k for k in keys if verl_stale.new_in(old, k) is None and verl_stale.new_in(new, k) is not None]


def parse_overrides(overrides: tuple[str, ...]) -> list[Any]:
    """Hydra's ``Override`` objects; an override that is not Hydra's syntax, a sweep or a package is an error."""
    return [_parse_one(text) for text in overrides]


@functools.lru_cache(maxsize=None)
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=4096)  # launch scripts repeat the same overrides; Hydra's parser takes ~1 ms each
def _parse_one(text: str) -> Any:
    from hydra.errors import HydraException

    try:
        o = _parser().parse_override(text)
    except HydraException as exc:
        raise ConfigError(f"Cannot parse override '{text}' (Hydra's syntax: key=value, +key=value, "
                          f"++key=value, ~key): {str(exc).splitlines()[0]}") from None
    if o.is_sweep_override():
        raise ConfigError(f"Override '{text}' is a sweep (several values): a verl launch takes one value per key "
                          f"(quote a list: key='[a,b]').")
    if o.package is not None:
        raise ConfigError(f"Override '{text}' selects a config group package (@{o.package}): only model_engine=NAME "
                          f"selects a group here.")
    return o


def _user_file(path: str, name: str) -> tuple[str, dict[str, Any]] | None:
    """(base config, the file's own tree) of ``--config-path/--config-name`` when that file exists."""
    file = Path(path) / f"{name}.yaml"
    if not file.is_file():
        return None
    from rlforge.config.compose import load_file  # duplicate keys, interpolation checks, clear YAML errors

    data = OmegaConf.to_container(load_file(str(file)))
    assert isinstance(data, dict)
    data.pop("hydra", None)
    defaults = data.pop("defaults", None) or []
    base, engine = None, None
    for entry in defaults:
        if entry == "_self_":
            continue
        if isinstance(entry, str) and entry in shipped():
            base = entry
        elif isinstance(entry, dict) and set(entry) == {"override model_engine"}:
            engine = entry["override model_engine"]
        else:
            raise ConfigError(f"{file}: defaults entry {entry!r} is not one of verl's configs rlforge ships "
                              f"({', '.join(shipped())}) or 'override model_engine: NAME'.")
    base = base or PPO
    if engine is not None:
        base = _engine_variant(base, engine, f"{file} (defaults)")
    return base, {str(k): v for k, v in data.items()}


_VARIABLE = re.compile(r"\$\{\s*(?:oc\.select:\s*)?([A-Za-z_]\w*)")  # ${name...}, ${oc.select:name...}


def variables(launch: Launch, base: str) -> frozenset[str]:
    """Top-level keys of the launch (its own config file's, its overrides') that verl's config ``base`` (the shipped
    config it builds on) lacks and that keys interpolate (``${mbs}``, ``${common.model}``): variables, which verl
    never reads."""
    file = Path(launch.config_path or "") / f"{launch.config_name}.yaml"
    text = file.read_text(encoding="utf-8") if launch.config_path and file.is_file() else ""
    own = yaml.safe_load(text) if text else None
    keys = {*(own if isinstance(own, dict) else {}), *(o.split("=", 1)[0].lstrip("+~").split(".")[0]
                                                       for o in launch.overrides)}
    used, tree = set(_VARIABLE.findall(text + " ".join(launch.overrides))), default_tree(base)
    return frozenset(k for k in keys if k not in tree and k in used)


def _engine_variant(name: str, engine: str, where: str) -> str:
    if engine == "dp":
        return name
    variant = ENGINE_VARIANTS.get((name, engine))
    if variant is None:
        engines = sorted({e for (n, e) in ENGINE_VARIANTS if n == name} | {"dp"})
        raise ConfigError(f"model_engine={engine} ({where}) with --config-name={name}: verl 0.9.1's model engines "
                          f"here are {', '.join(engines)}.")
    return variant


def base_config(launch: Launch) -> str:
    """The shipped config a launch builds on: its --config-name, or the one its own config file's defaults name (which
    says which of verl's trainers runs it, ``verl.TRAINERS``)."""
    found = _user_file(launch.config_path, launch.config_name) if launch.config_path else None
    if found is None:
        return launch.config_name
    return found[0] if found[0] != PPO else _named_trainer(launch.config_name)


def file_keys(launch: Launch) -> set[str]:
    """The keys the launch's own config file (``--config-path/--config-name``) sets to other values than the shipped
    config it builds on: the launch's own keys, as its overrides are (the report lists them first)."""
    found = _user_file(launch.config_path, launch.config_name) if launch.config_path else None
    if found is None:
        return set()
    from rlforge.config.verl_fates import flatten

    base, own = found
    default = dict(flatten(load_default(base)))
    return {k for k, v in flatten(own) if k not in default or default[k] != v}


def _named_trainer(name: str) -> str:
    """A config file of one's own built on ppo_trainer, named as one of verl's trainer configs (verl-recipe's
    recipe/dapo/config/dapo_trainer.yaml, which main_dapo composes): that trainer's; any other name: main_ppo's."""
    return name if name in shipped() and not name.startswith("sft_") else PPO


def compose_tree(launch: Launch) -> dict[str, Any]:
    """The launch's complete, resolved verl config (a nested dict), as verl's entry point would see it."""
    overrides = parse_overrides(tuple(launch.overrides))
    name, layers = launch.config_name, []
    found = _user_file(launch.config_path, name) if launch.config_path else None
    if found is not None:
        name, own = found
        layers.append(own)
    groups = SFT_GROUPS if name.startswith("sft_") else GROUPS
    chosen = [o for o in overrides if o.key_or_group in groups and o.type.name == "CHANGE" and isinstance(o.value(), str)]
    for o in chosen:
        if o.key_or_group == "model_engine":
            name = _engine_variant(name, o.value(), f"override '{o.input_line}'")
        elif o.value() != groups[o.key_or_group]:
            raise ConfigError(f"Override '{o.input_line}' chooses verl's '{o.value()}' {o.key_or_group} for SFT: rlforge's "
                              f"SFT runs on Lightning (sft.strategy: ddp, fsdp, deepspeed_*), with verl's default "
                              f"{o.key_or_group}={groups[o.key_or_group]} settings only (docs/sft.md).")
    try:
        tree = load_default(name)
    except ConfigError as exc:  # neither verl's nor the launch's own: say why its folder was not searched
        if not launch.config_path or Path(launch.config_path).is_dir():
            raise
        raise ConfigError(f"{exc} --config-path={launch.config_path} is not a folder here, so no "
                          f"{name}.yaml of the launch's own was found there.") from None
    for layer in layers:
        merge_into(tree, copy.deepcopy(layer))
    errors: list[str] = []
    of_hydra = [o for o in overrides if verl_hydra_own.is_hydra_own(o)]
    for o in overrides:
        if o not in chosen and o not in of_hydra:
            try:
                apply_override(tree, o)
            except ConfigError as exc:  # every override verl refuses at once, not one per run
                errors.append(str(exc))
    hydra, refused = verl_hydra_own.hydra_settings(of_hydra)
    errors += refused
    if errors:
        raise ConfigError(errors[0] if len(errors) == 1 else
                          f"{len(errors)} overrides verl 0.9.1 refuses:\n  " + "\n  ".join(errors))
    out = resolve(tree, "the verl launch")
    verl_switches.check(out, _switches(name))
    if hydra:  # reported (ignored: Hydra's own settings), never translated
        out["hydra"] = hydra
    return out


@functools.lru_cache(maxsize=None)
def _switches(name: str) -> frozenset[str]:
    """The true/false switches of verl's default tree ``name`` (``verl_switches.switches``)."""
    return verl_switches.switches(resolve(load_default(name), f"verl's {name}"))


def first_new_key(base: dict[str, Any], value: dict[str, Any]) -> str | None:
    """The first dotted key of ``value`` that ``base`` lacks (None: every key exists)."""
    for k, v in value.items():
        if k not in base:
            return str(k)
        if isinstance(v, dict) and isinstance(base[k], dict) and (deeper := first_new_key(base[k], v)) is not None:
            return f"{k}.{deeper}"
    return None


def apply_override(tree: dict[str, Any], o: Any) -> None:
    """One Hydra override on ``tree`` with Hydra's rules (struct mode: ``key=v`` needs the key; ``+key`` needs it
    absent or null; ``++key`` either way; ``~key`` deletes), in clearer words."""
    key, value, line = o.key_or_group, copy.deepcopy(o.value()), o.input_line
    *parents, leaf = key.split(".")
    node: Any = tree
    for i, part in enumerate(parents):
        if not isinstance(node, dict) or (part not in node and not (o.is_add() or o.is_force_add())):
            node = None
            break
        if not isinstance(node.get(part), dict):  # absent, null, or an interpolation that +/++ replaces
            node[part] = {}
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(verl_stale.unknown_key(tree, key, line, o.is_delete()))
    present = leaf in node
    if o.is_delete():
        if not present:
            from rlforge.config.verl_fates import flatten

            raise ConfigError(f"Override '{line}': cannot delete '{key}', which the config does not have."
                              + verl_stale.did_you_mean(key, [k for k, _ in flatten(tree)]))
        if value is not None and node[leaf] != value:
            raise ConfigError(f"Override '{line}': '{key}' is {node[leaf]!r}, not {value!r}, so it is not deleted.")
        del node[leaf]
    elif o.is_add() and present and node[leaf] not in (None, "???") and not isinstance(value, (dict, list)):
        # Hydra merges a mapping or list given with '+' into what is there; a plain value needs the key absent
        raise ConfigError(f"Override '{line}': '{key}' is already in verl's config; set it without '+': "
                          f"{line[1:]} (or force with '++').")
    elif not (o.is_add() or o.is_force_add()) and not present:
        raise ConfigError(verl_stale.unknown_key(tree, key, line, False))
    elif isinstance(value, dict) and isinstance(node.get(leaf), dict):
        new = None if o.is_add() or o.is_force_add() else first_new_key(node[leaf], value)
        if new is not None:  # struct mode: a plain override merges into the keys that exist
            raise ConfigError(f"Override '{line}': '{key}.{new}' is not a key of verl's config (verl 0.9.1 refuses it "
                              f"too). To add keys, prefix it with '+': +{line}.")
        merge_into(node[leaf], value)
    else:
        node[leaf] = value


def resolve(tree: dict[str, Any], where: str) -> dict[str, Any]:
    """Every ``${...}`` resolved, as ``OmegaConf.resolve`` does, with Hydra's ``${now:FORMAT}`` (the time of the
    launch, as a Hydra app resolves it); a failure names the key and the interpolation."""
    try:
        fast = Simple(tree).resolved()
    except Cycle as cycle:
        steps = " -> ".join(f"{key}: {raw(tree, key)}" for key in cycle.keys[:-1])
        raise ConfigError(f"Cannot resolve {where}: its interpolations form a cycle, {steps} -> back to "
                          f"{cycle.keys[0]}. Write a value for one of these keys.") from None
    if fast is not None:
        return fast
    from datetime import datetime

    from rlforge.config.compose import unresolvable

    if not OmegaConf.has_resolver("now"):  # Hydra registers it as its app starts (hydra.core.utils)
        OmegaConf.register_new_resolver("now", lambda pattern: datetime.now().strftime(pattern), use_cache=True)
    cfg = OmegaConf.create(tree)

    try:
        out = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:
        bad = unresolvable(cfg)
        key, text, why = bad if bad is not None else ("?", "?", "an interpolation failed")
        if "${hydra:" in text:  # unregistered, or Hydra's own resolver (imported) without a running app
            why += (" (${hydra:...} reads the runtime config of a running Hydra app, which `rlforge verl` composes "
                    "the launch without: write the value, e.g. the launch folder for ${hydra:runtime.cwd})")
        raise ConfigError(f"Cannot resolve '{key}: {text}' in {where}: {why}.") from None
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def compose_file(path: str) -> tuple[str, str, dict[str, Any]]:
    """A verl config file (sparse, or complete like a run's ``.hydra/config.yaml``) over verl's default tree (the one
    of its ``model_engine``), resolved: what ``rlforge config from-verl FILE`` translates. Returns (the shipped config
    it is read as, which says which of verl's trainers runs it; how that was found; the tree)."""
    file = Path(path)
    found = _user_file(str(file.parent), file.stem) if file.suffix in (".yaml", ".yml") else None
    if found is None:
        raise ConfigError(f"Config file not found: {path} (a verl config, .yaml).")
    name, own = found
    name, how = _file_trainer(file, name, own)
    engine = own.get("model_engine")  # a complete config names its engine (verl writes model_engine: megatron)
    name = ENGINE_VARIANTS.get((name, engine), name) if isinstance(engine, str) else name
    tree = load_default(name)
    merge_into(tree, copy.deepcopy(own))
    out = resolve(tree, path)
    verl_switches.check(out, _switches(name))
    return name, how, out


def _file_trainer(file: Path, base: str, own: dict[str, Any]) -> tuple[str, str]:
    """The shipped config a config file builds on: its defaults list's; else the ``hydra.job.config_name`` of the
    ``hydra.yaml`` a verl run writes beside its ``.hydra/config.yaml``; else what its sections show (only the
    fully-async and one-step-off trainers and the SFT trainers have sections of their own: a DAPO recipe's complete
    config reads as main_ppo's without its hydra.yaml)."""
    if base != PPO:
        return base, "its defaults list"
    if _named_trainer(file.stem) != PPO:
        return file.stem, "its file name"
    hydra_yaml, unknown = file.parent / "hydra.yaml", ""
    if hydra_yaml.is_file():
        try:
            data = yaml.safe_load(hydra_yaml.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{hydra_yaml} is not YAML ({str(exc).splitlines()[0]}): fix or remove it (rlforge "
                              f"reads which verl config the run composed from its hydra.job.config_name).") from None
        job = data.get("hydra") if isinstance(data, dict) else None
        job = job.get("job") if isinstance(job, dict) else None
        name = job.get("config_name") if isinstance(job, dict) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{hydra_yaml} has no hydra.job.config_name (a verl run's hydra.yaml names the config "
                              f"it composed there): fix or remove it.")
        name = name.removesuffix(".yaml")
        if name in shipped():
            return name, f"hydra.job.config_name in {hydra_yaml}"
        unknown = f"; {hydra_yaml} names '{name}', a config of its own"
    rollout = own.get("rollout")
    if "async_training" in own:
        return "fully_async_ppo_trainer", f"its async_training section (verl's fully-async trainer){unknown}"
    if isinstance(rollout, dict) and "nnodes" in rollout:
        return "one_step_off_ppo_trainer", f"its top-level rollout section (verl's one-step-off trainer){unknown}"
    if "actor_rollout_ref" not in own and ("model" in own or "engine" in own):
        data = own.get("data") if isinstance(own.get("data"), dict) else {}
        legacy = "use_remove_padding" in own or "multiturn" in data or "micro_batch_size" in data  # v0.7's keys
        return (LEGACY_SFT if legacy else SFT), f"its sections (an SFT trainer's top-level model/engine){unknown}"
    return PPO, (f"main_ppo's: nothing in it says otherwise{unknown} (a DAPO recipe run's config: keep its "
                 f"hydra.yaml beside it)")
