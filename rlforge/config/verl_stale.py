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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.config.verl_tree import PPO, default_tree

ARO = "actor_rollout_ref"
FIELDS = Path(__file__).parent / "verl_defaults" / "fields.json"  # written by scripts/gen_verl_defaults.py
# the sections whose config classes verl 0.9.1 always builds (its dataclasses refuse a field they lack): PPO's policy
# roles (the reference model's, and the critic's, where one is built) and the SFT trainer's engine sections
BUILT = (f"{ARO}.actor.", f"{ARO}.rollout.", f"{ARO}.model.")
BUILT_SFT = ("model.", "engine.", "optim.", "checkpoint.", "profiler.")
_IS = ("verl 0.9.1 moved rollout importance sampling to algorithm.rollout_correction (rollout_is: token or sequence, "
       "rollout_is_threshold; masking instead of weighting: rollout_rs, rollout_rs_threshold)")
_CKPT = ("trainer.max_actor_ckpt_to_keep and trainer.max_critic_ckpt_to_keep (1: only the last checkpoint; null, "
         "the default: every one)")
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
    **{f"{role}.fsdp_config.grad_offload": "none: verl 0.9.1 dropped gradient offload (remove the key; "
                                           "fsdp_config.param_offload and optimizer_offload remain)"
       for role in (f"{ARO}.actor", f"{ARO}.ref", "critic.model")},
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
    if old is None:
        return None
    new = MOVED[old] + key[len(old):]
    return new if new_in(default_tree(PPO), new) is None else None


@functools.cache
def _fields() -> dict[str, dict[str, str | None]]:
    return json.loads(FIELDS.read_text(encoding="utf-8"))["fields"]


@dataclass(frozen=True)
class Gap:
    """Where a key leaves verl's config: ``section`` (dotted, '' for the top level) lacks ``part``; ``cls`` is the
    section's config class ('' for a plain section)."""

    section: str
    part: str
    cls: str


def scalar_above(defaults: dict[str, Any], key: str) -> tuple[str, Any] | None:
    """The key above ``key`` that verl's default tree ``defaults`` holds as one value (a number, a string, a bool:
    the launch gave it a mapping, ``data.max_prompt_length='{a: 1}'``), with its default; else None."""
    node: Any = defaults
    path: list[str] = []
    for part in key.split(".")[:-1]:
        if not isinstance(node, dict) or part not in node:
            return None
        node, path = node[part], [*path, part]
        if node is not None and not isinstance(node, (dict, list)) and not (isinstance(node, str) and "${" in node):
            return ".".join(path), node  # (an interpolation may give a mapping)
    return None


def new_in(defaults: dict[str, Any], key: str) -> Gap | None:
    """None when verl's default tree ``defaults`` has ``key`` (a key of the tree, a field of its section's config
    class or of a field's own class, or a key below a field that takes any mapping: null or empty), else the
    :class:`Gap`."""
    node: Any = defaults
    cls, path = "", list[str]()
    for part in key.split("."):
        if not isinstance(node, dict) or not node:
            return None
        cls = str(node.get("_target_", cls))
        fields = _fields().get(cls, {})
        if part not in node:
            return None if part in fields else Gap(".".join(path), part, cls)
        node, cls, path = node[part], fields.get(part) or "", [*path, part]
    return None


def stops(gap: Gap) -> str:
    """Why verl 0.9.1 stops on a key of the ``gap`` in a section it builds, and what to set instead."""
    new = renamed(f"{gap.section}.{gap.part}")
    return (f"'{gap.part}' is not a field of verl 0.9.1's {gap.cls.rsplit('.', 1)[-1]} ({gap.section}): verl stops "
            f"when it builds that section (unexpected keyword '{gap.part}'), with or without '+'"
            + (f"; verl 0.9.1's key for it: {new}" if new else ""))


