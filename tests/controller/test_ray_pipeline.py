"""trainer.pipeline=one_step_off|async under the Ray controller: a rollout worker group of its own
(``ray.rollout_workers``) generates while the actor ranks train, on a local CPU cluster with the shipped tiny model.

- without a rollout group (or under torchrun) the pipelines are refused when the config is composed, naming the keys;
- ``one_step_off`` (2 rollout workers): the first update and the generation of step 2's batch wait for each other,
  and both see the other arrive: they run at the same time; each step trains on the version of the schedule, the
  engines' log-probs are those of that version's weights, and the rollout workers end with the final weights;
- ``async`` (``max_staleness=2``, the weight snapshots through the object store): the same schedule, and a run
  stopped after a checkpoint and resumed ends with the same weights bit for bit;
- 2 FSDP actor ranks: after every sync the rollout worker's engine holds exactly the gathered actor weights, the
  ranks keep no replica, and a ``sync`` run with the rollout group resumes bit for bit;
- a rollout worker that dies ends the run with an error naming it; no worker process outlives a run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time

import pytest
import torch
from omegaconf import OmegaConf

from rlforge import Trainer, hookimpl, load_config
from rlforge.controller.ray_controller import check_config
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugin_manager import PluginManager
from tests.controller.test_ray import needs_ray, ray_session  # noqa: F401 - ray_session is a fixture
from tests.test_pipeline import (
    ASYNC,
    FAST,
    OFF,
    Versions,
    _weights,
    assert_resume_is_bit_identical,
    assert_trained_on_schedule,
)

RAY = ["trainer.controller=ray", "strategy.device=cpu", "ray.rollout_workers=1", "data.arith.train_size=512", "data.arith.val_size=8"]
FSDP = ["strategy.name=fsdp", "strategy.num_processes=2", "ray.cpus_per_worker=0.5"]  # 2 x 0.5 + 1: the 2-CPU cluster
MEET_TIMEOUT_S = 60.0


def _config(tmp_path, *extra, algo="grpo"):
    return load_config(algo, [*FAST, *RAY, f"trainer.runs_root={tmp_path}", *extra])


class RayVersions(Versions):
    """:class:`Versions` with the weights read from the actor ranks (the driver's copy follows them only at
    checkpoints), and what the rollout workers' engines hold when the run ends."""

    def __init__(self):
        super().__init__()
        self.engines = []
        self.pids = []

    def actor_weights(self, trainer):
        return trainer.controller.actor.model_state_dict()

    @hookimpl
    def rlforge_fit_end(self, trainer):
        self.engines = [engine[0] for engine in trainer.controller.rollout.engine_weights()]
        self.pids = _pids(trainer.controller)


def _pids(controller):
    return [int(p.split()[1]) for g in (controller.actor, controller.rollout) for p in g.transport.procs]


def _assert_gone(pids):
    """The worker processes of a finished run exit (the controller kills them)."""
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], pids


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("pipeline", [OFF, ASYNC])
@pytest.mark.parametrize(("extra", "says"), [
    (["ray.rollout_workers=0"], r"with trainer.controller=ray generates on a rollout worker group of its own while "
                                r"the actor ranks train: set ray.rollout_workers=1 \(or more; got 0\)"),
    (["trainer.controller=torchrun"], r"which trainer.controller=torchrun does not support.*Use "
                                      r"trainer.controller=ray with ray.rollout_workers=1 \(or more\)"),
])
def test_pipelines_need_a_rollout_group(tmp_path, pipeline, extra, says):
    with pytest.raises(ConfigError, match=f"^{pipeline} .*{says}"):
        _config(tmp_path, pipeline, *extra)
    if "ray.rollout_workers=0" in extra:  # and again when the controller starts
        cfg = OmegaConf.merge(_config(tmp_path), OmegaConf.from_dotlist([pipeline, *extra]))
        with pytest.raises(ConfigError, match=says):
            check_config(cfg, PluginManager(autoload=False).registry.strategy.entry("single"), needs_critic=False)


def _meeting_grpo(folder):
    """GRPO whose first update (in the actor rank) and second generation (in each rollout worker: its share of step
    2's batch, launched by step 1 before its update) each wait for the other, at most ``MEET_TIMEOUT_S``; each that saw
    the other leaves a ``*-met`` file in ``folder``. Both meet only if the two run at the same time. Defined in a
    function, so that Ray ships the class to the workers by value."""
    grpo = PluginManager(autoload=False).registry.algorithm.get("grpo")

    def meet(mine, theirs):
        (folder / mine).touch()
        deadline = time.monotonic() + MEET_TIMEOUT_S
        while not (folder / theirs).exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        (folder / f"{mine}-met").touch()

    class MeetingGRPO(grpo):
        updated = False

        def configure_model(self):
            super().configure_model()
            if "RANK" in os.environ or not self.loads("actor"):  # an actor rank, or the driver (it loads no model)
                return  # only a rollout worker counts its generations
            calls = []

            def counted(module, args, kwargs):  # a hook, not a wrapped forward: it follows the model into a copy
                position = kwargs.get("cache_position")
                if position is not None and int(position[0]) == 0:  # a generation's prompt pass (hf_decode.Decoder)
                    calls.append(1)
                    if len(calls) == 2:
                        meet("generation", "update")

            self.actor.register_forward_pre_hook(counted, with_kwargs=True)

        def training_step(self, micro, ctx):
            if not self.updated:
                self.updated = True
                meet("update", "generation")
            return super().training_step(micro, ctx)

    return MeetingGRPO


