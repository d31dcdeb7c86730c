"""Pure tensor functions for advantages, policy/value losses, KL penalties and reward shaping.

This module is the public import point (``from rlforge.algorithms import functional as F``). The
advantage estimators live in :mod:`rlforge.algorithms.estimators` and :mod:`rlforge.algorithms.token_baseline`,
the losses in :mod:`rlforge.algorithms.losses` and :mod:`rlforge.algorithms.pg_losses`, the rollout correction
in :mod:`rlforge.algorithms.rollout_correction`; all are re-exported here. Defined here: the KL-in-reward
penalty and its coefficient controllers, and DAPO's reward shaping, overlong filter and group filter.

Semantics follow verl's definitions (docs/algorithms/formulas.md lists each formula, its verl
counterpart and every deliberate difference). Shapes: ``[B, R]`` = sequences x response tokens;
``mask`` is the response mask (1 on valid tokens). No function here touches a model.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from rlforge.algorithms.estimators import (
    decoupled_gae_advantage,
    gae_advantage,
    gdpo_advantage,
    gpg_advantage,
    group_index,
    grpo_outcome_advantage,
    grpo_passk_advantage,
    length_adaptive_lambda,
    masked_var,
    masked_whiten,
    opo_advantage,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    remax_advantage,
    rloo_outcome_advantage,
    softmean,
    sppo_softmean_advantage,
    sppo_win_rate_advantage,
)
from rlforge.algorithms.losses import (
    GSPO_LOG_RATIO_CLAMP,
    KL_ESTIMATORS,
    LOG_RATIO_CLAMP,
    LOSS_AGG_MODES,
    agg_loss,
    clipped_policy_loss,
    distillation_loss,
    forward_kl_topk,
    gpg_policy_loss,
    gspo_policy_loss,
    kl_penalty,
    value_loss,
)
from rlforge.algorithms.pg_losses import (
    cispo_policy_loss,
    clip_cov_policy_loss,
    dppo_kl_policy_loss,
    dppo_tv_policy_loss,
    dro_policy_loss,
    geo_mean_policy_loss,
    kl_cov_policy_loss,
    positive_lm_loss,
    positive_lm_weights,
    reinforce_policy_loss,
    sapo_policy_loss,
    sppo_policy_loss,
)
from rlforge.algorithms.policy_filtration import (
    FILTER_METHODS,
    REWEIGHT_METHODS,
    pf_ppo_filter_indices,
    pf_ppo_resample_indices,
    pf_ppo_weights,
)
from rlforge.algorithms.token_baseline import (
    optimal_token_baseline_advantage,
    tir_optimal_token_baseline_advantage,
)
from rlforge.algorithms.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_OPTIONS,
    compute_rollout_correction,
    normalize_is_weights,
    parse_is_threshold,
    parse_rs_options,
    parse_rs_thresholds,
    rollout_correction_metrics,
    rollout_is_weights,
    rollout_rejection_mask,
)

# --- KL penalty in the reward ---------------------------------------------------------------------


def kl_in_reward(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract a per-token KL penalty from the scores: ``rewards = scores - kl_coef * KL * mask``.

    ``KL`` is :func:`kl_penalty` (``estimator``) of ``log_prob`` (the rollout policy, i.e. the old
    log-probs) against ``ref_log_prob``. Returns ``(token_level_rewards, mean_kl)`` where ``mean_kl``
    (0-d) is the mean over sequences of each sequence's mean KL over its valid tokens (a sequence
    with no valid token counts as 0), the value to feed :meth:`AdaptiveKLController.update`.
    """
    valid = mask.bool()
    kl = torch.where(valid, kl_penalty(log_prob, ref_log_prob, estimator), 0.0)
    rewards = token_level_scores - kl_coef * kl
    per_seq = kl.sum(-1) / valid.sum(-1).clamp(min=1)
    return rewards, per_seq.mean().detach()


class FixedKLController:
    """A constant KL coefficient (``update`` is a no-op)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Keep the coefficient (both arguments are ignored)."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional KL-coefficient controller (Ziegler et al., 2019, arXiv:1909.08593).

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``. The
    coefficient grows while the measured KL is above target and shrinks while it is below.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ValueError(f"AdaptiveKLController: target_kl must be > 0, got {target_kl}.")
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}.")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Move the coefficient towards the target.

        :param current_kl: the KL measured on the last batch (e.g. ``mean_kl`` of :func:`kl_in_reward`).
        :param n_steps: samples (sequences) in that batch.
        """
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


# --- DAPO: overlong reward shaping, overlong filtering and dynamic-sampling filter ------------------------


