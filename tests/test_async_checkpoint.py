"""strategy.checkpoint=async (docs/reliability.md, "Checkpoints written in the background"): the shards are written
while training goes on and a checkpoint folder appears only once complete; only the run's last checkpoint holds
actor/, ``rlforge export`` writes it for the others; a resume from a background checkpoint is bit-identical to an
uninterrupted run; a failed run completes the write in flight, a failed write leaves no checkpoint; strategies that
cannot write in the background are refused by name."""

from __future__ import annotations

import json
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
from tests.controller.test_ray import _config as ray_config
from tests.controller.test_ray import needs_ray, ray_session  # noqa: F401 (a fixture)
from tests.controller.test_torchrun import _torchrun_fit
from tests.test_e2e import CrashAt

COMMON = ["trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_n=0", "data.arith.val_size=4",
          "strategy.checkpoint=async", "logger.backends=[jsonl]"]


def _weights(path):
    return load_file(str(path / "actor" / "model.safetensors"))


def _logged(trainer, name):
    """``{step: value}`` of a metric the run logged (metrics.jsonl)."""
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r[name] for r in map(json.loads, lines) if name in r}


class Gate:
    """Holds back the end of the step-1 checkpoint's background write until step 2 has trained, records which
    checkpoint folders existed as each step started, and keeps the actor's weights after step 1."""

    def __init__(self):
        self.release, self.seen, self.step1 = threading.Event(), {}, {}

    @hookimpl
    def rlforge_step_start(self, trainer, step):
        self.seen[step] = [p.name for p in ckpt.list_checkpoints(trainer.run_dir)]
        if step == 2:
            writing = trainer.controller.ranks["actor"].worker._writing
            assert writing is not None and not writing[0].done()  # still being written while this step trains

    @hookimpl
    def rlforge_step_end(self, trainer, step):
        if step == 1:
            self.step1 = {k: v.detach().clone() for k, v in trainer.module.actor.state_dict().items()}
        else:
            self.release.set()


@pytest.fixture
def gated(monkeypatch):
    """The background writes report their end only after ``Gate.release`` (a slow disk), so the test sees them in
    flight."""
    from rlforge.strategy import BaseStrategy

    gate = Gate()
    start = BaseStrategy.save_sharded_async

    def slow(self, path, model, optimizer):
        future = start(self, path, model, optimizer)  # the write itself runs: its end is held back
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


@pytest.mark.slow
def test_background_checkpoints_appear_when_complete_and_resume_bit_identically(tmp_path, gated):
    full = Trainer(fast_config("grpo", tmp_path / "a", *COMMON), callbacks=[gated])
    full.fit()
    assert gated.seen == {1: [], 2: []}  # step 1's checkpoint was not there while step 2 trained (its write was held)
    steps = ckpt.list_checkpoints(full.run_dir)
    assert [p.name for p in steps] == ["step_000001", "step_000002"]
    assert [ckpt.has_actor(p) for p in steps] == [False, True]  # actor/ at the end of the run only
    for p in steps:
        assert (p / "sharded" / "actor" / ".metadata").is_file()
        ckpt.read(p)  # complete
    assert not list((full.run_dir / "checkpoints").glob(".*"))  # no temporary folder left
    assert sorted(_logged(full, "timing_s/save_checkpoint")) == [1, 2]  # the loop blocked, every checkpoint
    assert list(_logged(full, "timing_s/checkpoint_write")) == [1]  # the background write (the last one is not)

    # interrupted as step 2 starts: the write in flight is completed on the way out
    with pytest.raises(KeyboardInterrupt):
        Trainer(fast_config("grpo", tmp_path / "b", *COMMON), callbacks=[CrashAt(2)]).fit()
    (run,) = (tmp_path / "b" / "default").iterdir()
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000001"]
    # as if a later run had been killed while writing step 2's shards: they are never taken for a checkpoint
    half = ckpt.staging_dir(run, 2) / "actor"
    half.mkdir(parents=True)
    (half / "__0_0.distcp").write_bytes(b"half")
    resumed = Trainer(fast_config("grpo", tmp_path / "b", *COMMON, "trainer.resume=auto"))
    resumed.fit()
    assert [h["step"] for h in resumed.history] == [2] and not ckpt.staging_dir(run, 2).exists()
    a, b = (_weights(r.run_dir / "checkpoints" / "step_000002") for r in (full, resumed))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert full.history[1]["critic/score/mean"] == resumed.history[0]["critic/score/mean"]

    # rlforge export writes actor/ into a checkpoint that has none, from its shards: the weights after step 1
    exported = export_checkpoint(steps[0], tmp_path / "export", PluginManager().registry, warn=lambda _: None)
    assert ckpt.has_actor(steps[0])
    mine = load_file(str(exported / "model.safetensors"))
    assert mine.keys() <= gated.step1.keys()
    for k in mine:
        assert torch.equal(mine[k], gated.step1[k].to(mine[k].dtype)), k


