"""verl's trainer module and its loop in rlforge's terms (``Derived`` rules, beside ``verl_derived``): which trainer
main_ppo runs (``trainer.use_v1``, ``trainer.v1.*``: its mode, rounds per step, sampler and staleness bound), and how
often the loop validates and saves (``test_freq``, ``save_freq``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.config.verl_fates import TRAINER_NAMES
from rlforge.config.verl_rules import Checked, custom_sampler, is_

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context


# main_ppo's choice of trainer: (value test, what rlforge does, what rlforge lacks)
MAIN_PPO_KEYS = {
    "trainer.use_v1": (bool, "verl's v1 trainer (main_ppo's default)",  # main_ppo: `if config.trainer.use_v1:`
                       "verl's deprecated legacy trainer (trainer.use_v1=False, main_ppo_v0)"),
    "trainer.v1.trainer_mode": (is_("sync"), "generate, then train", "verl's v1 asynchronous trainer modes (rlforge: "
                                "trainer.pipeline=one_step_off or async, docs/pipelines.md)"),
    # read in sync mode (trainer.v1.<mode>.parameter_sync_step): k rounds of generate-and-update per step, each on
    # train_batch_size / k prompts, the schedule over k x the steps
    "trainer.v1.sync.parameter_sync_step": (lambda v: v == 1, "one round of generate-and-update per step",
                                            "several rounds of generate-and-update per step (trainer.v1.sync."
                                            "parameter_sync_step: train_batch_size / k prompts each)"),
}


# the sampler of main_ppo's v1 trainer checks its staleness bound even in sync mode, where nothing is stale
STALENESS = "the staleness bound of verl's v1 asynchronous modes (in sync mode verl only checks its value)"
STALENESS_KEYS = {
    "trainer.v1.sampler.max_off_policy_threshold": Checked(  # isinstance: True passes, as in verl's check
        STALENESS, lambda v: v is None or (isinstance(v, int) and v > 0), "a positive integer or null"),
    "trainer.v1.sampler.max_off_policy_strategy": Checked(STALENESS, is_("drop", "wait"), "'drop' or 'wait'"),
}


def main_ppo_trainer(c: Context) -> None:
    """``trainer.use_v1``, ``trainer.v1.trainer_mode``, the sampler's class and its staleness bound: read only by
    verl.trainer.main_ppo, which picks its trainer with them (and checks the bound's values even in sync mode); a
    launch of another trainer module leaves them unread. The one-step-off trainer's launches get rlforge's
    ``trainer.pipeline=one_step_off``."""
    if c.trainer == "one_step_off":  # its own entry point: the batch of step k + 1 generated while step k trains
        c.set("trainer.pipeline", "one_step_off")
    for key in c.owned:
        if c.trainer in TRAINER_NAMES:
            c.unread(key, f"read only by verl.trainer.main_ppo (this launch runs on {TRAINER_NAMES[c.trainer]})")
        elif key in STALENESS_KEYS and c.get("trainer.use_v1") is False:  # main_ppo_v0: no replay buffer
            c.unread(key, "read only by verl's v1 trainer (trainer.use_v1=False: refused)")
        elif key in STALENESS_KEYS:
            c.checked(key, STALENESS_KEYS[key])
        elif ".custom_sampler." in key:
            (c.refuse(key, "a custom sampler class (trainer.v1.sampler.custom_sampler)") if custom_sampler(c.get) else
             c.unread(key, "verl plugs in a custom sampler only with both custom_sampler.path and .name") if c.get(key)
             else c.same(key, "verl's own replay buffer"))
        elif key.endswith("parameter_sync_step") and not isinstance(c.get(key), int):  # True is 1 there
            c.stop(key, "verl's v1 trainer runs range(parameter_sync_step) rounds and divides the batch by it, and "
                        "stops on a value that is not a whole number")
        else:
            ok, does, missing = MAIN_PPO_KEYS[key]
            (c.same(key, does) if ok(c.get(key)) else c.refuse(key, missing))


def save_freq(c: Context) -> None:
    """verl saves every save_freq steps and after the last one where save_freq > 0, never where it is <= 0; it
    compares the value with 0 at the first step, so one that is not a number stops it. rlforge also writes a final
    checkpoint either way."""
    key, value = "trainer.save_freq", c.get("trainer.save_freq")
    if value is None or isinstance(value, str):
        c.stop(key, "verl 0.9.1 compares it with 0 after the first step and stops on a value that is not a number "
                    "(trainer.save_freq=-1 means no checkpoints)")
    elif value > 0 and not float(value).is_integer():
        c.refuse(key, f"a fractional step interval (save_freq={value})")
    else:
        c.map(key, "trainer.save_every", max(0, int(value)), "rlforge also writes a final checkpoint")


def val_freq(c: Context) -> None:
    """verl validates every test_freq steps and after the last one where test_freq > 0; never during or after
    training where it is <= 0 (val_before_train is its own key)."""
    freq = c.get("trainer.test_freq")
    if freq is None and c.has("trainer.test_freq"):
        c.stop("trainer.test_freq", "null: verl 0.9.1 compares it with 0 after the first step and stops there "
               "(TypeError); trainer.test_freq=-1 means no validation")
        return
    every = bool(freq) and freq > 0
    c.map("trainer.test_freq", "trainer.val_every", freq if every else 0,
          "" if every else "no validation during training, none after the last step (trainer.val_at_end=false)")
    c.set("trainer.val_at_end", every)
