"""Keys a verl launch sets that verl 0.9.1 does not have: what verl does with them, and verl 0.9.1's name for them.

Launch scripts written for an older verl or for a project's fork of it (Search-R1, rllm, simpleRL, ...) set keys
verl 0.9.1 lacks. Hydra stops at ``key=value`` for a key the config lacks; ``+key=value`` composes, and then verl
stops where it builds the section's config class (a section with ``_target_``: the class gets an unexpected keyword)
or, in a plain section (``data``, ``trainer``, ...), never reads the key. rlforge refuses such keys as verl stops on
them, names the class, and gives verl 0.9.1's key for the setting where there is one (:data:`RENAMED`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

ARO = "actor_rollout_ref"
FIELDS = Path(__file__).parent / "verl_defaults" / "fields.json"  # written by scripts/gen_verl_defaults.py
# the sections whose config classes verl 0.9.1 always builds (its dataclasses refuse a field they lack): PPO's policy
# roles (the reference model's, and the critic's, where one is built) and the SFT trainer's engine sections
BUILT = (f"{ARO}.actor.", f"{ARO}.rollout.", f"{ARO}.model.")
BUILT_SFT = ("model.", "engine.", "optim.", "checkpoint.", "profiler.")
_IS = ("verl 0.9.1 moved rollout importance sampling to algorithm.rollout_correction (rollout_is: token or sequence, "
       "rollout_is_threshold; masking instead of weighting: rollout_rs, rollout_rs_threshold)")
_CKPT = "trainer.max_actor_ckpt_to_keep=1 and trainer.max_critic_ckpt_to_keep=1"
# a key of an older verl or of a fork -> verl 0.9.1's key for the same setting
RENAMED = {
    f"{ARO}.rollout.val_temperature": f"{ARO}.rollout.val_kwargs.temperature",
    f"{ARO}.rollout.n_val": f"{ARO}.rollout.val_kwargs.n",
    f"{ARO}.rollout.n_agent": f"{ARO}.rollout.n (responses per prompt)",
    f"{ARO}.rollout.multi_turn.max_turns": f"{ARO}.rollout.multi_turn.max_assistant_turns (and max_user_turns)",
    "data.shuffle_train_dataloader": "data.shuffle",
    f"{ARO}.actor.policy_loss.tau_pos": f"{ARO}.actor.tau_pos",
    f"{ARO}.actor.policy_loss.tau_neg": f"{ARO}.actor.tau_neg",
    "trainer.remove_previous_ckpt": _CKPT, "trainer.remove_previous_ckpt_in_save": _CKPT,
    **{f"algorithm.{leaf}": _IS for leaf in ("rollout_is", "rollout_is_threshold", "rollout_is_threshold_lower",
                                             "rollout_is_level", "rollout_is_mode", "rollout_is_veto_threshold")},
}
# sections that moved whole: the old prefix -> the new one
MOVED = {"critic.model.fsdp_config.": "critic.fsdp."}


def renamed(key: str) -> str | None:
    """verl 0.9.1's key for an older verl's or a fork's ``key`` (a sentence), or None."""
    if key in RENAMED:
        return RENAMED[key]
    old = next((p for p in MOVED if key.startswith(p)), None)
    return MOVED[old] + key[len(old):] if old else None


@functools.cache
def _fields() -> dict[str, frozenset[str]]:
    return {cls: frozenset(names) for cls, names in json.loads(FIELDS.read_text(encoding="utf-8"))["fields"].items()}


def new_in(defaults: dict[str, Any], key: str) -> str | None:
    """Where ``key`` is new to verl's default tree ``defaults``: None when verl has it (a key of the tree or a field of
    its section's config class, or a key below a field that takes any mapping), else the config class of the section
    that lacks it (its ``_target_``), or '' for a plain section."""
    node: Any = defaults
    for part in key.split("."):
        if not isinstance(node, dict) or not node:
            return None
        if part not in node:
            cls = str(node.get("_target_", ""))
            return None if part in _fields().get(cls, ()) else cls
        node = node[part]
    return None


def stops(key: str, owner: str) -> str:
    """Why verl 0.9.1 stops on ``key``, a field its config class ``owner`` lacks, and what to set instead."""
    leaf, cls = key.rsplit(".", 1)[-1], owner.rsplit(".", 1)[-1]
    new = renamed(key)
    return (f"not a field of verl 0.9.1's {cls}: verl stops when it builds that section (unexpected keyword "
            f"'{leaf}'), with or without '+'" + (f"; verl 0.9.1's key for it: {new}" if new else ""))


def unread(key: str) -> str:
    """The reason for refusing ``key``, new to a plain section of verl's config, which verl 0.9.1 never reads."""
    new = renamed(key)
    return (f"not a key verl 0.9.1 reads (an older verl's, a fork's or a project's own); verl would run without it, "
            f"rlforge refuses it rather than run differently from what the launch asks" +
            (f"; verl 0.9.1's key for it: {new}" if new else ""))


def hint(key: str, section_class: str) -> str:
    """The end of the error for an override of a key verl's config lacks (``section_class``: its section's config
    class, '' for a plain section)."""
    new = renamed(key)
    where = (f" '{key.rsplit('.', 1)[0]}' is verl 0.9.1's {section_class.rsplit('.', 1)[-1]}, which has no such "
             f"field: where verl builds it, it stops on it with '+' too." if section_class else "")
    return (f" verl 0.9.1's key for it: {new}." if new else "") + where
