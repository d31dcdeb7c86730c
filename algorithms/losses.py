"""Policy, value and KL losses: pure tensor functions from log-probs/values to per-token losses.

Import them from :mod:`rlforge.algorithms.functional`, the public entry point. Shapes: ``[B, R]`` =
sequences x response tokens; ``mask`` is the response mask (1 on valid tokens). Policy losses return
the ``[B, R]`` loss matrix (zero on masked positions) plus ``[B, R]`` statistics, to be reduced with
:func:`agg_loss`. Formulas, the verl counterparts and edge cases: docs/algorithms/formulas.md.
"""

from __future__ import annotations

import torch
from rlforge.algorithms import names
from rlforge.algorithms.names import KL_ESTIMATORS

from rlforge.ops import masked_sum

LOG_RATIO_CLAMP = 20.0
GSPO_LOG_RATIO_CLAMP = 10.0  # upper clamp of GSPO's sequence log-ratio (verl)


# --- loss aggregation -----------------------------------------------------------------------------
# Each mode: (loss_mat, mask, tokens, seqs, norm_length) -> scalar. ``tokens``/``seqs`` are the counts
# of the whole mini-batch (all micro-batches and ranks); the workers sum gradients over ranks.


def _seq_sums(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(loss_mat, mask, dim=-1)


_AGG_MODES = {
    "token-mean": lambda x, m, tokens, seqs, n: masked_sum(x, m) / tokens,
    "token-sum": lambda x, m, tokens, seqs, n: masked_sum(x, m),
    "seq-mean-token-sum": lambda x, m, tokens, seqs, n: _seq_sums(x, m).sum() / seqs,
    "seq-mean-token-mean": lambda x, m, tokens, seqs, n: (_seq_sums(x, m) / m.sum(-1).clamp(min=1)).sum() / seqs,
    "seq-mean-token-sum-norm": lambda x, m, tokens, seqs, n: (_seq_sums(x, m) / n).sum() / seqs,
}
LOSS_AGG_MODES = tuple(_AGG_MODES)
assert LOSS_AGG_MODES == names.LOSS_AGG_MODES, "algorithms/names.py lists the modes for config validation"


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
    - ``token-sum``: sum over valid tokens (no normalization).
    - ``seq-mean-token-sum``: per-sequence token sum, then sum / ``global_seqs``.
    - ``seq-mean-token-mean``: per-sequence token mean, then sum / ``global_seqs``.
    - ``seq-mean-token-sum-norm``: per-sequence token sum / ``norm_length``, then sum / ``global_seqs``
      (Dr. GRPO; ``norm_length`` defaults to the padded response length ``R``).

    ``global_tokens``/``global_seqs`` are the counts over the whole mini-batch (all micro-batches and
    ranks); passing them makes the sum of micro-batch losses equal the mini-batch loss. They default to
    this batch's own counts: its valid tokens, and its sequences with at least one valid token (as verl
    counts them), so the result is a plain mean over the non-empty rows. Both are clamped to >= 1.
    """
    aggregate = _AGG_MODES.get(mode)
    if aggregate is None:
        raise ValueError(f"Unknown loss_agg_mode '{mode}'. Allowed: {', '.join(LOSS_AGG_MODES)}.")
    mask = mask.to(loss_mat.dtype)
    if global_tokens is None:
        global_tokens = float(mask.sum().clamp(min=1))
    if global_seqs is None:
        global_seqs = float((mask.sum(-1) > 0).sum().clamp(min=1))
    return aggregate(loss_mat, mask, global_tokens, global_seqs, float(norm_length or loss_mat.shape[-1]))


def _weighted(loss: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """The per-token loss times the rollout-correction weights, when given (as verl's policy losses)."""
    return loss if rollout_is_weights is None else loss * rollout_is_weights


# --- policy loss ----------------------------------------------------------------------------------


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token, with dual-clip where the advantage is negative.

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``L = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))``, and where ``A < 0`` additionally
    ``L = min(L, -A * clip_ratio_c)``; times ``rollout_is_weights`` (``[B, R]``, rollout correction)
    when given. Returns the ``[B, R]`` loss matrix (to be aggregated with :func:`agg_loss`) and
    ``[B, R]`` indicator matrices for metrics: ``clipped``, ``clipped_lower``, ``neg_log_ratio`` (the
    per-token approximate KL ``old - new``).
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
    return _weighted(loss, rollout_is_weights) * mask, stats


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



