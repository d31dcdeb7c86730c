"""verl 0.9's other policy losses (algorithms/pg_losses.py), hand-computed, and the policy-loss registry."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.algorithms import functional as F
from rlforge.algorithms.grpo import GRPO
from rlforge.config import compose
from rlforge.errors import ConfigError
from rlforge.module import LossContext
from rlforge.protocols import PolicyLossOutput


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _close(actual: torch.Tensor, expected, atol: float = 1e-9) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-7)


def _grad(fn, logp: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """(loss matrix, stats, d sum(loss) / d log_prob)."""
    logp = logp.clone().requires_grad_(True)
    loss, stats = fn(logp, *args, **kwargs)
    loss.sum().backward()
    return loss.detach(), stats, logp.grad


OLD_HALF = torch.full((1, 4), math.log(0.5), dtype=torch.float64)  # p_old = 0.5 on every token


# --- CISPO ------------------------------------------------------------------------------------------------


def test_cispo_weighs_the_log_likelihood_by_the_clipped_ratio_without_its_gradient() -> None:
    ratio = _t([[1.5, 0.5, 1.0, 3.0]])
    logp = OLD_HALF + ratio.log()
    adv = _t([[1.0, 1.0, -1.0, 2.0]])
    mask = _t([[1, 1, 1, 0]])
    loss, stats, grad = _grad(F.cispo_policy_loss, logp, OLD_HALF, adv, mask, 0.2, 0.28)
    # clip(r, 0.8, 1.28) = 1.28, 0.8, 1.0; L = -clip * A * log p, with p = 0.5 r = 0.75, 0.25, 0.5
    _close(loss, [[-1.28 * math.log(0.75), -0.8 * math.log(0.25), 1.0 * math.log(0.5), 0.0]])
    # the clipped ratio is a constant: dL/dlogp = -clip * A, even for the clipped tokens (PPO would give 0)
    _close(grad, [[-1.28, -0.8, 1.0, 0.0]])
    _close(stats["clipped"][:, :3], [[1.0, 1.0, 0.0]])


# --- DPPO -------------------------------------------------------------------------------------------------


def test_dppo_tv_keeps_tokens_whose_probability_moved_less_than_the_bound() -> None:
    p = _t([[0.8, 0.45, 0.25, 0.6]])  # p - p_old = 0.3, -0.05, -0.25, 0.1
    adv = _t([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.float64)
    loss, stats, grad = _grad(F.dppo_tv_policy_loss, p.log(), OLD_HALF, adv, mask, 0.2, 0.2, 3.0)
    # A > 0 keeps p - p_old <= 0.2 (token 0 out, 1 in); A < 0 keeps p - p_old >= -0.2 (token 2 out, 3 in)
    # kept: L = -A * sg[min(r, 3)] * log p with r = p / 0.5 = 0.9 and 1.2
    _close(loss, [[0.0, -0.9 * math.log(0.45), 0.0, 1.2 * math.log(0.6)]])
    _close(grad, [[0.0, -0.9, 0.0, 1.2]])
    _close(stats["clipped"], [[1.0, 0.0, 1.0, 0.0]])
    # the truncation at clip_ratio_c: r = 1.2 > 1.1 on a kept token -> weight 1.1, counted in clipped_lower
    loss, stats, grad = _grad(F.dppo_tv_policy_loss, p.log(), OLD_HALF, adv, mask, 0.2, 0.2, 1.1)
    _close(grad, [[0.0, -0.9, 0.0, 1.1]])
    _close(stats["clipped_lower"], [[0.0, 0.0, 0.0, 1.0]])


def test_dppo_kl_bounds_the_binary_kl_in_the_advantages_direction_only() -> None:
    p = _t([[0.8, 0.45, 0.25, 0.6]])
    adv = _t([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.float64)
    # binary KL(0.5 || p) = 0.5 log(0.5 / p) + 0.5 log(0.5 / (1 - p)):
    # p = 0.8: 0.5 log(1.5625) = 0.2231 > 0.2 and p rose with A > 0: dropped
    # p = 0.45 fell with A > 0: kept whatever its KL; p = 0.6 rose with A < 0: kept
    # p = 0.25 fell with A < 0: 0.5 log(4/3) = 0.1438 <= 0.2: kept
    _, stats, grad = _grad(F.dppo_kl_policy_loss, p.log(), OLD_HALF, adv, mask, 0.2, 0.2, 3.0)
    _close(stats["clipped"], [[1.0, 0.0, 0.0, 0.0]])
    _close(grad, [[0.0, -0.9, 0.5, 1.2]])  # -A * r
    # a lower bound of 0.1 < 0.1438 drops the falling token with A < 0 as well
    _, stats, _ = _grad(F.dppo_kl_policy_loss, p.log(), OLD_HALF, adv, mask, 0.1, 0.2, 3.0)
    _close(stats["clipped"], [[1.0, 0.0, 1.0, 0.0]])


# --- SAPO -------------------------------------------------------------------------------------------------


def test_sapo_gate_has_the_ppo_gradient_at_ratio_one_and_decays_away_from_it() -> None:
    old = torch.zeros(1, 3, dtype=torch.float64) + math.log(0.25)
    logp = old + _t([[0.0, 0.0, math.log(2.0)]])  # ratios 1, 1, 2
    adv = _t([[1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.float64)
    loss, _, grad = _grad(F.sapo_policy_loss, logp, old, adv, mask, 1.0, 1.05)
    # gate f(r) = sigmoid(tau (r - 1)) 4 / tau: f(1) = 2 / tau; L = -A f(r)
    s1 = 1 / (1 + math.exp(-1.0))  # sigmoid(1 * (2 - 1))
    _close(loss, [[-2.0, 2.0 / 1.05, -4.0 * s1]])
    # df/dlogp = sigmoid' * tau * r * 4 / tau = 4 r sigmoid(1 - sigmoid): 1 at r = 1 (both taus), 8 s1 (1 - s1) at r = 2
    _close(grad, [[-1.0, 1.0, -8.0 * s1 * (1 - s1)]])


# --- Clip-Cov and KL-Cov ---------------------------------------------------------------------------------

# one row of 4 tokens; log-probs centred on their mean -1.1: +1, -1, 0, 0
LOGP_COV = _t([[-0.1, -2.1, -1.1, -1.1]])


def test_clip_cov_cuts_the_gradient_of_random_high_covariance_tokens() -> None:
    adv = _t([[3.0, -3.0, 1.0, -1.0]])  # mean 0: covariance (A - 0)(logp + 1.1) = 3, 3, 0, 0
    mask = torch.ones(1, 4, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    # ratio 1 everywhere, so no token is PPO-clipped; candidates: 1 < cov < 5 -> tokens 0 and 1
    loss, stats, grad = _grad(F.clip_cov_policy_loss, LOGP_COV, LOGP_COV, adv, mask, 0.2, 0.2, 0.25, 1.0, 5.0,
                              generator=g)
    # int(0.25 * 4) = 1 token drawn from the two: its loss and gradient are 0, the others are PPO's -A r
    cut = stats["clipped"][0]
    assert cut.sum() == 1 and cut[:2].sum() == 1
    plain = -adv[0]
    _close(loss[0], torch.where(cut.bool(), 0.0, plain))
    _close(grad[0], torch.where(cut.bool(), 0.0, -adv[0]))  # d(-A r)/dlogp = -A r = -A
    # a share of 0.5 draws 2 tokens: both candidates; a PPO-clipped token is never a candidate
    _, stats, _ = _grad(F.clip_cov_policy_loss, LOGP_COV, LOGP_COV, adv, mask, 0.2, 0.2, 0.5, 1.0, 5.0)
    _close(stats["clipped"], [[1.0, 1.0, 0.0, 0.0]])
    old = LOGP_COV - _t([[0.5, 0.0, 0.0, 0.0]])  # token 0: r = e^0.5 > 1.2 with A > 0: clipped by PPO
    _, stats, _ = _grad(F.clip_cov_policy_loss, LOGP_COV, old, adv, mask, 0.2, 0.2, 0.5, 1.0, 5.0)
    _close(stats["clipped"], [[0.0, 1.0, 0.0, 0.0]])


def test_kl_cov_penalizes_the_top_covariance_tokens() -> None:
    adv = _t([[3.0, -2.0, 1.0, -1.0]])  # mean 0.25: covariance 2.75, 2.25, 0, 0
    old = LOGP_COV - _t([[0.2, 0.0, 0.0, 0.0]])  # token 0's log-ratio is 0.2
    mask = torch.ones(1, 4, dtype=torch.float64)
    loss, stats, grad = _grad(F.kl_cov_policy_loss, LOGP_COV, old, adv, mask, 0.25, 0.1)
    # k = int(0.25 * 4) = 1: token 0 gets + 0.1 |logp - old|; all: -A r
    r0 = math.exp(0.2)
    _close(loss, [[-3.0 * r0 + 0.1 * 0.2, 2.0, -1.0, 1.0]])
    _close(grad, [[-3.0 * r0 + 0.1, 2.0, -1.0, 1.0]])
    _close(stats["penalized"], [[1.0, 0.0, 0.0, 0.0]])
    _close(stats["abs_log_ratio"], [[0.2, 0.0, 0.0, 0.0]])


# --- GMPO (geo_mean) ------------------------------------------------------------------------------------


def test_geo_mean_clips_each_log_ratio_on_the_advantages_side() -> None:
    old = torch.full((1, 3), -1.0, dtype=torch.float64)
    mask = _t([[1, 1, 0]])
    # A > 0: x = 0.1, 0.5 -> min(x, clamp(x, -0.2, 0.28)) = 0.1, 0.28; rho = exp(mean) = exp(0.19), L = -1 * rho
    logp = old + _t([[0.1, 0.5, 9.0]])
    loss, stats, grad = _grad(F.geo_mean_policy_loss, logp, old, torch.ones(1, 3, dtype=torch.float64), mask,
                              0.2, 0.28)
    rho = math.exp(0.19)
    _close(loss, [[-rho, -rho, 0.0]])  # the sequence's loss on each valid token
    mean = F.agg_loss(loss, mask, "seq-mean-token-mean")
    _close(mean, -rho)
    # gradient of the summed matrix: 2 tokens x d(-rho)/dx_t = -rho / 2 for the unclipped token, 0 for the clipped one
    _close(grad, [[-rho, 0.0, 0.0]])
    _close(stats["clipped"], [[0.0, 1.0, 0.0]])
    # A < 0: x = -0.5, 0.1 -> max(x, clamp(x)) = -0.2, 0.1 (only a fall below -low is clipped); L = +rho
    logp = old + _t([[-0.5, 0.1, 0.0]])
    loss, stats, _ = _grad(F.geo_mean_policy_loss, logp, old, -torch.ones(1, 3, dtype=torch.float64), mask, 0.2, 0.28)
    _close(loss, [[math.exp(-0.05), math.exp(-0.05), 0.0]])
    _close(stats["clipped_lower"], [[1.0, 0.0, 0.0]])


# --- SPPO, DRO, REINFORCE ---------------------------------------------------------------------------------


def test_sppo_is_the_squared_error_of_the_sequence_log_ratio() -> None:
    old = torch.full((1, 3), -1.0, dtype=torch.float64)
    logp = old + _t([[0.2, 0.1, 5.0]])  # D = 0.3 over the 2 valid tokens
    mask = _t([[1, 1, 0]])
    adv = _t([[0.5, 0.5, 0.0]])
    loss, _, _ = _grad(F.sppo_policy_loss, logp, old, adv, mask, 1.0)
    _close(loss, [[0.04, 0.04, 0.0]])  # (0.3 - 0.5)^2 on each valid token
    logp = logp.clone().requires_grad_(True)
    F.agg_loss(F.sppo_policy_loss(logp, old, adv, mask, 1.0)[0], mask, "seq-mean-token-mean").backward()
    _close(logp.grad, [[-0.4, -0.4, 0.0]])  # 2 (D - eta A) on every token
    # no gradient where D = eta A (eta = 0.6: 0.6 * 0.5 = 0.3)
    logp.grad = None
    F.agg_loss(F.sppo_policy_loss(logp, old, adv, mask, 0.6)[0], mask, "seq-mean-token-mean").backward()
    _close(logp.grad, torch.zeros(1, 3))


def test_dro_penalizes_the_squared_log_ratio() -> None:
    logp, old = _t([[-1.0]]), _t([[-1.5]])
    loss, _, grad = _grad(F.dro_policy_loss, logp, old, _t([[2.0]]), _t([[1.0]]), 0.5)
    _close(loss, [[2.0625]])  # -(-1 * 2 - 0.25 * 0.5^2)
    _close(grad, [[-1.75]])  # -A + beta (logp - old)
    with pytest.raises(ValueError, match="beta must be > 0"):
        F.dro_policy_loss(logp, old, _t([[2.0]]), _t([[1.0]]), 0.0)


def test_reinforce_is_the_weighted_log_likelihood() -> None:
    loss, stats, grad = _grad(F.reinforce_policy_loss, _t([[-1.0, -2.0]]), _t([[1.0, -1.0]]), _t([[1, 1]]),
                              _t([[0.5, 2.0]]))
    _close(loss, [[0.5, -4.0]])
    _close(grad, [[-0.5, 2.0]])
    assert stats == {}


# --- VAPO's positive-example LM loss ----------------------------------------------------------------------


def test_positive_lm_weights_normalize_by_the_positive_tokens_of_each_mini_batch() -> None:
    mask = (torch.arange(4)[None, :] < torch.tensor([2, 3, 1, 4])[:, None]).double()
    positive = torch.tensor([True, False, True, True])
    w = F.positive_lm_weights(positive, mask, 2)
    # mini-batch rows 0-1: N = 2 (row 0's tokens); rows 2-3: N = 1 + 4 = 5
    _close(w, [0.5, 0.0, 0.2, 0.2])
    logp = -torch.ones(4, 4, dtype=torch.float64)
    # the two mini-batches' losses: (1/2) 2 and (1/5) (1 + 4): each the mean NLL of its positive tokens = 1
    _close(F.positive_lm_loss(logp[:2], mask[:2], w[:2]), 1.0)
    _close(F.positive_lm_loss(logp[2:], mask[2:], w[2:]), 1.0)
    _close(F.positive_lm_weights(torch.zeros(4, dtype=torch.bool), mask, 2), [0.0] * 4)


# --- the registry ------------------------------------------------------------------------------------------

VERL_LOSSES = ("vanilla", "gspo", "gpg", "cispo", "sapo", "clip_cov", "kl_cov", "geo_mean", "dppo_tv", "dppo_kl",
               "dro", "bypass_mode")


def test_verl_losses_are_registered_and_vanilla_is_the_default(registry, default_config) -> None:
    assert set(VERL_LOSSES) | {"sppo"} <= set(registry.policy_loss.available())
    assert default_config.actor.policy_loss == "vanilla"
    assert default_config.actor.sapo.tau_pos == 1.0 and default_config.actor.sapo.tau_neg == 1.05
    assert (default_config.actor.clip_cov.ratio, default_config.actor.clip_cov.lb, default_config.actor.clip_cov.ub) \
        == (0.0002, 1.0, 5.0)
    assert (default_config.actor.kl_cov.ratio, default_config.actor.kl_cov.coef) == (0.0002, 0.1)


def test_unknown_loss_and_missing_dro_beta_fail_at_composition(registry) -> None:
    with pytest.raises(Exception, match="actor.policy_loss") as info:
        compose(registry, None, None, ["actor.policy_loss=cispo2"])
    assert "cispo" in str(info.value)
    with pytest.raises(ConfigError, match="actor.dro.beta"):
        compose(registry, None, None, ["actor.policy_loss=dro"])
    assert compose(registry, None, None, ["actor.policy_loss=dro", "actor.dro.beta=0.1"]).actor.dro.beta == 0.1


def _batch(rows: int = 4) -> B.Batch:
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(rows, 5, generator=g, dtype=torch.float64) - 0.05
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 3, 4, 2])[:rows, None]).double()
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, 5) * mask
    return B.Batch({B.OLD_LOG_PROBS: old, B.ROLLOUT_LOG_PROBS: old - 0.05, B.ADVANTAGES: adv, B.RESPONSE_MASK: mask},
                   {B.UID: list(range(rows))})


@pytest.mark.parametrize("name", [n for n in (*VERL_LOSSES, "sppo") if n not in ("clip_cov", "kl_cov")])
def test_every_row_separable_loss_sums_over_micro_batches(registry, name) -> None:
    """clip_cov and kl_cov pick tokens from the micro-batch's own statistics (as verl), so they are not."""
    extra = ["actor.dro.beta=0.5"] if name == "dro" else []
    module = GRPO(compose(registry, None, None, [f"actor.policy_loss={name}", *extra]))
    module.registry = registry
    batch = _batch()
    logp = batch[B.OLD_LOG_PROBS] + 0.2 * torch.randn(4, 5, generator=torch.Generator().manual_seed(4),
                                                      dtype=torch.float64)
    ctx = LossContext(global_tokens=float(batch[B.RESPONSE_MASK].sum()), global_seqs=4.0)
    full, metrics = module.policy_loss(batch, logp, None, ctx)
    parts = sum(module.policy_loss(batch.select(r), logp[r], None, ctx)[0] for r in ([0, 1], [2, 3]))
    assert parts.item() == pytest.approx(full.item(), rel=1e-9, abs=1e-12)
    assert "actor/pg_loss" in metrics


