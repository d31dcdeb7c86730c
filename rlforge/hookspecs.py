"""Every ``rlforge_*`` hook specification, grouped by the stage of the loop in which it fires.

Hooks are called with keyword arguments only. A spec may gain arguments in later versions but never
loses or renames one, so implementations that take fewer arguments keep working (pluggy passes only
the arguments an implementation names; ``*args``, ``**kwargs`` and parameters with a default would get
nothing, so an implementation that has them is refused when it is registered).

Which process calls a hook: every hook fires in the driver (the process that runs ``Trainer.fit``), except
``rlforge_before_optimizer_step``, which fires where the update runs: the driver with the local controller,
every data-parallel rank (a Ray worker process, with the plugins loaded there) with the Ray controller.
``rlforge_register`` fires in every process that loads the plugins.

A plugin that implements an ``rlforge_*`` function that is not specified here is refused when it loads.
"""

from __future__ import annotations

from typing import Any

import pluggy

HOOK_SPEC_VERSION = 2
hookspec = pluggy.HookspecMarker("rlforge")
hookimpl = pluggy.HookimplMarker("rlforge")


# --- registration -------------------------------------------------------------------------------


@hookspec(historic=True)
def rlforge_register(registry: Any) -> None:
    """Register components (algorithms, rollout engines, rewards, strategies, loggers, datasets).

    :param registry: the :class:`rlforge.registry.Registries`; call e.g.
        ``registry.algorithm.register("grpo", GRPO)``, ``registry.rollout.register("mine", MyEngine,
        config=MyEngineConfig)`` (options at ``rollout.mine.*``) or ``registry.plugin_options(MyOptions)``
        (options at ``plugins.<plugin name>.*``).

    Historic: a plugin registered late still receives the call. Fires once per plugin at load time, in
    every process that loads the plugins. All or nothing: if it raises, nothing the plugin registered stays.
    """


# --- fit ----------------------------------------------------------------------------------------


@hookspec
def rlforge_before_flow_compile(flow: Any, module: Any, config: Any) -> None:
    """The module's dataflow is built; edit it in place to change every algorithm's step.

    :param flow: the :class:`rlforge.DataFlow`; ``flow.insert_after(Stage.REWARD, my_stage)``,
        ``insert_before``, ``replace``, ``remove``.
    :param module: the :class:`rlforge.RLModule` whose flow it is.
    :param config: the composed config.

    Fires in ``Trainer.fit`` before any model loads; ``flow.compile()`` checks the result right after (every
    stage's ``requires`` must be produced by an earlier stage). Return None: a returned flow would not be used, and is
    an error (``flow.stages[:] = other.stages`` replaces every stage in place).
    """


@hookspec
def rlforge_fit_start(trainer: Any, module: Any) -> None:
    """Training is about to start: the config is frozen, models are loaded, resume is done.

    :param trainer: the :class:`rlforge.Trainer`.
    :param module: the :class:`rlforge.RLModule` being trained.
    """


@hookspec
def rlforge_fit_end(trainer: Any, module: Any, summary: dict[str, Any]) -> None:
    """Training finished normally, after the final checkpoint and validation.

    :param summary: final figures (accuracy before/after, steps, tokens/s, run folder).
    """


@hookspec
def rlforge_exception(trainer: Any, exception: BaseException) -> None:
    """An exception (including KeyboardInterrupt) escaped the loop; fires before it propagates.

    :param exception: the exception being raised.
    """


# --- one step -----------------------------------------------------------------------------------


@hookspec
def rlforge_step_start(trainer: Any, step: int) -> None:
    """A training step begins.

    :param step: the 1-based index of the step about to run.
    """


@hookspec
def rlforge_step_end(trainer: Any, step: int, metrics: dict[str, float]) -> None:
    """A training step ended; ``metrics`` holds everything that will be logged for it. To end the run after this
    step (early stopping), set ``trainer.should_stop = True`` (any hook may): the run validates
    (``trainer.val_at_end``), saves its last checkpoint and ends as at ``trainer.total_steps``;
    ``trainer.resume=auto`` would train on to ``total_steps``.

    :param step: the 1-based index of the finished step.
    :param metrics: flat metric dict (verl namespace); implementations may add keys, whose values must be numbers
        (a one-element tensor becomes one; anything else is an error naming the key, before a logger meets it), and
        remove keys; giving one rlforge wrote another value is an error naming it (log yours under a name of its own).
    """


@hookspec
def rlforge_stage_start(trainer: Any, stage: str, batch: Any) -> None:
    """A dataflow stage is about to run (fires for every stage, built-in or user-defined).

    :param stage: the stage name, e.g. ``"rollout"``.
    :param batch: the :class:`rlforge.Batch` the stage receives.
    """


