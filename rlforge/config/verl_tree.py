"""verl's default config trees as rlforge ships them (``verl_defaults/``, written by ``scripts/gen_verl_defaults.py``):
their names, the engine variants a launch selects, and loading them. ``verl_hydra`` composes launches over them;
``verl`` and ``verl_stale`` look keys up in them."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from rlforge.errors import ConfigError

DEFAULTS = Path(__file__).parent / "verl_defaults"  # package data, written by scripts/gen_verl_defaults.py
PPO, SFT, LEGACY_SFT = "ppo_trainer", "sft_trainer_engine", "sft_trainer"
# model_engine=X on the command line (a Hydra config-group choice in verl): the tree composed with that engine
ENGINE_VARIANTS = {
    ("ppo_trainer", "megatron"): "ppo_megatron_trainer", ("ppo_trainer", "torchtitan"): "ppo_torchtitan_trainer",
    ("ppo_trainer", "veomni"): "ppo_veomni_trainer", ("dapo_trainer", "megatron"): "dapo_megatron_trainer",
    ("fully_async_ppo_trainer", "megatron"): "fully_async_ppo_megatron_trainer",
    ("one_step_off_ppo_trainer", "megatron"): "one_step_off_ppo_megatron_trainer",
}
# keys of verl 0.9.0 that 0.9.1 dropped (with 0.9.0's default): scripts written for 0.9.0 still set them
REMOVED_IN_0_9_1 = {f"{role}.megatron.grad_offload": False
                    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")}


# verl-recipe configs that rlforge does not ship, whose trainers are rlforge algorithms
RECIPE_ALGORITHMS = {"sppo_trainer": "sppo", "prime_trainer": "prime"}


def shipped() -> list[str]:
    return sorted(p.stem for p in DEFAULTS.glob("*.yaml"))


def load_default(name: str) -> dict[str, Any]:
    """A deep copy of the shipped default tree ``name`` (parsed once per process)."""
    return copy.deepcopy(_load_default(name.removesuffix(".yaml")))


def default_tree(name: str) -> dict[str, Any]:
    """The shipped default tree ``name``, shared: not to be changed (:func:`load_default` gives a copy)."""
    return _load_default(name.removesuffix(".yaml"))


@functools.lru_cache(maxsize=None)
def _load_default(name: str) -> dict[str, Any]:
    path = DEFAULTS / f"{name}.yaml"
    if not path.is_file():
        algo = RECIPE_ALGORITHMS.get(name)
        hint = (f" verl-recipe's {algo.upper()} trainer has its counterpart in `rlforge fit --algo {algo}` "
                f"(docs/algorithms/{algo}.md), which takes rlforge's keys." if algo else "")
        raise ConfigError(f"rlforge does not know verl's config '{name}' (--config-name). verl's configs it ships: "
                          f"{', '.join(shipped())}.{hint}")
    tree = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for key, value in REMOVED_IN_0_9_1.items():
        parent, _, leaf = key.rpartition(".")
        node = tree
        for part in parent.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(leaf, value)
    return tree
