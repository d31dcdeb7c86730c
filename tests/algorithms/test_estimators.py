"""Advantage estimators, whitening and DAPO's reward shaping/filter against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.algorithms import functional as F

EPS = 1e-6


def _close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-6)


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _whiten(xs: list[float]) -> list[float]:
    """Reference whitening of a flat list: (x - mean) / sqrt(unbiased var + 1e-8)."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def _outcome(scores: list[float], lengths: list[int], width: int = 3):
    """Token-level rewards with each score on the last valid token, and the response mask."""
    rewards = torch.zeros(len(scores), width, dtype=torch.float64)
    mask = torch.zeros(len(scores), width, dtype=torch.float64)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, max(n, 1) - 1] = s
    return rewards, mask


def _broadcast(per_seq: list[float], mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(per_seq, dtype=mask.dtype).unsqueeze(-1) * mask


# --- masked_var / masked_whiten -----------------------------------------------------------------------


def test_masked_var_hand_computed() -> None:
    values = _t([[1.0, 2.0, 3.0, 100.0]])
    mask = _t([[1, 1, 1, 0]])
    # valid 1, 2, 3: mean 2, squared deviations 1, 0, 1 -> biased 2/3, unbiased 2/2 = 1
    assert F.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)
    assert F.masked_var(values, mask).item() == pytest.approx(1.0)


def test_masked_var_across_rows() -> None:
    values = _t([[1.0, 3.0], [5.0, -7.0]])
    mask = _t([[1, 1], [1, 0]])
    # valid 1, 3, 5: mean 3, squares 4 + 0 + 4 = 8 -> unbiased 8 / 2 = 4
    assert F.masked_var(values, mask).item() == pytest.approx(4.0)


def test_masked_whiten_hand_computed() -> None:
    values = _t([[1.0, 2.0, 3.0, 100.0]])
    mask = _t([[1, 1, 1, 0]])
    s = 1 / math.sqrt(1.0 + 1e-8)  # mean 2, unbiased var 1
    out = F.masked_whiten(values, mask)
    _close(out[:, :3], [[-s, 0.0, s]])
    assert out[0, 3].item() == pytest.approx(98 * s)  # masked positions are transformed, not zeroed
    out = F.masked_whiten(values, mask, shift_mean=False)
    _close(out[:, :3], [[2 - s, 2.0, 2 + s]])  # the mean is put back


def test_masked_whiten_ignores_garbage_on_masked_positions() -> None:
    mask = _t([[1, 1, 1, 0], [1, 0, 1, 0]])
    clean = _t([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 5.0, 0.0]])
    for garbage in (1e30, float("inf"), float("nan")):
        dirty = torch.where(mask.bool(), clean, garbage)
        assert F.masked_var(dirty, mask).item() == pytest.approx(F.masked_var(clean, mask).item())
        _close(F.masked_whiten(dirty, mask)[mask.bool()], F.masked_whiten(clean, mask)[mask.bool()])


def test_masked_var_degenerate_masks() -> None:
    values = _t([[1.0, 2.0]])
    with pytest.raises(ValueError, match="no valid position"):
        F.masked_var(values, torch.zeros_like(values))
    with pytest.raises(ValueError, match="at least 2"):
        F.masked_var(values, _t([[1, 0]]))
    assert F.masked_var(values, _t([[1, 0]]), unbiased=False).item() == 0.0


def test_masked_whiten_constant_input_is_zero() -> None:
    out = F.masked_whiten(torch.full((2, 3), 0.7), torch.ones(2, 3))
    assert torch.isfinite(out).all()
    _close(out, torch.zeros(2, 3), atol=1e-3)  # (0.7 - 0.7) * rsqrt(0 + 1e-8): float32 rounding only


# --- GAE ----------------------------------------------------------------------------------------------


