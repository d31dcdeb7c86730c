"""Faults: NaN losses skip steps then stop with a checkpoint; unsound resumes are refused."""

from __future__ import annotations

import pytest

from rlforge import Trainer, load_config
from rlforge.algorithms.grpo import GRPO
from rlforge.errors import NonFiniteError
from rlforge.errors import RLForgeError

FAST = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=4", "data.arith.train_size=512", "data.arith.val_size=8",
        "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[console]"]


class NaNAfter(GRPO):
    """Its loss turns NaN from the given training step on."""

    bad_from = 2

    def policy_loss(self, batch, log_probs, entropy, ctx):
        loss, metrics = super().policy_loss(batch, log_probs, entropy, ctx)
        return (loss * float("nan") if self.step >= self.bad_from else loss), metrics


def test_nan_steps_are_skipped_then_the_run_stops_with_a_checkpoint(tmp_path):
    cfg = load_config("grpo", [*FAST, f"trainer.runs_root={tmp_path}", "trainer.total_steps=10",
                               "trainer.max_nonfinite_steps=3"])
    trainer = Trainer(cfg)
    module = NaNAfter(cfg)
    with pytest.raises(NonFiniteError, match=r"3 optimizer steps in a row .* last good state is saved in .*step_000004"):
        trainer.fit(module)
    assert [h["actor/skipped_steps"] for h in trainer.history] == [0.0, 1.0, 2.0]
    ckpt = trainer.run_dir / "checkpoints" / "step_000004"
    assert (ckpt / "actor" / "model.safetensors").is_file()


def test_one_bad_step_is_skipped_and_training_goes_on(tmp_path):
    class OneBad(GRPO):
        def policy_loss(self, batch, log_probs, entropy, ctx):
            loss, metrics = super().policy_loss(batch, log_probs, entropy, ctx)
            return (loss * float("inf") if self.step == 2 else loss), metrics

    cfg = load_config("grpo", [*FAST, f"trainer.runs_root={tmp_path}", "trainer.total_steps=4"])
    trainer = Trainer(cfg)
    trainer.fit(OneBad(cfg))
    assert [h["actor/skipped_steps"] for h in trainer.history] == [0.0, 1.0, 1.0, 1.0]


def test_resume_refuses_a_changed_batch_shape_unless_forced(tmp_path):
    base = [*FAST, f"trainer.runs_root={tmp_path}", "trainer.total_steps=1"]
    Trainer(load_config("grpo", base)).fit()
    changed = [*base, "trainer.total_steps=2", "trainer.resume=auto", "data.train_batch_size=16",
               "actor.ppo_mini_batch_size=16"]
    with pytest.raises(RLForgeError, match=r"data\.train_batch_size: 8 -> 16.*trainer\.resume_force=true"):
        Trainer(load_config("grpo", changed)).fit()
    forced = Trainer(load_config("grpo", [*changed, "trainer.resume_force=true"]))
    assert forced.fit()["steps"] == 2
