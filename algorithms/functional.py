"""Pure tensor functions for advantages, policy losses, KL estimators and loss aggregation.

Semantics follow verl's definitions (see docs/algorithms/). Shapes: ``[B, R]`` = sequences x response
tokens; ``mask`` is the response mask (1 on valid tokens). No function here touches a model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Hashable

import torch

from rlforge.ops import masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs")
LOG_RATIO_CLAMP = 20.0


# --- advantages -----------------------------------------------------------------------------------


def grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each sequence's total reward, normalized within its group.

    ``A_i = (r_i - mean_g) / (std_g + epsilon)`` (``std`` unbiased) or ``r_i - mean_g`` without std
    normalization. A group of one sample gets mean 0 and std 1. The advantage is broadcast to every
    valid response token. Returns ``(advantages, returns)``, which are equal.
    """
    scores = token_level_rewards.sum(-1)
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    for rows in groups.values():
        if len(rows) > 1:
            s = scores[rows]
            mean[rows] = s.mean()
            std[rows] = s.std(unbiased=True)
    adv = scores - mean
    if norm_adv_by_std:
        adv = adv / (std + epsilon)
    adv = adv.unsqueeze(-1) * mask
    return adv, adv


# --- loss aggregation -----------------------------------------------------------------------------


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Aggregate a ``[B, R]`` loss matrix to a scalar.

    - ``token-mean``: sum over valid tokens / ``global_tokens``.
    - ``seq-mean-token-sum``: per-sequence token sum, then sum / ``global_seqs``.
    - ``seq-mean-token-mean``: per-sequence token mean, then sum / ``global_seqs``.
    - ``seq-mean-token-sum-norm``: per-sequence token sum / ``norm_length``, then sum / ``global_seqs``
      (Dr. GRPO; ``norm_length`` defaults to the padded response length ``R``).

    ``global_tokens``/``global_seqs`` are the counts over the whole mini-batch (all micro-batches and
    ranks); they default to this batch's own counts, which makes the result a plain mean. Passing the
    global counts makes the sum of micro-batch losses equal the mini-batch loss.
    """
    mask = mask.to(loss_mat.dtype)
    if global_tokens is None:
        global_tokens = float(mask.sum().clamp(min=1))
    if global_seqs is None:
        global_seqs = float(loss_mat.shape[0])
    if mode == "token-mean":
        return masked_sum(loss_mat, mask) / global_tokens
    seq_sum = masked_sum(loss_mat, mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return seq_sum.sum() / global_seqs
    if mode == "seq-mean-token-mean":
        return (seq_sum / mask.sum(-1).clamp(min=1)).sum() / global_seqs
    if mode == "seq-mean-token-sum-norm":
        length = float(norm_length or loss_mat.shape[-1])
        return (seq_sum / length).sum() / global_seqs
    raise ValueError(f"Unknown loss_agg_mode '{mode}'. Allowed: {', '.join(LOSS_AGG_MODES)}.")


# --- policy loss ----------------------------------------------------------------------------------


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token, with dual-clip where the advantage is negative.

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``L = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))``, and where ``A < 0`` additionally
    ``L = min(L, -A * clip_ratio_c)``. Returns the ``[B, R]`` loss matrix (to be aggregated with
    :func:`agg_loss`) and ``[B, R]`` indicator matrices for metrics: ``clipped``, ``clipped_lower``,
    ``neg_log_ratio`` (the per-token approximate KL ``old - new``).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for dual-clip, got {clip_ratio_c}")
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    loss = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)
    stats = {
        "clipped": (loss_clipped > loss_unclipped).float(),
        "clipped_lower": ((loss_ppo > loss_dual) & negative).float(),
        "neg_log_ratio": -log_ratio,
    }
    return loss * mask, stats


# --- KL -------------------------------------------------------------------------------------------


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(policy || ref) estimate from sampled-token log-probs.

    ``k1``/``kl``: ``logp - ref``; ``abs``: ``|logp - ref|``; ``k2``/``mse``: ``0.5 (logp - ref)^2``;
    ``k3``/``low_var_kl``: ``exp(ref - logp) - (ref - logp) - 1`` with the log-ratio clamped to +-20 and
    the result to +-10. A trailing ``+`` (e.g. ``k3+``) keeps the estimator's value but takes the
    gradient of ``k2`` (straight-through), which is an unbiased KL gradient.
    """
    if estimator.endswith("+"):
        value = kl_penalty(log_prob, ref_log_prob, estimator[:-1])
        grad = kl_penalty(log_prob, ref_log_prob, "k2")
        return grad - grad.detach() + value.detach()
    diff = log_prob - ref_log_prob
    if estimator in ("k1", "kl"):
        return diff
    if estimator == "abs":
        return diff.abs()
    if estimator in ("k2", "mse"):
        return 0.5 * diff.square()
    if estimator in ("k3", "low_var_kl"):
        kl = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (kl.exp() - kl - 1).clamp(-10.0, 10.0)
    allowed = ", ".join(KL_ESTIMATORS + tuple(e + "+" for e in KL_ESTIMATORS))
    raise ValueError(f"Unknown KL estimator '{estimator}'. Allowed: {allowed}.")


__all__ = [
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "grpo_outcome_advantage", "agg_loss", "clipped_policy_loss",
    "kl_penalty",
]