def test_gae_gamma_lambda_one() -> None:
    rewards = _t([[0.0, 0.0, 1.0]])
    values = _t([[0.5, 0.6, 0.7]])
    adv, ret = F.gae_advantage(rewards, values, torch.ones_like(rewards))
    # t=2: delta = 1 - 0.7 = 0.3, A = 0.3; t=1: delta = 0.7 - 0.6 = 0.1, A = 0.4;
    # t=0: delta = 0.6 - 0.5 = 0.1, A = 0.5. returns = A + V = [1, 1, 1] (undiscounted reward-to-go)
    _close(ret, [[1.0, 1.0, 1.0]])
    # whitened [0.5, 0.4, 0.3]: mean 0.4, unbiased var (0.01 + 0 + 0.01) / 2 = 0.01 -> [1, 0, -1]
    _close(adv, [_whiten([0.5, 0.4, 0.3])])
    _close(adv, [[1.0, 0.0, -1.0]], atol=1e-5)


def test_gae_discounted() -> None:
    rewards = _t([[0.0, 0.0, 1.0]])
    values = _t([[0.5, 0.6, 0.7]])
    adv, ret = F.gae_advantage(rewards, values, torch.ones_like(rewards), gamma=0.5, lam=0.5)
    # t=2: delta = 1 - 0.7 = 0.3;            A2 = 0.3
    # t=1: delta = 0.5 * 0.7 - 0.6 = -0.25;  A1 = -0.25 + 0.25 * 0.3 = -0.175
    # t=0: delta = 0.5 * 0.6 - 0.5 = -0.2;   A0 = -0.2 + 0.25 * -0.175 = -0.24375
    raw = [-0.24375, -0.175, 0.3]
    _close(ret, [[-0.24375 + 0.5, -0.175 + 0.6, 0.3 + 0.7]])  # [0.25625, 0.425, 1.0]
    _close(adv, [_whiten(raw)])


def test_gae_skips_masked_positions_and_zeroes_them() -> None:
    # row 0: two valid tokens then padding; row 1: a masked hole in the middle (an observation span)
    mask = _t([[1, 1, 0, 0], [1, 0, 1, 0]])
    rewards = _t([[0.0, 1.0, 9.0, 9.0], [0.0, 5.0, 1.0, 9.0]])  # 9 / 5 on masked positions: ignored
    values = _t([[0.5, 0.8, 7.0, 7.0], [0.25, 9.0, 0.7, 7.0]])  # 7 / 9 on masked positions: ignored
    adv, ret = F.gae_advantage(rewards, values, mask, gamma=0.5, lam=1.0)
    # row 0: t=1: delta = 1 + 0 - 0.8 = 0.2, A1 = 0.2; t=0: delta = 0.5 * 0.8 - 0.5 = -0.1,
    #        A0 = -0.1 + 0.5 * 0.2 = 0.0; returns = [0.5, 1.0]
    # row 1: t=2: delta = 1 - 0.7 = 0.3, A2 = 0.3; t=1 masked: skipped (V_next stays 0.7, A_next 0.3);
    #        t=0: delta = 0.5 * 0.7 - 0.25 = 0.1, A0 = 0.1 + 0.5 * 0.3 = 0.25; returns = [0.5, ., 1.0]
    _close(ret, [[0.5, 1.0, 0.0, 0.0], [0.5, 0.0, 1.0, 0.0]])
    w = _whiten([0.0, 0.2, 0.25, 0.3])
    _close(adv, [[w[0], w[1], 0.0, 0.0], [w[2], 0.0, w[3], 0.0]])

    clean_adv, clean_ret = F.gae_advantage(rewards * mask, values * mask, mask, gamma=0.5, lam=1.0)
    _close(adv, clean_adv)
    _close(ret, clean_ret)


# --- GRPO / Dr. GRPO ------------------------------------------------------------------------------------