def test_sapo_aggregates_per_sequence_unless_told_otherwise(registry) -> None:
    batch, logp = _batch(), _batch()[B.OLD_LOG_PROBS] + 0.1
    ctx = LossContext(global_tokens=float(batch[B.RESPONSE_MASK].sum()), global_seqs=4.0)
    losses = {}
    for mode in ("seq-mean-token-mean", "null"):
        module = GRPO(compose(registry, None, None, ["actor.policy_loss=sapo", f"actor.sapo.loss_agg_mode={mode}"]))
        losses[mode] = module.policy_loss(batch, logp, None, ctx)[0].item()
    mat, _ = F.sapo_policy_loss(logp, batch[B.OLD_LOG_PROBS], batch[B.ADVANTAGES], batch[B.RESPONSE_MASK])
    assert losses["seq-mean-token-mean"] == pytest.approx(F.agg_loss(mat, batch[B.RESPONSE_MASK],
                                                                     "seq-mean-token-mean").item())
    assert losses["null"] == pytest.approx(F.agg_loss(mat, batch[B.RESPONSE_MASK], "token-mean").item())  # actor's


def test_bypass_mode_takes_the_engines_log_probs_and_corrects_inside_the_loss(registry) -> None:
    cfg = compose(registry, None, None, ["actor.policy_loss=bypass_mode", "algorithm.rollout_is=token"])
    names = GRPO(cfg).flow().names()
    assert "bypass_old_logprob" in names and "old_logprob" not in names and "rollout_correction" not in names
    cfg = compose(registry, None, None, ["algorithm.rollout_is=token"])  # decoupled: the stage after old_logprob
    names = GRPO(cfg).flow().names()
    assert names[names.index("old_logprob") + 1] == "rollout_correction"


