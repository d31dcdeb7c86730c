"""The policy-loss registry (verl 0.9's ``actor.policy_loss.loss_mode``): ``actor.policy_loss=NAME``.

Every built-in loss is registered here under verl's name, with its options (if any) at ``actor.<name>.*``; a plugin
registers its own the same way (``registry.policy_loss.register("mine", fn, config=MyOptions)``). A policy loss is
called once per micro-batch with :class:`rlforge.protocols.PolicyLossInputs` and returns
:class:`rlforge.protocols.PolicyLossOutput`; ``PolicyGradientModule.policy_loss`` aggregates it and adds the
entropy and KL terms. The math is in the pure functions (``losses.py``, ``pg_losses.py``); this module only reads
the config. docs/algorithms/policy_losses.md describes each loss, its keys and the differences from verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from rlforge.algorithms.names import LOSS_AGG_MODES
from rlforge.algorithms.rollout_correction import SAFETY_BOUND

from rlforge.config.schema import option
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.protocols import PolicyLossInputs, PolicyLossOutput

if TYPE_CHECKING:
    import torch
    from rlforge.algorithms import functional as F
else:
    torch = lazy_import("torch")
    F = lazy_import("rlforge.algorithms.functional")

# the pure functions' statistics -> the metric names verl logs them under
STAT_METRICS = {
    "clipped": "actor/pg_clipfrac",
    "clipped_lower": "actor/pg_clipfrac_lower",
    "neg_log_ratio": "actor/ppo_kl",
    "abs_log_ratio": "actor/ppo_kl",
    "penalized": "actor/kl_cov_frac",
}


def _output(result: tuple[torch.Tensor, dict[str, torch.Tensor]], agg_mode: str | None = None,
            mask: torch.Tensor | None = None) -> PolicyLossOutput:
    loss, stats = result
    return PolicyLossOutput(loss, {STAT_METRICS[k]: v for k, v in stats.items()}, mask, agg_mode)


def _tensors(i: PolicyLossInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return i.log_prob, i.old_log_prob, i.advantages, i.mask


# --- options (actor.<name>.*) -----------------------------------------------------------------------------


@dataclass
class SapoOptions:
    tau_pos: float = option(1.0, gt=0)  # gate temperature where A > 0 (verl: actor.tau_pos)
    tau_neg: float = option(1.05, gt=0)  # gate temperature where A <= 0 (verl: actor.tau_neg)
    loss_agg_mode: Optional[str] = option("seq-mean-token-mean", choices=LOSS_AGG_MODES)  # verl always aggregates SAPO per sequence; None = actor.loss_agg_mode


@dataclass
class ClipCovOptions:
    ratio: float = option(0.0002, gt=0, le=1)  # share of the valid tokens whose gradient is cut (verl: clip_cov_ratio)
    lb: float = 1.0  # covariance lower bound of the candidates (verl: clip_cov_lb)
    ub: float = 5.0  # covariance upper bound of the candidates (verl: clip_cov_ub)


@dataclass
class KlCovOptions:
    ratio: float = option(0.0002, gt=0, le=1)  # share of the valid tokens that get the KL penalty (verl: kl_cov_ratio)
    coef: float = option(0.1, ge=0)  # weight of the |log-ratio| penalty (verl: ppo_kl_coef)


@dataclass
class DroOptions:
    beta: Optional[float] = option(None, gt=0)  # weight of the quadratic log-ratio penalty; required (verl: dro_beta)


@dataclass
class BypassOptions:
    loss_type: str = option("ppo_clip", choices=("ppo_clip", "reinforce"))  # ppo_clip: PPO clip on pi / pi_rollout, no extra weight; reinforce: -w A log pi with the IS weights and rejection of algorithm.rollout_*


@dataclass
class SppoOptions:
    eta: float = option(1.0, gt=0)  # scale of the target eta * A the sequence log-ratio regresses onto (verl: actor.sppo_eta)


# --- the losses --------------------------------------------------------------------------------------------


def vanilla(i: PolicyLossInputs) -> PolicyLossOutput:
    """PPO clip with clip-higher and dual clip (clip_ratio_low/high, clip_ratio_c)."""
    a = i.config.actor
    return _output(F.clipped_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c,
                                         i.rollout_is_weights))


def gspo(i: PolicyLossInputs) -> PolicyLossOutput:
    """GSPO: PPO clip on the length-normalized sequence ratio, token-level gradient."""
    a = i.config.actor
    return _output(F.gspo_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, i.rollout_is_weights))


def gpg(i: PolicyLossInputs) -> PolicyLossOutput:
    """GPG: -A log pi, no ratio, no clip."""
    return _output(F.gpg_policy_loss(i.log_prob, i.advantages, i.mask, i.rollout_is_weights))


def cispo(i: PolicyLossInputs) -> PolicyLossOutput:
    """CISPO: -sg[clip(ratio)] A log pi (MiniMax-M1)."""
    a = i.config.actor
    return _output(F.cispo_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, i.rollout_is_weights))


def sapo(i: PolicyLossInputs) -> PolicyLossOutput:
    """SAPO: a sigmoid gate on the ratio instead of the clip (tau_pos / tau_neg)."""
    o = i.config.actor.sapo
    return _output(F.sapo_policy_loss(*_tensors(i), o.tau_pos, o.tau_neg, i.rollout_is_weights), o.loss_agg_mode)


def clip_cov(i: PolicyLossInputs) -> PolicyLossOutput:
    """Clip-Cov: PPO clip, no gradient on a few random high-covariance tokens."""
    a, o = i.config.actor, i.config.actor.clip_cov
    return _output(F.clip_cov_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, o.ratio, o.lb, o.ub,
                                          i.rollout_is_weights))


def kl_cov(i: PolicyLossInputs) -> PolicyLossOutput:
    """KL-Cov: the unclipped surrogate with a |log-ratio| penalty on the top-covariance tokens."""
    o = i.config.actor.kl_cov
    return _output(F.kl_cov_policy_loss(*_tensors(i), o.ratio, o.coef, i.rollout_is_weights))


def geo_mean(i: PolicyLossInputs) -> PolicyLossOutput:
    """GMPO: the clipped geometric mean of the token ratios, one loss per sequence."""
    a = i.config.actor
    return _output(F.geo_mean_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, i.rollout_is_weights),
                   "seq-mean-token-mean")


def dppo_tv(i: PolicyLossInputs) -> PolicyLossOutput:
    """DPPO-Binary-TV: a probability-difference trust region, truncated ratio times log pi."""
    a = i.config.actor
    return _output(F.dppo_tv_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c,
                                         i.rollout_is_weights))


def dppo_kl(i: PolicyLossInputs) -> PolicyLossOutput:
    """DPPO-Binary-KL: a binary-KL trust region, truncated ratio times log pi."""
    a = i.config.actor
    return _output(F.dppo_kl_policy_loss(*_tensors(i), a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c,
                                         i.rollout_is_weights))


def sppo(i: PolicyLossInputs) -> PolicyLossOutput:
    """SPPO: (sequence log-ratio - eta A)^2."""
    return _output(F.sppo_policy_loss(*_tensors(i), i.config.actor.sppo.eta, i.rollout_is_weights))


class Dro:
    """DRO: -(A log pi - beta/2 (log pi - log pi_old)^2); actor.dro.beta is required."""

    def __call__(self, i: PolicyLossInputs) -> PolicyLossOutput:
        return _output(F.dro_policy_loss(*_tensors(i), i.config.actor.dro.beta, i.rollout_is_weights))

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        if config.actor.dro.beta is None:
            raise ConfigError("actor.policy_loss=dro needs 'actor.dro.beta' (> 0), the weight of its quadratic "
                              "log-ratio penalty, e.g. actor.dro.beta=0.1.")


class BypassMode:
    """Rollout correction's bypass mode: the engine's log-probs are the old ones; IS/rejection inside the loss."""

    # the module's flow takes the old log-probs from the engine (no actor forward) and runs no RolloutCorrection stage
    uses_rollout_log_probs = True

    def __call__(self, i: PolicyLossInputs) -> PolicyLossOutput:
        alg, a = i.config.algorithm, i.config.actor
        rollout = i.old_log_prob  # bypass: old_log_probs are the engine's
        weights, kept, _ = F.compute_rollout_correction(
            i.log_prob.detach(), rollout, i.mask, alg.rollout_is, alg.rollout_is_threshold,
            alg.rollout_is_batch_normalize, alg.rollout_rs, alg.rollout_rs_threshold)
        kept = kept.to(i.mask.dtype)
        if a.bypass_mode.loss_type == "reinforce":
            out = _output(F.reinforce_policy_loss(i.log_prob, i.advantages, kept, weights), mask=kept)
            out.stats["actor/ppo_kl"] = (rollout - i.log_prob).detach()
        else:  # ppo_clip: the ratio pi / pi_rollout is the IS correction; the weights are not applied
            out = _output(F.clipped_policy_loss(i.log_prob, rollout, i.advantages, kept, a.clip_ratio_low,
                                                a.clip_ratio_high, a.clip_ratio_c), mask=kept)
        log_ratio = torch.where(i.mask.bool(), (i.log_prob - rollout).detach(), 0.0)
        safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        out.stats["rollout_corr/kl"] = -log_ratio
        out.stats["rollout_corr/k3_kl"] = safe.exp() - safe - 1.0
        if weights is not None:
            out.stats["rollout_corr/rollout_is_mean"] = weights
        if alg.rollout_rs is not None:
            out.stats["rollout_corr/rollout_rs_masked_fraction"] = (i.mask.bool() & ~kept.bool()).float()
        return out


@hookimpl
def rlforge_register(registry: Any) -> None:
    reg = registry.policy_loss
    reg.register("vanilla", vanilla)
    reg.register("gspo", gspo)
    reg.register("gpg", gpg)
    reg.register("cispo", cispo)
    reg.register("sapo", sapo, config=SapoOptions)
    reg.register("clip_cov", clip_cov, config=ClipCovOptions)
    reg.register("kl_cov", kl_cov, config=KlCovOptions)
    reg.register("geo_mean", geo_mean)
    reg.register("dppo_tv", dppo_tv)
    reg.register("dppo_kl", dppo_kl)
    reg.register("dro", Dro(), config=DroOptions, description=Dro.__doc__.splitlines()[0])
    reg.register("bypass_mode", BypassMode(), config=BypassOptions, description=BypassMode.__doc__.splitlines()[0])
    reg.register("sppo", sppo, config=SppoOptions)
