"""DAPO's batch shaping as hooks, usable by any algorithm whose config turns them on.

- ``algorithm.overlong_buffer > 0``: soft overlong punishment added to the last token's reward.
- ``algorithm.filter_groups``: dynamic sampling. Groups whose rewards all agree carry no gradient signal;
  they are dropped and more prompts are generated until ``data.train_batch_size`` groups are kept, for at
  most ``algorithm.max_gen_batches`` generation rounds (then the step trains on what it has).
"""

from __future__ import annotations

from typing import Any

import torch

from rlforge import batch as B
from rlforge.hookspecs import hookimpl

from rlforge.algorithms import functional as F


@hookimpl
def rlforge_shape_rewards(trainer: Any, batch: B.Batch) -> B.Batch | None:
    alg = trainer.config.algorithm
    if not alg.get("overlong_buffer", 0):
        return None
    mask = batch[B.RESPONSE_MASK]
    lengths = mask.sum(-1)
    penalty = F.overlong_penalty(lengths, trainer.config.rollout.max_new_tokens, alg.overlong_buffer,
                                 alg.overlong_penalty)
    rewards = batch[B.TOKEN_LEVEL_REWARDS].clone()
    rewards[torch.arange(len(batch)), (lengths - 1).clamp(min=0)] += penalty.to(rewards.dtype)
    batch[B.TOKEN_LEVEL_REWARDS] = rewards
    batch.meta.setdefault("metrics", {})["critic/overlong_penalty/mean"] = float(penalty.float().mean())
    return batch


def _keep_informative(batch: B.Batch) -> B.Batch:
    return batch.select(F.uniform_group_mask(batch[B.TOKEN_LEVEL_REWARDS].sum(-1), batch[B.UID]))


@hookimpl
def rlforge_filter_groups(trainer: Any, batch: B.Batch) -> B.Batch | None:
    alg = trainer.config.algorithm
    if not alg.get("filter_groups", False):
        return None
    target = trainer.config.data.train_batch_size
    kept, rounds = _keep_informative(batch), 1
    while len(set(kept[B.UID])) < target and rounds < alg.max_gen_batches:
        kept = B.Batch.concat([kept, _keep_informative(trainer.generate_and_score())])
        rounds += 1
    groups = list(dict.fromkeys(kept[B.UID]))
    metrics = {"train/gen_batches": float(rounds), "train/kept_groups": float(min(len(groups), target))}
    if not groups:  # nothing informative: train on the original batch (its advantages are all zero)
        batch.meta.setdefault("metrics", {}).update(metrics)
        return batch
    if len(groups) > target:
        keep = set(groups[:target])
        kept = kept.select([i for i, u in enumerate(kept[B.UID]) if u in keep])
    kept.meta = {**batch.meta, "metrics": {**batch.meta.get("metrics", {}), **metrics}}
    return kept
