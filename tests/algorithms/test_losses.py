"""GSPO/GPG/value losses, KL-in-reward and its controllers, and micro-batch invariance of aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.algorithms import functional as F


def _close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-6)


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# --- GSPO -----------------------------------------------------------------------------------------------

# one sequence, 3 valid tokens + 1 padding; per-token log-ratios 0.3, -0.1, 0.1 -> mean 0.1
OLD = _t([[-1.0, -2.0, -0.5, -3.0]])
NEW = OLD + _t([[0.3, -0.1, 0.1, 50.0]])  # +50 on the padding must not count
MASK = _t([[1, 1, 1, 0]])
S = math.exp(0.1)  # sequence ratio s = exp(mean log-ratio) = 1.1051709


def test_gspo_value_is_the_sequence_ratio_for_every_token() -> None:
    adv = -torch.ones(1, 4, dtype=torch.float64)
    loss, stats = F.gspo_policy_loss(NEW, OLD, adv, MASK)
    # A = -1, s = 1.105 > 1 + 4e-4: the unclipped term -A s = s is the larger one, for every token
    # although the tokens' own ratios are exp(.3), exp(-.1), exp(.1)
    _close(loss, [[S, S, S, 0.0]])
    _close(stats["clipped"][:, :3], [[0.0, 0.0, 0.0]])
    _close(stats["clipped_lower"], torch.zeros(1, 4))
    _close(stats["neg_log_ratio"], [[-0.3, 0.1, -0.1, -50.0]])


def test_gspo_gradient_per_token_matches_the_sequence_objective() -> None:
    adv = -torch.ones(1, 4, dtype=torch.float64)
    logp = NEW.clone().requires_grad_(True)
    loss_mat, _ = F.gspo_policy_loss(logp, OLD, adv, MASK)
    F.agg_loss(loss_mat, MASK, "seq-mean-token-mean").backward()
    # L = (1/3) sum_t -A s_t with d s_t / d logp_t = s_t = s  ->  dL/dlogp_t = -A s / 3 = s / 3
    _close(logp.grad, [[S / 3, S / 3, S / 3, 0.0]])
    assert (logp.grad[0, :3] != 0).all()

    # the same gradient as the sequence-level objective -A * exp(mean_t(logp - old)) = s
    logp2 = NEW.clone().requires_grad_(True)
    torch.exp(((logp2 - OLD) * MASK).sum() / 3).backward()
    _close(logp.grad, logp2.grad)


def test_gspo_clipping_uses_the_sequence_ratio() -> None:
    adv = torch.ones(1, 4, dtype=torch.float64)
    logp = NEW.clone().requires_grad_(True)
    loss, stats = F.gspo_policy_loss(logp, OLD, adv, MASK)
    # A = +1, s = 1.105 > 1 + 4e-4: clipped to -A (1 + 4e-4) = -1.0004, no gradient
    _close(loss, [[-1.0004, -1.0004, -1.0004, 0.0]])
    _close(stats["clipped"][:, :3], [[1.0, 1.0, 1.0]])
    loss.sum().backward()
    _close(logp.grad, torch.zeros(1, 4))

    # with a wide clip range the same sequence is unclipped: -A s per token
    loss, stats = F.gspo_policy_loss(NEW, OLD, adv, MASK, clip_ratio_low=0.2, clip_ratio_high=0.2)
    _close(loss, [[-S, -S, -S, 0.0]])
    assert stats["clipped"].sum() == 0


def test_gspo_sequences_are_independent_and_padding_is_ignored() -> None:
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = _t([[0.2, 0.4, 9.0], [-0.3, 7.0, 7.0]])  # row 0: mean(.2, .4) = .3; row 1: -.3
    mask = _t([[1, 1, 0], [1, 0, 0]])
    adv = _t([[-2.0] * 3, [3.0] * 3])
    loss, _ = F.gspo_policy_loss(new, old, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5)
    # row 0: -A s = 2 e^.3; row 1: -A s = -3 e^-.3 (both inside [0.5, 1.5])
    _close(loss, [[2 * math.exp(0.3), 2 * math.exp(0.3), 0.0], [-3 * math.exp(-0.3), 0.0, 0.0]])


def test_gspo_multi_turn_sequence_ratio_spans_the_turns_only() -> None:
    mask = _t([[1, 1, 0, 0, 0, 1, 1, 0]])  # turn, observation, turn, padding
    old = torch.zeros(1, 8, dtype=torch.float64)
    new = _t([[0.1, 0.3, 5.0, 5.0, 5.0, -0.2, 0.2, 5.0]])  # 5.0: observation / padding, ignored
    loss, _ = F.gspo_policy_loss(new, old, -torch.ones(1, 8, dtype=torch.float64), mask, 0.5, 0.5)
    # log s = (0.1 + 0.3 - 0.2 + 0.2) / 4 model tokens = 0.1; -A s = e^0.1 on the model tokens of both turns
    s = math.exp(0.1)
    _close(loss, [[s, s, 0, 0, 0, s, s, 0]])


def test_gspo_log_ratio_clamped_at_10() -> None:
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = torch.full((1, 2), 12.0, dtype=torch.float64)  # sequence log-ratio 12 -> clamped to 10
    loss, _ = F.gspo_policy_loss(new, old, -torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))
    _close(loss, [[math.exp(10.0)] * 2])


def test_gspo_empty_row_is_zero() -> None:
    x = torch.zeros(1, 3)
    loss, _ = F.gspo_policy_loss(x, x, torch.ones(1, 3), torch.zeros(1, 3))
    _close(loss, torch.zeros(1, 3))


# --- GPG policy loss ------------------------------------------------------------------------------------


def test_gpg_policy_loss_and_gradient() -> None:
    logp = _t([[-1.0, -2.0, -0.5]]).requires_grad_(True)
    adv = _t([[2.0, 2.0, 2.0]])
    mask = _t([[1, 1, 0]])
    loss, stats = F.gpg_policy_loss(logp, adv, mask)
    _close(loss, [[2.0, 4.0, 0.0]])  # -logp * A: -(-1)*2, -(-2)*2, masked
    _close(stats["clipped"], torch.zeros(1, 3))
    loss.sum().backward()
    _close(logp.grad, [[-2.0, -2.0, 0.0]])  # d(-logp A)/dlogp = -A on valid tokens


# --- value loss -----------------------------------------------------------------------------------------

# row 0 = tokens 0, 1; row 1 = token 2 + one masked (garbage) position. cliprange 0.5
VPRED = _t([[1.0, 2.0], [2.0, 50.0]])
VOLD = _t([[0.8, 1.0], [3.0, -9.0]])
RET = _t([[1.5, 1.0], [1.0, 4.0]])
VMASK = _t([[1, 1], [1, 0]])
# tok0: clip(1.0, .3, 1.3) = 1.0; (1-1.5)^2 = .25 both -> .25, not clipped (tie)
# tok1: clip(2.0, .5, 1.5) = 1.5; (2-1)^2 = 1 > (1.5-1)^2 = .25 -> 1, not clipped
# tok2: clip(2.0, 2.5, 3.5) = 2.5; (2-1)^2 = 1 < (2.5-1)^2 = 2.25 -> 2.25, clipped
VALUE_EXPECTED = {
    "token-mean": 0.5 * (0.25 + 1 + 2.25) / 3,
    "token-sum": 0.5 * (0.25 + 1 + 2.25),
    "seq-mean-token-sum": 0.5 * ((0.25 + 1) + 2.25) / 2,
    "seq-mean-token-mean": 0.5 * ((0.25 + 1) / 2 + 2.25 / 1) / 2,
    "seq-mean-token-sum-norm": 0.5 * ((0.25 + 1) / 2 + 2.25 / 2) / 2,
}


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
def test_value_loss_hand_computed(mode: str) -> None:
    loss, clipfrac = F.value_loss(VPRED, RET, VOLD, VMASK, cliprange_value=0.5, loss_agg_mode=mode)
    assert loss.item() == pytest.approx(VALUE_EXPECTED[mode])
    assert clipfrac.item() == pytest.approx(1 / 3)  # 1 of 3 valid tokens clipped, whatever the mode


def test_value_loss_default_mode_and_gradient() -> None:
    v = VPRED.clone().requires_grad_(True)
    loss, _ = F.value_loss(v, RET, VOLD, VMASK)
    assert loss.item() == pytest.approx(VALUE_EXPECTED["token-mean"])
    loss.backward()
    # 0.5/3 * d/dv: tok0 (v - R) = -.5 (tie: either branch has this slope), tok1 (v - R) = 1,
    # tok2 the clipped branch is constant in v -> 0; masked -> 0
    _close(v.grad, [[-0.5 / 3, 1 / 3], [0.0, 0.0]])


def test_value_loss_huge_cliprange_is_plain_mse() -> None:
    loss, clipfrac = F.value_loss(VPRED, RET, VOLD, VMASK, cliprange_value=1e9)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 1 + 1) / 3)
    assert clipfrac.item() == 0.0


# --- micro-batch invariance (values and gradients) ----------------------------------------------------

SPLITS = [[2, 3], [1, 1, 3], [4, 1], [1, 1, 1, 1, 1]]


def _random_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = _t([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    x = torch.randn(5, 6, generator=g, dtype=torch.float64)
    return x, mask


def _chunks(split: list[int]):
    start = 0
    for size in split:
        yield slice(start, start + size)
        start += size


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
@pytest.mark.parametrize("split", SPLITS)
def test_agg_loss_micro_batch_values_and_gradients_match_full_batch(mode: str, split: list[int]) -> None:
    x, mask = _random_batch()
    full_in = x.clone().requires_grad_(True)
    full = F.agg_loss(full_in.square(), mask, mode)  # a non-linear function of the input
    full.backward()

    micro_in = x.clone().requires_grad_(True)
    tokens, seqs = float(mask.sum()), float(mask.shape[0])
    total = torch.zeros((), dtype=torch.float64)
    for rows in _chunks(split):
        part = F.agg_loss(micro_in[rows].square(), mask[rows], mode, tokens, seqs)
        part.backward()  # gradient accumulation, as the trainer does
        total = total + part.detach()
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    _close(micro_in.grad, full_in.grad, atol=1e-12)


@pytest.mark.parametrize("split", SPLITS)
def test_seq_mean_token_sum_norm_with_repadded_micro_batches_needs_norm_length(split: list[int]) -> None:
    x, mask = _random_batch()
    width = mask.shape[-1]
    full = F.agg_loss(x, mask, "seq-mean-token-sum-norm")  # normalizer: the padded width 6
    total = 0.0
    for rows in _chunks(split):
        keep = int(mask[rows].sum(0).nonzero().max()) + 1  # micro-batch re-padded to its own width
        part = F.agg_loss(x[rows, :keep], mask[rows, :keep], "seq-mean-token-sum-norm", None, 5.0, norm_length=width)
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-12)


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
@pytest.mark.parametrize("split", SPLITS)
def test_value_loss_micro_batch_invariance(mode: str, split: list[int]) -> None:
    g = torch.Generator().manual_seed(1)
    _, mask = _random_batch()
    vpred = torch.randn(5, 6, generator=g, dtype=torch.float64)
    vold = vpred + 0.8 * torch.randn(5, 6, generator=g, dtype=torch.float64)
    ret = torch.randn(5, 6, generator=g, dtype=torch.float64)

    full_in = vpred.clone().requires_grad_(True)
    full, full_cf = F.value_loss(full_in, ret, vold, mask, 0.5, mode)
    full.backward()
    assert 0 < full_cf.item() < 1  # the data exercises both branches

    micro_in = vpred.clone().requires_grad_(True)
    tokens, seqs = float(mask.sum()), 5.0
    total, total_cf = 0.0, 0.0
    for rows in _chunks(split):
        loss, cf = F.value_loss(micro_in[rows], ret[rows], vold[rows], mask[rows], 0.5, mode, tokens, seqs)
        loss.backward()
        total += loss.item()
        total_cf += cf.item()
    assert total == pytest.approx(full.item(), rel=1e-12)
    assert total_cf == pytest.approx(full_cf.item(), rel=1e-12)
    _close(micro_in.grad, full_in.grad, atol=1e-12)


# --- KL: straight-through k1+ -----------------------------------------------------------------------------


def test_k1_plus_value_is_k1_and_gradient_is_k2() -> None:
    logp_ref = _t([[-1.5, -1.0, -0.5]])
    logp = _t([[-1.0, -2.0, -0.5]]).requires_grad_(True)
    value = F.kl_penalty(logp, logp_ref, "k1+")
    _close(value.detach(), [[0.5, -1.0, 0.0]])  # logp - ref
    value.sum().backward()

    logp2 = logp.detach().clone().requires_grad_(True)
    F.kl_penalty(logp2, logp_ref, "k2").sum().backward()
    _close(logp.grad, logp2.grad)
    _close(logp.grad, [[0.5, -1.0, 0.0]])  # d/dlogp 0.5 (logp - ref)^2 = logp - ref, not k1's 1

    logp3 = logp.detach().clone().requires_grad_(True)
    F.kl_penalty(logp3, logp_ref, "kl+").sum().backward()
    _close(logp3.grad, logp2.grad)


# --- KL in the reward -------------------------------------------------------------------------------------

SCORES = _t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
LOGP = _t([[-1.0, -1.0, -1.0], [-0.5, -0.5, 5.0]])
REF = _t([[-1.5, -1.0, -0.5], [-1.0, -1.0, -3.0]])
KMASK = _t([[1, 1, 1], [1, 1, 0]])


def test_kl_in_reward_k1() -> None:
    rewards, mean_kl = F.kl_in_reward(SCORES, LOGP, REF, KMASK, kl_coef=0.1)
    # kl = logp - ref = [[.5, 0, -.5], [.5, .5, (masked 8 -> 0)]]; rewards = scores - 0.1 kl
    _close(rewards, [[-0.05, 0.0, 1.05], [-0.05, 1.95, 0.0]])
    # per-sequence mean: row 0 (.5 + 0 - .5)/3 = 0, row 1 (.5 + .5)/2 = .5 -> mean over sequences .25
    assert mean_kl.dim() == 0
    assert mean_kl.item() == pytest.approx(0.25)


def test_kl_in_reward_k2() -> None:
    rewards, mean_kl = F.kl_in_reward(SCORES, LOGP, REF, KMASK, kl_coef=0.1, estimator="k2")
    # k2 = .5 d^2 = [[.125, 0, .125], [.125, .125, -]] -> means .25/3 and .125
    _close(rewards, [[-0.0125, 0.0, 0.9875], [-0.0125, 1.9875, 0.0]])
    assert mean_kl.item() == pytest.approx((0.25 / 3 + 0.125) / 2)


def test_kl_in_reward_zero_coef_and_empty_row() -> None:
    mask = _t([[1, 1, 1], [0, 0, 0]])
    rewards, mean_kl = F.kl_in_reward(SCORES, LOGP, REF, mask, kl_coef=0.0)
    _close(rewards, SCORES)
    assert mean_kl.item() == pytest.approx(0.0)  # row 0 mean 0, the empty row counts as 0


# --- KL controllers -------------------------------------------------------------------------------------


def test_fixed_kl_controller() -> None:
    ctl = F.FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05
    other = F.FixedKLController(1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


def test_adaptive_kl_controller_hand_computed() -> None:
    ctl = F.AdaptiveKLController(init_kl_coef=0.2, target_kl=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)
    # error = clip(9/6 - 1 = 0.5, +-0.2) = 0.2; value *= 1 + 0.2 * 256 / 10000 = 1.00512
    assert ctl.value == pytest.approx(0.2 * 1.00512)
    ctl.update(current_kl=torch.tensor(5.4), n_steps=1000)
    # error = 5.4/6 - 1 = -0.1 (inside the clip); value *= 1 - 0.1 * 0.1 = 0.99
    assert ctl.value == pytest.approx(0.2 * 1.00512 * 0.99)
    ctl.update(current_kl=0.0, n_steps=500)
    # error = clip(-1, +-0.2) = -0.2; value *= 1 - 0.2 * 0.05 = 0.99
    assert ctl.value == pytest.approx(0.2 * 1.00512 * 0.99 * 0.99)


def test_adaptive_kl_controller_checkpoint_round_trip() -> None:
    ctl = F.AdaptiveKLController(0.1, 1.0, 100)
    ctl.update(2.0, 10)  # 0.1 * (1 + 0.2 * 0.1) = 0.102
    state = ctl.state_dict()
    assert state == {"value": pytest.approx(0.102)}
    assert all(type(v) is float for v in state.values())
    restored = F.AdaptiveKLController(0.1, 1.0, 100)
    restored.load_state_dict(state)
    restored.update(2.0, 10)
    ctl.update(2.0, 10)
    assert restored.value == ctl.value


def test_adaptive_kl_controller_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="horizon"):
        F.AdaptiveKLController(0.1, 1.0, 0)
    with pytest.raises(ValueError, match="target_kl"):
        F.AdaptiveKLController(0.1, 0.0, 10)


def test_kl_in_reward_feeds_the_controller() -> None:
    ctl = F.AdaptiveKLController(0.1, target_kl=0.5, horizon=10)
    rewards, mean_kl = F.kl_in_reward(SCORES, LOGP, REF, KMASK, ctl.value)
    ctl.update(mean_kl, n_steps=2)  # mean_kl .25 -> error clip(-.5) = -.2; * (1 - .2 * 2/10) = .96
    assert ctl.value == pytest.approx(0.096)


def test_public_names_are_exported() -> None:
    for name in F.__all__:
        assert hasattr(F, name), name


@pytest.mark.parametrize("loss", ["clipped_policy_loss", "cispo_policy_loss"])
def test_a_lower_clip_ratio_of_one_or_more_never_clips_below(loss: str) -> None:
    """clip_ratio_low >= 1 puts the lower bound 1 - low at or below 0, which no ratio reaches: as verl's CISPO example
    launch sets it (clip_ratio_low=10: no lower clip). Ratio 0.5 (second token: ratio 1): PPO with A = -1 takes
    max(-A r, -A clip(r)) = max(0.5, 0.8) = 0.8 at low 0.2, 0.5 at low 10; CISPO with A = +1 weighs -log_prob by
    clip(r) = 0.8 at low 0.2, 0.5 at low 10."""
    log_prob, old = torch.log(torch.tensor([[0.5, 1.0]])), torch.zeros(1, 2)
    sign = -1.0 if loss == "clipped_policy_loss" else 1.0
    advantages, mask = torch.full((1, 2), sign), torch.ones(1, 2)
    fn = getattr(F, loss)
    low, _ = fn(log_prob, old, advantages, mask, clip_ratio_low=10.0, clip_ratio_high=0.2)
    clipped, _ = fn(log_prob, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    if loss == "clipped_policy_loss":
        torch.testing.assert_close(low, torch.tensor([[0.5, 1.0]]))
        torch.testing.assert_close(clipped, torch.tensor([[0.8, 1.0]]))
    else:
        torch.testing.assert_close(low, -torch.tensor([[0.5, 1.0]]) * log_prob)
        torch.testing.assert_close(clipped, -torch.tensor([[0.8, 1.0]]) * log_prob)
