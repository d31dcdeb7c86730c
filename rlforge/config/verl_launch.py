"""A verl launch as an rlforge run: the arguments of ``python3 -m verl.trainer.main_ppo`` (or of verl's SFT trainer)
composed as verl composes them (``verl_hydra``), translated (``verl``), and turned into the base layer of rlforge's
config. ``rlforge verl ARGS`` and ``rlforge config from-verl`` call :func:`prepare`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from rlforge.config import verl, verl_hydra
from rlforge.config.verl_fates import Fate
from rlforge.errors import ConfigError, RLForgeError

E = TypeVar("E", bound=RLForgeError)

PPO_ENTRY, SFT_ENTRY = "verl.trainer.main_ppo", "verl.trainer.sft_trainer"
ORIGIN = "the verl launch"


@dataclass
class Prepared:
    translation: verl.Translation
    config: DictConfig  # the translation as an rlforge config layer (compose's ``base``)


def given_keys(overrides: list[str]) -> set[str]:
    """The keys a launch sets itself (``+a.b=1`` -> ``a.b``; a config group choice ``hydra/job_logging=x`` ->
    ``hydra.job_logging``)."""
    return {o.split("=", 1)[0].lstrip("+~").replace("/", ".") for o in overrides}


def prepare(args: list[str], entry: str = PPO_ENTRY, refuse: bool = True) -> Prepared:
    """Compose and translate a launch. With ``refuse``, a key whose feature rlforge lacks is an error listing every
    such key."""
    if entry not in verl_hydra.ENTRY_CONFIGS:
        raise ConfigError(f"Unknown verl entry point '{entry}'. Known: {', '.join(verl_hydra.ENTRY_CONFIGS)}.")
    launch = verl_hydra.parse_args(args, verl_hydra.ENTRY_CONFIGS[entry])
    tree = verl_hydra.compose_tree(launch)
    sft = launch.config_name.startswith("sft_")
    base = verl_hydra.base_config(launch)
    deleted = frozenset(o[1:].split("=", 1)[0] for o in launch.overrides if o.startswith("~"))
    translation = verl.translate(tree, given_keys(launch.overrides), sft=sft, config_name=base,
                                 variables=verl_hydra.variables(launch, base), deleted=deleted)
    translation.config_from = launch.why
    translation.given |= verl_hydra.file_keys(launch)  # for the report only: translate's "given" is the overrides'
    if refuse:
        check(translation)
    return Prepared(translation, as_layer(translation))


def prepare_file(path: str) -> Prepared:
    """A verl config file (sparse or complete, e.g. a run's ``.hydra/config.yaml``) over verl's defaults."""
    name, how, tree = verl_hydra.compose_file(path)
    default = dict(verl.flatten(verl_hydra.load_default(name)))
    # the keys it sets itself: a complete config repeats every default, which is not asking for a feature
    given = {k for k, v in verl.flatten(_own(path)) if k not in default or default[k] != v}
    translation = verl.translate(tree, given, sft=name.startswith("sft_"), config_name=name)
    translation.config_from = how
    return Prepared(translation, as_layer(translation))


def _own(path: str) -> dict[str, Any]:
    from rlforge.config.compose import load_file

    data = OmegaConf.to_container(load_file(path))
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def check(t: verl.Translation) -> None:
    refused = t.refused
    if refused:
        lines = "\n  ".join(f.line() for f in refused)
        raise ConfigError(f"This verl launch has {len(refused)} key(s) rlforge cannot run as asked:\n  {lines}\n"
                          f"(rlforge config from-verl ARGS shows the whole translation; see {verl.DOC})")


def as_layer(t: verl.Translation) -> DictConfig:
    """The translation's rlforge keys as a config layer."""
    tree = t.nested()
    if t.command == "sft":
        tree.pop("algorithm", None)
    return OmegaConf.create(tree)


# an rlforge key given after `--` that a translated key would overrule, with the translated key and where that one goes
# instead: the key after -- wins, as verl's total_training_steps beside total_epochs does
OUTRANKED = {"trainer.total_steps": ("trainer.total_epochs", "trainer.epoch_limit"),
             "sft.steps": ("sft.epochs", "sft.epoch_limit")}
# an epoch count given after `--` sets the run's length: a translated epoch limit would cut it short
LIMITS = {"trainer.total_epochs": "trainer.epoch_limit", "sft.epochs": "sft.epoch_limit"}


def beneath(prepared: Prepared, ours: list[str]) -> tuple[DictConfig, list[str]]:
    """The translation as the layer beneath rlforge's own keys ``ours`` (given after ``--``), and a line for each
    translated key that yields to one of them (:data:`OUTRANKED`): ``-- trainer.total_steps=2`` trains 2 steps where
    the launch counts total_epochs, which then only limits the run."""
    mine = {o.split("=", 1)[0].lstrip("+~") for o in ours}
    layer, notes = prepared.config, []
    for key, (winner, instead) in OUTRANKED.items():
        value = OmegaConf.select(layer, winner)
        if key not in mine or winner in mine or value is None:
            continue
        layer = layer.copy()
        OmegaConf.update(layer, winner, None)
        moved = instead not in mine and OmegaConf.select(layer, instead) is None
        if moved:
            OmegaConf.update(layer, instead, value)
        notes.append(f"{key} given after --: the translated {winner}={value} "
                     + (f"becomes {instead}={value} (the run stops there if that comes first), as verl's "
                        f"total_training_steps beside total_epochs" if moved else
                        f"is dropped: {instead} is given after -- too"))
    for key, limit in LIMITS.items():
        value = OmegaConf.select(layer, limit)
        if key in mine and limit not in mine and value is not None:
            layer = layer.copy()
            OmegaConf.update(layer, limit, None)
            notes.append(f"{key} given after --: the translated {limit}={value} is dropped (your epochs set the run)")
    return layer, notes


def named_by_verl(exc: E, prepared: Prepared, ours: list[str]) -> E:
    """``exc`` with the verl keys whose values the rlforge key it is about came from (:func:`verl_sources`)."""
    found = verl_sources(exc, prepared, ours)
    return type(exc)(f"{exc} (from verl's {', '.join(f'{f.key}={f.value}' for f in found)})") if found else exc


def verl_sources(exc: Exception, prepared: Prepared, ours: list[str]) -> list[Fate]:
    """The fates of the verl keys whose values the rlforge key ``exc`` is about came from: the first key it names that
    the translation wrote (``key: ...`` at its start, ``'key'`` quoted, ``(key)``), or an entry of a mapping it wrote
    (``reward.fn_kwargs.bogus`` from ``custom_reward_function.reward_kwargs.bogus``); none for a key given after
    ``--`` (``ours``: its value is not verl's)."""
    mine = {o.split("=", 1)[0].lstrip("+~") for o in ours}
    text = str(exc)
    named = [m.group(1) for pattern in (r"^(\w+(?:\.[\w-]+)+): ", r"'([\w.]+)'", r"\((\w+(?:\.\w+)+)\)")
             if (m := re.search(pattern, text))]  # the first of each: a later quoted key is a "did you mean" one

    fates = prepared.translation.fates

    def about(f: Any, subject: str) -> bool:  # mapped to the subject, or to the mapping the subject is an entry of
        rest = subject[len(f.target):] if subject.startswith(f.target + ".") else None
        return bool(f.target) and (f.target == subject or rest is not None and f.key.endswith(rest))

    def source(f: Any) -> Any:  # the fate whose value it is: itself, or the legacy key moved over it
        moved = not (f.value is f.mapped_value or f.value == f.mapped_value)  # "is": a NaN is not equal to itself
        if f.target and moved and not isinstance(f.mapped_value, dict):
            return next((g for g in fates if g.text.startswith(f"moved to {f.key}")), None)
        return f

    def sources(subject: str) -> list[Fate]:
        return [g for f in fates if about(f, subject) and (g := source(f)) is not None
                and not any(k == f.target or k.startswith(f.target + ".") for k in mine)]

    found = next((found for subject in named if (found := sources(subject))), [])
    if found and not any(prepared.translation.set_by_launch(f.key) for f in found):
        # a check between two values ('actor.ppo_mini_batch_size' must divide 'data.train_batch_size'): the key the
        # launch set rather than the default it left
        own = [f for subject in re.findall(r"'([\w.]+)'", text) for f in sources(subject)
               if prepared.translation.set_by_launch(f.key)]
        return own[:1] or found
    return found
