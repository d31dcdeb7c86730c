"""Rollout correction: importance weights and rejection between the rollout engine and the trainer.

The rollout engine (vLLM in bf16, say) and the trainer (FSDP in fp32) compute slightly different
probabilities for the same tokens, and an asynchronous rollout may come from an older policy. With
``log_ratio = old_log_prob - rollout_log_prob`` (trainer over engine), this module computes verl's
corrections (``verl/trainer/ppo/rollout_corr_helper.py``, 0.9.1), as pure tensor functions:

- **importance sampling** (``rollout_is``): weights ``pi_old / pi_rollout`` per ``token`` or per
  ``sequence`` (the product over the sequence, ``exp(sum log_ratio)``), either truncated above
  (TIS, ``rollout_is_threshold`` a number) or set to 0 outside ``[lower, upper]`` (IcePop,
  ``rollout_is_threshold="lower_upper"``). The policy losses multiply their per-token loss by them.
- **rejection sampling** (``rollout_rs``): tokens or whole sequences whose divergence (k1/k2/k3,
  per token or summed / averaged / maxed over the sequence) is out of bounds are removed from the
  response mask (masked IS, "MIS", when combined with the weights).
- **metrics** under verl's names (``rollout_corr/...``).

Import them from :mod:`rlforge.algorithms.functional`. Formulas and the differences from verl:
docs/algorithms/formulas.md, section "Rollout correction".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlforge import batch as B
from rlforge.dataflow import Stage, StepContext
from rlforge.lazy import lazy_import

if TYPE_CHECKING:  # torch loads on first use: config validation parses the thresholds without it
    import torch

    from rlforge import ops
else:
    torch = lazy_import("torch")
    ops = lazy_import("rlforge.ops")

# [B, R] importance weights (algorithm.rollout_is), written by RolloutCorrection;
# the policy losses multiply their per-token loss by them when the column is present
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
SAFETY_BOUND = 20.0  # log-ratios (and their sequence sums) are clamped to +-20 before exp
ROLLOUT_IS_LEVELS = ("token", "sequence")

# divergence of one token from its log-ratio lr = log(pi_old / pi_rollout)
_DIVERGENCES = {
    "k1": lambda lr: -lr,
    "k2": lambda lr: 0.5 * lr.square(),
    "k3": lambda lr: lr.exp() - 1.0 - lr,
}


def _seq_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    top = torch.where(mask.bool(), x, float("-inf")).amax(-1, keepdim=True)
    return torch.where(torch.isinf(top), 0.0, top)  # an empty row: 0


# aggregation of the per-token divergence: [B, R] (token) or [B, 1] (per sequence)
_AGGREGATES = {
    "token": lambda x, mask: x,
    "seq_sum": lambda x, mask: ops.masked_sum(x, mask, dim=-1).unsqueeze(-1),
    "seq_mean": lambda x, mask: (ops.masked_sum(x, mask, dim=-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1),
    "seq_max": _seq_max,
}
ROLLOUT_RS_OPTIONS = tuple(
    f"{agg}_{k}" for agg in _AGGREGATES for k in _DIVERGENCES if (agg, k) != ("seq_max", "k1")
)


# --- threshold specifications -----------------------------------------------------------------------


def _number(text: str, key: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"'{key}': '{text}' is not a number.") from None
    if not value > 0:
        raise ValueError(f"'{key}': bounds must be > 0, got {text}.")
    return value


def _bounds(spec: str, key: str) -> tuple[float | None, float]:
    """``"lower_upper"`` -> ``(lower, upper)``; a single number -> ``(None, upper)``."""
    lower, _, upper = spec.strip().rpartition("_")
    low = _number(lower, key) if lower else None
    up = _number(upper, key)
    if low is not None and low > up:
        raise ValueError(f"'{key}': the lower bound {low} is above the upper bound {up}.")
    return low, up


def parse_is_threshold(spec: str | float) -> tuple[float | None, float]:
    """``rollout_is_threshold`` -> ``(lower, upper)``.

    A number (or a numeric string) is the TIS upper bound (``lower`` None); ``"lower_upper"`` (e.g.
    ``"0.5_5.0"``) are IcePop's bounds. Raises ``ValueError`` naming the key for anything else.
    """
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"'rollout_is_threshold' must be a number or 'lower_upper', got {spec!r}.")
    lower, upper = _bounds(str(spec), "rollout_is_threshold")
    if lower is None and upper < 1:
        raise ValueError(f"'rollout_is_threshold' is {spec}: a truncation bound below 1 would cut every weight "
                         f"above it, importance ratios of 1 included. For IcePop's bounds write 'lower_upper' "
                         f"quoted: YAML reads 0.5_5 unquoted as the number 0.55 (write rollout_is_threshold: "
                         f"\"0.5_5\"; config files and the command line refuse an unquoted one).")
    return lower, upper


def parse_rs_options(rollout_rs: str) -> list[str]:
    """``rollout_rs`` (comma-separated options) -> the options in order, duplicates removed."""
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    unknown = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"'rollout_rs' has unknown option(s) {unknown or [rollout_rs]}. "
                         f"Allowed (comma-separated): {', '.join(ROLLOUT_RS_OPTIONS)}.")
    return options


def parse_rs_thresholds(rollout_rs: str, spec: str | float | None) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs`` and ``rollout_rs_threshold`` -> ``{option: (lower, upper)}``.

    ``spec`` holds one comma-separated entry per option, or a single entry for all. A ``*_k1`` option
    takes ratio bounds ``"lower_upper"`` (a single number ``u`` means ``1/u`` to ``u``); a k2/k3 option
    takes one upper bound (``lower`` None).
    """
    options = parse_rs_options(rollout_rs)
    if spec is None or isinstance(spec, bool):
        raise ValueError("'rollout_rs_threshold' must be set when 'rollout_rs' is (one entry per option).")
    entries = [e.strip() for e in str(spec).split(",") if e.strip()]
    if len(entries) == 1:
        entries *= len(options)
    if len(entries) != len(options):
        raise ValueError(f"'rollout_rs_threshold' has {len(entries)} entries for {len(options)} 'rollout_rs' "
                         f"options ({', '.join(options)}): give one per option, or one for all.")
    out: dict[str, tuple[float | None, float]] = {}
    for option, entry in zip(options, entries):
        lower, upper = _bounds(entry, f"rollout_rs_threshold ({option})")
        if option.endswith("k1"):
            lower = 1.0 / upper if lower is None else lower
            if lower > upper:
                raise ValueError(f"'rollout_rs_threshold' ({option}): a single bound u means [1/u, u] and needs "
                                 f"u >= 1, got {entry}.")
            out[option] = (lower, upper)
        elif lower is not None:
            raise ValueError(f"'rollout_rs_threshold' ({option}): a k2/k3 option takes one upper bound, "
                             f"not '{entry}'.")
        else:
            out[option] = (None, upper)
    return out


