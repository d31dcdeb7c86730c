"""rlforge.algorithms.functional against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.algorithms import functional as F

EPS = 1e-6


def _close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-6)


def _outcome_rewards(scores: list[float], width: int = 3, lengths: list[int] | None = None):
    """Token-level rewards with each score on the last valid token, and the response mask."""
    lengths = lengths or [width] * len(scores)
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


# --- GRPO advantage -----------------------------------------------------------------------------------


def test_grpo_one_group_hand_computed() -> None:
    rewards, mask = _outcome_rewards([1.0, 0.0, 0.0, 1.0])
    adv, ret = F.grpo_outcome_advantage(rewards, mask, ["a"] * 4)
    # mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = 0.5773502691896258
    std = math.sqrt(1.0 / 3.0)
    assert abs(std - 0.5773502691896258) < 1e-12
    a = 0.5 / (std + EPS)
    assert abs(a - 0.8660239) < 1e-6
    expected = torch.tensor([a, -a, -a, a]).unsqueeze(-1).expand(4, 3)
    _close(adv, expected)
    _close(ret, expected)


def test_grpo_two_groups_are_independent() -> None:
    rewards, mask = _outcome_rewards([1.0, 0.0, 3.0, 5.0, 4.0], width=2)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["a", "a", "b", "b", "b"])
    # group a: mean .5, std sqrt(.5); group b: mean 4, std 1
    sa = math.sqrt(0.5)
    expected = [0.5 / (sa + EPS), -0.5 / (sa + EPS), -1 / (1 + EPS), 1 / (1 + EPS), 0.0]
    _close(adv[:, 0], expected)
    _close(adv[:, 1], expected)


def test_grpo_batch_std_hand_computed() -> None:
    # rewards 1, 0 | 3, 5, 4: group means .5 and 4; batch mean 2.6, unbiased batch variance
    # (1.6^2 + 2.6^2 + .4^2 + 2.4^2 + 1.4^2) / 4 = 17.2 / 4 = 4.3
    rewards, mask = _outcome_rewards([1.0, 0.0, 3.0, 5.0, 4.0], width=2)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["a", "a", "b", "b", "b"], std_scope="batch")
    std = math.sqrt(4.3)
    _close(adv[:, 0], [0.5 / (std + EPS), -0.5 / (std + EPS), -1 / (std + EPS), 1 / (std + EPS), 0.0])
    # TRL 1.16's scale_rewards="batch": (r - group mean) / (nanstd(r) + 1e-4), nanstd with Bessel's correction
    scores = torch.tensor([1.0, 0.0, 3.0, 5.0, 4.0])
    trl = (scores - torch.tensor([0.5, 0.5, 4.0, 4.0, 4.0])) / (scores.std() + 1e-4)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["a", "a", "b", "b", "b"], epsilon=1e-4, std_scope="batch")
    _close(adv[:, 1], trl)
    # one sequence: std 1 (and mean 0, as a singleton group's in GRPO and verl)
    one, _ = F.grpo_outcome_advantage(*_outcome_rewards([2.0], width=1), ["a"], std_scope="batch")
    _close(one, [[2.0 / (1 + EPS)]])
    with pytest.raises(ValueError, match="std_scope must be 'group' or 'batch'"):
        F.grpo_outcome_advantage(rewards, mask, ["a"] * 5, std_scope="rows")


def test_grpo_interleaved_group_ids() -> None:
    rewards, mask = _outcome_rewards([1.0, 3.0, 0.0, 5.0], width=1)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, [0, 1, 0, 1])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    b = 1.0 / (math.sqrt(2.0) + EPS)
    _close(adv[:, 0], [a, -b, -a, b])


def test_grpo_sums_token_rewards() -> None:
    rewards = torch.tensor([[0.5, 0.5], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["g", "g"])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    _close(adv, [[a, a], [-a, -a]])


def test_grpo_all_equal_group_gives_zeros() -> None:
    rewards, mask = _outcome_rewards([0.7, 0.7, 0.7])
    adv, ret = F.grpo_outcome_advantage(rewards, mask, ["g"] * 3)
    assert torch.isfinite(adv).all()
    _close(adv, torch.zeros(3, 3))
    _close(ret, torch.zeros(3, 3))


def test_grpo_singleton_group_gets_raw_score() -> None:
    rewards, mask = _outcome_rewards([2.0, 1.0, 0.0], width=2)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["solo", "pair", "pair"])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    _close(adv[:, 0], [2.0 / (1.0 + EPS), a, -a])


def test_grpo_without_std_normalization() -> None:
    rewards, mask = _outcome_rewards([1.0, 0.0, 0.0, 1.0, 3.0])
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["a"] * 4 + ["b"], norm_adv_by_std=False)
    _close(adv[:, 0], [0.5, -0.5, -0.5, 0.5, 3.0])


def test_grpo_custom_epsilon() -> None:
    rewards, mask = _outcome_rewards([1.0, 0.0], width=1)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["g", "g"], epsilon=0.5)
    s = math.sqrt(0.5)
    _close(adv[:, 0], [0.5 / (s + 0.5), -0.5 / (s + 0.5)])


def test_grpo_broadcasts_to_valid_tokens_and_zeroes_padding() -> None:
    rewards, mask = _outcome_rewards([1.0, 0.0, 0.0, 1.0], width=4, lengths=[1, 4, 2, 3])
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["a"] * 4)
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    expected = torch.tensor(
        [[a, 0, 0, 0], [-a, -a, -a, -a], [-a, -a, 0, 0], [a, a, a, 0]], dtype=torch.float32
    )
    _close(adv, expected)
    assert adv.shape == mask.shape


def test_grpo_mask_with_hole_zeroes_masked_positions() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    adv, _ = F.grpo_outcome_advantage(rewards, mask, ["g", "g"])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    _close(adv, [[a, 0.0, a], [-a, -a, -a]])


# --- loss aggregation -------------------------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
# valid tokens: row0 1+2=3 (2 tok), row1 4 (1 tok), row2 7+8+9=24 (3 tok); 6 tokens, 3 sequences
EXPECTED = {
    "token-mean": (3 + 4 + 24) / 6,
    "token-sum": 3 + 4 + 24,
    "seq-mean-token-sum": (3 + 4 + 24) / 3,
    "seq-mean-token-mean": (3 / 2 + 4 / 1 + 24 / 3) / 3,
    "seq-mean-token-sum-norm": (3 / 3 + 4 / 3 + 24 / 3) / 3,
}


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
def test_agg_loss_modes_hand_computed(mode: str) -> None:
    out = F.agg_loss(LOSS, MASK, mode)
    assert out.dim() == 0
    assert out.item() == pytest.approx(EXPECTED[mode], rel=1e-6)


def test_agg_loss_default_mode_is_token_mean() -> None:
    assert F.agg_loss(LOSS, MASK).item() == pytest.approx(EXPECTED["token-mean"])


def test_agg_loss_seq_mean_token_sum_norm_with_norm_length() -> None:
    out = F.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=10)
    assert out.item() == pytest.approx((3 / 10 + 4 / 10 + 24 / 10) / 3)


def test_agg_loss_explicit_global_counts() -> None:
    assert F.agg_loss(LOSS, MASK, "token-mean", global_tokens=31).item() == pytest.approx(1.0)
    assert F.agg_loss(LOSS, MASK, "seq-mean-token-sum", global_seqs=31).item() == pytest.approx(1.0)


def test_agg_loss_ignores_masked_values_even_if_huge() -> None:
    loss = LOSS.clone()
    loss[MASK == 0] = 1e6
    for mode in F.LOSS_AGG_MODES:
        assert F.agg_loss(loss, MASK, mode).item() == pytest.approx(EXPECTED[mode], rel=1e-6)


# multi-turn masks: holes where tool output / user turns were inserted, padding after the last turn
MT_MASK = torch.tensor([[1.0, 1, 0, 0, 0, 1, 1, 0], [1.0, 0, 0, 1, 1, 0, 0, 0]])
MT_LOSS = torch.tensor([[1.0, 2, 50, 50, 50, 3, 4, 50], [6.0, 50, 50, 3, 3, 50, 50, 50]])  # 50: masked
# row 0: model tokens 1 + 2 + 3 + 4 = 10 (4 tokens); row 1: 6 + 3 + 3 = 12 (3 tokens); 7 tokens, 2 rows
MT_EXPECTED = {
    "token-mean": (10 + 12) / 7,
    "token-sum": 10 + 12,
    "seq-mean-token-sum": (10 + 12) / 2,
    "seq-mean-token-mean": (10 / 4 + 12 / 3) / 2,  # (2.5 + 4) / 2 = 3.25: the holes do not count
    "seq-mean-token-sum-norm": (10 / 8 + 12 / 8) / 2,  # the padded width 8, holes included
}


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
def test_agg_loss_multi_turn_mask(mode: str) -> None:
    assert F.agg_loss(MT_LOSS, MT_MASK, mode).item() == pytest.approx(MT_EXPECTED[mode], rel=1e-6)
    loss = MT_LOSS.clone().requires_grad_(True)
    F.agg_loss(loss, MT_MASK, mode).backward()
    assert (loss.grad[MT_MASK == 0] == 0).all()  # no gradient reaches an observation or padding token


def test_agg_loss_default_sequence_count_skips_empty_rows() -> None:
    # a third row without any model token (e.g. every token rejected): 50 everywhere, all masked
    loss = torch.cat([MT_LOSS, torch.full((1, 8), 50.0)])
    mask = torch.cat([MT_MASK, torch.zeros(1, 8)])
    # default: sequences with >= 1 valid token, as verl counts them when no global count is given: 2
    assert F.agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(22 / 2)
    assert F.agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((10 / 4 + 12 / 3) / 2)
    assert F.agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(22 / 8 / 2)
    # a caller-given count is used as is (the workers pass every row of the mini-batch, as verl's
    # global_batch_size = ppo_mini_batch_size * rollout.n does)
    assert F.agg_loss(loss, mask, "seq-mean-token-sum", global_seqs=3).item() == pytest.approx(22 / 3)
    # an all-empty batch: both counts clamp to 1, the loss is 0 in every mode
    for mode in F.LOSS_AGG_MODES:
        assert F.agg_loss(loss[2:], mask[2:], mode).item() == 0.0


def test_agg_loss_token_sum_ignores_global_counts() -> None:
    # token-sum never divides: the micro-batch sums add up to the mini-batch sum whatever the counts
    assert F.agg_loss(LOSS, MASK, "token-sum", global_tokens=100, global_seqs=100).item() == pytest.approx(31.0)


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
@pytest.mark.parametrize("split", [[1, 2], [2, 1], [1, 1, 1]])
def test_agg_loss_micro_batches_sum_to_full_batch(mode: str, split: list[int]) -> None:
    full = F.agg_loss(LOSS, MASK, mode)
    global_tokens = float(MASK.sum())
    global_seqs = float(LOSS.shape[0])
    total = torch.tensor(0.0)
    start = 0
    for size in split:
        rows = slice(start, start + size)
        total = total + F.agg_loss(LOSS[rows], MASK[rows], mode, global_tokens, global_seqs)
        start += size
    assert total.item() == pytest.approx(full.item(), rel=1e-6)


def test_agg_loss_unknown_mode() -> None:
    with pytest.raises(ValueError, match="Unknown loss_agg_mode 'token-median'. Allowed: token-mean, token-sum"):
        F.agg_loss(LOSS, MASK, "token-median")


def test_agg_loss_empty_mask_is_zero_not_nan() -> None:
    out = F.agg_loss(LOSS, torch.zeros_like(MASK), "token-mean")
    assert out.item() == 0.0


def test_agg_loss_gradient_flows() -> None:
    loss = LOSS.clone().requires_grad_(True)
    F.agg_loss(loss, MASK, "token-mean").backward()
    _close(loss.grad, MASK / 6)


# --- clipped policy loss ----------------------------------------------------------------------------


def _pl(ratio: float, adv: float, **kwargs):
    """Loss and stats for a single token with the given ratio (as a log-ratio) and advantage."""
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64)
    old = torch.zeros_like(logp)
    a = torch.tensor([[adv]], dtype=torch.float64)
    loss, stats = F.clipped_policy_loss(logp, old, a, torch.ones_like(logp), **kwargs)
    return loss.item(), {k: v.item() for k, v in stats.items()}


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "clipped", "clipped_lower"),
    [
        # positive advantage
        (1.1, 1.0, -1.1, 0.0, 0.0),  # inside the clip range: plain -A * ratio
        (1.5, 1.0, -1.2, 1.0, 0.0),  # above 1 + eps: clipped to -A * 1.2
        (0.5, 1.0, -0.5, 0.0, 0.0),  # below 1 - eps: pessimistic unclipped term
        (5.0, 2.0, -2.4, 1.0, 0.0),  # no dual clip for A > 0
        # negative advantage
        (0.9, -1.0, 0.9, 0.0, 0.0),  # inside
        (0.5, -1.0, 0.8, 1.0, 0.0),  # below 1 - eps: clipped to -A * 0.8
        (1.5, -1.0, 1.5, 0.0, 0.0),  # above 1 + eps: unclipped (pessimistic)
        (2.5, -1.0, 2.5, 0.0, 0.0),  # still under the dual-clip bound c = 3
        (5.0, -1.0, 3.0, 0.0, 1.0),  # dual clip: -A * c
        (10.0, -2.0, 6.0, 0.0, 1.0),  # dual clip scales with A
    ],
)
def test_clipped_policy_loss_hand_cases(ratio, adv, loss, clipped, clipped_lower) -> None:
    out, stats = _pl(ratio, adv, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    assert out == pytest.approx(loss, rel=1e-9)
    assert stats["clipped"] == clipped
    assert stats["clipped_lower"] == clipped_lower
    assert stats["neg_log_ratio"] == pytest.approx(-math.log(ratio))


def test_clipped_policy_loss_asymmetric_range() -> None:
    # clip-higher (DAPO): low 0.2, high 0.28
    out, stats = _pl(1.5, 1.0, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert out == pytest.approx(-1.28)
    out, _ = _pl(1.25, 1.0, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert out == pytest.approx(-1.25)
    out, _ = _pl(0.5, -1.0, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert out == pytest.approx(0.8)


def test_zero_advantage_gives_zero_loss() -> None:
    out, stats = _pl(3.0, 0.0)
    assert out == 0.0
    assert stats["clipped_lower"] == 0.0


def test_log_ratio_is_clamped_at_20() -> None:
    logp = torch.tensor([[30.0, -30.0, 5.0]], dtype=torch.float64)
    old = torch.zeros_like(logp)
    adv = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    loss, stats = F.clipped_policy_loss(logp, old, adv, torch.ones_like(logp), clip_ratio_c=1e12)
    _close(stats["neg_log_ratio"], [[-20.0, 20.0, -5.0]])
    # with a huge dual-clip bound the loss is the (clamped) ratio itself
    torch.testing.assert_close(loss, torch.tensor([[math.exp(20.0), 0.8, math.exp(5.0)]], dtype=torch.float64))
    assert torch.isfinite(loss).all()


def test_huge_log_ratio_stays_finite_for_positive_advantage() -> None:
    logp = torch.tensor([[200.0, -200.0]])
    loss, _ = F.clipped_policy_loss(logp, torch.zeros_like(logp), torch.ones_like(logp), torch.ones_like(logp))
    assert torch.isfinite(loss).all()
    _close(loss, [[-1.2, -math.exp(-20.0)]])


def test_policy_loss_is_masked() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.5], [0.5, 0.5]]))
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    loss, _ = F.clipped_policy_loss(logp, old, adv, mask)
    _close(loss, [[-1.2, 0.0], [0.0, 0.8]])


def test_clipfrac_aggregates_indicators() -> None:
    ratios = torch.tensor([[1.1, 1.5, 0.5, 5.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    _, stats = F.clipped_policy_loss(torch.log(ratios), torch.zeros(1, 4), adv, mask)
    _close(stats["clipped"], [[0.0, 1.0, 1.0, 0.0]])
    _close(stats["clipped_lower"], [[0.0, 0.0, 0.0, 1.0]])
    assert F.agg_loss(stats["clipped"], mask).item() == pytest.approx(0.5)
    assert F.agg_loss(stats["clipped_lower"], mask).item() == pytest.approx(0.25)


def test_policy_loss_gradient_is_zero_when_clipped() -> None:
    logp = torch.log(torch.tensor([[1.1, 1.5, 5.0]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, _ = F.clipped_policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3))
    loss.sum().backward()
    # d(-A * ratio)/dlogp = -A * ratio inside; 0 where clipped or dual-clipped
    _close(logp.grad, [[-1.1, 0.0, 0.0]], atol=1e-5)


def test_clip_ratio_c_must_exceed_one() -> None:
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        F.clipped_policy_loss(x, x, x, torch.ones(1, 1), clip_ratio_c=1.0)


# --- KL penalty ---------------------------------------------------------------------------------------

LOGP = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.5]], dtype=torch.float64)
DIFF = [0.5, -1.0, 0.0]  # logp - ref


def _k3(d: float) -> float:
    x = -d  # ref - logp
    return math.exp(x) - x - 1


@pytest.mark.parametrize("name", ["k1", "kl"])
def test_kl_k1(name: str) -> None:
    _close(F.kl_penalty(LOGP, REF, name), [DIFF])


def test_kl_abs() -> None:
    _close(F.kl_penalty(LOGP, REF, "abs"), [[0.5, 1.0, 0.0]])


@pytest.mark.parametrize("name", ["k2", "mse"])
def test_kl_k2(name: str) -> None:
    _close(F.kl_penalty(LOGP, REF, name), [[0.125, 0.5, 0.0]])


@pytest.mark.parametrize("name", ["k3", "low_var_kl"])
def test_kl_k3(name: str) -> None:
    expected = [[_k3(d) for d in DIFF]]
    # hand values: exp(-.5) + .5 - 1 = 0.10653066, exp(1) - 1 - 1 = 0.71828183, 0
    assert expected[0][0] == pytest.approx(0.10653066, abs=1e-8)
    assert expected[0][1] == pytest.approx(0.71828183, abs=1e-8)
    _close(F.kl_penalty(LOGP, REF, name), expected)


def test_kl_default_is_low_var_kl() -> None:
    _close(F.kl_penalty(LOGP, REF), F.kl_penalty(LOGP, REF, "k3"))


def test_k3_is_non_negative_and_clamped_to_10() -> None:
    ref = torch.tensor([[30.0, 5.0, -30.0, -8.0]])
    out = F.kl_penalty(torch.zeros(1, 4), ref, "k3")
    assert (out >= 0).all()
    assert torch.isfinite(out).all()
    assert out[0, 0].item() == 10.0  # exp(20) - 20 - 1 clamped to 10
    assert out[0, 1].item() == 10.0  # exp(5) - 6 = 142.4 clamped to 10
    assert out[0, 2].item() == 10.0  # exp(-20) + 20 - 1 = 19 clamped to 10
    assert out[0, 3].item() == pytest.approx(math.exp(-8.0) + 8 - 1)  # 7.000335, under the clamp


def test_k3_plus_value_is_k3_and_gradient_is_k2() -> None:
    logp = LOGP.clone().requires_grad_(True)
    value = F.kl_penalty(logp, REF, "k3+")
    _close(value.detach(), F.kl_penalty(LOGP, REF, "k3"))
    value.sum().backward()
    grad_plus = logp.grad.clone()

    logp2 = LOGP.clone().requires_grad_(True)
    F.kl_penalty(logp2, REF, "k2").sum().backward()
    _close(grad_plus, logp2.grad)
    _close(grad_plus, [DIFF])  # d/dlogp 0.5 (logp - ref)^2 = logp - ref

    logp3 = LOGP.clone().requires_grad_(True)
    F.kl_penalty(logp3, REF, "k3").sum().backward()
    # k3's own gradient differs: 1 - exp(ref - logp)
    _close(logp3.grad, [[1 - math.exp(-d) for d in DIFF]])
    assert not torch.allclose(logp3.grad, grad_plus)


def test_low_var_kl_plus_matches_k3_plus() -> None:
    _close(F.kl_penalty(LOGP, REF, "low_var_kl+"), F.kl_penalty(LOGP, REF, "k3+"))


def test_kl_gradient_does_not_flow_to_reference() -> None:
    ref = REF.clone().requires_grad_(True)
    logp = LOGP.clone().requires_grad_(True)
    F.kl_penalty(logp, ref.detach(), "k3+").sum().backward()
    assert ref.grad is None
    assert logp.grad is not None


def test_kl_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="Unknown KL estimator 'k4'"):
        F.kl_penalty(LOGP, REF, "k4")


def test_kl_estimator_list_matches_config_validation() -> None:
    for name in F.KL_ESTIMATORS:
        F.kl_penalty(LOGP, REF, name)
        F.kl_penalty(LOGP, REF, name + "+")


# --- DAPO: overlong penalty and dynamic-sampling filter -------------------------------------------------


def test_overlong_penalty() -> None:
    # max 20, buffer 4 -> free up to 16 tokens, then -(L - 16) / 4
    out = F.overlong_penalty(torch.tensor([10, 16, 17, 18, 20]), 20, 4)
    _close(out, [0.0, 0.0, -0.25, -0.5, -1.0])
    _close(F.overlong_penalty([10, 17, 20], 20, 4, penalty_factor=0.5), [0.0, -0.125, -0.5])
    # past the maximum the line continues (verl does not clamp at -factor): -(22 - 16) / 4 = -1.5
    _close(F.overlong_penalty([22], 20, 4), [-1.5])
    assert F.overlong_penalty(torch.tensor([3.0]), 20, 4).dtype == torch.float32
    with pytest.raises(ValueError, match="buffer_length"):
        F.overlong_penalty([1], 20, 0)


def test_uniform_group_mask() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    ids = ["a", "a", "b", "b", "c", "c", "d"]
    # a all equal -> drop; b mixed -> keep; c all equal -> drop; d singleton -> keep
    keep = F.uniform_group_mask(scores, ids)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, False, True, True, False, False, True]
    assert F.uniform_group_mask([0.0, 1.0, 0.0, 0.0], [1, 2, 1, 2]).tolist() == [False, True, False, True]


def test_uniform_group_mask_exact_ties() -> None:
    # identical floats are equal, whatever their float mean rounds to (np.std([.1]*3) is 1.4e-17 > 0)
    assert F.uniform_group_mask([0.1, 0.1, 0.1], ["g"] * 3).tolist() == [False] * 3
    assert F.uniform_group_mask([0.1, 0.1, 0.1 + 1e-9], ["g"] * 3).tolist() == [True] * 3
