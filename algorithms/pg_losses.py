"""The policy losses of verl 0.9's registry beyond PPO clip, GSPO and GPG: pure tensor functions.

Import them from :mod:`rlforge.algorithms.functional`. Same conventions as :mod:`rlforge.algorithms.losses`:
shapes ``[B, R]`` (sequences x response tokens), ``mask`` 1 on valid tokens, each function returns the ``[B, R]``
loss matrix (0 on masked positions) and ``[B, R]`` statistics, to be reduced with ``agg_loss``. The registry that
selects them from ``actor.policy_loss`` is :mod:`rlforge.algorithms.policy_losses`. Formulas, verl's counterparts
(``verl/trainer/ppo/core_algos.py``, 0.9.1) and the differences: docs/algorithms/policy_losses.md.
"""

from __future__ import annotations

import torch
from rlforge.algorithms.losses import LOG_RATIO_CLAMP, _weighted

BINARY_KL_EPS = 1e-8  # DPPO-KL: inside the log of the binary KL's second term (verl)
SEQ_EPS = 1e-8  # GMPO: added to the sequence length in its means (verl)


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _masked(loss: torch.Tensor, mask: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return torch.where(mask.bool(), _weighted(loss, rollout_is_weights), 0.0)


def _zeros(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like, dtype=torch.float32)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = mask.bool()
    return torch.where(valid, x, 0.0).sum() / valid.sum().clamp(min=1)


# --- ratio-weighted log-likelihood: CISPO, DPPO --------------------------------------------------------


def cispo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1): the clipped ratio as a constant weight on the log-likelihood.

    ``r = exp(clamp(log_prob - old, -20, 20))``; ``L = -sg[clip(r, 1 - low, 1 + high)] * A * log_prob``. Every token
    keeps its gradient (``-sg[clip(r)] * A``), however far its ratio moved. Stats: ``clipped`` (the ratio was out of
    range), ``clipped_lower`` (zeros), ``neg_log_ratio``.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = -clipped.detach() * advantages * log_prob
    stats = {"clipped": (ratio != clipped).float(), "clipped_lower": _zeros(loss), "neg_log_ratio": -log_ratio.detach()}
    return _masked(loss, mask, rollout_is_weights), stats


def _dppo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    keep: torch.Tensor,
    clip_ratio_c: float,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``L = -A * sg[min(r, c)] * log_prob * keep`` and DPPO's stats, for a trust-region mask ``keep``."""
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    keep = keep.detach().to(log_prob.dtype)
    loss = -advantages * ratio.clamp(max=clip_ratio_c).detach() * log_prob * keep
    stats = {"clipped": 1.0 - keep.float(), "clipped_lower": (ratio > clip_ratio_c).float() * keep.float(),
             "neg_log_ratio": -log_ratio.detach()}
    return _masked(loss, mask, rollout_is_weights), stats


def dppo_tv_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-TV (arXiv:2602.04879): a trust region on the token's probability, not its ratio.

    With ``p = exp(log_prob)`` and ``p_old = exp(old)``, a token is kept where ``p - p_old <= high`` (``A > 0``) or
    ``p - p_old >= -low`` (``A <= 0``): the update may not move its probability by more than the bound in the
    direction the advantage pushes. ``L = -A * sg[min(r, clip_ratio_c)] * log_prob`` on kept tokens, 0 on the others
    (truncated importance sampling instead of the dual clip). Stats: ``clipped`` (not kept), ``clipped_lower``
    (kept and ``r > clip_ratio_c``), ``neg_log_ratio``.
    """
    delta = log_prob.exp() - old_log_prob.exp()
    keep = torch.where(advantages > 0, delta <= clip_ratio_high, delta >= -clip_ratio_low)
    return _dppo_loss(log_prob, old_log_prob, advantages, mask, keep, clip_ratio_c, rollout_is_weights)


def dppo_kl_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-KL (arXiv:2602.04879): :func:`dppo_tv_policy_loss` with a binary-KL trust region.

    ``KL = p_old (log p_old - log p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``, the KL between the
    Bernoulli distributions "this token or another" of the old and the new policy. Kept: ``KL <= high or p <= p_old``
    (``A > 0``), ``KL <= low or p >= p_old`` (``A <= 0``): only a move in the advantage's direction is bounded.
    """
    p, p_old = log_prob.exp(), old_log_prob.exp()
    binary_kl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log(
        (1.0 - p_old + BINARY_KL_EPS) / (1.0 - p + BINARY_KL_EPS))
    keep = torch.where(advantages > 0, (binary_kl <= clip_ratio_high) | (p <= p_old),
                       (binary_kl <= clip_ratio_low) | (p >= p_old))
    return _dppo_loss(log_prob, old_log_prob, advantages, mask, keep, clip_ratio_c, rollout_is_weights)


# --- soft gate: SAPO --------------------------------------------------------------------------------------


