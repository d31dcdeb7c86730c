"""verl's reward keys in rlforge's terms (``Derived`` rules, beside ``verl_derived``): the reward manager and the
reward function (``reward.*`` and the legacy ``reward_model.*`` / ``custom_reward_function.*`` that some of verl's
trainers move there), its keyword arguments, and DAPO's overlong shaping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlforge.config.verl_fates import MIGRATING_TRAINERS
from rlforge.config.verl_rules import joined, nest

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

REWARD_MANAGERS = {"naive": "rule", "dapo": "rule", "gdpo": "rule"}  # verl 0.9.1's reward loop has no 'prime' manager
VERL_MANAGERS = ("naive", "dapo", "remote", "gdpo", "rate_limited")  # the names verl 0.9.1's reward loop registers
# verl's older managers, still in 0.9.1's verl/workers/reward_manager but not registered by its reward loop
LEGACY_MANAGERS = {"prime": "naive scoring in a process pool: rlforge's reward.manager=rule with reward.num_workers",
                   "batch": "one call of the reward function with the lists of a whole batch"}


# overlong_buffer_cfg's keys with an rlforge key of their own: (target, conversion, the difference the report states)
OVERLONG: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    "len": ("algorithm.overlong_buffer", int, "verl's dapo reward manager puts the penalty in the reward itself, so its "
            "validation rewards (val-aux/<source>/reward) carry it too; rlforge shapes the training rewards only "
            "(validation accuracy, val-core, is the same)"),
    "penalty_factor": ("algorithm.overlong_penalty", float, ""),
    "log": ("algorithm.overlong_log", bool, "verl keeps each response's overlong_reward and overlong flag (the rollout "
            "dump, and val-aux metrics where its validation rewards carry the penalty); rlforge logs their means per "
            "training step, critic/overlong_penalty/mean and critic/overlong/ratio"),
}


def overlong(c: Context) -> None:
    """DAPO's overlong shaping: only with the dapo reward manager, only when overlong_buffer_cfg.enable."""
    keys = list(c.owned)
    # a legacy reward_model.reward_kwargs key goes over reward.reward_kwargs: the whole section where verl's trainer
    # moves it (Context.legacy_reward_kwargs), else key by key (the move's meaning)
    whole = c.legacy_reward_kwargs
    given = {k.rsplit(".", 1)[1] for k in keys if k.startswith("reward_model.") and c.get(k) is not None}
    for key in keys:
        if not key.startswith("reward_model.") and (whole or key.rsplit(".", 1)[1] in given):
            (c.unread(key, "replaced by reward_model.reward_kwargs: verl's migrate_legacy_reward_impl moves that "
                           "whole section over it") if whole else
             c.ignore(key, "the launch's legacy reward_model.reward_kwargs key of the same name goes over it"))
        elif key.startswith("reward_model.") and c.get(key) is None and not whole:
            c.unread(key, "null: reward.reward_kwargs's key of the same name applies")
    keys = [k for k in keys if not c.done(k)]
    cfg = {k.rsplit(".", 1)[1]: c.get(k) for k in keys}
    if not c.overlong_on:
        why = ("read only with overlong_buffer_cfg.enable" if c.reward_manager == "dapo"
               else f"read only by the dapo reward manager (this one: {c.reward_manager})")
        for key in keys:
            (c.map(key, "algorithm.overlong_buffer", 0) if key.endswith("enable") and c.reward_manager == "dapo"
             else c.unread(key, why))
        return
    longest = c.get("data.max_response_length")
    absent = [leaf for leaf in (*OVERLONG, "max_resp_len") if leaf not in cfg]
    for key in keys:
        leaf = key.rsplit(".", 1)[1]
        moved = (legacy_moved(c, "reward.reward_kwargs") + "; rlforge reads it as the move means"
                 if key.startswith("reward_model.") and c.trainer not in MIGRATING_TRAINERS else "")
        problem = overlong_stop(leaf, cfg)
        if problem:
            c.stop(key, problem)
        elif leaf == "enable" and absent:  # verl asserts max_resp_len and len when it builds its manager, and reads
            # penalty_factor and log by attribute when it scores (a key the section lacks is an error there)
            c.stop(key, f"overlong shaping without {', '.join(absent)} (reward_kwargs.max_resp_len, overlong_buffer_cfg"
                        f".len/penalty_factor/log): verl's dapo reward manager stops without them")
        elif leaf == "enable":
            c.same(key, joined("DAPO's overlong shaping (algorithm.overlong_buffer > 0)", moved))
        elif leaf == "len" and not float(cfg[leaf]).is_integer():  # verl computes with it: a ramp of 8.5 tokens
            c.refuse(key, f"a ramp of a fractional length (overlong_buffer_cfg.len={cfg[leaf]}; rlforge's "
                          f"algorithm.overlong_buffer counts whole tokens)")
        elif leaf in OVERLONG:
            target, convert, note = OVERLONG[leaf]
            c.map(key, target, convert(cfg[leaf]), joined(note, moved))
        elif leaf == "max_resp_len":
            (c.same(key, joined("rollout.max_new_tokens", moved)) if cfg[leaf] == longest else
             c.refuse(key, f"an overlong limit (max_resp_len={cfg[leaf]}) other than data.max_response_length"))
        else:
            c.refuse(key, f"DAPO reward option {leaf}")


