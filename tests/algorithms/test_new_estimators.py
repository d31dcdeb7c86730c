"""The estimators of issue 30, hand-computed: GDPO, VAPO's decoupled and length-adaptive GAE, SPPO's targets, the
optimal token baseline (single- and multi-turn) and PF-PPO's sample selection."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.algorithms import functional as F


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-6)


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).double()


# --- GDPO --------------------------------------------------------------------------------------------------


def test_gdpo_normalizes_each_component_in_its_group_then_whitens() -> None:
    mask = _mask([2, 1], 2)
    rewards = torch.zeros(2, 2, dtype=torch.float64)
    # component 1 = [1, 0] in one group: (r - 0.5) / (std 0.7071 + 1e-6) = +-0.70711 (a);
    # component 2 = [3, 3] carries no signal in its group: 0. Sum: [a, -a] on tokens [a, a | -a]
    adv, ret = F.gdpo_advantage(rewards, mask, ["g", "g"], [_t([1.0, 0.0]), _t([3.0, 3.0])])
    # whitening 3 tokens a, a, -a: mean a/3, deviations 2a/3, 2a/3, -4a/3, unbiased var 4a^2/3 = 2/3
    r3 = 1 / math.sqrt(3)
    _close(adv, [[r3, r3], [-2 * r3, 0.0]], atol=1e-5)
    assert ret is adv
    # a component's scale does not matter (unlike summing the rewards first); its weight does
    scaled, _ = F.gdpo_advantage(rewards, mask, ["g", "g"], [_t([10.0, 0.0]), _t([3.0, 3.0])])
    _close(scaled, adv, atol=1e-5)


def test_gdpo_weights_and_default_component() -> None:
    mask = torch.ones(4, 1, dtype=torch.float64)
    ids = ["a", "a", "b", "b"]
    c1, c2 = _t([1.0, 0.0, 1.0, 0.0]), _t([0.0, 1.0, 1.0, 0.0])
    # per group, both components are +-0.70711 (a): c1 -> [a, -a, a, -a], c2 -> [-a, a, a, -a]
    # weights 1, 0.5: [a/2, -a/2, 3a/2, -3a/2], then whitened: mean 0, unbiased var = (1/3)(a^2/4 * 2 + 9a^2/4 * 2)
    # = 5a^2/3 -> x / (a sqrt(5/3))
    adv, _ = F.gdpo_advantage(torch.zeros(4, 1, dtype=torch.float64), mask, ids, [c1, c2], [1.0, 0.5])
    k = 1 / math.sqrt(5 / 3)
    _close(adv[:, 0], [0.5 * k, -0.5 * k, 1.5 * k, -1.5 * k], atol=1e-5)
    # no components: the total reward is the only one (GRPO, then whitened over the batch)
    rewards = c1.unsqueeze(-1)
    default, _ = F.gdpo_advantage(rewards, mask, ids)
    grpo, _ = F.grpo_outcome_advantage(rewards, mask, ids)
    _close(default, F.masked_whiten(grpo, mask))
    with pytest.raises(ValueError, match="2 reward components but 1 weights"):
        F.gdpo_advantage(rewards, mask, ids, [c1, c2], [1.0])


# --- VAPO: decoupled and length-adaptive GAE --------------------------------------------------------------


def test_decoupled_gae_critic_targets_are_the_reward_to_go_with_lambda_one() -> None:
    rewards = _t([[0.0, 0.5, 1.0]])
    values = _t([[0.3, -0.2, 0.7]])
    mask = torch.ones(1, 3, dtype=torch.float64)
    _, returns = F.decoupled_gae_advantage(rewards, values, mask, 1.0, 1.0, 0.0)
    _close(returns, [[1.5, 1.5, 1.0]])  # lam = gamma = 1: sum of later rewards, whatever the values
    # lam_policy = 0: one-step TD errors r_t + V_{t+1} - V_t = -0.5, 1.4, 0.3, then whitened
    adv, _ = F.decoupled_gae_advantage(rewards, values, mask, 1.0, 1.0, 0.0)
    td = [-0.5, 1.4, 0.3]
    mean = sum(td) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in td) / 2 + 1e-8)
    _close(adv, [[(x - mean) / std for x in td]])
    # equal lambdas: plain GAE
    for lam in (0.0, 0.9, 1.0):
        a1, r1 = F.decoupled_gae_advantage(rewards, values, mask, 0.9, lam, lam)
        a2, r2 = F.gae_advantage(rewards, values, mask, 0.9, lam)
        _close(a1, a2)
        _close(r1, r2)


def test_decoupled_gae_takes_one_lambda_per_row() -> None:
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g,
                                                                                     dtype=torch.float64)
    mask = _mask([4, 2, 3], 4)
    lams = _t([0.0, 0.5, 0.9])
    adv, _ = F.decoupled_gae_advantage(rewards, values, mask, 1.0, 1.0, lams)
    # each row's raw GAE with its own lambda (whitening pools the rows: compare before it, through the returns of a
    # critic lambda equal to the row's)
    raw = torch.stack([F.decoupled_gae_advantage(rewards, values, mask, 1.0, float(lam), float(lam))[1][i]
                       - values[i] * mask[i] for i, lam in enumerate(lams)])
    _close(adv, F.masked_whiten(raw, mask) * mask)


def test_length_adaptive_lambda_is_clamped_at_zero() -> None:
    mask = _mask([0, 10, 20, 40, 100], 100)
    # 1 - 1 / (0.05 L): L = 0 and 10 (-1) clamp to 0; 20 -> 0; 40 -> 0.5; 100 -> 0.8
    _close(F.length_adaptive_lambda(mask, 0.05), [0.0, 0.0, 0.0, 0.5, 0.8])
    with pytest.raises(ValueError, match="alpha must be > 0"):
        F.length_adaptive_lambda(mask, 0.0)


# --- SPPO targets -------------------------------------------------------------------------------------------


def test_softmean_lies_between_mean_and_max() -> None:
    x = _t([0.0, math.log(3.0)])
    _close(F.softmean(x, 1.0), math.log(2.0))  # log((1 + 3) / 2)
    _close(F.softmean(x, 0.0), math.log(3.0) / 2)  # the mean
    _close(F.softmean(x, 1e-6), math.log(3.0) / 2, atol=1e-5)  # beta -> 0: the mean
    assert F.softmean(x, 200.0).item() == pytest.approx(math.log(3.0), abs=0.01)  # beta -> inf: the max


def test_sppo_softmean_advantage_centres_on_the_whole_batch() -> None:
    rewards = _t([[0.0, 0.0], [0.0, math.log(3.0)]])
    mask = _t([[1, 0], [1, 1]])
    adv, ret = F.sppo_softmean_advantage(rewards, mask, 1.0)
    _close(adv, [[-math.log(2.0), 0.0], [math.log(1.5), math.log(1.5)]])  # r - log 2
    assert ret is adv


def test_sppo_win_rate_advantage_within_groups() -> None:
    rewards = _t([[1.0], [0.0], [0.0], [5.0]])
    mask = torch.ones(4, 1, dtype=torch.float64)
    adv, _ = F.sppo_win_rate_advantage(rewards, mask, ["a", "a", "a", "b"])
    # row 0 beats both others: P = 1; rows 1, 2 lose to row 0 and tie each other: (0 + 1/2) / 2 = 1/4; row 3 alone
    _close(adv[:, 0], [0.5, -0.25, -0.25, 0.0])


# --- the optimal token baseline -----------------------------------------------------------------------------

HALF = math.log(0.5)


def test_otb_with_equal_path_variance_is_the_group_mean_per_token() -> None:
    rewards = _t([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2, dtype=torch.float64)
    old = torch.full((2, 2), HALF, dtype=torch.float64)
    # w = 1 - 2 * 0.5 + 0.5 = 0.5 on every token: the baseline is the plain mean of G_t = [1, 1], [0, 0]
    adv, ret = F.optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, torch.full((2, 2), 0.5,
                                                                                            dtype=torch.float64))
    _close(ret, [[1.0, 1.0], [0.0, 0.0]])
    _close(adv, [[0.5, 0.5], [-0.5, -0.5]])


def test_otb_weights_paths_by_their_variance() -> None:
    rewards = _t([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2, dtype=torch.float64)
    old = _t([[HALF, HALF], [math.log(0.9), math.log(0.9)]])
    spp = _t([[0.5, 0.5], [0.82, 0.82]])
    # w: row 0: 1 - 1 + 0.5 = 0.5 -> W = 0.5, 1.0; row 1: 1 - 1.8 + 0.82 = 0.02 -> W = 0.02, 0.04
    # B_t = (1 * W0 + 0 * W1) / (W0 + W1) = 0.5 / 0.52 = 1.0 / 1.04 = 25/26 at both positions
    adv, _ = F.optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp)
    b = 25 / 26
    _close(adv, [[1 - b, 1 - b], [-b, -b]])
    # IS weights scale w by rho^2: rho = 5 on row 1 makes its W 25x: W1 = 0.5, 1.0 -> baseline 0.5
    rho = _t([[1.0, 1.0], [5.0, 5.0]])
    adv, _ = F.optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp, rho)
    _close(adv, [[0.5, 0.5], [-0.5, -0.5]])


def test_otb_zero_tail_singletons_and_padding() -> None:
    rewards = _t([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    mask = _t([[1, 1, 1], [1, 0, 0], [1, 0, 0]])
    old = torch.full((3, 3), HALF, dtype=torch.float64)
    spp = torch.full((3, 3), 0.5, dtype=torch.float64)
    # group g: rows 0 (3 tokens, G = 1, 1, 1) and 1 (1 token, G = 1): equal weights, baseline at t=0 is 1
    # row 0 is the unique longest: its baseline from t = 1 (the second-longest length) on is 0 -> adv = G
    adv, _ = F.optimal_token_baseline_advantage(rewards, mask, ["g", "g", "s"], old, spp)
    _close(adv, [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])  # row 2 is alone: no baseline
    # without the zero tail, t = 1, 2 have only row 0: baseline = its own G -> adv 0
    adv, _ = F.optimal_token_baseline_advantage(rewards, mask, ["g", "g", "s"], old, spp, handle_zero_tail=False)
    _close(adv, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])


def test_tir_otb_compares_the_kth_model_token_of_each_response() -> None:
    # row 0: model tokens at 0 and 3 (tool output at 1-2); row 1: model tokens at 0 and 1
    mask = _t([[1, 0, 0, 1], [1, 1, 0, 0]])
    rewards = _t([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    old = torch.full((2, 4), HALF, dtype=torch.float64)
    spp = torch.full((2, 4), 0.5, dtype=torch.float64)
    adv, ret = F.tir_optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp)
    # packed: row 0 G = [1, 1], row 1 G = [0, 0], equal W: baseline 0.5 at both packed positions
    _close(adv, [[0.5, 0.0, 0.0, 0.5], [-0.5, -0.5, 0.0, 0.0]])
    _close(ret, [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    # the single-turn estimator compares positions instead: position 1 has only row 1 and position 3 only row 0,
    # each its own baseline there: advantage 0 (both rows have 2 tokens, so no zero tail)
    single, _ = F.optimal_token_baseline_advantage(rewards, mask, ["g", "g"], old, spp)
    _close(single, [[0.5, 0.0, 0.0, 0.0], [-0.5, 0.0, 0.0, 0.0]])


def test_tir_otb_equals_otb_on_single_turn_masks_and_skips_empty_rows() -> None:
    g = torch.Generator().manual_seed(1)
    mask = _mask([3, 1, 4, 2, 0], 4)
    rewards = torch.randn(5, 4, generator=g, dtype=torch.float64) * mask
    old = -torch.rand(5, 4, generator=g, dtype=torch.float64)
    spp = old.exp().square() + 0.1
    ids = ["a", "a", "a", "b", "b"]
    a1, r1 = F.optimal_token_baseline_advantage(rewards, mask, ids, old, spp)
    a2, r2 = F.tir_optimal_token_baseline_advantage(rewards, mask, ids, old, spp)
    _close(r1, r2)
    _close(a1, a2)
    # group b: TIR-OTB leaves the empty row 4 out, so row 3 is alone (OTB: its unique longest row, zero tail from
    # column 0): no baseline, its return is its advantage
    _close(a2[3], r2[3] * mask[3])
    _close(a2[4], torch.zeros(4))


# --- PF-PPO's selection ----------------------------------------------------------------------------------------


def test_pf_ppo_weights() -> None:
    s = _t([0.0, 1.0, 0.5, -1.0])
    eps = 1e-8
    _close(F.pf_ppo_weights(s, "pow", 2.0), [eps, 1 + eps, 0.25 + eps, 1 + eps], atol=1e-12)
    _close(F.pf_ppo_weights(s, "pow", 0.0), [1 + eps] * 4, atol=1e-12)  # |s|^0 = 1 (0^0 too): uniform
    _close(F.pf_ppo_weights(s, "max_min", 2.0), [eps, 1 + eps, eps, 1 + eps], atol=1e-12)  # batch max 1, min -1
    _close(F.pf_ppo_weights(s, "max_random", 2.0), [0.1 + eps, 0.4 + eps, 0.1 + eps, 0.1 + eps], atol=1e-12)
    with pytest.raises(ValueError, match="Allowed: pow, max_min, max_random"):
        F.pf_ppo_weights(s, "median")


def test_pf_ppo_max_min_resamples_only_the_extremes_and_is_seeded() -> None:
    s = _t([0.3, 1.0, 0.5, -1.0, 0.2, 0.0, 0.9, 0.4])
    draws = F.pf_ppo_resample_indices(s, "max_min", 2.0, torch.Generator().manual_seed(0))
    assert len(draws) == 8 and set(draws.tolist()) <= {1, 3}  # the others' weight 1e-8 is never drawn here
    again = F.pf_ppo_resample_indices(s, "max_min", 2.0, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_pf_ppo_filter_keeps_chosen_responses_per_prompt() -> None:
    s = _t([0.2, 0.9, 0.1, 0.5, 0.5, 0.3])
    ids = ["a", "a", "a", "b", "b", "c"]
    assert F.pf_ppo_filter_indices(s, ids, "best_of_n").tolist() == [1, 3, 5]  # b's tie: its first row
    assert F.pf_ppo_filter_indices(s, ids, "best_worst").tolist() == [1, 2, 3, 4, 5]
    kept = F.pf_ppo_filter_indices(s, ids, "best_random", torch.Generator().manual_seed(0)).tolist()
    assert len(kept) == 5 and {1, 3, 4, 5} <= set(kept) and len({0, 2} & set(kept)) == 1
    with pytest.raises(ValueError, match="Allowed: best_of_n, best_random, best_worst"):
        F.pf_ppo_filter_indices(s, ids, "best")
