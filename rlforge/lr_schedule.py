"""Learning-rate schedules of the actor, the critic (``actor.*``, ``critic.*``) and SFT (``sft.*``): transformers'
``get_scheduler`` under rlforge's names, so a schedule means what it means in transformers, TRL and verl.

Every schedule starts with a linear warm-up from 0 over ``warmup_steps`` scheduler steps (or, where that is 0,
``int(warmup_ratio x the run's steps)``), then follows ``lr_scheduler``:

- ``constant``: the peak rate to the end;
- ``cosine``: a cosine from the peak down to ``min_lr_ratio`` x the peak, ``num_cycles`` waves over the rest of the
  run (0.5: one half-wave down);
- ``linear``: a straight line from the peak down to 0 at the run's last step.

The schedule steps once per training step in RL (each update's optimizer steps share one rate, as in verl) and once
per optimizer step in SFT. Its first step is step 0, so with a warm-up the first step runs at rate 0 (transformers'
and verl's convention).

A resumed run rebuilds its schedule for the run's length as configured now and continues it at the checkpoint's step
(``continue_at_step``): a longer ``trainer.total_steps`` gives the rest of the run the longer run's rates, as verl's
resume does (the rate the optimizer state held, the old schedule's, would otherwise drive the first resumed step).
"""

from __future__ import annotations

from typing import Any

# rlforge's name -> transformers' SchedulerType name
LR_SCHEDULERS = {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr", "linear": "linear"}
# the section keys a schedule reads besides the warm-up, by transformers' keyword argument
OPTIONS = {"cosine": {"min_lr_rate": "min_lr_ratio", "num_cycles": "num_cycles"}}


def warmup_steps(steps: int, ratio: float, total: int) -> int:
    """The warm-up length: ``steps`` when > 0, else ``int(ratio x total)`` (verl's lr_warmup_steps and
    lr_warmup_steps_ratio, transformers' warmup_steps and warmup_ratio)."""
    return int(steps) if steps > 0 else int(float(ratio) * total)


def depends_on_length(section: Any) -> bool:
    """Whether the schedule of ``section`` changes with the run's length: a decaying one, or a warm-up given as a
    share of the run."""
    return section.lr_scheduler != "constant" or (int(section.warmup_steps) <= 0 and float(section.warmup_ratio) > 0)


def continue_at_step(scheduler: Any) -> None:
    """Set the optimizer's rates to ``scheduler``'s (a ``LambdaLR``, its state just loaded from a checkpoint) at its
    step. ``load_state_dict`` restores the step but not the rates, which come with the optimizer's state: the old
    schedule's last rate, which a schedule rebuilt for another run length (a longer ``trainer.total_steps``) does not
    give at that step (cosine: 0, the end of the shorter run, for the first resumed step). The same length: the same
    rates. A scheduler without rate functions (another kind an ``RLModule.configure_optimizers`` returned) is left
    as loaded."""
    if not hasattr(scheduler, "lr_lambdas"):
        return
    rates = [base * rate(scheduler.last_epoch) for rate, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    for group, lr in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = lr
    scheduler._last_lr = rates


def build(optimizer: Any, section: Any, total: int) -> Any:
    """The schedule ``section`` (``actor``, ``critic`` or ``sft``) asks for over a run of ``total`` steps."""
    from transformers import get_scheduler

    name = section.lr_scheduler
    extra = {arg: float(getattr(section, key)) for arg, key in OPTIONS.get(name, {}).items()} or None
    return get_scheduler(LR_SCHEDULERS[name], optimizer,
                         num_warmup_steps=warmup_steps(section.warmup_steps, section.warmup_ratio, total),
                         num_training_steps=total, scheduler_specific_kwargs=extra)