def overlong_stop(leaf: str, cfg: dict[str, Any]) -> str:
    """Where verl's dapo reward manager stops on the value of ``leaf`` with overlong shaping on: its constructor
    asserts max_resp_len is set, len > 0 and max_resp_len >= len ('' where it does not stop)."""
    length, limit = cfg.get("len"), cfg.get("max_resp_len")
    if leaf == "max_resp_len" and limit is None:
        return "null with overlong shaping on: verl's dapo reward manager asserts it is set (data.max_response_length)"
    number = isinstance(length, (int, float)) and not isinstance(length, bool)
    if leaf == "len" and not (number and length > 0):
        return (f"overlong_buffer_cfg.len={length!r} with overlong shaping on: verl's dapo reward manager asserts it is "
                f"positive (enable=False turns shaping off)")
    if leaf == "len" and isinstance(limit, int) and limit < length:
        return f"longer than max_resp_len ({limit}): verl's dapo reward manager asserts max_resp_len >= len"
    return ""


PLACEMENT_KEYS = ("enable_resource_pool", "n_gpus_per_node", "nnodes")  # verl's legacy reward_model placement


def legacy_moved(c: Context, new: str) -> str:
    """What becomes of a legacy reward key (``reward_model.*``, ``custom_reward_function.*``) that moves to ``new``."""
    if c.trainer in MIGRATING_TRAINERS:
        return f"moved to {new}, as verl moves it"
    return (f"moved to {new}, as verl's migrate_legacy_reward_impl moves it; verl 0.9.1 calls that only in its DAPO "
            f"recipe and fully-async trainers: its main_ppo leaves this legacy key unread (there the launch keeps "
            f"{new}'s value)")


def unknown_manager(c: Context, key: str) -> None:
    """A reward manager rlforge does not have, named by ``key``: one of verl's, or a project's own."""
    name, own = c.reward_manager, "rlforge's: reward.manager=rule or model, or a reward plugin (docs/plugins.md)"
    unread = key.startswith("reward_model.") and c.trainer not in MIGRATING_TRAINERS
    if name in VERL_MANAGERS:
        c.refuse(key, f"verl's '{name}' reward manager ({own})")
    elif name in LEGACY_MANAGERS:
        c.stop(key, f"verl's older '{name}' reward manager (verl/workers/reward_manager/{name}.py: "
                    f"{LEGACY_MANAGERS[name]}), which verl 0.9.1's reward loop does not register"
                    + ("; its main_ppo never reads this legacy key and would score with reward.reward_manager.name "
                       "instead" if unread else " (verl stops where it looks it up)") + f"; {own}")
    elif unread:
        c.stop(key, f"a reward manager '{name}' of the launch's own project, which rlforge does not have; verl 0.9.1's "
                    f"main_ppo never reads this legacy key and would score with reward.reward_manager.name instead; "
                    f"{own}")
    else:
        c.stop(key, f"a reward manager '{name}' that verl 0.9.1's reward loop does not register (verl stops where it "
                    f"looks it up; a project that has one registers it in its own code); {own}")