def test_dr_grpo_is_grpo_without_std() -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 2.0], [3, 1, 2, 3, 2, 2, 1])
    ids = ["a"] * 4 + ["b", "b", "solo"]
    adv, ret = F.grpo_outcome_advantage(rewards, mask, ids, norm_adv_by_std=False)
    # group a: mean 0.5 -> +-0.5; group b (all equal): 0; singleton: mean 0 -> raw 2.0, no std division
    _close(adv, _broadcast([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 2.0], mask))
    _close(ret, adv)
    # the epsilon plays no role without std normalization
    _close(F.grpo_outcome_advantage(rewards, mask, ids, norm_adv_by_std=False, epsilon=10.0)[0], adv)


def test_grpo_accepts_tensor_group_ids() -> None:
    rewards, mask = _outcome([1.0, 0.0, 3.0, 5.0], [1, 1, 1, 1], width=1)
    adv, _ = F.grpo_outcome_advantage(rewards, mask, torch.tensor([7, 7, 8, 8]))
    a, b = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (math.sqrt(2.0) + EPS)  # std of [1,0]: sqrt(.5); [3,5]: sqrt(2)
    _close(adv[:, 0], [a, -a, -b, b])


def test_group_ids_length_must_match() -> None:
    rewards, mask = _outcome([1.0, 0.0], [1, 1])
    with pytest.raises(ValueError, match="group_ids has 3 entries"):
        F.grpo_outcome_advantage(rewards, mask, ["a", "a", "b"])


# --- GRPO pass@k -----------------------------------------------------------------------------------------


def test_grpo_passk_only_the_best_sample_learns() -> None:
    rewards, mask = _outcome([1.0, 3.0, 2.0, 0.5, 0.5, 0.0, 4.0, 1.0, 1.0], [3, 2, 1, 3, 3, 1, 2, 3, 3])
    ids = ["a"] * 3 + ["b"] * 2 + ["c"] * 4
    adv, ret = F.grpo_passk_advantage(rewards, mask, ids)
    # a: best 3, second 2 -> 1; std of [1, 3, 2]: mean 2, squares 1 + 1 + 0 = 2, unbiased 2/2 = 1 -> 1/(1+eps)
    # b: tie [0.5, 0.5] -> the first is "best", 0.5 - 0.5 = 0 (std 0: 0 / eps = 0)
    # c: best 4, second 1 -> 3; std of [0, 4, 1, 1]: mean 1.5, squares 2.25 + 6.25 + .25 + .25 = 9, /3 -> sqrt 3
    a, c = 1.0 / (1.0 + EPS), 3.0 / (math.sqrt(3.0) + EPS)
    _close(adv, _broadcast([0.0, a, 0.0, 0.0, 0.0, 0.0, c, 0.0, 0.0], mask))
    _close(ret, adv)
    adv, _ = F.grpo_passk_advantage(rewards, mask, ids, norm_adv_by_std=False)
    _close(adv, _broadcast([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0], mask))


def test_grpo_passk_interleaved_groups_and_singleton() -> None:
    rewards, mask = _outcome([0.0, 2.0, 1.0, 0.0], [1, 1, 1, 1], width=1)
    adv, _ = F.grpo_passk_advantage(rewards, mask, [1, 2, 1, 2], norm_adv_by_std=False)
    _close(adv[:, 0], [0.0, 2.0, 1.0, 0.0])  # group 1: [0, 1] -> row 2 gets 1; group 2: [2, 0] -> row 1 gets 2
    with pytest.raises(ValueError, match="row 2 is alone"):
        F.grpo_passk_advantage(rewards[:3], mask[:3], [1, 1, 2])


# --- RLOO ----------------------------------------------------------------------------------------------


def test_rloo_leave_one_out_baseline() -> None:
    rewards, mask = _outcome([1.0, 2.0, 6.0, 1.0, 0.0, 2.0], [3, 2, 1, 3, 3, 2])
    adv, ret = F.rloo_outcome_advantage(rewards, mask, ["a", "a", "a", "b", "b", "solo"])
    # group a (n=3): r0 - (2+6)/2 = -3, r1 - (1+6)/2 = -1.5, r2 - (1+2)/2 = 4.5
    #   (= n/(n-1) (r - mean) = 1.5 * (r - 3)); group b: 1 - 0 = 1, 0 - 1 = -1; singleton: baseline 0 -> 2
    _close(adv, _broadcast([-3.0, -1.5, 4.5, 1.0, -1.0, 2.0], mask))
    _close(ret, adv)
    assert (adv[mask == 0] == 0).all()