@pytest.mark.slow
def test_ppo_critic_shards_resume_bit_identically(tmp_path):
    """The critic's weights and optimizer are only in sharded/critic/ (no full state in trainer_state.pt)."""
    full = Trainer(fast_config("ppo", tmp_path / "a", *COMMON))
    full.fit()
    assert (ckpt.step_dir(full.run_dir, 1) / "sharded" / "critic" / ".metadata").is_file()
    with pytest.raises(KeyboardInterrupt):
        Trainer(fast_config("ppo", tmp_path / "b", *COMMON), callbacks=[CrashAt(2)]).fit()
    resumed = Trainer(fast_config("ppo", tmp_path / "b", *COMMON, "trainer.resume=auto"))
    resumed.fit()
    a, b = (_weights(r.run_dir / "checkpoints" / "step_000002") for r in (full, resumed))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert full.history[1]["critic/vf_loss"] == resumed.history[0]["critic/vf_loss"]


@pytest.mark.slow
def test_a_failed_background_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    from rlforge.strategy import BaseStrategy

    start = BaseStrategy.save_sharded_async

    def full_disk_at_step_2(self, path, model, optimizer):
        if "step_000002" not in str(path):
            return start(self, path, model, optimizer)
        out: Future = Future()
        out.set_exception(OSError(28, "No space left on device"))
        return out

    monkeypatch.setattr(BaseStrategy, "save_sharded_async", full_disk_at_step_2)
    trainer = Trainer(fast_config("grpo", tmp_path, *COMMON, "trainer.total_steps=3"))
    with pytest.raises(RLForgeError, match=r"Cannot write checkpoint step 2 .*No space left on device"):
        trainer.fit()
    assert [p.name for p in ckpt.list_checkpoints(trainer.run_dir)] == ["step_000001"]
    ckpt.read(ckpt.step_dir(trainer.run_dir, 1))


class FailingSave:
    """A ``rlforge_save_checkpoint`` hook that fails at step ``step``."""

    def __init__(self, step):
        self.step = step

    @hookimpl
    def rlforge_save_checkpoint(self, trainer, checkpoint):
        if trainer.step == self.step:
            raise RuntimeError(f"save hook failed at step {self.step}")


