"""Advantage estimators: pure tensor functions from rewards (and values) to ``(advantages, returns)``.

Import them from :mod:`rlforge.algorithms.functional`, the public entry point. Shapes: ``[B, R]`` =
sequences x response tokens; ``mask`` is the response mask (1 on valid tokens, 0 elsewhere);
``group_ids`` holds one hashable per sequence (same prompt => same id). Every estimator returns
tensors with zeros on masked positions and carries no gradient. Formulas, the verl counterparts and
edge cases: docs/algorithms/formulas.md.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch

WHITEN_EPS = 1e-8  # added to the variance before the reciprocal square root


# --- helpers --------------------------------------------------------------------------------------


def _where(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` on valid positions, exactly 0 elsewhere (also when ``x`` is inf/nan there)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def group_index(group_ids: Sequence[Hashable], batch_size: int) -> tuple[torch.Tensor, int]:
    """Map group ids to ``0..G-1`` in order of first appearance: ``(index [B] long, G)`` on the CPU."""
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.tolist()  # iterating a tensor yields 0-d tensors, which hash by identity
    ids = list(group_ids)
    if len(ids) != batch_size:
        raise ValueError(f"group_ids has {len(ids)} entries but the batch has {batch_size} sequences.")
    first: dict[Hashable, int] = {}
    index = [first.setdefault(g, len(first)) for g in ids]
    return torch.tensor(index, dtype=torch.long), len(first)


class _Groups:
    """Per-row group statistics of a score vector, computed in float64 on the CPU.

    float64 keeps a group of identical scores exactly identical to its mean (so its std is exactly 0),
    and the ``[B]`` vectors are tiny, so the host round trip costs one sync per step.
    """

    def __init__(self, scores: torch.Tensor, group_ids: Sequence[Hashable]) -> None:
        self.scores = scores.detach().to("cpu", torch.float64)
        self.index, n = group_index(group_ids, scores.shape[0])
        self.count = torch.zeros(n, dtype=torch.float64).index_add_(0, self.index, torch.ones_like(self.scores))
        self.size = self.count[self.index]  # [B]: size of each row's group

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row sum of ``x`` ([B], float64) over the row's group."""
        return torch.zeros_like(self.count).index_add_(0, self.index, x)[self.index]

    def mean(self) -> torch.Tensor:
        return self.sum(self.scores) / self.size

    def std(self) -> torch.Tensor:
        """Unbiased (n - 1) standard deviation of the row's group; 0 for a singleton."""
        dev = self.scores - self.mean()
        return (self.sum(dev.square()) / (self.size - 1).clamp(min=1)).sqrt()

    def singleton(self) -> torch.Tensor:
        return self.size == 1