def test_rloo_ties_and_all_equal_group() -> None:
    rewards, mask = _outcome([1.0, 1.0, 0.0, 0.5, 0.5], [3] * 5)
    adv, _ = F.rloo_outcome_advantage(rewards, mask, ["a", "a", "a", "b", "b"])
    # a: 1 - (1+0)/2 = 0.5 (both tied samples), 0 - (1+1)/2 = -1; b (all equal): 0
    _close(adv[:, 0], [0.5, 0.5, -1.0, 0.0, 0.0])


# --- OPO ------------------------------------------------------------------------------------------------


def test_opo_length_weighted_baseline() -> None:
    rewards, mask = _outcome([1.0, 0.0, 1.0, 1.0, 0.0, 3.0], [2, 4, 1, 2, 2, 2], width=4)
    adv, ret = F.opo_advantage(rewards, mask, ["a", "a", "a", "b", "b", "solo"])
    # group a: b = (2*1 + 4*0 + 1*1) / (2 + 4 + 1) = 3/7 -> [4/7, -3/7, 4/7]
    # group b (equal lengths): plain mean 0.5 -> [0.5, -0.5]; singleton: baseline 0 -> 3
    _close(adv, _broadcast([4 / 7, -3 / 7, 4 / 7, 0.5, -0.5, 3.0], mask))
    _close(ret, adv)


def test_opo_all_equal_group_is_zero() -> None:
    rewards, mask = _outcome([0.2, 0.2, 0.2], [1, 2, 3])
    _close(F.opo_advantage(rewards, mask, [0, 0, 0])[0], torch.zeros(3, 3))


# --- GPG ------------------------------------------------------------------------------------------------


def test_gpg_rescales_by_batch_over_nonzero() -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 2.0], [3, 3, 2, 1, 3, 3, 2])
    ids = ["a"] * 4 + ["b", "b", "solo"]
    adv, ret = F.gpg_advantage(rewards, mask, ids)
    # B = 7, M = count_nonzero(scores) = 3 (1, 1, 2) -> scale 7/3
    # a: mean 0.5 -> +-0.5 * 7/3 = +-7/6; b: all zero -> 0; singleton: mean 0 -> 2 * 7/3 = 14/3
    _close(adv, _broadcast([7 / 6, -7 / 6, -7 / 6, 7 / 6, 0.0, 0.0, 14 / 3], mask))
    _close(ret, adv)
    adv2, _ = F.gpg_advantage(rewards, mask, ids, f_norm=2.0, alpha=3.0)  # * alpha / f_norm = * 1.5
    _close(adv2, adv * 1.5)


def test_gpg_all_zero_scores() -> None:
    rewards, mask = _outcome([0.0, 0.0], [2, 2])
    adv, _ = F.gpg_advantage(rewards, mask, ["a", "a"])  # M = 0 is clamped to 1: no division by zero
    _close(adv, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="f_norm"):
        F.gpg_advantage(rewards, mask, ["a", "a"], f_norm=0.0)


# --- REINFORCE++ ----------------------------------------------------------------------------------------


def test_reinforce_pp_discounted_returns() -> None:
    rewards = _t([[0.5, 0.0, 1.0], [0.0, 2.0, 7.0]])  # 7.0 sits on a masked position
    mask = _t([[1, 1, 1], [1, 1, 0]])
    adv, ret = F.reinforce_pp_advantage(rewards, mask, gamma=0.5)
    # row 0: G2 = 1, G1 = 0 + 0.5 * 1 = 0.5, G0 = 0.5 + 0.5 * 0.5 = 0.75
    # row 1: t=2 masked -> 0 (the running return 0 is carried over), G1 = 2, G0 = 0 + 0.5 * 2 = 1
    _close(ret, [[0.75, 0.5, 1.0], [1.0, 2.0, 0.0]])
    # whiten [0.75, 0.5, 1, 1, 2]: mean 1.05, squares .09+.3025+.0025+.0025+.9025 = 1.3, var 1.3/4 = .325
    s = 1 / math.sqrt(0.325 + 1e-8)
    _close(adv, [[-0.3 * s, -0.55 * s, -0.05 * s], [-0.05 * s, 0.95 * s, 0.0]])


