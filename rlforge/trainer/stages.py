"""Implementations of the built-in dataflow stages: each is ``(trainer, batch) -> batch``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlforge import batch as B
from rlforge.dataflow import Stage
from rlforge.protocols import SamplingParams


def rollout(t: Any, batch: B.Batch) -> B.Batch:
    t.hook.rlforge_rollout_start(trainer=t, batch=batch)
    batch = t.controller.generate(batch, SamplingParams.from_config(t.config.rollout))
    t.module.on_rollout_end(batch)
    t.hook.rlforge_rollout_end(trainer=t, batch=batch)
    return batch


def reward(t: Any, batch: B.Batch) -> B.Batch:
    batch = t.controller.score(batch)
    batch[B.TOKEN_LEVEL_REWARDS] = batch[B.TOKEN_LEVEL_SCORES]
    shaped = t.hook.rlforge_shape_rewards(trainer=t, batch=batch)
    batch = shaped if shaped is not None else batch
    t.hook.rlforge_reward_end(trainer=t, batch=batch)
    return batch


def filter_groups(t: Any, batch: B.Batch) -> B.Batch:
    filtered = t.hook.rlforge_filter_groups(trainer=t, batch=batch)
    return filtered if filtered is not None else batch


def old_logprob(t: Any, batch: B.Batch) -> B.Batch:
    """Log-probs of the policy that generated: the engine's own when they match the actor's recomputation
    (``actor.reuse_rollout_log_probs``, default: when the engine says so), else a forward pass."""
    reuse = t.config.actor.reuse_rollout_log_probs
    if reuse is None:
        reuse = bool(getattr(t.controller, "logprobs_match_actor", False))
    if reuse:
        batch[B.OLD_LOG_PROBS] = batch[B.ROLLOUT_LOG_PROBS]
    else:
        batch[B.OLD_LOG_PROBS] = t.controller.compute_log_probs(batch, "actor")
    return batch


def ref_logprob(t: Any, batch: B.Batch) -> B.Batch:
    batch[B.REF_LOG_PROBS] = t.controller.compute_log_probs(batch, "ref")
    return batch


def values(t: Any, batch: B.Batch) -> B.Batch:
    batch[B.VALUES] = t.controller.compute_values(batch)
    return batch


def update_critic(t: Any, batch: B.Batch) -> B.Batch:
    t.step_metrics.update(t.controller.update_critic(batch))
    return batch


def advantage(t: Any, batch: B.Batch) -> B.Batch:
    batch = t.module.advantages(batch)
    t.hook.rlforge_advantage_end(trainer=t, batch=batch)
    return batch


def update_actor(t: Any, batch: B.Batch) -> B.Batch:
    if t.step <= t.config.trainer.critic_warmup:  # the critic learns first; the policy waits
        return batch
    t.hook.rlforge_update_start(trainer=t, batch=batch)
    metrics = t.controller.update_actor(batch)
    t.step_metrics.update(metrics)
    t.hook.rlforge_update_end(trainer=t, batch=batch, metrics=metrics)
    return batch


def sync_weights(t: Any, batch: B.Batch) -> B.Batch:
    seconds = t.controller.sync_weights()
    t.hook.rlforge_weight_sync_end(trainer=t, seconds=seconds)
    return batch


STAGE_IMPLS: dict[Stage, Callable[[Any, B.Batch], B.Batch]] = {
    Stage.ROLLOUT: rollout,
    Stage.REWARD: reward,
    Stage.FILTER: filter_groups,
    Stage.OLD_LOGPROB: old_logprob,
    Stage.REF_LOGPROB: ref_logprob,
    Stage.VALUES: values,
    Stage.ADVANTAGE: advantage,
    Stage.UPDATE_CRITIC: update_critic,
    Stage.UPDATE_ACTOR: update_actor,
    Stage.SYNC_WEIGHTS: sync_weights,
}