def overlong_penalty(
    response_lengths: torch.Tensor | Sequence[int],
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment, one value per sequence (``[B]``, <= 0), added to the score.

    ``min(-(L - (max_response_length - buffer_length)) / buffer_length * penalty_factor, 0)``: 0 up
    to ``max - buffer`` tokens, then linearly down to ``-penalty_factor`` at ``max_response_length``.
    """
    if buffer_length <= 0:
        raise ValueError(f"overlong_penalty: buffer_length must be > 0, got {buffer_length}.")
    lengths = torch.as_tensor(response_lengths)
    lengths = lengths.to(torch.get_default_dtype() if not lengths.is_floating_point() else lengths.dtype)
    exceed = lengths - (max_response_length - buffer_length)
    return (-exceed / buffer_length * penalty_factor).clamp(max=0.0)


def truncated_rows(responses: torch.Tensor, mask: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """Which responses were cut off (bool ``[B]``): their last generated token (the last where ``mask`` is 1) is
    none of ``stop_ids``. A row with no generated token is not truncated. DAPO's overlong filtering and TRL's
    ``mask_truncated_completions`` train none of these rows' tokens."""
    if not list(stop_ids):
        raise ValueError("truncated_rows: no stop_ids, so every response would count as truncated.")
    if responses.dim() != 2 or responses.shape != mask.shape:
        raise ValueError(f"truncated_rows: responses {tuple(responses.shape)} and mask {tuple(mask.shape)} must both "
                         f"be [B, R].")
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask.bool(), positions, -1).amax(-1)
    tokens = responses.gather(-1, last.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    stops = torch.as_tensor(list(stop_ids), dtype=responses.dtype, device=responses.device)
    return (last >= 0) & ~torch.isin(tokens, stops)


def uniform_group_mask(scores: torch.Tensor | Sequence[float], group_ids: Sequence[Hashable]) -> torch.Tensor:
    """DAPO dynamic sampling: which rows to KEEP (bool ``[B]``).

    A row is kept when its group's scores are not all equal (the group carries a learning signal) or
    its group has a single member. Groups where every sample scored the same are dropped.
    """
    if not isinstance(scores, torch.Tensor):
        scores = torch.tensor(scores, dtype=torch.float64)
    index, n = group_index(group_ids, scores.shape[0])
    s = scores.detach().to("cpu", torch.float64)
    lo = torch.full((n,), float("inf"), dtype=s.dtype).scatter_reduce(0, index, s, "amin")
    hi = torch.full((n,), float("-inf"), dtype=s.dtype).scatter_reduce(0, index, s, "amax")
    size = torch.zeros(n, dtype=torch.long).index_add_(0, index, torch.ones_like(index))
    return ((hi > lo) | (size == 1))[index].to(scores.device)


__all__ = [
    # constants
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "LOG_RATIO_CLAMP", "GSPO_LOG_RATIO_CLAMP",
    # advantage estimators (estimators.py)
    "masked_var", "masked_whiten", "group_index", "grpo_outcome_advantage", "grpo_passk_advantage",
    "rloo_outcome_advantage", "opo_advantage", "gpg_advantage", "reinforce_pp_baseline_advantage", "gae_advantage",
    "reinforce_pp_advantage", "remax_advantage", "gdpo_advantage", "decoupled_gae_advantage",
    "length_adaptive_lambda",
    "softmean", "sppo_softmean_advantage", "sppo_win_rate_advantage",
    # PF-PPO's sample selection (policy_filtration.py)
    "REWEIGHT_METHODS", "FILTER_METHODS", "pf_ppo_weights", "pf_ppo_resample_indices", "pf_ppo_filter_indices",
    # optimal token baseline (token_baseline.py)
    "optimal_token_baseline_advantage", "tir_optimal_token_baseline_advantage",
    # losses (losses.py)
    "agg_loss", "clipped_policy_loss", "gspo_policy_loss", "gpg_policy_loss", "value_loss", "kl_penalty",
    "distillation_loss",
    "forward_kl_topk",
    # verl 0.9's other policy losses (pg_losses.py)
    "cispo_policy_loss", "dppo_tv_policy_loss", "dppo_kl_policy_loss", "sapo_policy_loss", "clip_cov_policy_loss",
    "kl_cov_policy_loss", "geo_mean_policy_loss", "sppo_policy_loss", "dro_policy_loss", "reinforce_policy_loss",
    "positive_lm_weights", "positive_lm_loss",
    # rollout correction (rollout_correction.py)
    "ROLLOUT_IS_LEVELS", "ROLLOUT_RS_OPTIONS", "parse_is_threshold", "parse_rs_options", "parse_rs_thresholds",
    "rollout_is_weights", "normalize_is_weights", "rollout_rejection_mask", "rollout_correction_metrics",
    "compute_rollout_correction",
    # KL in reward, DAPO (here)
    "kl_in_reward", "FixedKLController", "AdaptiveKLController", "overlong_penalty", "uniform_group_mask",
]
