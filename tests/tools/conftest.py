"""One short real training run shared by the tracking, export and eval tests (session-scoped: fits cost time)."""

from __future__ import annotations

import pytest

SMALL = [
    "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.arith.train_size=512", "data.arith.val_size=8",
    "trainer.val_every=1", "trainer.progress=false", "trainer.total_steps=2", "trainer.save_every=1",
    "trainer.keep_last_n=0",
]


@pytest.fixture(scope="session")
def fitted_run(tmp_path_factory: pytest.TempPathFactory):
    """A 2-step GRPO run logged to console, mlflow, tensorboard, jsonl and csv, with the profiler's per-stage
    metrics; checkpoints at steps 1 and 2."""
    from rlforge import Trainer, load_config
    from rlforge.plugin_manager import PluginManager

    root = tmp_path_factory.mktemp("fitted_run")
    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [*SMALL, f"trainer.runs_root={root}", "logger.backends=[console,mlflow,tensorboard,jsonl,csv]",
                                      "plugins.profiler.stage_metrics=true"],
                      plugins=pm)
    trainer = Trainer(cfg, plugins=pm)
    summary = trainer.fit()
    return trainer, summary
