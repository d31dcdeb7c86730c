"""Helpers for tests of rlforge and of plugins built on it (the way Lightning ships ``BoringModel``).

``fast_config(algo, tmp_path, *overrides)`` is the config of a short run on the shipped tiny model and the built-in
task: small batches, no validation, no checkpoints, no progress bar, console logging only. A test adds the few keys
it is about::

    from rlforge import Trainer
    from rlforge.testing import fast_config

    def test_my_algorithm_trains(tmp_path):
        trainer = Trainer(fast_config("my_algo", tmp_path, "trainer.total_steps=2"))
        trainer.fit()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAST_OVERRIDES = (
    "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=16", "rollout.n=4",
    "data.arith.train_size=512", "data.arith.val_size=16", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.save_every=0",
    "trainer.progress=false", "logger.backends=[console]",
)


def fast_config(algo: str, tmp_path: str | Path, *overrides: str, plugins: Any = None) -> Any:
    """The composed config of algorithm ``algo`` for a short test run writing under ``tmp_path``: ``FAST_OVERRIDES``,
    then ``overrides`` (later keys win)."""
    from rlforge import load_config

    return load_config(algo, [*FAST_OVERRIDES, f"trainer.runs_root={tmp_path}", *overrides], plugins=plugins)
