"""Preference-learning losses: pure tensor functions of per-sequence log-probabilities.

Inputs are ``[N]`` tensors, one entry per completion: the log-probability of the completion's tokens
summed over the completion (``*_logps``) under the policy and, where a loss uses one, the frozen
reference model; ``*_lengths`` are the completions' token counts, for the losses that average over
tokens. Every loss returns per-example ``losses`` (the training loss is their mean, or their sum over
the whole batch divided by its size under data parallelism) and the detached implicit rewards that
:func:`preference_metrics` turns into TRL's metric names. Definitions follow the papers and TRL;
docs/algorithms/{dpo,ipo,kto,simpo,orpo,rm}.md give the formulas and hyperparameters.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F


class PreferenceLoss(NamedTuple):
    """Per-example losses and the detached implicit rewards of the chosen and rejected completions."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


class ORPOLoss(NamedTuple):
    """ORPO's odds-ratio term per example and its pieces (TRL's metric names in the comments)."""

    losses: torch.Tensor  # -beta * log sigmoid(log_odds): add losses.mean() to the chosen NLL
    chosen_rewards: torch.Tensor  # beta * mean log-prob of the chosen completion
    rejected_rewards: torch.Tensor
    log_odds: torch.Tensor  # log odds(chosen) - log odds(rejected); its mean is "log_odds_chosen"
    log_odds_ratio: torch.Tensor  # log sigmoid(log_odds); its mean is "log_odds_ratio"


def _positive(value: float, name: str) -> None:
    if not value > 0:
        raise ValueError(f"'{name}' must be > 0, got {value}.")


def _smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"'label_smoothing' must be in [0, 0.5], got {label_smoothing}.")