@pytest.mark.slow
def test_a_failure_while_a_checkpoint_starts_loses_no_written_checkpoint(tmp_path, monkeypatch):
    """The ranks' background write starts last in ``Trainer.save``: a failing save hook leaves nothing half-started,
    and a Ctrl-C inside the controller's part (the write already running) is waited for on the way out; the staged
    folder stays unnamed and the next resume starts from the checkpoint before it."""
    from rlforge.controller.groups import GroupController

    trainer = Trainer(fast_config("grpo", tmp_path / "a", *COMMON), callbacks=[FailingSave(2)])
    with pytest.raises(RuntimeError, match="save hook failed at step 2"):
        trainer.fit()
    assert [p.name for p in ckpt.list_checkpoints(trainer.run_dir)] == ["step_000001"]
    assert not ckpt.staging_dir(trainer.run_dir, 2).exists()

    start = GroupController.state_dict

    def interrupted(self, staging, background=False):
        state = start(self, staging, background)
        if "step_000002" in str(staging):
            raise KeyboardInterrupt  # the shards are being written
        return state

    monkeypatch.setattr(GroupController, "state_dict", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Trainer(fast_config("grpo", tmp_path / "b", *COMMON)).fit()
    (run,) = (tmp_path / "b" / "default").iterdir()
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step_000001"]
    assert (ckpt.staging_dir(run, 2) / "actor" / ".metadata").is_file()  # the write was waited for, not cut off
    monkeypatch.setattr(GroupController, "state_dict", start)
    resumed = Trainer(fast_config("grpo", tmp_path / "b", *COMMON, "trainer.resume=auto"))
    resumed.fit()
    assert [h["step"] for h in resumed.history] == [2] and not ckpt.staging_dir(run, 2).exists()


def test_a_strategy_without_background_saves_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"strategy.checkpoint=async: strategy.name=megatron cannot write its sharded "
                                          r"state in the background .*these do: .*fsdp.*single"):
        fast_config("grpo", tmp_path, "strategy.checkpoint=async", "strategy.name=megatron",
                    "trainer.controller=ray", "strategy.num_processes=2")


def test_damaged_shards_are_an_incomplete_checkpoint(tmp_path):
    """What a resume reads first: a checkpoint without actor/ is complete only when every role's shards have the
    .metadata torch.distributed.checkpoint writes last and every .distcp file it lists, whole."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "checkpoints" / "step_000003"
    shards = folder / "sharded" / "actor"
    shards.mkdir(parents=True)
    (folder / "meta.json").write_text('{"step": 3}')
    torch.save({"step": 3}, folder / "trainer_state.pt")
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"sharded/actor/.metadata is missing: the checkpoint is "
                                                     r"incomplete"):
        ckpt.read(folder)
    dcp.save({"w": torch.ones(64)}, checkpoint_id=str(shards), no_dist=True)
    assert ckpt.read(folder)[0] == {"step": 3}
    (data,) = shards.glob("*.distcp")
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ckpt.CorruptCheckpoint, match=rf"{data} cannot be read: it is truncated or corrupted \(100 "
                                                     rf"bytes; .*places data up to byte"):
        ckpt.read(folder)
    data.unlink()
    with pytest.raises(ckpt.CorruptCheckpoint, match=rf"{data} is missing \(listed by .*\.metadata\)"):
        ckpt.read(folder)
    (shards / ".metadata").write_bytes(b"x")
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"\.metadata cannot be read: it is truncated or corrupted"):
        ckpt.read(folder)
    for f in shards.iterdir():
        f.unlink()
    shards.rmdir()
    with pytest.raises(ckpt.CorruptCheckpoint, match=r"holds neither actor/ nor sharded/"):
        ckpt.read(folder)


def test_a_read_only_checkpoint_gets_actor_in_a_stand_in(tmp_path, monkeypatch):
    """rlforge export/eval/generate of a checkpoint without actor/ that this process may not write into (archived
    read-only, another user's): actor/ is built in a temporary stand-in, and the checkpoint is left as it is."""
    import errno
    from pathlib import Path

    import torch.distributed.checkpoint as dcp
    from omegaconf import OmegaConf
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from rlforge.build import Builder
    from rlforge.tools.export import write_missing_actor

    config = fast_config("grpo", tmp_path)
    module = Builder(config, PluginManager.for_config(config)).module(roles={"actor"})
    module.configure_model()
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    dcp.save({"model": get_model_state_dict(module.actor)}, checkpoint_id=str(checkpoint / "sharded" / "actor"),
             no_dist=True)
    (checkpoint / "meta.json").write_text(json.dumps({"step": 1, "config": OmegaConf.to_container(config)}))
    (tmp_path / "run" / "config.yaml").write_text("run: config\n")
    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.parent == checkpoint:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    stand_in = write_missing_actor(checkpoint)
    assert stand_in != checkpoint and stand_in.name == checkpoint.name and not ckpt.has_actor(checkpoint)
    assert (stand_in / "actor" / "config.json").is_file() and (stand_in / "meta.json").read_text().startswith('{"step"')
    assert (stand_in.parent.parent / "config.yaml").read_text() == "run: config\n"  # the run's files, for the card
    weights = load_file(str(stand_in / "actor" / "model.safetensors"))
    assert weights.keys() == module.actor.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in module.actor.state_dict().items())


