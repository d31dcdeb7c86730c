"""rlforge.algorithms.grpo.GRPO: advantages and the policy loss composed from the functional pieces."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge import batch as B
from rlforge.algorithms import functional as F
from rlforge.algorithms.grpo import GRPO, GRPOConfig
from rlforge.config import compose
from rlforge.errors import ConfigError, NonFiniteError, RLForgeError
from rlforge.module import LossContext


def _batch() -> B.Batch:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    rewards = torch.zeros(4, 3)
    rewards[0, 1], rewards[3, 2] = 1.0, 1.0  # group a: [1, 0]; group b: [0, 1]
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 3, generator=g)
    return B.Batch(
        {
            B.RESPONSE_MASK: mask,
            B.TOKEN_LEVEL_REWARDS: rewards,
            B.OLD_LOG_PROBS: old,
            B.REF_LOG_PROBS: old - 0.1,
        },
        {B.UID: ["a", "a", "b", "b"]},
    )


def test_grpo_is_registered_with_its_config(registry) -> None:
    assert registry.algorithm.get("grpo") is GRPO
    assert GRPO.config_class is GRPOConfig


def test_compute_advantages(default_config) -> None:
    out = GRPO(default_config).advantages(_batch())
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = torch.tensor([[a, a, 0], [-a, -a, -a], [-a, 0, 0], [a, a, a]])
    torch.testing.assert_close(out[B.ADVANTAGES], expected)
    torch.testing.assert_close(out[B.RETURNS], expected)


def test_compute_advantages_without_std(registry) -> None:
    cfg = compose(registry, None, None, ["algorithm.norm_adv_by_std=false"])
    out = GRPO(cfg).advantages(_batch())
    assert out[B.ADVANTAGES][0, 0].item() == pytest.approx(0.5)
    assert out[B.ADVANTAGES][1, 0].item() == pytest.approx(-0.5)


def test_advantages_wrapper_checks_columns(default_config) -> None:
    class Lazy(GRPO):
        def compute_advantages(self, batch):
            return batch

    with pytest.raises(RLForgeError, match="Lazy.compute_advantages did not set 'advantages'"):
        Lazy(default_config).advantages(_batch())

    def returning(value):  # what a new algorithm's compute_advantages gets wrong: named, with what it takes
        class Wrong(GRPO):
            def compute_advantages(self, batch):
                return value(super().compute_advantages(batch))
        return Wrong(default_config)

    def put(col, change):
        def value(b):
            b[col] = change(b[col], b[B.RESPONSE_MASK])
            return b
        return value

    for value, message in ((lambda b: None, "Wrong.compute_advantages returned NoneType: return the batch"),
                           (lambda b: [b], "returned list"),
                           (put(B.ADVANTAGES, lambda a, m: a > 0),
                            r"set 'advantages' to a torch.bool tensor of shape \(4, 3\): it takes a float tensor"),
                           (put(B.ADVANTAGES, lambda a, m: a[:, 0]), r"of shape \(4,\)")):
        with pytest.raises(RLForgeError, match=message):
            returning(value).advantages(_batch())
    with pytest.raises(NonFiniteError, match="set 'returns' to NaN or inf on 4 response token"):
        returning(put(B.RETURNS, lambda r, m: r.index_fill(1, torch.tensor([0]), math.nan))).advantages(_batch())
    masked = returning(put(B.RETURNS, lambda r, m: r.masked_fill(m == 0, math.nan)))
    assert masked.advantages(_batch())[B.RETURNS].shape == (4, 3)  # NaN on padding is not a token of a response


@pytest.mark.parametrize("mode", F.LOSS_AGG_MODES)
def test_policy_loss_micro_batches_sum_to_full_batch(registry, mode: str) -> None:
    cfg = compose(
        registry, None, None,
        [f"actor.loss_agg_mode={mode}", "actor.use_kl_loss=true", "actor.kl_loss_type=k3+", "actor.entropy_coeff=0.01"],
    )
    module = GRPO(cfg)
    batch = module.advantages(_batch())
    g = torch.Generator().manual_seed(1)
    log_probs = batch[B.OLD_LOG_PROBS] + 0.3 * torch.randn(4, 3, generator=g)
    entropy = torch.rand(4, 3, generator=g)
    mask = batch[B.RESPONSE_MASK]
    ctx = LossContext(global_tokens=float(mask.sum()), global_seqs=4.0)
    full, metrics = module.policy_loss(batch, log_probs, entropy, ctx)
    total = sum(
        module.policy_loss(batch.select(rows), log_probs[rows], entropy[rows], ctx)[0] for rows in ([0, 1], [2, 3])
    )
    assert total.item() == pytest.approx(full.item(), rel=1e-5)
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/kl_loss"):
        assert key in metrics


@pytest.mark.parametrize("coeff", [0.1, -0.1])
def test_entropy_coefficient_rewards_or_penalizes_entropy(registry, coeff: float) -> None:
    """loss = policy loss - coeff x token-mean entropy: a bonus for entropy, or with a negative coefficient
    (entropy minimization, as verl allows) a penalty."""
    module = GRPO(compose(registry, None, None, [f"actor.entropy_coeff={coeff}"]))
    batch = module.advantages(_batch())
    mask = batch[B.RESPONSE_MASK]
    ctx = LossContext(global_tokens=float(mask.sum()), global_seqs=4.0)
    low, high = (module.policy_loss(batch, batch[B.OLD_LOG_PROBS], torch.full((4, 3), e), ctx)[0] for e in (0.1, 0.9))
    assert (high - low).item() == pytest.approx(-coeff * 0.8, rel=1e-5)


def test_policy_loss_equals_functional_composition(default_config) -> None:
    module = GRPO(default_config)
    batch = module.advantages(_batch())
    log_probs = batch[B.OLD_LOG_PROBS] + 0.5
    mask = batch[B.RESPONSE_MASK]
    ctx = LossContext(global_tokens=float(mask.sum()), global_seqs=4.0)
    loss, metrics = module.policy_loss(batch, log_probs, None, ctx)
    pg, _ = F.clipped_policy_loss(log_probs, batch[B.OLD_LOG_PROBS], batch[B.ADVANTAGES], mask)
    expected = F.agg_loss(pg, mask, "token-mean")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["actor/pg_loss"] == pytest.approx(expected.item(), rel=1e-6)
    assert "actor/kl_loss" not in metrics and "actor/entropy" not in metrics


@pytest.mark.parametrize(
    ("override", "key"),
    [("actor.clip_ratio_c=1.0", "actor.clip_ratio_c"), ("actor.kl_loss_type=k9", "actor.kl_loss_type")],
)
def test_validate_config(registry, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        compose(registry, None, None, [override])


def test_flow_needs_reference_only_with_kl(default_config, registry) -> None:
    assert GRPO(default_config).needs_reference() is False
    cfg = compose(registry, None, None, ["actor.use_kl_loss=true"])
    assert GRPO(cfg).needs_reference() is True
