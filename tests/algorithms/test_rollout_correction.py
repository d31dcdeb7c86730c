"""Rollout correction (verl's rollout_is / rollout_rs) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.algorithms import functional as F
from rlforge.algorithms import rollout_correction as RC
from rlforge.algorithms.base import ROLLOUT_IS_WEIGHTS
from rlforge.errors import ConfigError
from rlforge.module import LossContext
from rlforge.plugin_manager import PluginManager

LN2 = math.log(2.0)


def _close(actual, expected, atol: float = 1e-9) -> None:
    actual = torch.as_tensor(actual, dtype=torch.float64)
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=1e-9)


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _pair(ratios, mask, base: float = -1.0):
    """(old, rollout) log-probs whose per-token ratio pi_old / pi_rollout is ``ratios`` on valid tokens;
    the rollout log-probs are -inf on masked positions (garbage that must not leak)."""
    mask = _t(mask)
    rollout = torch.where(mask.bool(), torch.full_like(mask, base), float("-inf"))
    old = torch.full_like(mask, base) + torch.log(_t(ratios))
    return old, rollout, mask


# ratios 0.5, 1, 3 and a masked position; a second row with 1.5 alone
OLD, ROLLOUT, MASK = _pair([[0.5, 1.0, 3.0, 1.0], [1.5, 1.0, 1.0, 1.0]], [[1, 1, 1, 0], [1, 0, 0, 0]])


# --- threshold specifications ------------------------------------------------------------------------


def test_parse_is_threshold() -> None:
    assert F.parse_is_threshold(2) == (None, 2.0)
    assert F.parse_is_threshold("2.0") == (None, 2.0)  # the config stores it as a string
    assert F.parse_is_threshold("0.5_5.0") == (0.5, 5.0)  # IcePop bounds


@pytest.mark.parametrize("spec, message", [
    ("abc", "'abc' is not a number"), ("-1", "must be > 0"), ("0_2", "must be > 0"),
    ("5_0.5", "lower bound 5.0 is above the upper bound 0.5"), (True, "a number or 'lower_upper'"),
])
def test_parse_is_threshold_errors(spec, message) -> None:
    with pytest.raises(ValueError, match=message):
        F.parse_is_threshold(spec)


def test_parse_rs_thresholds() -> None:
    assert F.parse_rs_thresholds("token_k1, seq_mean_k3", "0.5_2.0,0.01") == {
        "token_k1": (0.5, 2.0), "seq_mean_k3": (None, 0.01)}
    # one entry for all options; a single k1 bound u means [1/u, u]; duplicates are dropped
    assert F.parse_rs_thresholds("token_k1,token_k2,token_k1", 2) == {"token_k1": (0.5, 2.0), "token_k2": (None, 2.0)}
    assert len(F.ROLLOUT_RS_OPTIONS) == 11 and "seq_max_k1" not in F.ROLLOUT_RS_OPTIONS


@pytest.mark.parametrize("options, spec, message", [
    ("seq_max_k1", "2", r"unknown option\(s\) \['seq_max_k1'\]"),
    ("", "2", "unknown option"),
    ("token_k1,token_k2", "2,3,4", "3 entries for 2 'rollout_rs' options"),
    ("token_k2", "0.1_0.2", "a k2/k3 option takes one upper bound"),
    ("token_k1", None, "'rollout_rs_threshold' must be set"),
    ("token_k1", "0.5", "needs u >= 1"),
])
def test_parse_rs_thresholds_errors(options, spec, message) -> None:
    with pytest.raises(ValueError, match=message):
        F.parse_rs_thresholds(options, spec)


# --- importance weights ------------------------------------------------------------------------------


def test_token_tis_truncates_above_the_threshold() -> None:
    w = F.rollout_is_weights(OLD, ROLLOUT, MASK, "token", 2.0)
    _close(w, [[0.5, 1.0, 2.0, 0.0], [1.5, 0.0, 0.0, 0.0]])  # 3 -> 2; the -inf padding gives 0, not nan


def test_token_icepop_zeroes_outside_the_bounds() -> None:
    w = F.rollout_is_weights(OLD, ROLLOUT, MASK, "token", "0.6_2.5")
    _close(w, [[0.0, 1.0, 0.0, 0.0], [1.5, 0.0, 0.0, 0.0]])  # 0.5 < 0.6 and 3 > 2.5 -> 0


def test_sequence_weights_are_the_product_over_the_sequence() -> None:
    # row 0: 0.5 * 1 * 3 = 1.5 = exp(log .5 + log 1 + log 3) on every valid token; row 1: 1.5
    _close(F.rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", 10.0), [[1.5, 1.5, 1.5, 0.0], [1.5, 0, 0, 0]])
    old, rollout, mask = _pair([[2.0, 3.0, 1.0], [0.5, 1.0, 1.0]], [[1, 1, 0], [1, 1, 1]])
    # products 6 and 0.5: TIS at 2 -> 2, 0.5; IcePop 0.6_5 -> 0 (6 > 5), 0 (0.5 < 0.6)
    _close(F.rollout_is_weights(old, rollout, mask, "sequence", 2.0), [[2.0, 2.0, 0.0], [0.5, 0.5, 0.5]])
    _close(F.rollout_is_weights(old, rollout, mask, "sequence", "0.6_5"), torch.zeros(2, 3))


def test_weights_clamp_the_log_ratio_at_20_and_carry_no_gradient() -> None:
    old = _t([[25.0, 10.0]]).requires_grad_(True)
    rollout = torch.zeros(1, 2, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    w = F.rollout_is_weights(old, rollout, mask, "token", 1e12)
    _close(w, [[math.exp(20.0), math.exp(10.0)]])
    assert not w.requires_grad
    _close(F.rollout_is_weights(old, rollout, mask, "sequence", 1e12), [[math.exp(20.0)] * 2])  # sum 35 -> 20


def test_unknown_level() -> None:
    with pytest.raises(ValueError, match="'rollout_is' is 'geometric'. Allowed: token, sequence"):
        F.rollout_is_weights(OLD, ROLLOUT, MASK, "geometric")


def test_normalize_is_weights() -> None:
    w = F.rollout_is_weights(OLD, ROLLOUT, MASK, "token", 2.0)  # valid: 0.5, 1, 2, 1.5: mean 5/4
    out, factor = F.normalize_is_weights(w, MASK, "token")
    assert factor == pytest.approx(1.25)
    _close(out, [[0.4, 0.8, 1.6, 0.0], [1.2, 0.0, 0.0, 0.0]])
    # sequence: one weight per non-empty row (row 0: 1.5 on 3 tokens, row 1: 1.5, row 2 empty): mean 1.5
    seq = torch.cat([_t([[1.5, 1.5, 1.5, 0.0], [0.5, 0.0, 0.0, 0.0]]), torch.zeros(1, 4)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    out, factor = F.normalize_is_weights(seq, mask, "sequence")
    assert factor == pytest.approx((1.5 + 0.5) / 2)  # not (1.5 * 3 + 0.5) / 4 (token-weighted)
    _close(out, seq)
    _, factor = F.normalize_is_weights(torch.zeros(2, 4), MASK, "token")
    assert factor == 1.0  # all weights 0: left as they are


# --- rejection sampling ------------------------------------------------------------------------------

# log-ratios lr = old - rollout: row 0 [0.1, -0.2, 0.5, (masked)], row 1 [0.0, 0.05, (masked) x2]
RS_OLD = _t([[0.1, -0.2, 0.5, 7.0], [0.0, 0.05, 7.0, 7.0]])
RS_ROLLOUT = torch.zeros(2, 4, dtype=torch.float64)
RS_MASK = _t([[1, 1, 1, 0], [1, 1, 0, 0]])
# k1 = -lr: row 0 [-0.1, 0.2, -0.5] (sum -0.4, mean -0.1333), row 1 [0, -0.05] (sum -0.05, mean -0.025)
# k2 = lr^2 / 2: row 0 [0.005, 0.02, 0.125] (sum 0.15, mean 0.05, max 0.125), row 1 [0, 0.00125]
# k3 = e^lr - 1 - lr: row 0 [0.0051709, 0.0187308, 0.1487213] (sum 0.172623, mean 0.057541), row 1 [0, 0.0012711]
KEEP_ALL = [[1, 1, 1, 0], [1, 1, 0, 0]]
ROW0_OUT = [[0, 0, 0, 0], [1, 1, 0, 0]]


@pytest.mark.parametrize("option, threshold, expected", [
    # log 0.7 = -0.357, log 1.2 = 0.182: -0.1 in, 0.2 above, -0.5 below; row 1 in
    ("token_k1", "0.7_1.2", [[1, 0, 0, 0], [1, 1, 0, 0]]),
    ("token_k2", "0.01", [[1, 0, 0, 0], [1, 1, 0, 0]]),  # 0.02 and 0.125 > 0.01
    ("token_k3", "0.1", [[1, 1, 0, 0], [1, 1, 0, 0]]),  # 0.1487 > 0.1
    ("seq_sum_k1", "0.7_1.5", ROW0_OUT),  # -0.4 < log 0.7 = -0.357: the whole row goes
    ("seq_sum_k1", "0.5_1.5", KEEP_ALL),  # -0.4 >= log 0.5 = -0.693
    ("seq_sum_k2", "0.1", ROW0_OUT),  # 0.15 > 0.1
    ("seq_sum_k3", "0.1", ROW0_OUT),  # 0.1726 > 0.1
    ("seq_mean_k1", "0.9_1.1", ROW0_OUT),  # -0.1333 < log 0.9 = -0.105
    ("seq_mean_k2", "0.05", KEEP_ALL),  # 0.05 <= 0.05
    ("seq_mean_k2", "0.04", ROW0_OUT),
    ("seq_mean_k3", "0.05", ROW0_OUT),  # 0.0575 > 0.05
    ("seq_max_k2", "0.1", ROW0_OUT),  # max 0.125 > 0.1
    ("seq_max_k3", "0.2", KEEP_ALL),  # max 0.1487 <= 0.2
    ("seq_max_k3", "0.1", ROW0_OUT),
    ("token_k2,seq_max_k3", "0.01,0.2", [[1, 0, 0, 0], [1, 1, 0, 0]]),  # every option must pass
    # row 0 fails token_k3 at t2 and seq_sum_k2 (0.15); row 1 passes token_k3 but fails seq_sum_k2 (0.00125)
    ("token_k3,seq_sum_k2", "0.1,0.001", [[0, 0, 0, 0], [0, 0, 0, 0]]),
    ("token_k3,seq_sum_k2", "0.1,0.01", ROW0_OUT),
])
def test_rejection_mask_every_option(option, threshold, expected) -> None:
    kept = F.rollout_rejection_mask(RS_OLD, RS_ROLLOUT, RS_MASK, option, threshold)
    assert kept.dtype == RS_MASK.dtype
    _close(kept, expected)


def test_rejection_k1_bounds_apply_to_the_rollout_over_old_ratio() -> None:
    # verl's k1 statistic is -lr = log(pi_rollout / pi_old): "0.5_1.0" keeps IS ratios in [1, 2]
    old, rollout, mask = _pair([[1.5, 0.8]], [[1, 1]])
    _close(F.rollout_rejection_mask(old, rollout, mask, "token_k1", "0.5_1.0"), [[1.0, 0.0]])


def test_rejection_keeps_the_mask_dtype_and_multi_turn_holes() -> None:
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0]])  # turn, observation, turn, padding (long dtype)
    old = _t([[0.0, 0.0, 9.0, 9.0, 0.0, 0.3, 9.0]])  # 9: on masked positions, ignored
    kept = F.rollout_rejection_mask(old, torch.zeros(1, 7, dtype=torch.float64), mask, "token_k2", 0.01)
    assert kept.dtype == torch.long
    assert kept.tolist() == [[1, 1, 0, 0, 1, 0, 0]]  # 0.3^2 / 2 = 0.045 > 0.01


# --- metrics -----------------------------------------------------------------------------------------

# ratios 2, 1 | 0.5 ; old log-probs -1, -2 | -0.5
M_MASK = _t([[1, 1, 0], [1, 0, 0]])
M_OLD = _t([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
M_ROLLOUT = M_OLD - _t([[LN2, 0.0, 0.0], [-LN2, 0.0, 0.0]])


def test_offpolicy_metrics() -> None:
    m = F.rollout_correction_metrics(M_OLD, M_ROLLOUT, M_MASK)
    assert set(m) == {f"rollout_corr/{k}" for k in
                      ("kl", "k3_kl", "training_ppl", "rollout_ppl", "log_ppl_diff", "chi2_token", "chi2_seq")}
    assert m["rollout_corr/kl"] == pytest.approx(0.0)  # mean(-lr) = (-ln2 + 0 + ln2) / 3
    # k3: (2 - ln2 - 1) + 0 + (0.5 + ln2 - 1) = 0.5 over 3 tokens
    assert m["rollout_corr/k3_kl"] == pytest.approx(0.5 / 3)
    # per-sequence mean log-probs: old -1.5, -0.5; rollout -1.5 - ln2/2, -0.5 + ln2
    assert m["rollout_corr/training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2)
    assert m["rollout_corr/rollout_ppl"] == pytest.approx((math.exp(1.5) * math.sqrt(2) + math.exp(0.5) / 2) / 2)
    assert m["rollout_corr/log_ppl_diff"] == pytest.approx((-LN2 / 2 + LN2) / 2)
    assert m["rollout_corr/chi2_token"] == pytest.approx((4 + 1 + 0.25) / 3 - 1)  # E[w^2] - 1 = 0.75
    assert m["rollout_corr/chi2_seq"] == pytest.approx((4 + 0.25) / 2 - 1)  # row products 2, 0.5


def test_is_metrics_token_tis() -> None:
    m = F.rollout_correction_metrics(M_OLD, M_ROLLOUT, M_MASK, "token", 1.5)
    # raw 2, 1, 0.5 -> applied 1.5, 1, 0.5: mean 1, max 1.5, min 0.5; 2 > 1.5 (1 of 3); 0.5 < 1/1.5 (1 of 3)
    # std: E[w^2] = 3.5/3, var 3.5/3 - 1 = 1/6; ESS = E[w]^2 / E[w^2] = 1 / (3.5/3) = 6/7
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(1.5)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(1 / 6))
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(6 / 7)
    assert "rollout_corr/rollout_is_oob_ratio" not in m


def test_is_metrics_sequence_tis() -> None:
    m = F.rollout_correction_metrics(M_OLD, M_ROLLOUT, M_MASK, "sequence", 1.5)
    # row products 2 (2 tokens) and 0.5 (1 token) -> applied 1.5, 1.5 | 0.5: token mean 3.5/3
    # max/min: the untruncated row products 2 and 0.5; fractions over rows: 1 of 2 above 1.5, 1 of 2 below 2/3
    # E[w^2] = (2.25 + 2.25 + 0.25) / 3 = 4.75/3; var 4.75/3 - (7/6)^2 = 8/36; ESS (49/36) / (57/36)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(7 / 6)
    assert m["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_corr/rollout_is_min"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(0.5)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(8 / 36))
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(49 / 57)


def test_is_metrics_token_icepop() -> None:
    m = F.rollout_correction_metrics(M_OLD, M_ROLLOUT, M_MASK, "token", "0.6_1.5")
    # raw 2, 1, 0.5 -> applied 0, 1, 0: mean 1/3, max 1, min 0; 2 above 1.5, 0.5 below 0.6; 2 of 3 zeroed
    # E[w^2] = 1/3, var 1/3 - 1/9 = 2/9; ESS (1/9) / (1/3) = 1/3
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1 / 3)
    assert (m["rollout_corr/rollout_is_max"], m["rollout_corr/rollout_is_min"]) == (1.0, 0.0)
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    assert m["rollout_corr/rollout_is_std"] == pytest.approx(math.sqrt(2 / 9))
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1 / 3)


def test_rs_metrics_and_empty_mask() -> None:
    kept = _t([[1, 0, 0], [1, 0, 0]])  # one of the 3 valid tokens rejected, in row 0
    m = F.rollout_correction_metrics(M_OLD, M_ROLLOUT, M_MASK, rejection_mask=kept)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="no valid token"):
        F.rollout_correction_metrics(M_OLD, M_ROLLOUT, torch.zeros_like(M_MASK))


def test_compute_rollout_correction_end_to_end() -> None:
    w, mask, m = F.compute_rollout_correction(M_OLD, M_ROLLOUT, M_MASK)
    assert w is None and mask is M_MASK and "rollout_corr/kl" in m  # off: metrics only
    w, mask, m = F.compute_rollout_correction(M_OLD, M_ROLLOUT, M_MASK, "token", 1.5, True, "token_k2", 0.1)
    # weights 1.5, 1, 0.5 (mean 1: factor 1); k2 = ln2^2 / 2 = 0.24 > 0.1 for both non-1 ratios
    _close(w, [[1.5, 1.0, 0.0], [0.5, 0.0, 0.0]])
    _close(mask, [[0, 1, 0], [0, 0, 0]])
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.0)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)


# --- the policy losses multiply their per-token loss by the weights ------------------------------------


def test_policy_losses_multiply_by_the_weights() -> None:
    logp = _t([[-1.0, -2.0, -0.5]]).requires_grad_(True)
    old = logp.detach().clone()  # ratio 1: the PPO loss is -A per token
    adv = _t([[1.0, -2.0, 3.0]])
    mask = _t([[1, 1, 0]])
    w = _t([[0.5, 2.0, 0.0]])
    loss, stats = F.clipped_policy_loss(logp, old, adv, mask, rollout_is_weights=w)
    _close(loss, [[-0.5, 4.0, 0.0]])  # -A * w
    _close(stats["clipped"], torch.zeros(1, 3))  # the indicators ignore the weights
    loss.sum().backward()
    _close(logp.grad, [[-0.5, 4.0, 0.0]])  # d(-A w ratio)/dlogp = -A w at ratio 1
    gspo, _ = F.gspo_policy_loss(logp, old, adv, mask, rollout_is_weights=w)
    _close(gspo, [[-0.5, 4.0, 0.0]])
    gpg, _ = F.gpg_policy_loss(logp, adv, mask, rollout_is_weights=w)
    _close(gpg, [[0.5, -8.0, 0.0]])  # -logp * A * w: 1 * 1 * 0.5, 2 * -2 * 2


# --- the algorithm module and the config --------------------------------------------------------------


@pytest.fixture(scope="module")
def pm():
    return PluginManager(autoload=False)


@pytest.mark.parametrize("algo, plain, weighted", [
    ("grpo", -1.0, -0.25),  # ratio 1, A = 1: token losses -1, -1; token-mean -1; weighted (-0.5 + 0) / 2
    ("gspo", -1.0, -0.25),  # seq-mean-token-mean of the same matrix
    ("gpg", 1.5, 0.25),  # -logp * A = 1, 2: token-mean 1.5; weighted (0.5 + 0) / 2
])
def test_policy_loss_reads_the_weights_column(pm, algo, plain, weighted) -> None:
    module = pm.registry.algorithm.get(algo)(load_config(algo, plugins=pm))
    logp = _t([[-1.0, -2.0, -0.5]])
    batch = B.Batch({B.OLD_LOG_PROBS: logp.clone(), B.ADVANTAGES: _t([[1.0, 1.0, 1.0]]),
                     B.RESPONSE_MASK: _t([[1, 1, 0]]), B.REF_LOG_PROBS: logp.clone()})
    ctx = LossContext(global_tokens=2.0, global_seqs=1.0)
    _, metrics = module.policy_loss(batch, logp, None, ctx)
    assert metrics["actor/pg_loss"] == pytest.approx(plain)
    batch[ROLLOUT_IS_WEIGHTS] = _t([[0.5, 0.0, 7.0]])  # 7 on the masked token: no effect
    _, metrics = module.policy_loss(batch, logp, None, ctx)
    assert metrics["actor/pg_loss"] == pytest.approx(weighted)


def test_rollout_correction_config_defaults_and_validation(pm) -> None:
    alg = load_config("grpo", plugins=pm).algorithm
    assert (alg.rollout_is, alg.rollout_is_threshold, alg.rollout_is_batch_normalize, alg.rollout_rs,
            alg.rollout_rs_threshold) == (None, "2.0", False, None, None)
    ok = load_config("grpo", ["algorithm.rollout_is=sequence", "algorithm.rollout_is_threshold=0.5_5.0",
                              "algorithm.rollout_rs=token_k1,seq_mean_k3", "algorithm.rollout_rs_threshold=0.5_2.0,0.01"],
                     plugins=pm).algorithm
    assert F.parse_is_threshold(ok.rollout_is_threshold) == (0.5, 5.0)


@pytest.mark.parametrize("override, message", [
    (["algorithm.rollout_is=geometric"], r"'algorithm\.rollout_is' is 'geometric'\. Allowed: token, sequence"),
    (["algorithm.rollout_is_threshold=abc"], r"'algorithm\.rollout_is_threshold': 'abc' is not a number"),
    (["algorithm.rollout_rs=token_k4", "algorithm.rollout_rs_threshold=1"], r"'algorithm\.rollout_rs' has unknown"),
    (["algorithm.rollout_rs=token_k1"], r"'algorithm\.rollout_rs_threshold' must be set"),
])
def test_rollout_correction_config_errors_name_the_key(pm, override, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("grpo", override, plugins=pm)


# --- the stage ---------------------------------------------------------------------------------------


def test_the_stage_is_in_the_flow_only_when_on_and_refuses_reused_log_probs(pm):
    from rlforge import load_config

    names = pm.registry.algorithm.get("grpo")(load_config("grpo", plugins=pm)).flow().names()
    assert "rollout_correction" not in names
    cfg = load_config("grpo", ["algorithm.rollout_is=token"], plugins=pm)
    names = pm.registry.algorithm.get("grpo")(cfg).flow().compile().names()
    assert names.index("old_logprob") + 1 == names.index("rollout_correction") < names.index("update_actor")
    with pytest.raises(ConfigError, match="actor.reuse_rollout_log_probs=null"):
        load_config("grpo", ["algorithm.rollout_is=token", "actor.reuse_rollout_log_probs=true"], plugins=pm)


def test_the_stage_recomputes_reused_log_probs_writes_weights_and_rejects(pm):
    from rlforge import batch as B
    from rlforge import load_config
    from rlforge.testing import fake_controller, step_context

    cfg = load_config("grpo", ["algorithm.rollout_is=token", "algorithm.rollout_is_threshold=2.0",
                               "algorithm.rollout_rs=token_k1", "algorithm.rollout_rs_threshold=0.5_2.0"], plugins=pm)
    rollout = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    trainer = torch.log(torch.tensor([[0.5, 0.75, 1.0], [0.1, 0.5, 0.5]]))  # ratios 1, 1.5, 2 / 0.2, 1, 1
    calls = []

    def compute_log_probs(batch, role):
        calls.append(role)
        return trainer

    batch = B.Batch({B.ROLLOUT_LOG_PROBS: rollout, B.RESPONSE_MASK: torch.ones(2, 3, dtype=torch.long)})
    batch[B.OLD_LOG_PROBS] = batch[B.ROLLOUT_LOG_PROBS]  # what OLD_LOGPROB does when it reuses the engine's
    ctx = step_context(cfg, controller=fake_controller(workers={"actor": {"compute_log_probs": compute_log_probs}}))
    out = RC.RolloutCorrection().run(ctx, batch)
    assert calls == ["actor"] and torch.equal(out[B.OLD_LOG_PROBS], trainer)
    # token weights: min(ratio, 2) = 1, 1.5, 2 / 0.2, 1, 1
    assert torch.allclose(out[RC.ROLLOUT_IS_WEIGHTS], torch.tensor([[1.0, 1.5, 2.0], [0.2, 1.0, 1.0]]))
    # token_k1 rejection keeps ratios in [0.5, 2] of pi_rollout / pi_old: 1, 0.667, 0.5 / 5 (rejected), 1, 1
    assert out[B.RESPONSE_MASK].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert ctx.metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert ctx.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 6)
    assert ctx.metrics["rollout_corr/kl"] != 0.0