def test_reinforce_pp_gamma_one_carries_through_masked_span() -> None:
    rewards = _t([[1.0, 5.0, 1.0], [0.5, 0.5, 0.5]])  # 5.0 sits on a masked position: ignored
    mask = _t([[1, 0, 1], [1, 1, 1]])
    _, ret = F.reinforce_pp_advantage(rewards, mask)
    # row 0: G2 = 1; t=1 masked: the running return 1 is carried over (verl 0.9.1), so G0 = 1 + 1 = 2
    # row 1 (gamma 1): reward-to-go [1.5, 1.0, 0.5]
    _close(ret, [[2.0, 0.0, 1.0], [1.5, 1.0, 0.5]])


def test_reinforce_pp_baseline() -> None:
    rewards, mask = _outcome([1.0, 0.0, 3.0], [2, 1, 2], width=3)
    adv, ret = F.reinforce_pp_baseline_advantage(rewards, mask, ["a", "a", "solo"])
    # centred: a -> [0.5, -0.5]; singleton -> 3 (mean 0). Valid tokens: 0.5, 0.5, -0.5, 3, 3
    # mean 6.5/5 = 1.3; deviations -.8, -.8, -1.8, 1.7, 1.7; squares sum 10.3; unbiased var 2.575
    w = [d / math.sqrt(2.575 + 1e-8) for d in (-0.8, -0.8, -1.8, 1.7, 1.7)]
    _close(adv, [[w[0], w[1], 0.0], [w[2], 0.0, 0.0], [w[3], w[4], 0.0]])
    _close(ret, adv)


def test_reinforce_pp_baseline_all_equal_groups_are_zero() -> None:
    rewards, mask = _outcome([0.5, 0.5, 1.0, 1.0], [3, 2, 1, 3])
    adv, _ = F.reinforce_pp_baseline_advantage(rewards, mask, ["a", "a", "b", "b"])
    assert torch.isfinite(adv).all()
    _close(adv, torch.zeros(4, 3))


# --- ReMax ----------------------------------------------------------------------------------------------


def test_remax() -> None:
    rewards = _t([[0.0, 1.0, 2.0], [3.0, 0.0, 9.0]])  # 9 is on a masked position: ignored
    mask = _t([[1, 1, 1], [1, 1, 0]])
    baselines = _t([1.5, 1.0])
    adv, ret = F.remax_advantage(rewards, baselines, mask)
    # row 0: reverse cumsum [0+1+2, 1+2, 2] = [3, 3, 2]; minus 1.5 -> [1.5, 1.5, 0.5]
    # row 1: [3+0, 0, .] = [3, 0, 0]; minus 1 -> [2, -1, 0]
    _close(ret, [[3.0, 3.0, 2.0], [3.0, 0.0, 0.0]])
    _close(adv, [[1.5, 1.5, 0.5], [2.0, -1.0, 0.0]])


# --- multi-turn masks (agentic rollouts) ---------------------------------------------------------------
# The response mask has holes where tool output / user turns were inserted, and padding after the last
# model token. Outcome estimators read the score from the last model token of the trajectory.

