"""strategy.checkpoint=async (docs/reliability.md, "Checkpoints written in the background"): the shards are written
while training goes on and a checkpoint folder appears only once complete; only the run's last checkpoint holds
actor/, ``rlforge export`` writes it for the others; a resume from a background checkpoint is bit-identical to an
uninterrupted run; a failed run completes the write in flight, a failed write leaves no checkpoint; strategies that
cannot write in the background are refused by name."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
import torch
from safetensors.torch import load_file

from rlforge import Trainer, hookimpl
from rlforge import checkpoint as ckpt
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugin_manager import PluginManager
from rlforge.testing import fast_config
from rlforge.tools.export import export_checkpoint
from tests.test_e2e import CrashAt

COMMON = ["trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last_n=0", "logger.backends=[console]",
          "trainer.val_before_train=false", "strategy.checkpoint=async"]


def _weights(path):
    return load_file(str(path / "actor" / "model.safetensors"))


class Gate:
    """Holds the background write of the step-``step`` checkpoint until the step after it has trained, and records
    which checkpoint folders existed at each step's start."""

    def __init__(self, step):
        self.step, self.release, self.seen = step, threading.Event(), {}

    @hookimpl
    def rlforge_step_start(self, trainer, step):
        self.seen[step] = [p.name for p in ckpt.list_checkpoints(trainer.run_dir)]
        if step == self.step + 1:
            writing = trainer.controller.ranks["actor"].worker._writing
            assert writing is not None and not writing[0].done()  # still being written while this step trains

    @hookimpl
    def rlforge_step_end(self, trainer, step):
        if step == self.step + 1:
            self.release.set()


@pytest.fixture
def gated(monkeypatch):
    """The background writes wait for ``Gate.release`` (a slow disk), so the test sees them in flight."""
    from rlforge.strategy import BaseStrategy

    gate = Gate(1)
    start = BaseStrategy.save_sharded_async

    def slow(self, path, model, optimizer):
        future = start(self, path, model, optimizer)  # the write itself runs: its completion is held back
        out: Future = Future()

        def wait():
            gate.release.wait(60)
            try:
                out.set_result(future.result())
            except BaseException as exc:  # handed on to finish_sharded
                out.set_exception(exc)

        threading.Thread(target=wait, daemon=True).start()
        return out

    monkeypatch.setattr(BaseStrategy, "save_sharded_async", slow)
    return gate


def test_background_checkpoints_appear_when_complete_and_resume_bit_identically(tmp_path, gated):
    full = Trainer(fast_config("grpo", tmp_path / "a", *COMMON), callbacks=[gated])
    full.fit()
    # step 1's checkpoint was not visible while step 2 trained (its write was held): it appeared when step 2's
    # checkpoint started
    assert gated.seen[2] == [] and gated.seen[3] == ["step_000001"]
    steps = ckpt.list_checkpoints(full.run_dir)
    assert [p.name for p in steps] == ["step_000001", "step_000002", "step_000003"]
    assert [ckpt.has_actor(p) for p in steps] == [False, False, True]  # actor/ at the end of the run only
    for p in steps:
        assert (p / "sharded" / "actor" / ".metadata").is_file()
        ckpt.read(p)  # complete
    assert not list((full.run_dir / "checkpoints").glob(".*"))  # no temporary folder left
    for h in full.history:
        assert h["timing_s/save_checkpoint"] >= 0
    assert [("timing_s/checkpoint_write" in h) for h in full.history] == [True, True, False]

    with pytest.raises(KeyboardInterrupt):
        Trainer(fast_config("grpo", tmp_path / "b", *COMMON), callbacks=[CrashAt(3)]).fit()
    interrupted = ckpt.list_checkpoints(next((tmp_path / "b" / "default").iterdir()))
    assert [p.name for p in interrupted] == ["step_000001", "step_000002"]  # the write in flight was completed
    resumed = Trainer(fast_config("grpo", tmp_path / "b", *COMMON, "trainer.resume=auto"))
    resumed.fit()
    assert [h["step"] for h in resumed.history] == [3]
    a, b = (_weights(r.run_dir / "checkpoints" / "step_000003") for r in (full, resumed))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert full.history[2]["critic/score/mean"] == resumed.history[0]["critic/score/mean"]

    # rlforge export writes actor/ of a checkpoint that has none, from its shards: step 2's weights, as trained
    exported = export_checkpoint(steps[1], tmp_path / "export", PluginManager().registry, warn=lambda _: None)
    assert ckpt.has_actor(steps[1])
    resumed_from_2 = torch.load(steps[1] / "trainer_state.pt", weights_only=True)["step"] == 2
    assert resumed_from_2 and (exported / "config.json").is_file()
    again = Trainer(fast_config("grpo", tmp_path / "c", *COMMON[:-1], "trainer.total_steps=2"))
    again.fit()  # the same seed and data, sync full checkpoints: the step-2 weights are the same bits
    two = _weights(again.run_dir / "checkpoints" / "step_000002")
    mine = load_file(str(exported / "model.safetensors"))
    for k in two:
        assert torch.equal(two[k].float(), mine[k].float()), k


class FailingWrite:
    """The background write of step 2's checkpoint fails (a full disk)."""

    @staticmethod
    def patch(monkeypatch):
        from rlforge.strategy import BaseStrategy

        start = BaseStrategy.save_sharded_async

        def failing(self, path, model, optimizer):
            if "step_000002" not in str(path):
                return start(self, path, model, optimizer)
            out: Future = Future()
            out.set_exception(OSError(28, "No space left on device"))
            return out

        monkeypatch.setattr(BaseStrategy, "save_sharded_async", failing)


def test_a_failed_background_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    FailingWrite.patch(monkeypatch)
    trainer = Trainer(fast_config("grpo", tmp_path, *COMMON))
    with pytest.raises(RLForgeError, match=r"Cannot write checkpoint step 2 .*No space left on device"):
        trainer.fit()
    assert [p.name for p in ckpt.list_checkpoints(trainer.run_dir)] == ["step_000001"]
    ckpt.read(ckpt.step_dir(trainer.run_dir, 1))


def test_a_half_written_checkpoint_is_never_resumed(tmp_path):
    """A kill during the background write leaves the staged shards (no .metadata): the next run removes them and
    continues from the checkpoint before."""
    with pytest.raises(KeyboardInterrupt):
        Trainer(fast_config("grpo", tmp_path, *COMMON), callbacks=[CrashAt(3)]).fit()
    (run,) = (tmp_path / "default").iterdir()
    staged = ckpt.staging_dir(run, 3) / "actor"
    staged.mkdir(parents=True)
    (staged / "__0_0.distcp").write_bytes(b"half")
    resumed = Trainer(fast_config("grpo", tmp_path, *COMMON, "trainer.resume=auto"))
    resumed.fit()
    assert [h["step"] for h in resumed.history] == [3]
    assert not ckpt.staging_dir(run, 3).exists()


def test_a_strategy_without_background_saves_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"strategy.checkpoint=async: strategy.name=megatron cannot write its sharded "
                                          r"state in the background .*these do: .*fsdp.*single"):
        fast_config("grpo", tmp_path, "strategy.checkpoint=async", "strategy.name=megatron",
                    "trainer.controller=ray", "strategy.num_processes=2")