@hookspec
def rlforge_stage_end(trainer: Any, stage: str, batch: Any, seconds: float) -> None:
    """A dataflow stage finished.

    :param seconds: wall-clock time the stage took (logged as ``timing_s/<name>``, verl's names for the built-in
        stages: ``gen``, ``reward``, ``old_log_prob``, ``ref``, ``values``, ``adv``, ``update_critic``,
        ``update_actor``, ``update_weights``).
    """


@hookspec
def rlforge_rollout_start(trainer: Any, batch: Any) -> None:
    """Generation is about to run on the prompts in ``batch``."""


@hookspec
def rlforge_rollout_end(trainer: Any, batch: Any) -> None:
    """Generation finished: ``batch`` holds responses, masks and rollout log-probs."""


@hookspec(firstresult=True)
def rlforge_shape_rewards(trainer: Any, batch: Any) -> Any:
    """Return a batch with reshaped rewards (e.g. a length or format penalty), or None to leave it.

    Stops at the first non-None result, which must be a batch of at least one row (else an error naming the plugin). Fires right after scoring, before ``rlforge_reward_end``. The built-in overlong penalty (``algorithm.overlong_buffer``) is part of the reward, not one of these results: it is added to the ``token_level_rewards`` of the batch the implementations are given, and its metrics kept in their result; an implementation that rebuilds the rewards from ``token_level_scores`` (the reward function's, unshaped) starts over without it.
    """


@hookspec
def rlforge_reward_end(trainer: Any, batch: Any) -> None:
    """Rewards are in ``batch`` (``token_level_scores``, ``token_level_rewards`` and per-sample ``scores``)."""


@hookspec(firstresult=True)
def rlforge_filter_groups(trainer: Any, batch: Any) -> Any:
    """Return a filtered batch (e.g. DAPO dynamic sampling drops uniform groups), or None to keep it.

    Stops at the first non-None result, which must be a batch of at least one row (else an error naming the plugin:
    to draw more prompts until enough groups remain, use ``algorithm.filter_groups``). Fires after rewards, before log-probs and advantages.
    """


@hookspec
def rlforge_advantage_end(trainer: Any, batch: Any) -> None:
    """Advantages (and returns) are in ``batch``."""


@hookspec
def rlforge_update_start(trainer: Any, batch: Any) -> None:
    """The actor update is about to run on ``batch``: the batch it trains (with ``algorithm.mask_truncated``, the
    response mask zeroed on the truncated rows; the stages after the update get the batch unmasked)."""


@hookspec
def rlforge_update_end(trainer: Any, batch: Any, metrics: dict[str, float]) -> None:
    """The actor update finished.

    :param metrics: the update's metrics (``actor/pg_loss``, ``actor/grad_norm``, ...).
    """


@hookspec
def rlforge_before_optimizer_step(trainer: Any, module: Any, optimizer: Any, rank: int) -> None:
    """Gradients are accumulated and clipped; the optimizer is about to step.

    Per rank: fires in the process that runs the update (the driver with the local controller, each Ray
    worker with the Ray controller), so ``trainer`` is always None here.

    :param module: the :class:`rlforge.RLModule` of that process.
    :param optimizer: the optimizer about to step.
    :param rank: the data-parallel rank (0 with one process).
    """


@hookspec
def rlforge_weight_sync_end(trainer: Any, seconds: float) -> None:
    """The rollout engine now holds the actor's latest weights.

    :param seconds: time taken by the sync.
    """


# --- validation and checkpoints -----------------------------------------------------------------


@hookspec
def rlforge_validation_end(trainer: Any, step: int, metrics: dict[str, float]) -> None:
    """Validation on held-out prompts finished.

    :param step: the training step after which validation ran (0 = before training).
    :param metrics: ``val/*`` metrics, e.g. ``val/accuracy``; implementations may add keys (numbers), and giving one
        rlforge wrote another value is an error naming it (the summary's accuracy is read from it).
    """


@hookspec
def rlforge_save_checkpoint(trainer: Any, checkpoint: dict[str, Any]) -> None:
    """A checkpoint is being written; add entries to ``checkpoint`` to save extra state.

    Each implementation gets a dict of its own; an entry that two of them add (two instances of one callback with a
    fixed key) is an error naming both, since one's state would be lost on resume. ``rlforge_load_checkpoint`` gets
    every entry.

    Values must load with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, dicts. Each entry is
    checked when saved: one that would not load (a numpy array, an object) stops the run there, named, rather than
    leave checkpoints a resume cannot read.
    """


@hookspec
def rlforge_load_checkpoint(trainer: Any, checkpoint: dict[str, Any]) -> None:
    """A checkpoint was read on resume; restore extra state that ``rlforge_save_checkpoint`` added."""