# --- importance weights ---------------------------------------------------------------------------


def _log_ratio(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``old - rollout`` on valid tokens, 0 elsewhere (garbage on padding cannot leak), detached."""
    return torch.where(mask.bool(), (old_log_prob - rollout_log_prob).detach(), 0.0)


def _raw_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"'rollout_is' is '{level}'. Allowed: {', '.join(ROLLOUT_IS_LEVELS)} (or None: off).")
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    return torch.where(mask.bool(), log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp(), 0.0)


def _apply_threshold(raw: torch.Tensor, lower: float | None, upper: float) -> torch.Tensor:
    if lower is None:
        return raw.clamp(max=upper)  # TIS
    return torch.where((raw >= lower) & (raw <= upper), raw, 0.0)  # IcePop


def rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    threshold: str | float = 2.0,
) -> torch.Tensor:
    """Importance weights ``pi_old / pi_rollout`` ``[B, R]``, 0 on masked positions, detached.

    ``level="token"``: ``w_t = exp(clamp(lr_t, -20, 20))``; ``level="sequence"``: every valid token of
    row ``i`` gets ``exp(clamp(sum_t m_t lr_t, -20, 20))``. Then ``threshold`` (see
    :func:`parse_is_threshold`): a number ``u`` truncates, ``min(w, u)`` (TIS); ``"lower_upper"`` sets
    ``w`` to 0 outside ``[lower, upper]`` (IcePop).
    """
    lower, upper = parse_is_threshold(threshold)
    raw = _raw_weights(_log_ratio(old_log_prob, rollout_log_prob, mask), mask, level)
    return _apply_threshold(raw, lower, upper)


def normalize_is_weights(weights: torch.Tensor, mask: torch.Tensor, level: str = "token") -> tuple[torch.Tensor, float]:
    """Rescale the weights to mean 1 (``rollout_is_batch_normalize``); returns ``(weights, factor)``.

    The mean is over valid tokens (``token``) or over the sequences with a valid token, one weight each
    (``sequence``). A mean <= 1e-8 leaves the weights as they are (factor 1.0).
    """
    valid = mask.bool()
    per_row = valid.sum(-1)
    if level == "sequence":
        seq_w = ops.masked_sum(weights, mask, dim=-1) / per_row.clamp(min=1)
        mean = seq_w[per_row > 0].mean() if bool((per_row > 0).any()) else torch.zeros(())
    else:
        mean = ops.masked_sum(weights, mask) / valid.sum().clamp(min=1)
    factor = float(mean)
    if factor <= 1e-8:
        return weights, 1.0
    return weights / factor, factor


# --- rejection sampling -----------------------------------------------------------------------------


def rollout_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    rollout_rs: str,
    threshold: str | float,
) -> torch.Tensor:
    """The response mask with rejected tokens/sequences set to 0 (same dtype as ``mask``).

    For each option ``<agg>_<k>`` of ``rollout_rs`` (all must pass): the per-token divergence of
    ``lr = clamp(old - rollout, -20, 20)`` is ``k1 = -lr``, ``k2 = lr^2 / 2`` or ``k3 = e^lr - 1 - lr``;
    ``token`` tests each token, ``seq_sum`` / ``seq_mean`` / ``seq_max`` test the sum / mean / max over the
    row's valid tokens and keep or reject the whole row. k1 passes when
    ``log(lower) <= stat <= log(upper)``; k2/k3 when ``stat <= upper``.
    """
    valid = mask.bool()
    lr = _log_ratio(old_log_prob, rollout_log_prob, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    keep = valid.clone()
    for option, (lower, upper) in parse_rs_thresholds(rollout_rs, threshold).items():
        agg, k = option.rsplit("_", 1)
        stat = _AGGREGATES[agg](_DIVERGENCES[k](lr), mask)
        if lower is None:
            passed = stat <= upper
        else:
            passed = (stat >= math.log(lower)) & (stat <= math.log(upper))
        keep &= passed.expand_as(keep)
    return torch.where(keep, mask, torch.zeros((), dtype=mask.dtype, device=mask.device))


# --- metrics --------------------------------------------------------------------------------------


def _mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float(ops.masked_sum(x, mask) / mask.sum().clamp(min=1))


def _offpolicy_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """KL (k1, k3), perplexities and chi-square between the engine and the trainer (verl's names)."""
    rows = mask.sum(-1) > 0
    lr = _log_ratio(old, rollout, mask)
    safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    length = mask.sum(-1).clamp(min=1)
    mean_old = (ops.masked_sum(old, mask, dim=-1) / length)[rows]
    mean_rollout = (ops.masked_sum(rollout, mask, dim=-1) / length)[rows]
    return {
        "kl": _mean(-lr, mask),  # KL(rollout || old), k1: E[log pi_rollout - log pi_old]
        "k3_kl": _mean(safe.exp() - safe - 1.0, mask),  # the same KL, k3 estimator
        "training_ppl": float((-mean_old).exp().mean()),
        "rollout_ppl": float((-mean_rollout).exp().mean()),
        "log_ppl_diff": float((mean_rollout - mean_old).mean()),
        "chi2_token": _mean((2 * safe).exp(), mask) - 1.0,
        "chi2_seq": float((2 * lr.sum(-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean()) - 1.0,
    }


def _is_metrics(lr: torch.Tensor, mask: torch.Tensor, level: str, threshold: str | float) -> dict[str, float]:
    """Statistics of the weights :func:`rollout_is_weights` gives (before batch normalization)."""
    lower, upper = parse_is_threshold(threshold)
    raw = _raw_weights(lr, mask, level)
    weights = _apply_threshold(raw, lower, upper)
    low = 1.0 / upper if lower is None else lower
    valid = mask.bool()
    if level == "sequence":  # per row: the untruncated product of the ratios, over the non-empty rows
        seq_lr = lr.sum(-1)[valid.any(-1)]
        seq_w = seq_lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
        extremes = {"rollout_is_max": float(seq_w.max()), "rollout_is_min": float(seq_w.min()),
                    "rollout_is_ratio_fraction_high": float((seq_lr > math.log(upper)).double().mean()),
                    "rollout_is_ratio_fraction_low": float((seq_lr < math.log(low)).double().mean())}
    else:
        extremes = {"rollout_is_max": float(weights[valid].max()), "rollout_is_min": float(weights[valid].min()),
                    "rollout_is_ratio_fraction_high": _mean((raw > upper).double(), mask),
                    "rollout_is_ratio_fraction_low": _mean((raw < low).double(), mask)}
    capped = weights.clamp(0.0, upper)
    mean_capped = _mean(capped, mask)
    second = _mean(capped.square(), mask)
    out = {"rollout_is_mean": _mean(weights, mask), **extremes,
           "rollout_is_std": math.sqrt(max(second - mean_capped**2, 0.0)) if int(valid.sum()) > 1 else 0.0,
           "rollout_is_eff_sample_size": mean_capped**2 / second if second > 0 else 0.0}
    if lower is not None:
        out["rollout_is_oob_ratio"] = _mean(((raw < lower) | (raw > upper)).double(), mask)
    return out


def _rs_metrics(mask: torch.Tensor, kept: torch.Tensor) -> dict[str, float]:
    rejected = mask.bool() & ~kept.bool()
    rows = mask.bool().any(-1)
    return {"rollout_rs_masked_fraction": _mean(rejected.double(), mask),
            "rollout_rs_seq_masked_fraction": float(rejected.any(-1)[rows].double().mean())}


def rollout_correction_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float = 2.0,
    rejection_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """Diagnostics of the engine/trainer mismatch, keyed ``rollout_corr/<verl's name>``.

    Always: ``kl`` (k1, mean over valid tokens of ``rollout - old``), ``k3_kl`` (mean of
    ``e^lr - lr - 1``), ``training_ppl``/``rollout_ppl`` (mean over sequences of ``exp(-mean log-prob)``),
    ``log_ppl_diff``, ``chi2_token`` (``E[w^2] - 1``) and ``chi2_seq`` (per sequence). With
    ``rollout_is``: the weights' ``rollout_is_mean/max/min/std``, ``rollout_is_eff_sample_size``,
    ``rollout_is_ratio_fraction_high/low`` (share above the upper bound, i.e. truncated, and below the
    lower bound, ``1/upper`` for TIS) and, for IcePop, ``rollout_is_oob_ratio`` (share zeroed). With
    ``rejection_mask`` (:func:`rollout_rejection_mask`'s output): ``rollout_rs_masked_fraction``
    (tokens) and ``rollout_rs_seq_masked_fraction`` (sequences with a rejected token).
    Raises ``ValueError`` when ``mask`` has no valid token.
    """
    if not bool(mask.bool().any()):
        raise ValueError("rollout_correction_metrics: the response mask has no valid token.")
    old, rollout = old_log_prob.detach(), rollout_log_prob.detach()
    out = _offpolicy_metrics(old, rollout, mask)
    if rollout_is is not None:
        out.update(_is_metrics(_log_ratio(old, rollout, mask), mask, rollout_is, rollout_is_threshold))
    if rejection_mask is not None:
        out.update(_rs_metrics(mask, rejection_mask))
    return {f"rollout_corr/{k}": v for k, v in out.items()}


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Everything a rollout-correction stage needs, from the ``algorithm.rollout_*`` options.

    Returns ``(weights, response_mask, metrics)``: the IS weights (None when ``rollout_is`` is None;
    rescaled to mean 1 with ``rollout_is_batch_normalize``, whose factor is the metric
    ``rollout_corr/rollout_is_batch_norm_factor``), the response mask after rejection (``mask`` itself
    when ``rollout_rs`` is None) and :func:`rollout_correction_metrics`. The weights are computed on the
    mask *before* rejection, as in verl; the losses then use the rejected mask.
    """
    weights, factor = None, None
    if rollout_is is not None:
        weights = rollout_is_weights(old_log_prob, rollout_log_prob, mask, rollout_is, rollout_is_threshold)
        if rollout_is_batch_normalize:
            weights, factor = normalize_is_weights(weights, mask, rollout_is)
    kept = None
    if rollout_rs is not None:
        kept = rollout_rejection_mask(old_log_prob, rollout_log_prob, mask, rollout_rs, rollout_rs_threshold)
    metrics = rollout_correction_metrics(old_log_prob, rollout_log_prob, mask, rollout_is, rollout_is_threshold, kept)
    if factor is not None:
        metrics["rollout_corr/rollout_is_batch_norm_factor"] = factor
    return weights, (mask if kept is None else kept), metrics


class RolloutCorrection(Stage):
    """After ``old_logprob``: the rollout-correction weights (column ``rollout_is_weights``) and the response
    mask after rejection, from the ``algorithm.rollout_*`` options, with their ``rollout_corr/*`` metrics.

    The correction compares the engine's log-probs with the trainer's, so when the old log-probs were taken
    from the engine (``actor.reuse_rollout_log_probs``), this stage recomputes them with the actor."""

    name = "rollout_correction"
    requires = frozenset({B.OLD_LOG_PROBS, B.ROLLOUT_LOG_PROBS, B.RESPONSE_MASK})
    produces = frozenset({ROLLOUT_IS_WEIGHTS})

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        alg = ctx.config.algorithm
        if batch[B.OLD_LOG_PROBS] is batch[B.ROLLOUT_LOG_PROBS]:
            batch[B.OLD_LOG_PROBS] = ctx.workers.actor.compute_log_probs(batch, "actor")
        weights, mask, metrics = compute_rollout_correction(
            batch[B.OLD_LOG_PROBS], batch[B.ROLLOUT_LOG_PROBS], batch[B.RESPONSE_MASK], alg.rollout_is,
            alg.rollout_is_threshold, alg.rollout_is_batch_normalize, alg.rollout_rs, alg.rollout_rs_threshold)
        batch[B.RESPONSE_MASK] = mask.to(batch[B.RESPONSE_MASK].dtype)
        if weights is not None:
            batch[ROLLOUT_IS_WEIGHTS] = weights
        ctx.log(metrics)
        return batch


class RolloutLogProbsAsOld(Stage):
    """Bypass mode (``actor.policy_loss=bypass_mode``, verl's ``rollout_correction.bypass_mode``): in place of
    ``old_logprob``, the engine's log-probs are the old ones (no actor forward pass); the policy loss applies the
    ``algorithm.rollout_*`` correction between the current policy and the engine's."""

    name = "bypass_old_logprob"
    requires = frozenset({B.ROLLOUT_LOG_PROBS})
    produces = frozenset({B.OLD_LOG_PROBS})

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch[B.OLD_LOG_PROBS] = batch[B.ROLLOUT_LOG_PROBS]
        return batch


__all__ = [
    "RolloutCorrection", "RolloutLogProbsAsOld", "ROLLOUT_IS_WEIGHTS",
    "SAFETY_BOUND", "ROLLOUT_IS_LEVELS", "ROLLOUT_RS_OPTIONS", "parse_is_threshold", "parse_rs_options",
    "parse_rs_thresholds", "rollout_is_weights", "normalize_is_weights", "rollout_rejection_mask",
    "rollout_correction_metrics", "compute_rollout_correction",
]
