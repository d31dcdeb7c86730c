"""The optimal token baseline (OTB, arXiv:2602.07078): a per-token, per-group baseline weighted by path variance.

Import the estimators from :mod:`rlforge.algorithms.functional`; the algorithms that use them are in
:mod:`rlforge.algorithms.otb`. verl 0.9.1: ``compute_optimal_token_baseline_advantage`` and
``compute_multi_turn_optimal_token_baseline_advantage`` in ``verl/trainer/ppo/core_algos.py``. Formulas and the
differences: docs/algorithms/otb.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from rlforge.algorithms.estimators import group_index

OTB_EPS = 1e-8  # added to the baseline's denominator (verl)


def _returns_and_weights(
    rewards: torch.Tensor, mask: torch.Tensor, old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-to-go ``G_t`` and the cumulative path-variance proxy ``W_t = sum_{j<=t} m_j w_j``."""
    m = mask.to(rewards.dtype)
    returns = (rewards * m).flip(-1).cumsum(-1).flip(-1)
    w = 1.0 - 2.0 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.square()
    return returns, (w * m).cumsum(-1)


def _baseline(returns: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, index: torch.Tensor,
              handle_zero_tail: bool, epsilon: float) -> torch.Tensor:
    """``B_t = sum_g G_t W_t m_t / (sum_g W_t m_t + eps)`` per group and column; 0 for a singleton group; with
    ``handle_zero_tail`` 0 past the second-longest length on a group's unique longest row."""
    m = mask.to(returns.dtype)
    n = int(index.max()) + 1 if len(index) else 0
    idx = index.to(returns.device)
    num = torch.zeros((n, returns.shape[1]), dtype=returns.dtype, device=returns.device).index_add_(
        0, idx, returns * weights * m)
    den = torch.zeros_like(num).index_add_(0, idx, weights * m)
    baseline = (num / (den + epsilon))[idx]
    size = torch.zeros(n, dtype=torch.long).index_add_(0, index, torch.ones_like(index))[index]
    baseline = torch.where((size > 1).to(returns.device).unsqueeze(-1), baseline, 0.0)
    if handle_zero_tail:
        lengths = mask.bool().sum(-1).cpu()
        top = torch.full((n,), -1, dtype=torch.long).scatter_reduce(0, index, lengths, "amax")[index]
        at_top = lengths == top
        n_top = torch.zeros(n, dtype=torch.long).index_add_(0, index, at_top.long())[index]
        second = torch.full((n,), -1, dtype=torch.long).scatter_reduce(
            0, index, torch.where(at_top, -1, lengths), "amax")[index]
        rows = (size > 1) & at_top & (n_top == 1) & (second >= 0)  # a unique longest row (second < top then)
        cols = torch.arange(returns.shape[1])
        tail = rows.unsqueeze(-1) & (cols.unsqueeze(0) >= second.clamp(min=0).unsqueeze(-1))
        baseline = torch.where(tail.to(returns.device), 0.0, baseline)
    return baseline


def optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB: the reward-to-go minus a baseline per group and token position, weighted by each path's variance.

    ``G_t = sum_{s>=t} m_s r_s``; per token ``w_t = 1 - 2 pi_t + sum_v pi(v)^2`` (``pi_t = exp(old_log_probs)``, the
    sampled token's probability; ``sum_pi_squared`` from the actor's forward pass), times ``rollout_is_weights^2``
    when given; ``W_t = sum_{j<=t} m_j w_j``. Per group and column ``B_t = sum_i G_t W_t m_t / (sum_i W_t m_t +
    epsilon)``, 0 for a singleton group. ``handle_zero_tail``: in a group whose longest row is unique, that row's
    baseline is 0 from the second-longest length on (no other path estimates it). ``advantages = (G - B) m``,
    ``returns = G``. No gradient.
    """
    with torch.no_grad():
        index, _ = group_index(group_ids, token_level_rewards.shape[0])
        returns, weights = _returns_and_weights(token_level_rewards, mask, old_log_probs, sum_pi_squared,
                                                rollout_is_weights)
        baseline = _baseline(returns, weights, mask, index, handle_zero_tail, epsilon)
        advantages = (returns - baseline) * mask.to(returns.dtype)
    return advantages, returns


def tir_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn (tool-integrated) rollouts: the baseline over the model's own tokens, position by position.

    ``G`` and ``W`` as in :func:`optimal_token_baseline_advantage`, taken at each row's valid tokens and packed to
    the left (the k-th model token of every row is compared with the k-th of the others, whatever tool output lies
    between). Rows without a valid token take no part in their group. The baseline of the packed positions is
    unpacked to the valid tokens; ``advantages = (G - B) m``, ``returns = G`` (in the original layout). On a
    single-turn mask it equals :func:`optimal_token_baseline_advantage`.
    """
    with torch.no_grad():
        index, _ = group_index(group_ids, token_level_rewards.shape[0])
        returns, weights = _returns_and_weights(token_level_rewards, mask, old_log_probs, sum_pi_squared,
                                                rollout_is_weights)
        valid = mask.bool()
        lengths = valid.sum(-1)
        width = int(lengths.max()) if len(lengths) else 0
        packed_mask = torch.arange(width, device=mask.device).unsqueeze(0) < lengths.unsqueeze(-1)

        def pack(x: torch.Tensor) -> torch.Tensor:
            return x.new_zeros((x.shape[0], width)).masked_scatter(packed_mask, x[valid])

        # an empty row is a group of its own: it neither counts in its group's size nor in its lengths
        alone = torch.arange(len(index)) + int(index.max()) + 1 if len(index) else index
        index = torch.where(lengths.cpu() > 0, index, alone)
        baseline = _baseline(pack(returns), pack(weights), packed_mask, index, handle_zero_tail, epsilon)
        packed_adv = pack(returns) - baseline
        advantages = returns.new_zeros(returns.shape).masked_scatter(valid, packed_adv[packed_mask])
    return advantages, returns


__all__ = ["optimal_token_baseline_advantage", "tir_optimal_token_baseline_advantage"]