def test_a_plugin_registers_its_own_policy_loss(no_autoload) -> None:
    from dataclasses import dataclass

    from rlforge.hookspecs import hookimpl
    from rlforge.plugin_manager import PluginManager

    calls = []

    def half_vanilla(inputs):
        """PPO clip, halved."""
        calls.append(inputs.config.actor.half.factor)
        loss, _ = F.clipped_policy_loss(inputs.log_prob, inputs.old_log_prob, inputs.advantages, inputs.mask)
        return PolicyLossOutput(loss * inputs.config.actor.half.factor, {})

    @dataclass
    class Half:
        factor: float = 0.5  # scales the loss

    class Plugin:
        @hookimpl
        def rlforge_register(self, registry):
            registry.policy_loss.register("half", half_vanilla, config=Half)

    pm = PluginManager()
    pm.register(Plugin(), "half-plugin")
    cfg = load_config("grpo", ["actor.policy_loss=half"], plugins=pm)
    module = pm.registry.algorithm.get("grpo")(cfg)
    module.registry = pm.registry
    batch, logp = _batch(), _batch()[B.OLD_LOG_PROBS]
    ctx = LossContext(global_tokens=float(batch[B.RESPONSE_MASK].sum()), global_seqs=4.0)
    loss, _ = module.policy_loss(batch, logp, None, ctx)
    plain, _ = F.clipped_policy_loss(logp, batch[B.OLD_LOG_PROBS], batch[B.ADVANTAGES], batch[B.RESPONSE_MASK])
    assert loss.item() == pytest.approx(0.5 * F.agg_loss(plain, batch[B.RESPONSE_MASK]).item())
    assert calls == [0.5]