MT_MASK = _t([
    [1, 1, 0, 0, 0, 1, 1, 0],  # turn (2 tokens), observation (3), turn (2), padding: L = 4, last at 6
    [1, 0, 0, 1, 1, 0, 0, 0],  # turn (1), observation (2), turn (2), padding (3):    L = 3, last at 4
    [1, 1, 1, 0, 0, 1, 0, 0],  # turn (3), observation (2), turn (1), padding (2):    L = 4, last at 5
    [1, 0, 1, 0, 1, 0, 1, 1],  # four turns between single-token observations:        L = 5, last at 7
])
MT_IDS = ["a", "a", "b", "b"]
MT_SCORES = [1.0, 0.0, 2.0, 0.0]


def _trajectory(scores: list[float], garbage: float = 0.0) -> torch.Tensor:
    """Token-level rewards: each score on the row's last model token; ``garbage`` on the observation
    tokens (masked positions inside the trajectory), which the token-level estimators must ignore."""
    rewards = torch.zeros_like(MT_MASK)
    for i, s in enumerate(scores):
        valid = MT_MASK[i].nonzero().flatten()
        rewards[i, valid[-1]] = s
        inside = torch.arange(MT_MASK.shape[1]) < valid[-1]
        rewards[i, inside & (MT_MASK[i] == 0)] = garbage
    return rewards


def _mt(per_seq: list[float]) -> torch.Tensor:
    return _broadcast(per_seq, MT_MASK)


def test_multi_turn_grpo_and_dr_grpo() -> None:
    adv, ret = F.grpo_outcome_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS)
    # a: [1, 0], mean 0.5, std sqrt(0.5); b: [2, 0], mean 1, std sqrt(2)
    a, b = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (math.sqrt(2.0) + EPS)
    _close(adv, _mt([a, -a, b, -b]))  # every model token of every turn, 0 on observations and padding
    _close(ret, adv)
    adv, _ = F.grpo_outcome_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS, norm_adv_by_std=False)
    _close(adv, _mt([0.5, -0.5, 1.0, -1.0]))


def test_multi_turn_grpo_passk() -> None:
    adv, _ = F.grpo_passk_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS)
    # a: best row 0, 1 - 0 = 1 over std sqrt(0.5); b: best row 2, 2 - 0 = 2 over std sqrt(2)
    _close(adv, _mt([1.0 / (math.sqrt(0.5) + EPS), 0.0, 2.0 / (math.sqrt(2.0) + EPS), 0.0]))


def test_multi_turn_rloo() -> None:
    adv, ret = F.rloo_outcome_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS)
    # groups of 2: r_i - r_other -> a: 1 - 0, 0 - 1; b: 2 - 0, 0 - 2
    _close(adv, _mt([1.0, -1.0, 2.0, -2.0]))
    _close(ret, adv)


def test_multi_turn_opo_counts_model_tokens_only() -> None:
    adv, _ = F.opo_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS)
    # L counts model tokens, not the observation tokens in the holes: L = 4, 3, 4, 5
    # a: b = (4 * 1 + 3 * 0) / 7 = 4/7 -> [3/7, -4/7]; b: b = (4 * 2 + 5 * 0) / 9 = 8/9 -> [10/9, -8/9]
    _close(adv, _mt([3 / 7, -4 / 7, 10 / 9, -8 / 9]))


def test_multi_turn_gpg() -> None:
    adv, _ = F.gpg_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS)
    # B = 4, M = 2 non-zero scores -> x2; centred a: +-0.5, b: +-1
    _close(adv, _mt([1.0, -1.0, 2.0, -2.0]))


def test_multi_turn_reinforce_pp_baseline() -> None:
    adv, _ = F.reinforce_pp_baseline_advantage(_trajectory(MT_SCORES), MT_MASK, MT_IDS)
    # centred [0.5, -0.5, 1, -1] on 4, 3, 4, 5 model tokens: 16 values, mean (2 - 1.5 + 4 - 5) / 16 = -1/32
    flat = [0.5] * 4 + [-0.5] * 3 + [1.0] * 4 + [-1.0] * 5
    assert sum(flat) / len(flat) == -1 / 32
    w = iter(_whiten(flat))
    expected = [[next(w) if m else 0.0 for m in row] for row in MT_MASK.tolist()]
    _close(adv, expected)