# sections whose entries verl passes on as they are (to megatron-core, to the reward function or manager) or reads
# by name (named teachers), the legacy keys verl moves, and Hydra's own settings (checked against Hydra's config by
# verl_hydra): a new key there is an entry, for the tables' rules
PASSED_ON = tuple(f"{role}.megatron.override_{what}_config." for role in (f"{ARO}.actor", f"{ARO}.ref", "critic")
                  for what in ("transformer", "ddp", "optimizer")) + (
    f"{ARO}.actor.optim.override_optimizer_config.", "reward.reward_kwargs.", "reward_model.",
    "custom_reward_function.",
    "reward.custom_reward_function.", "reward.reward_manager.", "distillation.", "data.apply_chat_template_kwargs.",
    "algorithm.rollout_correction.", "hydra.")


def settle(c: Any, key: str, gap: Gap, built_sections: tuple[str, ...], variables: frozenset[str], exact: bool,
           ruled: bool) -> bool:
    """Give ``key``, which verl's defaults lack (``gap``), its fate in the translation context ``c``: refused where verl
    stops on it (a config class it builds) or where no rule covers it (verl never reads it), ignored where it is a
    variable of one's own config file. False: the tables' rule decides (``exact``: a rule for this very key;
    ``ruled``: a pattern's, which decides in the sections of :data:`PASSED_ON`)."""
    if built(gap, built_sections):
        c.stop(key, stops(gap) + did_you_mean(key, c.flat, clause=True))
    elif "." not in key or key.split(".", 1)[0] in variables:
        c.unread(key, "a top-level key of the config, which verl 0.9.1 never reads (a variable: its value counts where "
                      "other keys interpolate it)")
    elif exact or ruled and key.startswith(PASSED_ON):
        return False
    else:
        c.stop(key, unread(key) + did_you_mean(key, c.flat, clause=True))
    return True


def near(key: str, keys: Any) -> str | None:
    """The one of ``keys`` that ``key`` nearly spells (a typo), else None."""
    import difflib

    close = difflib.get_close_matches(key, [k for k in keys if k != key], n=1, cutoff=0.9)
    return close[0] if close else None


def did_you_mean(key: str, keys: Any, clause: bool = False) -> str:
    """" Did you mean 'k'?" for the key ``key`` nearly spells (``clause``: "; did you mean 'k'?"), else ''."""
    k = near(key, keys)
    return "" if k is None else f"; did you mean '{k}'?" if clause else f" Did you mean '{k}'?"


def unread(key: str) -> str:
    """The reason for refusing ``key``, new to a plain section of verl's config, which verl 0.9.1 never reads."""
    new = renamed(key)
    return (f"not a key verl 0.9.1 reads (an older verl's, a fork's or a project's own); verl would run without it, "
            f"rlforge refuses it rather than run differently from what the launch asks" +
            (f"; verl 0.9.1's key for it: {new}" if new else ""))


def built(gap: Gap | None, prefixes: tuple[str, ...] = (*BUILT, f"{ARO}.ref.", "critic.")) -> bool:
    """Whether verl 0.9.1 stops on the key of ``gap``: a field missing from a config class verl builds."""
    return bool(gap and gap.cls and f"{gap.section}.".startswith(prefixes))


def hint(key: str, gap: Gap | None) -> str:
    """The end of the error for an override of a key verl's config lacks."""
    new = renamed(key)
    where = (f" '{gap.section}' is verl 0.9.1's {gap.cls.rsplit('.', 1)[-1]}, which has no field '{gap.part}': verl "
             f"stops on it, with '+' too, when it builds that section (a reference model's or a critic's only where the "
             f"run has one)." if gap and built(gap) else "")
    return (f" verl 0.9.1's key for it: {new}." if new else "") + where


def unknown_key(tree: dict[str, Any], key: str, line: str, delete: bool) -> str:
    """The error for an override of a key verl's config lacks: the key it nearly spells (a typo), else Hydra's advice
    ('+') unless the section is one of verl's config classes; and verl 0.9.1's key for the setting where there is one
    (:func:`hint`)."""
    from rlforge.config.verl_fates import flatten

    gap = new_in(tree, key)
    mean = did_you_mean(key, [k for k, _ in flatten(tree)])
    plus = not (delete or mean or built(gap) or renamed(key))
    add = f" To add a key, prefix it with '+': +{line.lstrip('+')}." if plus else ""
    return (f"Override '{line}': '{key}' is not a key of verl's config (verl 0.9.1 refuses it too)."
            + mean + hint(key, gap) + add)
