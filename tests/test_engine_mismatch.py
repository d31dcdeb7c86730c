"""The rollout engine's log-probs made to differ from the trainer's (the hf engine generating in bf16 while the trainer
computes in fp32): algorithm.rollout_is measures the mismatch and training stays finite (docs/pipelines.md)."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge import Trainer, load_config
from rlforge.plugins.rollout.hf import HFRollout

FAST = [
    "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=16", "rollout.n=4",
    "data.arith.train_size=512", "data.arith.val_size=16", "trainer.val_every=0", "trainer.progress=false", "trainer.val_before_train=false",
    "logger.backends=[console]", "trainer.total_steps=3", "model.precision=32-true", "algorithm.rollout_is=token",
    "algorithm.rollout_is_threshold=2.0",
]


@pytest.mark.parametrize("pipeline", ["sync", "one_step_off"])
def test_bf16_engine_against_fp32_trainer(tmp_path, monkeypatch, pipeline):
    # the engine computes in bf16 (autocast), the trainer's old log-probs in fp32
    monkeypatch.setattr(HFRollout, "autocast", lambda self, device: torch.autocast(device.type, dtype=torch.bfloat16))
    cfg = load_config("grpo", [*FAST, f"trainer.runs_root={tmp_path}", f"trainer.pipeline={pipeline}"])
    trainer = Trainer(cfg)
    trainer.fit()
    for h in trainer.history:
        assert h["rollout_corr/k3_kl"] > 1e-6 and h["rollout_corr/kl"] != 0.0  # the engine and trainer disagree
        assert h["rollout_corr/rollout_is_max"] > 1.0 > h["rollout_corr/rollout_is_min"]  # weights are not all 1
        assert h["rollout_corr/rollout_is_max"] <= 2.0  # truncated (TIS)
        assert abs(h["rollout_corr/rollout_is_mean"] - 1.0) < 0.2  # a small mismatch, not a broken engine
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert math.isfinite(h[key]), (key, h[key])
    assert all(torch.isfinite(p).all() for p in trainer.module.actor.parameters())