# --- sequence-level and plain policy-gradient losses ------------------------------------------------


def gspo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (token form): PPO clipping on the length-normalized *sequence* importance ratio.

    ``log s_i = mean_t over valid tokens of (log_prob - old_log_prob)``. Each token uses
    ``s_{i,t} = exp(min(sg[log s_i] + log_prob_t - sg[log_prob_t], 10))``, whose value is ``s_i`` for
    every token of the sequence while the gradient flows through each token's own log-prob
    (``d s_{i,t} / d log_prob_t = s_{i,t}``); ``sg`` stops the gradient.
    ``L = max(-A s_{i,t}, -A clip(s_{i,t}, 1 - low, 1 + high))``, no dual clip. The clip ranges are
    tiny because ``s_i`` is a geometric mean. ``rollout_is_weights`` multiply the per-token loss when
    given. Aggregate with ``seq-mean-token-mean`` to get GSPO's objective. Stats (``[B, R]``): ``clipped``, ``clipped_lower`` (always 0), ``neg_log_ratio``
    (per token ``old - new``).
    """
    valid = mask.bool()
    log_ratio = log_prob - old_log_prob
    lengths = valid.sum(-1).clamp(min=1)
    seq_log_ratio = torch.where(valid, log_ratio, 0.0).sum(-1) / lengths
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach()
    ratio = torch.exp(token_log_ratio.clamp(max=GSPO_LOG_RATIO_CLAMP))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    stats = {
        "clipped": (loss_clipped > loss_unclipped).float(),
        "clipped_lower": torch.zeros_like(loss, dtype=torch.float32),
        "neg_log_ratio": -log_ratio.detach(),
    }
    return torch.where(valid, _weighted(loss, rollout_is_weights), 0.0), stats


def gpg_policy_loss(
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG: the plain policy-gradient loss ``-log_prob * A`` per valid token (no ratio, no clipping),
    times ``rollout_is_weights`` when given.

    Stats ``clipped`` and ``clipped_lower`` are ``[B, R]`` zeros, for metric code shared with PPO.
    """
    loss = torch.where(mask.bool(), _weighted(-log_prob * advantages, rollout_is_weights), 0.0)
    zeros = torch.zeros_like(loss, dtype=torch.float32)
    return loss, {"clipped": zeros, "clipped_lower": zeros.clone()}


# --- on-policy distillation -----------------------------------------------------------------------