def _outcome(adv: torch.Tensor, like: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast a per-sequence float64 advantage to the valid tokens; returns ``(adv, adv)``."""
    out = _where(mask, adv.to(device=like.device, dtype=like.dtype).unsqueeze(-1).expand_as(like))
    return out, out


# --- whitening ------------------------------------------------------------------------------------


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the positions where ``mask`` is 1 (a 0-d tensor).

    ``unbiased`` applies Bessel's correction ``n / (n - 1)`` with ``n`` the number of valid positions.
    Raises ``ValueError`` for an empty mask, and for a single valid position when ``unbiased``.
    """
    n = mask.bool().sum()
    if n.item() == 0:
        raise ValueError("masked_var: the mask has no valid position; the variance is undefined.")
    mean = _where(mask, values).sum() / n
    var = _where(mask, (values - mean).square()).sum() / n
    if unbiased:
        if n.item() == 1:
            raise ValueError("masked_var: unbiased variance needs at least 2 valid positions, the mask has 1.")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Standardize ``values`` with the mean and unbiased variance of its valid positions.

    ``(x - mean) * rsqrt(var + 1e-8)``; with ``shift_mean=False`` the mean is added back (only the
    spread changes). Every position is transformed, masked ones included; callers zero them.
    """
    n = mask.bool().sum().clamp(min=1)
    mean = _where(mask, values).sum() / n
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


# --- outcome (one score per sequence) estimators ---------------------------------------------------


def grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
    std_scope: str = "group",
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each sequence's total reward, normalized within its group.

    ``A_i = (r_i - mean_g) / (std_g + epsilon)`` (``std`` unbiased) or ``r_i - mean_g`` without std
    normalization (Dr. GRPO). A group of one sample gets mean 0 and std 1. ``std_scope="batch"`` divides by the
    unbiased std of every sequence reward of the batch instead of the group's (one number; 1 for a batch of one
    sequence): TRL's ``scale_rewards="batch"``. The advantage is broadcast to every valid response token. Returns
    ``(advantages, returns)``, which are equal.
    """
    adv = _group_normalized(token_level_rewards.sum(-1), group_ids, norm_adv_by_std, epsilon, std_scope)
    return _outcome(adv, token_level_rewards, mask)


def _group_normalized(scores: torch.Tensor, group_ids: Sequence[Hashable], norm_adv_by_std: bool,
                      epsilon: float, std_scope: str = "group") -> torch.Tensor:
    """GRPO's ``(r - mean_g) / (std_g + epsilon)`` per sequence ([B], float64 on the CPU; singleton: mean 0, std 1);
    ``std_scope="batch"``: the batch's std for every sequence."""
    g = _Groups(scores, group_ids)
    single = g.singleton()
    adv = g.scores - torch.where(single, 0.0, g.mean())
    if norm_adv_by_std:
        if std_scope not in ("group", "batch"):
            raise ValueError(f"std_scope must be 'group' or 'batch', not {std_scope!r}.")
        std = (torch.where(single, 1.0, g.std()) if std_scope == "group" else
               g.scores.std() if len(g.scores) > 1 else torch.ones((), dtype=g.scores.dtype))
        adv = adv / (std + epsilon)
    return adv


def gdpo_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    components: torch.Tensor | Sequence[torch.Tensor] | None = None,
    weights: Sequence[float] | None = None,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): GRPO-normalize each reward component separately, sum them, whiten over the batch.

    ``components``: K score vectors ``[B]`` (a ``[K, B]`` tensor or a list), e.g. a format and a correctness reward;
    None = one component, the sequence's total reward. ``A = masked_whiten(sum_k w_k * grpo_k)`` over the valid
    tokens, where ``grpo_k`` is component ``k``'s :func:`grpo_outcome_advantage` (broadcast to the tokens) and ``w``
    = ``weights`` (default 1 each). A component that varies little within groups therefore counts as much as one
    that varies a lot. Returns ``(advantages, returns)``, which are equal.
    """
    scores = [token_level_rewards.sum(-1)] if components is None else list(components)
    w = [1.0] * len(scores) if weights is None else [float(x) for x in weights]
    if len(w) != len(scores) or not scores:
        raise ValueError(f"gdpo_advantage: {len(scores)} reward components but {len(w)} weights.")
    total = sum(wk * _group_normalized(torch.as_tensor(sk), group_ids, norm_adv_by_std, epsilon)
                for wk, sk in zip(w, scores))
    per_token, _ = _outcome(total, token_level_rewards, mask)
    adv = _where(mask, masked_whiten(per_token, mask))
    return adv, adv


def grpo_passk_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO for pass@k (arXiv:2503.19595): only the best sample of each group gets an advantage.

    ``A_best = r_max - r_second_max`` of the group, divided by ``std_g + epsilon`` (unbiased std) when
    ``norm_adv_by_std``; every other sample gets 0. Among tied best samples the first in batch order is
    "best" (its advantage is then 0 anyway). Every group needs >= 2 samples (``ValueError`` otherwise).
    Returns ``(advantages, returns)``, which are equal.
    """
    g = _Groups(token_level_rewards.sum(-1), group_ids)
    if bool(g.singleton().any()):
        row = int(g.singleton().nonzero()[0])
        raise ValueError(f"grpo_passk_advantage: pass@k needs >= 2 samples per group; row {row} is alone in its "
                         "group (set rollout.n >= 2).")
    rows = torch.arange(len(g.scores))
    n = len(g.count)
    top = torch.full((n,), float("-inf"), dtype=torch.float64).scatter_reduce(0, g.index, g.scores, "amax")
    is_top = g.scores == top[g.index]
    first = torch.full((n,), len(rows)).scatter_reduce(0, g.index[is_top], rows[is_top], "amin")
    best = rows == first[g.index]
    others = torch.where(best, float("-inf"), g.scores)
    second = torch.full((n,), float("-inf"), dtype=torch.float64).scatter_reduce(0, g.index, others, "amax")
    adv = torch.where(best, g.scores - second[g.index], 0.0)
    if norm_adv_by_std:
        adv = adv / (g.std() + epsilon)
    return _outcome(adv, token_level_rewards, mask)


def rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: the reward minus the mean reward of the *other* samples of the group.

    ``A_i = r_i - (sum_g - r_i) / (n - 1) = n / (n - 1) * (r_i - mean_g)`` for a group of ``n >= 2``;
    a singleton keeps its raw reward (baseline 0). ``epsilon`` is accepted for a uniform signature and
    unused. Returns ``(advantages, returns)``, which are equal.
    """
    del epsilon
    g = _Groups(token_level_rewards.sum(-1), group_ids)
    n = g.size
    adv = torch.where(g.singleton(), g.scores, (g.scores - g.mean()) * n / (n - 1).clamp(min=1))
    return _outcome(adv, token_level_rewards, mask)


def opo_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: the reward minus the length-weighted group mean ``sum_j L_j r_j / sum_j L_j``.

    ``L_j`` is the number of valid tokens of sequence ``j``. A singleton, or a group whose sequences
    are all empty, has baseline 0. ``epsilon`` is unused. Returns ``(advantages, returns)``, equal.
    """
    del epsilon
    g = _Groups(token_level_rewards.sum(-1), group_ids)
    lengths = mask.detach().bool().sum(-1).to("cpu", torch.float64)
    total = g.sum(lengths)
    baseline = g.sum(lengths * g.scores) / total.clamp(min=1)
    adv = g.scores - torch.where(g.singleton(), 0.0, baseline)
    return _outcome(adv, token_level_rewards, mask)


def gpg_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    f_norm: float = 1.0,
    alpha: float = 1.0,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: the group-mean-centred reward, rescaled by ``B / M`` and divided by ``f_norm``.

    ``A_i = alpha * (B / max(M, 1)) * (r_i - mean_g) / f_norm`` with ``B`` the batch size and ``M`` the
    number of sequences whose total reward is non-zero. A singleton has mean 0. ``alpha`` is an extra
    factor (1.0 reproduces verl, whose own ``alpha`` argument is overwritten by ``B / M``); ``epsilon``
    is unused. Returns ``(advantages, returns)``, which are equal.
    """
    del epsilon
    if f_norm == 0:
        raise ValueError("gpg_advantage: f_norm must be non-zero.")
    g = _Groups(token_level_rewards.sum(-1), group_ids)
    scale = len(g.scores) / max(int(torch.count_nonzero(g.scores)), 1)
    adv = alpha * scale * (g.scores - torch.where(g.singleton(), 0.0, g.mean())) / f_norm
    return _outcome(adv, token_level_rewards, mask)


def reinforce_pp_baseline_advantage(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[Hashable],
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: ``r_i - mean_g`` per token, then whitened over the batch.

    The centred score (singleton: mean 0) is broadcast to the valid tokens and whitened with the
    mean/unbiased variance over all valid tokens of the batch (:func:`masked_whiten`), so longer
    sequences weigh more in the statistics. ``epsilon`` is unused (whitening adds 1e-8 to the variance).
    Returns ``(advantages, returns)``, which are equal.
    """
    del epsilon
    g = _Groups(token_level_rewards.sum(-1), group_ids)
    centred = g.scores - torch.where(g.singleton(), 0.0, g.mean())
    per_token, _ = _outcome(centred, token_level_rewards, mask)
    adv = _where(mask, masked_whiten(per_token, mask))
    return adv, adv