def test_multi_turn_remax() -> None:
    rewards = _trajectory(MT_SCORES, garbage=9.0)  # 9 on observation tokens: ignored
    adv, ret = F.remax_advantage(rewards, _t([0.5, 0.5, 1.5, 0.25]), MT_MASK)
    # undiscounted reward-to-go of the model tokens = the score on every model token of every turn
    _close(ret, _mt(MT_SCORES))
    _close(adv, _mt([0.5, -0.5, 0.5, -0.25]))


def test_multi_turn_reinforce_pp_carries_the_return_across_observations() -> None:
    mask = MT_MASK[:2]
    rewards = _t([[0.0, 0.5, 9.0, 9.0, 9.0, 0.0, 1.0, 9.0], [0.0, 9.0, 9.0, 0.0, 2.0, 9.0, 9.0, 9.0]])
    adv, ret = F.reinforce_pp_advantage(rewards, mask, gamma=0.5)  # the 9s are on masked positions
    # row 0: t6: 1; t5: 0 + 0.5 * 1 = 0.5; t4..t2 observation: 0.5 carried (no discount step);
    #        t1: 0.5 + 0.5 * 0.5 = 0.75 (turn 1's own reward plus the discounted later score); t0: 0.375
    # row 1: t4: 2; t3: 1; t2, t1 observation: 1 carried; t0: 0.5
    # (resetting at the observation would give t1 = 0.5, t0 = 0.25 and t0 = 0 in row 1)
    _close(ret, [[0.375, 0.75, 0, 0, 0, 0.5, 1.0, 0], [0.5, 0, 0, 1.0, 2.0, 0, 0, 0]])
    w = _whiten([0.375, 0.75, 0.5, 1.0, 0.5, 1.0, 2.0])
    _close(adv, [[w[0], w[1], 0, 0, 0, w[2], w[3], 0], [w[4], 0, 0, w[5], w[6], 0, 0, 0]])


def test_multi_turn_gae_carries_value_and_advantage_across_observations() -> None:
    mask = MT_MASK[:2]
    rewards = _t([[0, 0, 9, 9, 9, 0, 1, 9], [0, 9, 9, 0, 1, 9, 9, 9]])  # 9: on masked positions
    values = _t([[0.5, 0.4, 9, 9, 9, 0.6, 0.8, 9], [0.2, 9, 9, 0.4, 0.5, 9, 9, 9]])
    adv, ret = F.gae_advantage(rewards, values, mask, gamma=0.5, lam=0.5)  # gamma * lam = 0.25
    # row 0: t6: delta = 1 + 0 - 0.8 = 0.2, A = 0.2
    #        t5: delta = 0.5 * 0.8 - 0.6 = -0.2, A = -0.2 + 0.25 * 0.2 = -0.15
    #        t4..t2 observation: V_next = 0.6 and A_next = -0.15 carried over
    #        t1: delta = 0.5 * 0.6 - 0.4 = -0.1, A = -0.1 + 0.25 * -0.15 = -0.1375
    #        t0: delta = 0.5 * 0.4 - 0.5 = -0.3, A = -0.3 + 0.25 * -0.1375 = -0.334375
    # row 1: t4: delta = 1 - 0.5 = 0.5, A = 0.5; t3: delta = 0.5 * 0.5 - 0.4 = -0.15, A = -0.15 + 0.125 = -0.025
    #        t2, t1 observation: carried; t0: delta = 0.5 * 0.4 - 0.2 = 0, A = 0.25 * -0.025 = -0.00625
    # returns = A + V on model tokens
    _close(ret, [[0.165625, 0.2625, 0, 0, 0, 0.45, 1.0, 0], [0.19375, 0, 0, 0.375, 1.0, 0, 0, 0]])
    w = _whiten([-0.334375, -0.1375, -0.15, 0.2, -0.00625, -0.025, 0.5])
    _close(adv, [[w[0], w[1], 0, 0, 0, w[2], w[3], 0], [w[4], 0, 0, w[5], w[6], 0, 0, 0]])