@needs_ray
def test_one_step_off_generates_beside_the_update_on_the_schedule(tmp_path, ray_session):
    rec = RayVersions()
    meetings = tmp_path / "meet"
    meetings.mkdir()
    cfg = _config(tmp_path, OFF, "trainer.total_steps=5", "actor.lr=1e-3", "trainer.val_every=2",
                  "ray.rollout_workers=2", "ray.rollout_cpus_per_worker=0.5")
    trainer = Trainer(cfg, callbacks=[rec])
    trainer.fit(_meeting_grpo(meetings)(cfg))
    assert sorted(p.name for p in meetings.glob("*-met")) == ["generation-met", "update-met"]
    assert_trained_on_schedule(trainer, rec, (OFF,))
    assert len(rec.engines) == 2
    for engine in rec.engines:  # synced to validate at the end
        assert all(torch.equal(engine[k], v) for k, v in rec.weights[5].items())
    _assert_gone(rec.pids)


@needs_ray
@pytest.mark.slow
def test_async_trains_on_the_schedule_and_resumes_bit_identically(tmp_path, ray_session):
    """max_staleness=2: from step 3 on, the weights reach the rollout worker as object-store snapshots that the rollout
    thread loads before the generation that needs them."""
    rec = RayVersions()
    pipeline = (ASYNC, "trainer.max_staleness=2")
    full = assert_resume_is_bit_identical(lambda path, *extra: _config(path, *pipeline, *extra), tmp_path, [0, 1],
                                          steps=5, record=rec, interrupt=False)
    assert_trained_on_schedule(full, rec, pipeline)


class SyncProbe:
    """At every weight sync: the rollout worker's engine weights and the actor's gathered weights (and the engine's
    weights at the start)."""

    def __init__(self):
        self.seen = []
        self.replica = self.initial = None

    @hookimpl
    def rlforge_fit_start(self, trainer):
        self.initial = trainer.controller.rollout.engine_weights()[0][0]

    @hookimpl
    def rlforge_weight_sync_end(self, trainer):
        controller = trainer.controller
        gathered = controller.actor.model_state_dict()
        self.seen.append((controller.rollout.engine_weights()[0][0], gathered))
        self.replica = controller.actor.holds_replica()


@needs_ray
@pytest.mark.slow
def test_fsdp_ranks_give_the_rollout_worker_their_exact_weights_and_sync_resumes(tmp_path, ray_session):
    probe = SyncProbe()
    common = [*FSDP, "trainer.total_steps=3", "trainer.save_every=2", "trainer.keep_last_n=0", "actor.lr=1e-3"]
    full = Trainer(_config(tmp_path / "a", *common), callbacks=[probe])
    full.fit()
    assert probe.replica == [False, False]  # the ranks build no engine and keep no replica
    assert len(probe.seen) == 3
    for engine, gathered in probe.seen:
        assert engine.keys() == gathered.keys()
        assert all(torch.equal(engine[k], gathered[k]) for k in gathered)
    assert not all(torch.equal(probe.seen[0][0][k], v) for k, v in probe.initial.items())  # trained, not model.path

    # sync samples from each worker's RNG: the rollout worker's is in the checkpoint too. Resumed: a copy of the run
    # as it stood after step 2 (a run stopped mid-way and resumed: the pipelines' local tests in tests/test_pipeline.py
    # and the killed-worker tests under Ray)
    folder = tmp_path / "b" / full.run_dir.parent.name / full.run_dir.name
    shutil.copytree(full.run_dir, folder)
    shutil.rmtree(folder / "checkpoints" / "step_000003")
    resumed = Trainer(_config(tmp_path / "b", *common, "trainer.resume=auto"))
    resumed.fit()
    a, b = (_weights(t.run_dir, 3) for t in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert full.history[2]["critic/score/mean"] == resumed.history[0]["critic/score/mean"]


class KillRollout:
    """Kills the rollout worker (SIGKILL to its pid) when step 2's update starts, and keeps the run's worker pids."""

    def __init__(self):
        self.pid = None
        self.pids = []

    @hookimpl
    def rlforge_stage_start(self, trainer, stage):
        if trainer.step == 2 and stage == "update_actor":
            self.pids = _pids(trainer.controller)
            self.pid = int(trainer.controller.rollout.transport.procs[0].split()[1])
            os.kill(self.pid, signal.SIGKILL)


@needs_ray
def test_a_dead_rollout_worker_ends_the_run_naming_it(tmp_path, ray_session):
    killer = KillRollout()
    with pytest.raises(RLForgeError) as info:
        Trainer(_config(tmp_path, OFF, "trainer.total_steps=3"), callbacks=[killer]).fit()
    msg = str(info.value)
    # the call that finds it dead depends on timing: step 3's generation if it was still running, else the final
    # checkpoint's (its RNG state) or validation's (the weight sync)
    assert re.search(rf"The rollout worker \(rank 0 of 1, pid {killer.pid} on [\d.]+\) died during '\w+'", msg), msg
    assert "trainer.resume=auto" in msg
    _assert_gone(killer.pids)