def sapo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (arXiv:2511.20347): a smooth gate on the ratio instead of a hard clip.

    ``r = exp(clamp(log_prob - old, -20, 20))``; ``tau = tau_pos`` where ``A > 0``, else ``tau_neg``;
    ``L = -A * sigmoid(tau (r - 1)) * 4 / tau``. At ``r = 1`` the gate's slope is 1 (the PPO gradient); away from
    it the gradient decays smoothly, faster for larger ``tau``. Stats: ``clipped``/``clipped_lower`` (zeros),
    ``neg_log_ratio``.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    tau = torch.where(advantages > 0, torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device),
                      torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device))
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    loss = -gate * advantages
    stats = {"clipped": _zeros(loss), "clipped_lower": _zeros(loss), "neg_log_ratio": -log_ratio.detach()}
    return _masked(loss, mask, rollout_is_weights), stats


# --- covariance-selected tokens: Clip-Cov, KL-Cov -----------------------------------------------------------


def _covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per token ``(A - mean A) (log_prob - mean log_prob)``, the means over the valid tokens; detached."""
    adv, logp = advantages.detach(), log_prob.detach()
    return (adv - _masked_mean(adv, mask)) * (logp - _masked_mean(logp, mask))


def clip_cov_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    rollout_is_weights: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (arXiv:2505.22617): PPO clip, plus no gradient for a few tokens of high covariance.

    ``L = max(-A r, -A clip(r, 1 - low, 1 + high))`` (no dual clip), except on ``n = max(1, int(clip_cov_ratio *
    valid tokens))`` tokens drawn at random (``torch.randperm`` with ``generator``) among the valid, unclipped ones
    whose covariance ``(A - mean A)(log_prob - mean log_prob)`` lies strictly inside ``(clip_cov_lb, clip_cov_ub)``:
    their loss is 0 (the entropy-collapsing updates are the confident tokens with large advantage). Stats:
    ``clipped`` (the tokens set to 0), ``clipped_lower`` (zeros), ``neg_log_ratio``.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    valid = mask.bool()
    cov = _covariance(advantages, log_prob, mask)
    candidates = (valid & ~(loss_clipped > loss_unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)).nonzero()
    n = max(int(clip_cov_ratio * int(valid.sum())), 1)
    keep = torch.ones_like(advantages, dtype=torch.bool)
    if len(candidates):
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:n].to(candidates.device)]
        keep[chosen[:, 0], chosen[:, 1]] = False
    loss = torch.maximum(loss_unclipped, loss_clipped) * keep
    stats = {"clipped": (~keep).float(), "clipped_lower": _zeros(loss), "neg_log_ratio": -log_ratio.detach()}
    return _masked(loss, mask, rollout_is_weights), stats


def kl_cov_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (arXiv:2505.22617): the unclipped surrogate, plus a KL penalty on the tokens of highest covariance.

    ``L = -A r``; on the ``k = max(1, int(kl_cov_ratio * valid tokens))`` valid tokens with the largest
    ``(A - mean A)(log_prob - mean log_prob)``: ``L = -A r + ppo_kl_coef * |log_prob - old|``. Stats:
    ``abs_log_ratio`` (``|log_prob - old|``, verl's ``actor/ppo_kl`` for this loss), ``penalized`` (the top-k tokens).
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    valid = mask.bool()
    loss = -advantages * ratio
    penalized = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid and kl_cov_ratio > 0:
        k = max(1, int(n_valid * kl_cov_ratio))
        flat = valid.flatten().nonzero().squeeze(-1)
        top = torch.topk(_covariance(advantages, log_prob, mask).flatten()[flat], k).indices
        penalized.view(-1)[flat[top]] = True
        loss = torch.where(penalized, loss + ppo_kl_coef * log_ratio.abs(), loss)
    stats = {"abs_log_ratio": log_ratio.abs().detach(), "penalized": penalized.float()}
    return _masked(loss, mask, rollout_is_weights), stats


# --- sequence-level: GMPO (geo_mean), SPPO ----------------------------------------------------------------


def geo_mean_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO (arXiv:2507.20673): the geometric mean of the token ratios, clipped per token in log space.

    ``x_t = log_prob - old`` (not clamped), clipped on the side the advantage pushes:
    ``x~_t = sgn(A) min(sgn(A) x_t, sgn(A) clamp(x_t, -low, high))``. Per sequence ``rho_i = exp(sum_t m x~_t /
    (L_i + 1e-8))``, ``A_i = sum_t m A_t / (L_i + 1e-8)`` (a sequence-level advantage) and
    ``loss_i = -A_i rho_i``, times the geometric mean of ``rollout_is_weights`` over the sequence when given. The
    matrix carries ``loss_i`` on every valid token of row ``i``: aggregate with ``seq-mean-token-mean`` for GMPO's
    mean over sequences (the gradient of each ``loss_i`` reaches every token through ``rho_i``). Stats: ``clipped``
    (``x`` clipped and ``A > 0``), ``clipped_lower`` (clipped and ``A < 0``), ``neg_log_ratio``.
    """
    m = mask.to(log_prob.dtype)
    log_ratio = torch.where(mask.bool(), log_prob - old_log_prob, 0.0)
    sign = torch.sign(advantages)
    bounded = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * bounded)
    length = m.sum(-1) + SEQ_EPS
    rho = torch.exp((clipped_log_ratio * m).sum(-1) / length)
    seq_adv = (advantages * m).sum(-1) / length
    seq_loss = -seq_adv * rho
    if rollout_is_weights is not None:
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights + 1e-10) * m).sum(-1) / length)
    clipped = log_ratio != bounded
    stats = {"clipped": (clipped & (advantages > 0)).float(), "clipped_lower": (clipped & (advantages < 0)).float(),
             "neg_log_ratio": -log_ratio.detach()}
    return _masked(seq_loss.unsqueeze(-1).expand_as(log_prob), mask, None), stats


