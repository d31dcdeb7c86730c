"""DAPO's batch shaping, usable by any algorithm whose config turns it on.

- ``algorithm.overlong_buffer > 0``: soft overlong punishment added to the last token's reward (a wrapper of the
  ``rlforge_shape_rewards`` hook: plugins that shape rewards shape the penalized rewards).
- ``algorithm.mask_truncated``: overlong filtering, the stage :class:`MaskTruncated` in place of the actor's update
  (the policy-gradient algorithms put it there): responses cut off before a stop token train none of their tokens.
- ``algorithm.filter_groups``: dynamic sampling, the stage :class:`DynamicSampling` (the policy-gradient
  algorithms insert it after the reward stage). Groups whose rewards all agree carry no gradient signal;
  they are dropped and more prompts go through the stages before it (rollout, reward, ...) until
  ``data.train_batch_size`` groups are kept, for at most ``algorithm.max_gen_batches`` generation rounds
  (then the step trains on what it has). Any flow can include it. ``algorithm.filter_metric`` names the value
  that must vary within a group (:data:`FILTER_METRICS`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.agent.types import TOKEN_LIMIT
from rlforge.dataflow import Stage, StepContext, UpdateActorStage
from rlforge.errors import RLForgeError
from rlforge.evaluation import FAULT_METRICS
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.microbatch import groups_splitting_evenly
from rlforge.models import model_stop_ids

if TYPE_CHECKING:
    import torch
    from rlforge.algorithms import functional as F
else:
    torch = lazy_import("torch")
    F = lazy_import("rlforge.algorithms.functional")


@hookimpl(wrapper=True)
def rlforge_shape_rewards(trainer: Any, batch: B.Batch) -> Generator[None, B.Batch | None, B.Batch | None]:
    """The overlong penalty as part of the reward, whatever other ``rlforge_shape_rewards`` implementations do: a
    wrapper around them (not one of their first-result chain, where a plugin's result would replace it), it adds the
    penalty to the batch they are given and keeps it in the result."""
    if not trainer.config.algorithm.get("overlong_buffer", 0):
        return (yield)
    _add_overlong_penalty(trainer, batch)
    shaped = yield
    if shaped is None:
        return batch
    if shaped is not batch:  # a new batch: keep the penalty's metrics with it
        shaped.meta.setdefault("metrics", {}).update(batch.meta.get("metrics", {}))
    return shaped


def _add_overlong_penalty(trainer: Any, batch: B.Batch) -> None:
    alg = trainer.config.algorithm
    mask = batch[B.RESPONSE_MASK]
    lengths = mask.sum(-1)
    penalty = F.overlong_penalty(lengths, trainer.config.rollout.max_new_tokens, alg.overlong_buffer,
                                 alg.overlong_penalty)
    rewards = batch[B.TOKEN_LEVEL_REWARDS].clone()
    rewards[torch.arange(len(batch)), (lengths - 1).clamp(min=0)] += penalty.to(rewards.dtype)
    batch[B.TOKEN_LEVEL_REWARDS] = rewards
    if alg.get("overlong_log", True):
        batch.meta.setdefault("metrics", {}).update({
            "critic/overlong_penalty/mean": float(penalty.float().mean()),
            "critic/overlong/ratio": float((penalty < 0).float().mean()),
        })


# algorithm.filter_metric -> the per-sample value whose spread within a group keeps the group (verl's
# filter_groups.metric: seq_reward / seq_final_reward without KL in the reward, score, acc)
FILTER_METRICS = {
    "reward": lambda batch: batch[B.TOKEN_LEVEL_REWARDS].sum(-1),  # the sequence reward, overlong shaping included
    "score": lambda batch: batch[B.SCORES],  # the reward function's score, before any shaping
    "acc": lambda batch: _verl_acc(batch),
}


def _verl_acc(batch: B.Batch) -> torch.Tensor:
    """verl's ``acc`` of each sample, as its DAPO filter reads it from the reward's extra info: the function's own, or
    its score where it returned a number (the rule manager records both in ``B.REWARD_EXTRA_INFO``); where not every
    sample has one (another manager), ``B.ACC``."""
    values = [row.get("acc") for row in batch.lists.get(B.REWARD_EXTRA_INFO) or [{}]]
    return torch.tensor(values) if all(isinstance(v, float) for v in values) else batch[B.ACC]


def _keep_informative(batch: B.Batch, metric: str) -> B.Batch:
    if metric == "acc" and B.ACC not in batch:
        raise RLForgeError("algorithm.filter_metric=acc: the reward manager gives no accuracy (acc column) for "
                           "these responses; filter on reward or score.")
    return batch.select(F.uniform_group_mask(FILTER_METRICS[metric](batch), batch[B.UID]))


class DynamicSampling(Stage):
    """DAPO's dynamic sampling: keep only groups whose rewards differ, refilling from new prompts."""

    name = "dynamic_sampling"
    requires = frozenset({B.TOKEN_LEVEL_REWARDS, B.UID})
    uses_engine = True  # refills through ctx.regenerate

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        alg = ctx.config.algorithm
        target, most, metric = ctx.config.data.train_batch_size, alg.max_gen_batches, alg.filter_metric
        kept, rounds, generated = _keep_informative(batch, metric), 1, len(batch)
        while len(set(kept[B.UID])) < target and rounds < most:
            step_metrics, ctx.metrics = ctx.metrics, {}  # what the round's stages log, merged below
            try:
                more = ctx.regenerate(before=self)
            finally:
                step_metrics, ctx.metrics = ctx.metrics, step_metrics
            merge_round_metrics(ctx.metrics, step_metrics, generated, len(more))
            kept, rounds, generated = B.Batch.concat([kept, _keep_informative(more, metric)]), rounds + 1, \
                generated + len(more)
        # at most the target; fewer (the rounds ran out) as many as split evenly over the data-parallel ranks
        groups = groups_splitting_evenly(kept[B.UID], list(dict.fromkeys(kept[B.UID]))[:target],
                                         ctx.data_parallel_size)
        ctx.log({"train/gen_batches": float(rounds), "train/kept_groups": float(len(groups))})
        if not groups:  # nothing informative: train on the original batch (its advantages are all zero)
            return batch
        keep = set(groups)
        return kept.select([i for i, u in enumerate(kept[B.UID]) if u in keep])


SUMMED_METRICS = (*FAULT_METRICS, "agent/engine_calls")  # counts: a step's are the sum over its generation rounds


def merge_round_metrics(metrics: dict[str, float], logged: dict[str, float], rows: int, more: int) -> None:
    """Into the step's ``metrics`` (those of the ``rows`` generated so far), what the stages before dynamic sampling
    ``logged`` for a generation round of ``more`` rows, so that they describe every row generated in the step: seconds
    (``timing_s/*``) and counts (:data:`SUMMED_METRICS`) summed, a ``.../max`` or ``.../min`` the extreme, any other
    value the mean weighted by rows. A key the step had not logged yet is taken as it is."""
    for key, new in logged.items():
        old = metrics.get(key)
        if old is None:
            metrics[key] = new
        elif key.startswith("timing_s/") or key in SUMMED_METRICS:
            metrics[key] = old + new
        elif key.endswith("/max"):
            metrics[key] = max(old, new)
        elif key.endswith("/min"):
            metrics[key] = min(old, new)
        else:
            metrics[key] = (old * rows + new * more) / (rows + more)


class MaskTruncated(UpdateActorStage):
    """DAPO's overlong filtering (TRL's ``mask_truncated_completions``): the actor's update with the response mask
    zeroed on the rows that were cut off (:func:`~rlforge.algorithms.functional.truncated_rows`: the last generated
    token is not a stop token; or an agent trajectory the token budget ended, ``stop_reason`` max_tokens), so they add
    nothing to the policy loss, its KL and entropy terms or the token count of ``actor.loss_agg_mode``. Their rewards
    still count in their groups' advantages; the critic, the data metrics and the stages after the update see the
    whole batch, the update's hooks and its own metrics the masked one. Logs ``actor/truncated_masked_ratio``, the
    share of rows masked, on the steps the actor updates."""

    requires = UpdateActorStage.requires | {B.RESPONSES}

    def __init__(self) -> None:
        self._stop_ids: list[int] | None = None

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        if ctx.step <= ctx.config.trainer.critic_warmup:  # no update this step (the critic learns first)
            return batch
        if self._stop_ids is None:
            self._stop_ids = sorted(model_stop_ids(ctx.config, ctx.module.tokenizer))
        mask = batch[B.RESPONSE_MASK]
        cut = F.truncated_rows(batch[B.RESPONSES], mask, self._stop_ids)
        if B.STOP_REASON in batch:  # agent trajectories the token budget ended between turns
            cut |= torch.tensor([reason == TOKEN_LIMIT for reason in batch[B.STOP_REASON]], dtype=torch.bool)
        ctx.log({"actor/truncated_masked_ratio": float(cut.float().mean())})
        trained = batch.copy()
        trained[B.RESPONSE_MASK] = mask * (~cut).unsqueeze(-1).to(mask.dtype)
        super().run(ctx, trained)
        return batch