def reward(c: Context) -> None:
    """verl's reward section, with the legacy keys moved in first, as migrate_legacy_reward_impl moves them (which
    verl 0.9.1 runs in its DAPO recipe and fully-async trainers only: under main_ppo the difference is stated)."""
    legacy = {"reward_model.reward_manager": "reward.reward_manager.name", "reward_model.num_workers": "reward.num_workers",
              "reward_model.enable": "reward.reward_model.enable", "reward_model.model.path": "reward.reward_model.model_path",
              "custom_reward_function.path": "reward.custom_reward_function.path",
              "custom_reward_function.name": "reward.custom_reward_function.name"}
    value = {new: c.get(new) for new in legacy.values()}
    source, module = c.get("reward.reward_manager.source"), c.get("reward.reward_manager.module.path")
    known = c.reward_manager in REWARD_MANAGERS and source == "register"
    if not known and source == "register" and c.get("reward_model.reward_manager") is not None:
        # the launch's own key, which moves over reward.reward_manager.name (under main_ppo: rlforge moves it)
        unknown_manager(c, "reward_model.reward_manager")
        c.ignore("reward.reward_manager.name", "the legacy reward_model.reward_manager names the manager")
    # custom_reward_function moves as a whole section (verl assigns it), the other keys one by one
    whole = c.trainer in MIGRATING_TRAINERS and any(c.get(f"custom_reward_function.{leaf}") is not None
                                                    for leaf in ("path", "name"))
    for old, new in legacy.items():
        if c.get(old) is not None or whole and old.startswith("custom_reward_function."):
            value[new] = c.get(old)
            c.same(old, legacy_moved(c, new) if c.get(old) is not None else
                   f"null, moved with its section over {new}, as verl moves it")
        elif c.has(old):
            c.unread(old, f"null: {new} applies")
    for leaf in PLACEMENT_KEYS:  # moved to reward.reward_model.<leaf>, which is placement only (verl_keys)
        c.ignore(f"reward_model.{leaf}", f"moved to reward.reward_model.{leaf}, as verl moves it: where verl places "
                                         f"its reward model; rlforge's runs beside the actor (reward.model.device)")
    file = value["reward.custom_reward_function.path"]
    reward_fn_kwargs(c, file, whole, c.get("custom_reward_function.path") is not None)
    for key in c.owned:
        if key.startswith(("reward_model.", "custom_reward_function.")) and key not in legacy and not c.done(key):
            (c.unread(key, "null") if c.get(key) is None else c.refuse(key, f"verl's legacy {key}"))
    rm = bool(value["reward.reward_model.enable"])
    if known:
        told = {"experiment_name": c.get("trainer.experiment_name")} if c.reward_manager == "gdpo" else None
        c.map("reward.reward_manager.name", "reward.manager", "model" if rm else "rule",
              "with reward.max_error_share=0: a reward call that raises stops the run, as in verl (rlforge's own "
              "default scores it reward.fallback_score and stops only when every call of a step fails)"
              + (f"; and reward.extra_info={told}: verl's gdpo manager sets experiment_name in each row's extra_info"
                 if told else ""))
        c.set("reward.max_error_share", 0.0)
        if told:  # verl's gdpo manager is its naive one that tells the function the experiment
            c.set("reward.extra_info", told)
    elif source == "register":
        unknown_manager(c, "reward.reward_manager.name")
    else:
        c.refuse("reward.reward_manager.name", f"a reward manager class by path ({module})")
    c.same("reward.reward_manager.source", "registered reward managers")
    for key in ("reward.reward_manager.module.path", "reward.reward_manager.module.name"):
        c.unread(key, "read only with reward_manager.source=importlib")
    c.same("reward.reward_model.enable", "a reward model" if rm else "rule rewards")
    path = value["reward.reward_model.model_path"]
    (c.map("reward.reward_model.model_path", "reward.model.path", path) if rm
     else c.unread("reward.reward_model.model_path", "read only with reward_model.enable"))
    fn = value["reward.custom_reward_function.name"]
    if file:
        c.map("reward.custom_reward_function.path", "reward.file", file)
        if fn or not whole:
            c.map("reward.custom_reward_function.name", "reward.fn_name", fn or "compute_score")
        else:
            c.stop("reward.custom_reward_function.name", "the custom_reward_function section verl moves here has no "
                   "name, and verl stops on it (get_custom_reward_fn asserts one): give custom_reward_function.name")
    else:
        c.same("reward.custom_reward_function.path", "the built-in function of each row's data_source")
        c.unread("reward.custom_reward_function.name", "read only with custom_reward_function.path")
    workers = value["reward.num_workers"]
    if c.given & {"reward.num_workers", "reward_model.num_workers"} and workers:  # the launch's own count
        c.map("reward.num_workers", "reward.num_workers", max(1, int(workers)), "processes that run the reward "
              "function (verl's reward loop workers)")
    else:
        c.ignore("reward.num_workers", "verl's default of 8 reward loop workers (speed only): rlforge's "
                 "reward.num_workers stays 1 unless the launch sets a count")


def reward_fn_kwargs(c: Context, file: Any, whole: bool, legacy_path: bool) -> None:
    """``custom_reward_function.reward_kwargs``: keyword arguments verl binds to the custom reward function. The
    legacy section's replace the new one's where verl moves the section whole, and where the legacy section gives
    the function (they go with it); else they go over the new one's key by key."""
    new, old = "reward.custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs"
    keys = {prefix: [k for k in c.owned if k == prefix or k.startswith(prefix + ".")] for prefix in (new, old)}
    if whole or legacy_path:
        for key in keys[new]:
            (c.unread(key, "replaced by the legacy custom_reward_function section, which verl moves over it whole")
             if whole else c.ignore(key, "the legacy custom_reward_function.path gives the function, and the legacy "
                                    "section's reward_kwargs go with it"))
        keys[new] = []
    kwargs = {k[len(prefix) + 1:]: c.get(k) for prefix in (new, old) for k in keys[prefix] if k != prefix}
    for prefix in (new, old):
        for key in keys[prefix]:
            if not file:
                c.unread(key, "read only with custom_reward_function.path")
            elif key == prefix and not isinstance(c.get(key), dict):
                c.refuse(key, f"a {prefix} that is not a mapping of keyword arguments ({c.get(key)!r})")
            else:
                c.map(key, "reward.fn_kwargs", nest(kwargs), "" if prefix == new else legacy_moved(c, new))