# --- SPPO's sequence targets -----------------------------------------------------------------------


def softmean(x: torch.Tensor, beta: float) -> torch.Tensor:
    """``(1 / beta) log((1 / n) sum_j exp(beta x_j))`` over the last dimension (0-d for a vector); the plain mean at
    ``beta = 0`` (its limit). Between the mean (beta -> 0) and the max (beta -> inf)."""
    if beta == 0:
        return x.mean(-1)
    return (torch.logsumexp(beta * x, dim=-1) - math.log(x.shape[-1])) / beta


def sppo_softmean_advantage(
    token_level_rewards: torch.Tensor, mask: torch.Tensor, beta: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPPO as verl's recipe runs it: ``A_i = r_i - softmean_beta(r)``, the soft mean over the **whole batch**
    (no groups), broadcast to the valid tokens. Returns ``(advantages, returns)``, which are equal."""
    scores = token_level_rewards.detach().sum(-1).double()
    return _outcome(scores - softmean(scores, beta), token_level_rewards, mask)


def sppo_win_rate_advantage(
    token_level_rewards: torch.Tensor, mask: torch.Tensor, group_ids: Sequence[Hashable]
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPPO as the paper defines its target: ``A_i = P_i - 1/2`` with ``P_i`` the win rate of response ``i`` against
    the other responses to the same prompt, ``(#{j: r_i > r_j} + #{j != i: r_i = r_j} / 2) / (n - 1)``; a singleton
    gets 0. Broadcast to the valid tokens. Returns ``(advantages, returns)``, which are equal."""
    g = _Groups(token_level_rewards.sum(-1), group_ids)
    wins = torch.zeros_like(g.scores)
    for group in range(len(g.count)):
        rows = (g.index == group).nonzero().squeeze(-1)
        s = g.scores[rows]
        diff = s.unsqueeze(-1) - s.unsqueeze(0)  # [n, n]: r_i - r_j
        wins[rows] = (diff > 0).double().sum(-1) + 0.5 * ((diff == 0).double().sum(-1) - 1)
    adv = torch.where(g.singleton(), 0.0, wins / (g.size - 1).clamp(min=1) - 0.5)
    return _outcome(adv, token_level_rewards, mask)


# --- token-level estimators -----------------------------------------------------------------------


def _gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
         lam: float | torch.Tensor) -> torch.Tensor:
    """The raw GAE advantages ``[B, R]`` (see :func:`gae_advantage`); ``lam`` a number or one per row ``[B]``."""
    valid = mask.bool()
    lam = torch.as_tensor(lam, dtype=rewards.dtype, device=rewards.device)
    zero = torch.zeros_like(rewards[:, 0])
    next_value, last_adv = zero, zero
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * last_adv
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        last_adv = torch.where(valid[:, t], step, last_adv)
        adv[:, t] = last_adv
    return adv


