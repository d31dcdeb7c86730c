"""Preference-learning losses (DPO, IPO, KTO, SimPO, ORPO, reward model) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.algorithms import preference as P


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _close(actual, expected, atol: float = 1e-9) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=1e-9)


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --- DPO -----------------------------------------------------------------------------------------------


def test_dpo_sigmoid_hand_computed_with_gradient() -> None:
    pc = _t([-1.0, -5.0]).requires_grad_(True)
    out = P.dpo_loss(pc, _t([-3.0, -4.0]), _t([-2.0, -4.0]), _t([-2.0, -4.0]), beta=0.5)
    # pair 0: h = (-1 + 2) - (-3 + 2) = 2, beta h = 1: -log sigmoid(1) = log(1 + e^-1) = 0.3132617
    # pair 1: h = (-5 + 4) - (-4 + 4) = -1, beta h = -0.5: log(1 + e^0.5) = 0.9740770
    _close(out.losses, [softplus(-1.0), softplus(0.5)])
    assert out.losses[0].item() == pytest.approx(0.3132617, abs=1e-7)
    _close(out.chosen_rewards, [0.5 * 1.0, 0.5 * -1.0])  # beta (pi_c - ref_c)
    _close(out.rejected_rewards, [0.5 * -1.0, 0.0])
    assert not out.chosen_rewards.requires_grad
    out.losses.sum().backward()
    # d/d pi_c of -log sigmoid(beta h) = -beta sigmoid(-beta h): -0.5 * sigmoid(-1), -0.5 * sigmoid(0.5)
    _close(pc.grad, [-0.5 * sigmoid(-1.0), -0.5 * sigmoid(0.5)])


def test_dpo_label_smoothing() -> None:
    out = P.dpo_loss(_t([-1.0]), _t([-3.0]), _t([-2.0]), _t([-2.0]), beta=0.5, label_smoothing=0.1)
    # 0.9 * -log sigmoid(1) + 0.1 * -log sigmoid(-1) = 0.9 * 0.3132617 + 0.1 * 1.3132617 = 0.4132617
    _close(out.losses, [0.9 * softplus(-1.0) + 0.1 * softplus(1.0)])
    assert out.losses.item() == pytest.approx(0.4132617, abs=1e-7)


@pytest.mark.parametrize("kwargs, message", [
    ({"beta": 0.0}, "'beta' must be > 0"), ({"label_smoothing": 0.6}, r"'label_smoothing' must be in \[0, 0.5\]"),
])
def test_dpo_bad_hyperparameters(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        P.dpo_loss(_t([-1.0]), _t([-1.0]), _t([-1.0]), _t([-1.0]), **kwargs)


# --- IPO -----------------------------------------------------------------------------------------------


def test_ipo_length_normalized_squared_loss() -> None:
    out = P.ipo_loss(_t([-4.0, -2.0]), _t([-3.0, -2.0]), _t([-6.0, -2.0]), _t([-2.0, -2.0]),
                     chosen_lengths=torch.tensor([4, 5]), rejected_lengths=torch.tensor([2, 0]), beta=0.25)
    # pair 0: (-4 + 6) / 4 - (-3 + 2) / 2 = 0.5 + 0.5 = 1; 1 / (2 beta) = 2: (1 - 2)^2 = 1
    # pair 1: 0 - 0 = 0 (a length of 0 counts as 1): (0 - 2)^2 = 4
    _close(out.losses, [1.0, 4.0])
    _close(out.chosen_rewards, [0.25 * 2.0, 0.0])  # beta * summed log-ratio, as TRL logs it
    _close(out.rejected_rewards, [0.25 * -1.0, 0.0])


# --- KTO -----------------------------------------------------------------------------------------------


def test_kto_kl_estimate_is_a_clamped_detached_mean() -> None:
    policy = _t([-1.0, -2.0, -3.0]).requires_grad_(True)
    z0 = P.kto_kl_estimate(policy, _t([-1.5, -2.1, -3.3]))  # differences 0.5, 0.1, 0.3: mean 0.3
    assert z0.item() == pytest.approx(0.3) and not z0.requires_grad
    assert P.kto_kl_estimate(_t([-2.0]), _t([-1.0])).item() == 0.0  # -1 clamps to 0


def test_kto_unpaired_hand_computed() -> None:
    pc = _t([-1.0]).requires_grad_(True)
    out = P.kto_loss(pc, _t([-3.0, -2.0]), _t([-2.3]), _t([-2.3, -2.3]), kl=0.3, beta=1.0,
                     desirable_weight=2.0, undesirable_weight=1.0)
    # desirable: r = 1.3, 1 - sigmoid(1.3 - 0.3) = 1 - 0.7310586 = 0.2689414, x 2
    # undesirable: r = -0.7: 1 - sigmoid(0.3 + 0.7) = 0.2689414; r = 0.3: 1 - sigmoid(0) = 0.5
    _close(out.losses, [2 * (1 - sigmoid(1.0)), 1 - sigmoid(1.0), 0.5])
    _close(out.chosen_rewards, [1.3])
    _close(out.rejected_rewards, [-0.7, 0.3])
    out.losses.sum().backward()
    # d/dr of 2 (1 - sigmoid(r - kl)) = -2 sigmoid(1) sigmoid(-1)
    _close(pc.grad, [-2 * sigmoid(1.0) * sigmoid(-1.0)])


def test_kto_one_side_empty_and_kl_has_no_gradient() -> None:
    kl = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    out = P.kto_loss(_t([]), _t([-1.0]), _t([]), _t([-1.0]), kl=kl, beta=2.0)
    _close(out.losses, [1 - sigmoid(2.0 * (0.5 - 0.0))])  # only the undesirable example: 1 - sigmoid(1)
    assert out.chosen_rewards.numel() == 0
    assert not out.losses.requires_grad  # the reference point is detached, nothing else needs a gradient


# --- SimPO ---------------------------------------------------------------------------------------------


def test_simpo_hand_computed() -> None:
    out = P.simpo_loss(_t([-6.0]), _t([-10.0]), torch.tensor([3]), torch.tensor([4]), beta=2.0, simpo_gamma=0.5)
    # mean log-probs -2 and -2.5: z = 2 * 0.5 - 0.5 = 0.5; -log sigmoid(0.5) = log(1 + e^-0.5) = 0.4740770
    _close(out.losses, [softplus(-0.5)])
    assert out.losses.item() == pytest.approx(0.4740770, abs=1e-7)
    _close(out.chosen_rewards, [-4.0])  # beta * mean log-prob
    _close(out.rejected_rewards, [-5.0])
    smoothed = P.simpo_loss(_t([-6.0]), _t([-10.0]), torch.tensor([3]), torch.tensor([4]), 2.0, 0.5, 0.2)
    _close(smoothed.losses, [0.8 * softplus(-0.5) + 0.2 * softplus(0.5)])


# --- ORPO ----------------------------------------------------------------------------------------------


def test_orpo_odds_ratio_hand_computed() -> None:
    pc = _t([-1.5]).requires_grad_(True)
    out = P.orpo_odds_ratio_loss(pc, _t([-2.0]), torch.tensor([3]), torch.tensor([2]), beta=0.1)
    # mean log-probs p_c = -0.5, p_r = -1; log odds(p) = p - log(1 - e^p)
    # log(1 - e^-0.5) = log 0.3934693 = -0.9327521; log(1 - e^-1) = log 0.6321206 = -0.4586751
    log_odds = (-0.5 - math.log(1 - math.exp(-0.5))) - (-1.0 - math.log(1 - math.exp(-1.0)))
    assert log_odds == pytest.approx(0.5 + 0.9327521 - 0.4586751, abs=1e-7)
    ratio = -softplus(-log_odds)  # log sigmoid(log_odds)
    _close(out.log_odds, [log_odds])
    _close(out.log_odds_ratio, [ratio])
    _close(out.losses, [-0.1 * ratio])
    _close(out.chosen_rewards, [-0.05])  # beta * mean log-prob
    _close(out.rejected_rewards, [-0.1])
    out.losses.sum().backward()
    assert pc.grad.item() < 0  # raising the chosen log-prob lowers the loss


def test_orpo_log1mexp_is_accurate_near_zero() -> None:
    # a mean log-prob of -1e-10 (near-certain tokens): log(1 - e^x) = log(1e-10) exactly, no cancellation
    out = P.orpo_odds_ratio_loss(_t([-1e-10]), _t([-2.0]), torch.tensor([1]), torch.tensor([1]))
    expected = (-1e-10 - math.log(1e-10)) - (-2.0 - math.log(1 - math.exp(-2.0)))
    _close(out.log_odds, [expected], atol=1e-6)


# --- reward model --------------------------------------------------------------------------------------


def test_reward_model_loss_with_margin_and_centering() -> None:
    chosen, rejected = _t([2.0, 0.0]), _t([1.0, 1.0])
    _close(P.reward_model_loss(chosen, rejected), [softplus(-1.0), softplus(1.0)])  # -log sigmoid(1), (-1)
    # margins 0.5 and 0: -log sigmoid(1 - 0.5), -log sigmoid(-1)
    _close(P.reward_model_loss(chosen, rejected, _t([0.5, 0.0])), [softplus(-0.5), softplus(1.0)])
    _close(P.reward_model_loss(chosen, rejected, 0.5), [softplus(-0.5), softplus(1.5)])
    # centering: + 0.01 (r_c + r_r)^2 = + 0.09, + 0.01
    _close(P.reward_model_loss(chosen, rejected, center_rewards_coefficient=0.01),
           [softplus(-1.0) + 0.09, softplus(1.0) + 0.01])


# --- metrics -------------------------------------------------------------------------------------------


def test_preference_metrics_paired() -> None:
    m = P.preference_metrics(_t([0.5, -0.2]), _t([-0.5, 0.1]), _t([-10.0, -20.0]), _t([-30.0, -40.0]))
    assert m == pytest.approx({
        "rewards/chosen": 0.15, "rewards/rejected": -0.2, "rewards/margins": 0.35,
        "rewards/accuracies": 0.5,  # 0.5 > -0.5 yes, -0.2 > 0.1 no
        "logps/chosen": -15.0, "logps/rejected": -35.0,
    })
    with pytest.raises(ValueError, match="paired=False"):
        P.preference_metrics(_t([1.0]), _t([1.0, 2.0]))


def test_preference_metrics_unpaired() -> None:
    m = P.preference_metrics(_t([1.3]), _t([-0.7, 0.3]), paired=False)
    assert m == pytest.approx({"rewards/chosen": 1.3, "rewards/rejected": -0.2, "rewards/margins": 1.5})
    m = P.preference_metrics(_t([]), _t([-0.7, 0.3]), None, _t([-5.0, -7.0]), paired=False)
    assert m == pytest.approx({"rewards/rejected": -0.2, "logps/rejected": -6.0})