def forward_kl_topk(
    student_topk_log_prob: torch.Tensor, teacher_topk_log_prob: torch.Tensor, log_prob_min_clamp: float | None = None,
    teacher_ids: torch.Tensor | None = None, student_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's ``forward_kl_topk`` divergence per token, [B, R]: ``sum_k p_T,k (log p_T,k - log p_S,k)`` over the
    teacher's top-k tokens ``[B, R, K]`` (``log p_S,k``: the student's full-vocabulary log-softmax at those tokens,
    with its gradient), both log-probs clamped below at ``log_prob_min_clamp`` when given, then at least 0 (the
    truncated sum can be negative). Stats [B, R]: ``student_mass`` and ``teacher_mass``, ``sum_k p`` of each before
    the clamp (how much of each distribution the top-k holds); with the teacher's and the student's own top-k ids
    ([B, R, K] each), verl's overlap diagnostics (after "Rethinking On-Policy Distillation of Large Language Models",
    arXiv:2604.13016): ``overlap_count``, how many of the teacher's top-k tokens are among the student's, and
    ``overlap_token_advantage``, the mean over those tokens of ``-p_T,k (log p_T,k - log p_S,k)`` (clamped log-probs;
    0 where none overlap)."""
    stats = {"student_mass": student_topk_log_prob.detach().exp().sum(-1),
             "teacher_mass": teacher_topk_log_prob.detach().exp().sum(-1)}
    student, teacher = student_topk_log_prob.float(), teacher_topk_log_prob.float()
    if log_prob_min_clamp is not None:
        student, teacher = student.clamp_min(log_prob_min_clamp), teacher.clamp_min(log_prob_min_clamp)
    token_kl = teacher.exp() * (teacher - student)
    if teacher_ids is not None and student_ids is not None:
        overlap = (teacher_ids[..., :, None] == student_ids[..., None, :]).any(-1)
        count = overlap.sum(-1)
        stats["overlap_count"] = count.float()
        stats["overlap_token_advantage"] = (-token_kl.detach() * overlap).sum(-1) / count.clamp_min(1)
    return token_kl.sum(-1).clamp_min(0.0), stats


def distillation_loss(
    log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor | None,
    old_log_prob: torch.Tensor,
    mask: torch.Tensor,
    loss_mode: str = "k3",
    loss_max_clamp: float | None = None,
    use_policy_gradient: bool = False,
    clip_ratios: tuple[float, float, float] = (0.2, 0.2, 3.0),
    rollout_is_weights: torch.Tensor | None = None,
    divergence: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """On-policy distillation's per-token loss from the sampled tokens' log-probs under the student (``log_prob``,
    with its gradient) and the teacher.

    ``d = kl_penalty(log_prob, teacher_log_prob, loss_mode)`` (an estimate of KL(student || teacher)), or the
    per-token ``divergence`` when given (e.g. :func:`forward_kl_topk`, with its gradient), clamped to
    ``[-loss_max_clamp, loss_max_clamp]`` when given. ``use_policy_gradient=False``: the loss is ``d``.
    ``True``: :func:`clipped_policy_loss` with advantages ``-d`` (detached), ``old_log_prob`` and
    ``clip_ratios = (low, high, c)``, times ``rollout_is_weights`` when given (as verl: the direct loss is not
    weighted); 0 off the mask. Returns the
    ``[B, R]`` loss (aggregate with :func:`agg_loss`) and ``[B, R]`` stats: ``abs_loss`` (``|d|`` before the
    clamp) and, with the policy gradient, ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``.
    """
    if divergence is not None:
        d = divergence
    else:
        assert teacher_log_prob is not None, "an estimator loss needs the teacher's log-probs of the sampled tokens"
        d = kl_penalty(log_prob, teacher_log_prob, loss_mode)
    stats = {"abs_loss": d.detach().abs()}
    if loss_max_clamp is not None:
        d = d.clamp(-loss_max_clamp, loss_max_clamp)
    if not use_policy_gradient:
        return torch.where(mask.bool(), d, 0.0), stats
    loss, pg = clipped_policy_loss(log_prob, old_log_prob, -d.detach(), mask, *clip_ratios,
                                   rollout_is_weights=rollout_is_weights)
    names = {"clipped": "pg_clipfrac", "clipped_lower": "pg_clipfrac_lower", "neg_log_ratio": "ppo_kl"}
    return loss, {**stats, **{names[k]: v for k, v in pg.items()}}


# --- value loss -----------------------------------------------------------------------------------


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values_old: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss: ``0.5 * agg(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2))``.

    ``agg`` is :func:`agg_loss` with ``loss_agg_mode`` and the mini-batch counts ``global_tokens`` /
    ``global_seqs`` (so micro-batch losses sum to the mini-batch loss). ``clipfrac`` is the fraction of
    valid tokens where the clipped term is the larger one, divided by ``global_tokens`` too, so it sums
    over micro-batches in the same way. Returns ``(loss, clipfrac)``, both 0-d; ``clipfrac`` detached.
    """
    clipped_pred = torch.maximum(torch.minimum(vpreds, values_old + cliprange_value), values_old - cliprange_value)
    loss_plain = (vpreds - returns).square()
    loss_clip = (clipped_pred - returns).square()
    loss_mat = torch.where(mask.bool(), torch.maximum(loss_plain, loss_clip), 0.0)
    loss = 0.5 * agg_loss(loss_mat, mask, loss_agg_mode, global_tokens, global_seqs)
    clipped = (loss_clip > loss_plain).to(loss_mat.dtype)
    clipfrac = agg_loss(clipped, mask, "token-mean", global_tokens, global_seqs)
    return loss, clipfrac


__all__ = [
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "LOG_RATIO_CLAMP", "GSPO_LOG_RATIO_CLAMP", "agg_loss",
    "clipped_policy_loss", "gspo_policy_loss", "gpg_policy_loss", "value_loss", "kl_penalty", "distillation_loss",
]
