"""PRIME's math (Cui et al., "Process Reinforcement through Implicit Rewards", arXiv:2502.01456; verl-recipe
``prime/``): implicit process rewards from a causal-LM reward model, its outcome-label loss, the per-source RLOO
advantage and the accuracy-band prompt filter. Pure tensor functions; ``docs/algorithms/prime.md`` has the formulas.

Shapes: ``[B, R]`` per response token with ``mask`` 1 on the response's tokens, ``[B]`` per sequence; ``group_ids``
name each row's prompt (the ``uid`` column).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch

    from rlforge.algorithms import estimators as E
else:
    torch = lazy_import("torch")
    E = lazy_import("rlforge.algorithms.estimators")


def _lengths(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(-1).long()


def implicit_process_rewards(q: torch.Tensor, mask: torch.Tensor, beta: float, lam: float = 0.0,
                             acc: torch.Tensor | None = None) -> torch.Tensor:
    """Token rewards of the implicit PRM from ``q = log pi_psi - log pi_ref`` per response token.

    ``lam = 0``: ``r_t = beta * q_t``. ``lam > 0``: ``r_t = sum_{k >= t} lam^(k-t) beta q_k``, and with ``acc``
    (verl's ``prime_use_gt``) the last token's term is ``acc - sum_{k < L-1} beta q_k`` first. Either way the last
    response token gets 0 and padding 0 (verl's ``prime_granularity=token``: rewards on ``t < L-1``)."""
    lengths = _lengths(mask)
    steps = q.new_zeros(q.shape)
    steps[mask.bool()] = (beta * q)[mask.bool()]
    rows = torch.arange(len(q))
    last = (lengths - 1).clamp(min=0)
    if lam and acc is not None:
        before_last = steps.sum(-1) - steps[rows, last]
        steps[rows, last] = torch.where(lengths > 0, acc.to(steps.dtype) - before_last, steps[rows, last])
    rewards = steps
    if lam:
        rewards = torch.zeros_like(steps)
        running = steps.new_zeros(len(steps))
        for t in reversed(range(steps.shape[1])):
            running = steps[:, t] + lam * running
            rewards[:, t] = running
    keep = torch.arange(q.shape[1]).unsqueeze(0) < (lengths - 1).unsqueeze(1)
    return rewards * keep


def batch_norm(rewards: torch.Tensor) -> torch.Tensor:
    """verl's ``prime_norm=batch_norm``: divide by the largest ``|sum_{k >= t} r_k|`` over the batch (plus 1e-6), so
    no return-to-go exceeds 1 in magnitude."""
    reverse = rewards.flip(-1).cumsum(-1).flip(-1)
    return rewards / (reverse.abs().max() + 1e-6)


def outcome_bce(q: torch.Tensor, acc: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-sequence cross-entropy of the PRM's outcome prediction ``sigmoid(beta * sum_t q_t)`` against ``acc``
    (verl's ``loss_type=ce``; its mean over the rows is verl's loss) [B]."""
    logits = beta * (q * mask).sum(-1)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, acc.to(logits.dtype), reduction="none")


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Each group id's rows, in first-seen order."""
    groups: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    return groups


def masked_rloo(rewards: torch.Tensor, mask: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """verl-recipe PRIME's RLOO of one reward source: within each group of ``n`` samples, with ``m_j`` the mean of
    sample ``j``'s rewards over its ``mask`` positions, ``r~_{i,t} = n/(n-1) r_{i,t} - sum_j m_j / (n-1)`` at the
    masked positions, 0 elsewhere. A group of one sample gets 0 (no baseline)."""
    keep = mask.bool()
    out = torch.zeros_like(rewards)
    for rows in _groups(group_ids).values():
        n = len(rows)
        if n < 2:
            continue
        sub, sub_keep = rewards[rows], keep[rows]
        counts = sub_keep.sum(-1).clamp(min=1)
        means = (sub * sub_keep).sum(-1) / counts
        out[rows] = torch.where(sub_keep, sub * n / (n - 1) - means.sum() / (n - 1), 0.0)
    return out


def prime_advantages(process_rewards: torch.Tensor | None, acc: torch.Tensor | None, mask: torch.Tensor,
                     group_ids: Sequence[Hashable], dpo_coef: float = 5.0, gt_coef: float = 5.0,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """verl-recipe PRIME's ``compute_rloo_advantage_return``: RLOO of the process rewards (over the response mask)
    times ``dpo_coef`` plus RLOO of the outcome ``acc`` (on each response's last token) times ``gt_coef``; returns
    are the reverse cumulative sums (gamma 1), advantages the returns whitened over the response tokens, 0 at padding
    (verl's function leaves whitened values there, which its loss masks). A source that is None or has a zero
    coefficient is left out. Returns ``(advantages, returns)``."""
    mask_f = mask.to(torch.float32)
    total = torch.zeros(mask.shape, dtype=torch.float32)
    if process_rewards is not None and dpo_coef:
        total = total + dpo_coef * masked_rloo(process_rewards.float(), mask, group_ids)
    if acc is not None and gt_coef:
        last = torch.zeros(mask.shape, dtype=torch.bool)
        lengths = _lengths(mask)
        has = lengths > 0
        last[torch.arange(len(mask))[has], lengths[has] - 1] = True
        outcome = torch.zeros(mask.shape, dtype=torch.float32)
        outcome[last] = acc.float()[has]
        total = total + gt_coef * masked_rloo(outcome, last, group_ids)
    returns = (total * mask_f).flip(-1).cumsum(-1).flip(-1)
    return E.masked_whiten(returns, mask_f) * mask_f, returns


def pairwise_accuracy(sequence_scores: torch.Tensor, acc: torch.Tensor, group_ids: Sequence[Hashable]) -> float:
    """verl-recipe PRIME's ``compute_dpo_accuracy``: within each group, over the pairs of samples, the share (weighted
    by ``|acc_i - acc_j|``) where the PRM orders the pair as ``acc`` does (score difference > 0 where acc's is);
    0.5 for a group whose ``acc`` are all equal; the mean over the groups. 0.5 is chance."""
    per_group = []
    for rows in _groups(group_ids).values():
        s, a = sequence_scores[rows].float(), acc[rows].float()
        upper = torch.triu(torch.ones(len(rows), len(rows), dtype=torch.bool), diagonal=1)
        ds, da = (s.unsqueeze(1) - s.unsqueeze(0))[upper], (a.unsqueeze(1) - a.unsqueeze(0))[upper]
        weight = da.abs().sum()
        per_group.append(0.5 if weight == 0 else float((((ds > 0) == (da > 0)).float() * da.abs()).sum() / weight))
    return sum(per_group) / max(len(per_group), 1)


def band_passes(acc: torch.Tensor, group_ids: Sequence[Hashable], lower: float, upper: float,
                too_long: torch.Tensor | None = None) -> dict[Hashable, bool]:
    """Per prompt (group id): whether its samples' mean ``acc`` is within ``[lower, upper]`` and (``too_long`` given:
    per row, whether a response reached the length limit) none of its responses is truncated."""
    return {g: lower <= float(acc[rows].float().mean()) <= upper
            and not (too_long is not None and bool(too_long[rows].any())) for g, rows in _groups(group_ids).items()}


def accuracy_band(acc: torch.Tensor, group_ids: Sequence[Hashable], keep_groups: int, lower: float, upper: float,
                  too_long: torch.Tensor | None = None) -> list[int]:
    """verl-recipe PRIME's ``filter_and_downsample``: prompts sorted by whether they pass (:func:`band_passes`),
    passing first, stably, and the first ``keep_groups`` kept. Returns the kept rows (passing prompts first)."""
    passes, rows = band_passes(acc, group_ids, lower, upper, too_long), _groups(group_ids)
    order = sorted(rows, key=lambda g: not passes[g])  # sorted() is stable: the batch's order within each kind
    return [i for g in order[:keep_groups] for i in rows[g]]