def sppo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eta: float = 1.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SPPO (arXiv:2405.00675): regress the sequence log-ratio onto the scaled target.

    ``D_i = sum_t m (log_prob - old)`` (the log of ``pi_theta(y|x) / pi_old(y|x)``), ``A_i`` = the row's advantage
    (its mean over the valid tokens: SPPO's advantages are one value per sequence), ``loss_i = (D_i - eta A_i)^2``,
    carried on every valid token of row ``i`` (times ``rollout_is_weights`` when given). ``seq-mean-token-mean``
    gives verl's mean over sequences; the other modes weigh each sequence by its length as usual. The gradient
    w.r.t. each token's log-prob is ``2 (D_i - eta A_i)`` times the mode's weight of row ``i``. Stats:
    ``neg_log_ratio``.
    """
    m = mask.to(log_prob.dtype)
    log_ratio = torch.where(mask.bool(), log_prob - old_log_prob, 0.0)
    seq_log_ratio = log_ratio.sum(-1)
    seq_adv = (advantages * m).sum(-1) / m.sum(-1).clamp(min=1)
    seq_loss = (seq_log_ratio - eta * seq_adv).square()
    stats = {"neg_log_ratio": -log_ratio.detach()}
    return _masked(seq_loss.unsqueeze(-1).expand_as(log_prob), mask, rollout_is_weights), stats


# --- penalized likelihood: DRO; plain REINFORCE -----------------------------------------------------------


def dro_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DRO (verl ``dro``): the log-likelihood weighted by the advantage, minus a quadratic log-ratio penalty.

    ``L = -(A log_prob - beta / 2 (log_prob - old)^2)``; ``beta > 0`` keeps the policy near the old one (the
    gradient ``-A + beta (log_prob - old)`` vanishes at ``log_prob - old = A / beta``). Stats: ``neg_log_ratio``.
    """
    if not beta > 0:
        raise ValueError(f"dro_policy_loss: beta must be > 0, got {beta}.")
    log_ratio = log_prob - old_log_prob
    loss = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    return _masked(loss, mask, rollout_is_weights), {"neg_log_ratio": -log_ratio.detach()}


def reinforce_policy_loss(
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with importance weights: ``L = -A * log_prob * w`` (``w`` = ``rollout_is_weights``, detached; 1
    when None). The loss of rollout correction's bypass mode with ``loss_type=reinforce``. Stats: none."""
    weights = None if rollout_is_weights is None else rollout_is_weights.detach()
    return _masked(-advantages * log_prob, mask, weights), {}


# --- VAPO's positive-example language-model loss -------------------------------------------------------------


def positive_lm_weights(positive: torch.Tensor, mask: torch.Tensor, mini_batch_rows: int) -> torch.Tensor:
    """Per-row weights ``[B]`` of :func:`positive_lm_loss`: ``1 / N`` on the positive rows, 0 elsewhere, where ``N``
    is the number of valid tokens of the positive rows of the row's mini-batch (consecutive chunks of
    ``mini_batch_rows`` rows, as the actor's update splits its batch); 0 for a mini-batch without a positive token.
    """
    pos = positive.detach().bool().to(mask.device)
    tokens = torch.where(pos, mask.detach().bool().sum(-1), 0).double()
    chunk = torch.arange(len(pos), device=mask.device) // max(int(mini_batch_rows), 1)
    per_chunk = torch.zeros(int(chunk.max()) + 1 if len(pos) else 0, dtype=torch.float64,
                            device=mask.device).index_add_(0, chunk, tokens)
    n = per_chunk[chunk]
    return torch.where(pos & (n > 0), 1.0 / n.clamp(min=1), 0.0)


def positive_lm_loss(log_prob: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """VAPO's LM loss on the correct responses: ``-sum_i w_i sum_t m log_prob`` (a 0-d tensor). With
    :func:`positive_lm_weights`, the sum over a mini-batch's micro-batches is ``-(1/N) sum_{i in T} sum_t log pi``,
    the mean negative log-likelihood of the tokens of its positive responses ``T``."""
    per_row = torch.where(mask.bool(), log_prob, 0.0).sum(-1)
    return -(weights.to(log_prob.dtype) * per_row).sum()


__all__ = [
    "positive_lm_weights", "positive_lm_loss",
    "cispo_policy_loss", "dppo_tv_policy_loss", "dppo_kl_policy_loss", "sapo_policy_loss", "clip_cov_policy_loss",
    "kl_cov_policy_loss", "geo_mean_policy_loss", "sppo_policy_loss", "dro_policy_loss", "reinforce_policy_loss",
]