def gae_advantage(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over the response tokens, then whitened.

    Backwards over valid positions: ``delta_t = r_t + gamma * V_next - V_t``,
    ``A_t = delta_t + gamma * lam * A_next``, where ``V_next``/``A_next`` belong to the next *valid*
    position (0 past the end). Masked positions are skipped entirely: their rewards and values are
    ignored and they do not count as a discount step (verl's handling since it supports multi-turn
    masks). ``returns = A + V`` (before whitening); ``advantages = masked_whiten(A)``. Both are 0 on
    masked positions.
    """
    return decoupled_gae_advantage(token_level_rewards, values, mask, gamma, lam, lam)


def decoupled_gae_advantage(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam_critic: float = 1.0,
    lam_policy: float | torch.Tensor = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """VAPO's decoupled GAE: the critic's targets with ``lam_critic``, the policy's advantages with ``lam_policy``.

    ``returns = GAE(lam_critic) + V`` (with ``lam_critic=1`` and ``gamma=1``: the reward-to-go, whatever the values);
    ``advantages = masked_whiten(GAE(lam_policy))``. ``lam_policy`` is a number or one value per sequence ``[B]``
    (:func:`length_adaptive_lambda`). Equal lambdas give :func:`gae_advantage`. Both are 0 on masked positions.
    """
    with torch.no_grad():
        critic = _gae(token_level_rewards, values, mask, gamma, lam_critic)
        same = not isinstance(lam_policy, torch.Tensor) and lam_policy == lam_critic
        policy = critic if same else _gae(token_level_rewards, values, mask, gamma, lam_policy)
        returns = _where(mask, critic + values)
        advantages = _where(mask, masked_whiten(policy, mask))
    return advantages, returns


def length_adaptive_lambda(mask: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    """VAPO's length-adaptive GAE lambda, one per sequence ``[B]``: ``1 - 1 / (alpha * L_i)``, clamped at 0.

    ``L_i`` is the number of valid tokens. ``alpha * L`` is the number of steps the advantage looks ahead: a
    response shorter than ``1 / alpha`` tokens gets ``lambda = 0`` (one-step TD; the formula would be negative), an
    empty one 0 as well. Raises ``ValueError`` unless ``alpha > 0``.
    """
    if not alpha > 0:
        raise ValueError(f"length_adaptive_lambda: alpha must be > 0, got {alpha}.")
    lengths = mask.detach().bool().sum(-1).to(torch.get_default_dtype() if not mask.is_floating_point() else mask.dtype)
    return (1.0 - 1.0 / (alpha * lengths)).clamp(min=0.0)


def reinforce_pp_advantage(
    token_level_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go per token, whitened over the batch.

    Backwards over valid positions: ``G_t = r_t + gamma * G_next``, where ``G_next`` belongs to the next
    *valid* position (0 past the end). Masked positions (padding, or a tool-output / user-turn span of a
    multi-turn response) are skipped as in verl: the running return is carried through them unchanged,
    their rewards are ignored and they do not count as a discount step, so the final score reaches every
    earlier turn. ``advantages = masked_whiten(G)``; ``returns = G``. Both are 0 on masked positions.
    """
    with torch.no_grad():
        valid = mask.bool()
        running = torch.zeros_like(token_level_rewards[:, 0])
        returns = torch.zeros_like(token_level_rewards)
        for t in reversed(range(token_level_rewards.shape[-1])):
            running = torch.where(valid[:, t], token_level_rewards[:, t] + gamma * running, running)
            returns[:, t] = torch.where(valid[:, t], running, 0.0)
        advantages = _where(mask, masked_whiten(returns, mask))
    return advantages, returns


def remax_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: reward-to-go minus the greedy rollout's reward.

    ``returns_t = sum_{s >= t} m_s r_s`` (undiscounted, valid rewards only) and
    ``advantages_t = returns_t - b`` with ``b = reward_baselines[i]`` (shape ``[B]``), the score of the
    greedy response to the same prompt. Both are 0 on masked positions.
    """
    with torch.no_grad():
        rewards = _where(mask, token_level_rewards)
        to_go = rewards.flip(-1).cumsum(-1).flip(-1)
        returns = _where(mask, to_go)
        advantages = _where(mask, to_go - reward_baselines.to(to_go.dtype).unsqueeze(-1))
    return advantages, returns


__all__ = [
    "masked_var", "masked_whiten", "group_index", "grpo_outcome_advantage", "gdpo_advantage", "grpo_passk_advantage",
    "rloo_outcome_advantage", "opo_advantage", "gpg_advantage", "reinforce_pp_baseline_advantage", "gae_advantage",
    "decoupled_gae_advantage", "length_adaptive_lambda", "reinforce_pp_advantage", "remax_advantage", "softmean",
    "sppo_softmean_advantage", "sppo_win_rate_advantage",
]