@needs_ray
@pytest.mark.slow
def test_ray_fsdp_ranks_write_in_the_background_and_resume_bit_identically(tmp_path, ray_session):
    """2 FSDP ranks over gloo: each writes its shard in the background (over a gloo group of its own), and a run
    interrupted after the step-1 checkpoint continues to the same weights as an uninterrupted one."""
    common = ["trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_n=0", "strategy.checkpoint=async",
              "logger.backends=[jsonl]"]
    full = Trainer(ray_config(tmp_path / "a", *common))
    full.fit()
    first = ckpt.step_dir(full.run_dir, 1)
    assert not ckpt.has_actor(first) and (first / "sharded" / "actor" / "__1_0.distcp").is_file()  # rank 1's shard
    assert list(_logged(full, "timing_s/checkpoint_write")) == [1]

    with pytest.raises(KeyboardInterrupt):
        Trainer(ray_config(tmp_path / "b", *common), callbacks=[CrashAt(2)]).fit()
    resumed = Trainer(ray_config(tmp_path / "b", *common, "trainer.resume=auto"))
    resumed.fit()
    assert [h["step"] for h in resumed.history] == [2]
    a, b = (_weights(r.run_dir / "checkpoints" / "step_000002") for r in (full, resumed))
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
def test_torchrun_ranks_write_in_the_background_and_resume_bit_identically(tmp_path):
    """Under torchrun (2 FSDP ranks, gloo): step 1's checkpoint is written in the background; resuming from it
    (trainer.resume=<step_1>, which sets the newer step 2 aside) trains step 2 again to the same weights."""
    _torchrun_fit(tmp_path, "trainer.total_steps=2", "strategy.checkpoint=async")
    (run,) = (tmp_path / "default").iterdir()
    first = ckpt.step_dir(run, 1)
    assert not ckpt.has_actor(first) and (first / "sharded" / "actor" / "__1_0.distcp").is_file()  # rank 1's shard
    before = _weights(ckpt.step_dir(run, 2))
    log = _torchrun_fit(tmp_path, "trainer.total_steps=2", "strategy.checkpoint=async", f"trainer.resume={first}")
    assert "resumed from" in log and "step    2/2" in log, log[-3000:]
    again = _weights(ckpt.step_dir(run, 2))
    for k in before:
        assert torch.equal(before[k], again[k]), k


class StopInSave:
    """Sets ``trainer.should_stop`` from inside the step-1 checkpoint's ``rlforge_save_checkpoint`` and counts the
    calls per step."""

    def __init__(self):
        self.saved: list[int] = []

    @hookimpl
    def rlforge_save_checkpoint(self, trainer, checkpoint):
        self.saved.append(trainer.step)
        checkpoint["mine"] = {"step": trainer.step}
        trainer.should_stop = True


def test_a_stop_set_by_a_save_hook_ends_the_run_at_that_step_and_the_hooks_run_once(tmp_path, pm):
    cfg = fast_config("grpo", tmp_path, *COMMON, "trainer.total_steps=3", plugins=pm)
    stop = StopInSave()
    trainer = Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[stop])
    assert trainer.fit()["steps"] == 1  # no step trained after the save that set the stop
    assert stop.saved == [1]  # the last checkpoint (with actor/) of step 1 reuses the entries its hooks saved
    (last,) = ckpt.list_checkpoints(trainer.run_dir)
    assert last.name == "step_000001" and ckpt.has_actor(last)
    assert ckpt.read(last)[0]["extra"]["mine"] == {"step": 1}