def _mean_logps(logps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Summed log-prob / number of tokens (a length of 0 counts as 1)."""
    return logps / torch.as_tensor(lengths, device=logps.device).to(logps.dtype).clamp(min=1)


def _smoothed_sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """``-(1 - eps) log sigmoid(z) - eps log sigmoid(-z)``: the preference flipped with probability eps."""
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> PreferenceLoss:
    """DPO, sigmoid loss (Rafailov et al., 2023), with conservative label smoothing (cDPO).

    ``h = (pi_c - ref_c) - (pi_r - ref_r)``; ``loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)``.
    Rewards: ``beta (pi - ref)`` of each completion.
    """
    _positive(beta, "beta")
    _smoothing(label_smoothing)
    chosen = policy_chosen_logps - reference_chosen_logps
    rejected = policy_rejected_logps - reference_rejected_logps
    losses = _smoothed_sigmoid_loss(beta * (chosen - rejected), label_smoothing)
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


def ipo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float = 0.1,
) -> PreferenceLoss:
    """IPO (Azar et al., 2023): ``loss = (h - 1 / (2 beta))^2`` with length-normalized log-ratios.

    ``h = (pi_c - ref_c) / L_c - (pi_r - ref_r) / L_r`` (TRL's normalization, which reproduces the
    paper's results). Rewards: ``beta (pi - ref)`` of each completion (summed, as TRL logs them).
    """
    _positive(beta, "beta")
    chosen = policy_chosen_logps - reference_chosen_logps
    rejected = policy_rejected_logps - reference_rejected_logps
    h = _mean_logps(chosen, chosen_lengths) - _mean_logps(rejected, rejected_lengths)
    losses = (h - 1.0 / (2.0 * beta)).square()
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


def kto_kl_estimate(policy_kl_logps: torch.Tensor, reference_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point ``z0 = max(0, mean(pi(y'|x) - ref(y'|x)))``, detached (0-d).

    The log-probs are of mismatched pairs (each prompt with another example's completion). Under data
    parallelism pass the log-probs gathered from all ranks, as TRL averages before clamping.
    """
    return (policy_kl_logps - reference_kl_logps).detach().mean().clamp(min=0.0)


def kto_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    kl: torch.Tensor | float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> PreferenceLoss:
    """KTO (Ethayarajh et al., 2024), unpaired: desirable and undesirable completions may differ in number.

    With ``r = pi - ref`` and the reference point ``kl`` (:func:`kto_kl_estimate`, no gradient):
    desirable ``1 - sigmoid(beta (r - kl))`` times ``desirable_weight``, undesirable
    ``1 - sigmoid(beta (kl - r))`` times ``undesirable_weight``. ``losses`` is both concatenated
    (desirable first). Rewards: ``beta r``.
    """
    _positive(beta, "beta")
    kl = torch.as_tensor(kl, dtype=policy_chosen_logps.dtype, device=policy_chosen_logps.device).detach()
    chosen = policy_chosen_logps - reference_chosen_logps
    rejected = policy_rejected_logps - reference_rejected_logps
    chosen_losses = 1.0 - torch.sigmoid(beta * (chosen - kl))
    rejected_losses = 1.0 - torch.sigmoid(beta * (kl - rejected))
    losses = torch.cat([desirable_weight * chosen_losses, undesirable_weight * rejected_losses])
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


def simpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float = 2.0,
    simpo_gamma: float = 1.0,
    label_smoothing: float = 0.0,
) -> PreferenceLoss:
    """SimPO (Meng et al., 2024): reference-free, length-normalized, with a target margin.

    ``z = beta (pi_c / L_c - pi_r / L_r) - simpo_gamma``;
    ``loss = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)``. Rewards: ``beta pi / L``.
    """
    _positive(beta, "beta")
    _smoothing(label_smoothing)
    chosen = _mean_logps(policy_chosen_logps, chosen_lengths)
    rejected = _mean_logps(policy_rejected_logps, rejected_lengths)
    losses = _smoothed_sigmoid_loss(beta * (chosen - rejected) - simpo_gamma, label_smoothing)
    return PreferenceLoss(losses, beta * chosen.detach(), beta * rejected.detach())


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, accurate on both sides of ``-log 2``."""
    return torch.where(x < -math.log(2.0), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_odds_ratio_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float = 0.1,
) -> ORPOLoss:
    """ORPO's odds-ratio term (Hong et al., 2024); the full loss is ``NLL(chosen) + losses.mean()``.

    With the mean token log-probs ``p = pi / L`` and ``log odds(p) = p - log(1 - e^p)``:
    ``log_odds = log odds(p_c) - log odds(p_r)``, ``losses = -beta log sigmoid(log_odds)``.
    Rewards: ``beta p``. The NLL term is the usual token-mean cross-entropy of the chosen completions,
    computed by the caller from the logits.
    """
    _positive(beta, "beta")
    chosen = _mean_logps(policy_chosen_logps, chosen_lengths)
    rejected = _mean_logps(policy_rejected_logps, rejected_lengths)
    log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
    ratio = F.logsigmoid(log_odds)
    return ORPOLoss(-beta * ratio, beta * chosen.detach(), beta * rejected.detach(), log_odds.detach(), ratio.detach())


def reward_model_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    center_rewards_coefficient: float = 0.0,
) -> torch.Tensor:
    """Bradley-Terry reward-model loss per pair: ``-log sigmoid(r_c - r_r - margin)``.

    ``margin`` (per pair or one number; None = 0) asks the chosen reward to win by at least that much
    (Llama 2). ``center_rewards_coefficient`` adds ``c (r_c + r_r)^2``, which keeps the rewards centred
    on 0 (TRL's option; 0 = off).
    """
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        diff = diff - torch.as_tensor(margin, dtype=diff.dtype, device=diff.device)
    losses = -F.logsigmoid(diff)
    if center_rewards_coefficient:
        losses = losses + center_rewards_coefficient * (chosen_rewards + rejected_rewards).square()
    return losses


def preference_metrics(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    policy_chosen_logps: torch.Tensor | None = None,
    policy_rejected_logps: torch.Tensor | None = None,
    paired: bool = True,
) -> dict[str, float]:
    """TRL's metric names: ``rewards/chosen``, ``rewards/rejected`` (means), ``rewards/margins`` (chosen
    mean minus rejected mean), ``rewards/accuracies`` (share of pairs where chosen > rejected; only when
    ``paired``), ``logps/chosen``, ``logps/rejected`` (means, when the log-probs are given).

    ``paired=False`` (KTO): the two sides may differ in size; a side with no example has no keys, and
    ``rewards/margins`` needs both sides.
    """
    if paired and chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(f"preference_metrics: paired rewards differ in shape, {tuple(chosen_rewards.shape)} "
                         f"vs {tuple(rejected_rewards.shape)} (pass paired=False for unpaired data).")
    out: dict[str, float] = {}
    for side, rewards, logps in (("chosen", chosen_rewards, policy_chosen_logps),
                                 ("rejected", rejected_rewards, policy_rejected_logps)):
        if rewards.numel():
            out[f"rewards/{side}"] = float(rewards.detach().double().mean())
        if logps is not None and logps.numel():
            out[f"logps/{side}"] = float(logps.detach().double().mean())
    if chosen_rewards.numel() and rejected_rewards.numel():
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    if paired and chosen_rewards.numel():
        out["rewards/accuracies"] = float((chosen_rewards > rejected_rewards).double().mean())
    return out


__all__ = [
    "PreferenceLoss", "ORPOLoss", "dpo_loss", "ipo_loss", "kto_kl_estimate", "kto_loss", "simpo_loss",
    "orpo_odds_ratio_loss", "reward_model_loss", "preference_metrics",
]