def _verl_style_returns(rewards, values, mask, gamma, lam):
    """An independent transcription of verl 0.9.1's backward loops, with arithmetic masks
    (``x * m + (1 - m) * previous``) instead of ``torch.where``: GAE advantages and REINFORCE++ returns."""
    next_v, last_a, running = 0.0, 0.0, 0.0
    gae, rpp = [], []
    for t in reversed(range(rewards.shape[-1])):
        m = mask[:, t]
        a = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * last_a
        next_v = values[:, t] * m + (1 - m) * next_v
        last_a = a * m + (1 - m) * last_a
        g = rewards[:, t] + gamma * running
        running = g * m + (1 - m) * running
        gae.append(last_a)
        rpp.append(g * m)
    return torch.stack(gae[::-1], 1), torch.stack(rpp[::-1], 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multi_turn_gae_and_reinforce_pp_match_verl_on_model_tokens(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(6, 12, generator=g) < 0.6).double()
    mask[:, 0] = 1  # holes anywhere, padding anywhere
    rewards = torch.randn(6, 12, generator=g, dtype=torch.float64)
    values = torch.randn(6, 12, generator=g, dtype=torch.float64)
    verl_gae, verl_rpp = _verl_style_returns(rewards, values, mask, 0.9, 0.8)
    adv, ret = F.gae_advantage(rewards, values, mask, gamma=0.9, lam=0.8)
    valid = mask.bool()
    _close(ret[valid], (verl_gae + values)[valid], atol=1e-12)
    _close(adv[valid], F.masked_whiten(verl_gae, mask)[valid], atol=1e-12)
    adv, ret = F.reinforce_pp_advantage(rewards, mask, gamma=0.9)
    _close(ret, verl_rpp, atol=1e-12)
    _close(adv, F.masked_whiten(verl_rpp, mask) * mask, atol=1e-12)


# --- masked positions never leak ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["grpo", "passk", "rloo", "opo", "gpg", "rpp_baseline", "rpp", "remax", "gae"]
)
def test_masked_positions_are_zero_and_do_not_matter(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    mask = _t([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    rewards = torch.rand(4, 5, generator=g, dtype=torch.float64) * mask
    values = torch.rand(4, 5, generator=g, dtype=torch.float64)
    ids = ["a", "a", "b", "b"]
    fns = {
        "grpo": lambda r, v: F.grpo_outcome_advantage(r, mask, ids),
        "passk": lambda r, v: F.grpo_passk_advantage(r, mask, ids),
        "rloo": lambda r, v: F.rloo_outcome_advantage(r, mask, ids),
        "opo": lambda r, v: F.opo_advantage(r, mask, ids),
        "gpg": lambda r, v: F.gpg_advantage(r, mask, ids),
        "rpp_baseline": lambda r, v: F.reinforce_pp_baseline_advantage(r, mask, ids),
        "rpp": lambda r, v: F.reinforce_pp_advantage(r, mask, gamma=0.9),
        "remax": lambda r, v: F.remax_advantage(r, _t([0.1, 0.2, 0.3, 0.4]), mask),
        "gae": lambda r, v: F.gae_advantage(r, v, mask, gamma=0.9, lam=0.8),
    }
    adv, ret = fns[name](rewards, values)
    assert adv.shape == ret.shape == mask.shape
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    assert adv[mask == 1].abs().sum() > 0
    # garbage values on masked positions change nothing (outcome estimators sum the reward row as
    # verl does, so their masked *rewards* stay 0 here; token-level ones also get garbage rewards)
    outcome = name in ("grpo", "passk", "rloo", "opo", "gpg", "rpp_baseline")
    dirty_r = rewards if outcome else torch.where(mask.bool(), rewards, 123.0)
    adv2, ret2 = fns[name](dirty_r, torch.where(mask.bool(), values, -77.0))
    _close(adv2, adv)
    _close(ret2, ret)
