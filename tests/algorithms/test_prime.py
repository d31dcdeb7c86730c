"""PRIME's math (algorithms/implicit_prm.py) against hand-computed values and against verl-recipe's own PRIME code
(data/verl_prime_vectors.json, written by gen_verl_vectors.py --prime-recipe), and the ``prm`` role's training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlforge.algorithms import implicit_prm as P

VERL = json.loads((Path(__file__).parent / "data" / "verl_prime_vectors.json").read_text())
TOL = {"atol": 1e-6, "rtol": 1e-5}  # verl ran in float32


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# --- hand-computed ----------------------------------------------------------------------------------------------
Q = _t([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
MASK = _t([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_token_rewards_are_beta_q_with_the_last_token_zero():
    assert P.implicit_process_rewards(Q, MASK, beta=0.5).tolist() == [[0.5, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]]


def test_lambda_accumulates_the_rewards_and_use_gt_replaces_the_last_term():
    # row 0: beta q = [0.5, 1, 1.5]; r2 = 1.5, r1 = 1 + 0.5 * 1.5 = 1.75, r0 = 0.5 + 0.5 * 1.75 = 1.375; last -> 0
    out = P.implicit_process_rewards(Q, MASK, beta=0.5, lam=0.5)
    assert out[0].tolist() == [1.375, 1.75, 0.0, 0.0]
    # use_gt with acc 1: the last term is 1 - (0.5 + 1) = -0.5: r1 = 1 - 0.25 = 0.75, r0 = 0.5 + 0.375 = 0.875
    out = P.implicit_process_rewards(Q, MASK, beta=0.5, lam=0.5, acc=_t([1.0, 0.0]))
    assert out[0].tolist() == [0.875, 0.75, 0.0, 0.0]


def test_batch_norm_bounds_every_return_to_go_by_one():
    rewards = _t([[1.0, 2.0, 0.0], [-4.0, 0.0, 0.0]])  # returns-to-go [3, 2, 0] and [-4, 0, 0]: the largest is 4
    out = P.batch_norm(rewards)
    assert torch.allclose(out, rewards / (4 + 1e-6))
    assert float(out.flip(-1).cumsum(-1).abs().max()) == pytest.approx(1.0, abs=1e-6)


def test_outcome_bce():
    q = _t([[2.0, 2.0], [1.0, -3.0]])
    # row 0: logit 0.5 * 4 = 2, acc 1 -> -log(sigmoid(2)); row 1: logit -1, acc 0 -> -log(1 - sigmoid(-1))
    out = P.outcome_bce(q, _t([1.0, 0.0]), torch.ones(2, 2), beta=0.5)
    assert out.tolist() == pytest.approx([-math.log(1 / (1 + math.exp(-2))), -math.log(1 - 1 / (1 + math.exp(1)))])


def test_outcome_rloo_is_acc_minus_the_others_mean():
    acc = _t([1.0, 0.0, 1.0, 1.0])
    last = torch.zeros(4, 3, dtype=torch.bool)
    last[:, 2] = True
    outcome = torch.zeros(4, 3)
    outcome[:, 2] = acc
    out = P.masked_rloo(outcome, last, ["a"] * 4)
    others = [(acc.sum() - a) / 3 for a in acc]
    assert out[:, 2].tolist() == pytest.approx([float(a - o) for a, o in zip(acc, others)])
    assert out[:, :2].abs().sum() == 0


def test_process_rloo_means_sum_to_zero_per_group():
    g = torch.Generator().manual_seed(0)
    rewards, mask = torch.randn(6, 5, generator=g), (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    out = P.masked_rloo(rewards, mask, ["a", "a", "a", "b", "b", "b"])
    means = (out * mask).sum(-1) / mask.sum(-1)
    assert abs(float(means[:3].sum())) < 1e-5 and abs(float(means[3:].sum())) < 1e-5
    assert (out[mask == 0] == 0).all()


def test_advantages_of_one_group_by_hand():
    # acc [1, 0], 2 tokens each: outcome RLOO on the last token [1, -1] x 5 -> returns [[5, 5], [-5, -5]]; whitened
    # over the 4 tokens: mean 0, unbiased variance 100 / 3
    adv, ret = P.prime_advantages(torch.zeros(2, 2), _t([1.0, 0.0]), torch.ones(2, 2), ["a", "a"], 5.0, 5.0)
    assert ret.tolist() == [[5.0, 5.0], [-5.0, -5.0]]
    assert adv.flatten().tolist() == pytest.approx([5 / math.sqrt(100 / 3)] * 2 + [-5 / math.sqrt(100 / 3)] * 2, rel=1e-5)


def test_pairwise_accuracy_by_hand():
    # group a: scores [3, 1, 2], acc [1, 0, 1]: pairs (0,1) right, (1,2) right, (0,2) weight 0 -> 1.0; group b all
    # equal acc -> 0.5; mean 0.75
    scores, acc = _t([3.0, 1.0, 2.0, 0.3, 0.1]), _t([1.0, 0.0, 1.0, 1.0, 1.0])
    assert P.pairwise_accuracy(scores, acc, ["a", "a", "a", "b", "b"]) == pytest.approx(0.75)


def test_accuracy_band_keeps_passing_prompts_first_in_order():
    acc = _t([1, 1, 1, 0, 0, 1])  # a: mean 1 (above 0.8), b and c: 0.5
    uids = ["a", "a", "b", "b", "c", "c"]
    assert P.accuracy_band(acc, uids, 2, 0.2, 0.8) == [2, 3, 4, 5]
    assert P.accuracy_band(acc, uids, 3, 0.2, 0.8) == [2, 3, 4, 5, 0, 1]
    too_long = torch.tensor([False, False, False, False, True, False])  # a response of c hit the limit
    assert P.accuracy_band(acc, uids, 2, 0.2, 0.8, too_long) == [2, 3, 0, 1]
    assert P.band_passes(acc, uids, 0.2, 0.8, too_long) == {"a": False, "b": True, "c": False}


# --- verl-recipe's own code ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", VERL["advantage"], ids=lambda c: f"dpo{c['dpo_coef']}-gt{c['gt_coef']}")
def test_advantages_match_verl(case):
    n, mask = VERL["n"], _t(VERL["mask"])
    groups = [i // n for i in range(len(mask))]
    adv, ret = P.prime_advantages(_t(VERL["scores"]), _t(VERL["acc"]), mask, groups, case["dpo_coef"], case["gt_coef"])
    assert torch.allclose(ret, _t(case["returns"]), **TOL)
    assert torch.allclose(adv, _t(case["advantages"]) * mask, **TOL)  # verl leaves whitened values at padding


def test_bce_pairwise_accuracy_and_batch_norm_match_verl():
    scores, acc, mask, n = _t(VERL["scores"]), _t(VERL["acc"]), _t(VERL["mask"]), VERL["n"]
    assert float(P.outcome_bce(scores, acc, mask, VERL["beta"]).mean()) == pytest.approx(VERL["bce"], rel=1e-5)
    groups = [i // n for i in range(len(mask))]
    assert P.pairwise_accuracy((scores * mask).sum(-1), acc, groups) == pytest.approx(VERL["pairwise_acc"], rel=1e-6)
    assert torch.allclose(P.batch_norm(scores), _t(VERL["batch_norm"]), **TOL)
