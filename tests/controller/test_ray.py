"""The Ray controller on a local CPU cluster: 2 ranks per role, FSDP over gloo, the shipped tiny model.

- placement that a local cluster cannot hold fails at once, naming its resources (a cluster at ray.address: within
  ray.placement_timeout_s);
- a GRPO run whose actor worker is killed mid-run stops with an error naming the worker and its role, and
  ``trainer.resume=auto`` continues from the last (full) checkpoint;
- PPO (actor and critic groups) with sharded checkpoints, interrupted and resumed, ends with the same weights
  bit for bit as an uninterrupted run;
- the core imports and lists the controller without Ray installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlforge import Trainer, hookimpl, load_config
from rlforge.controller.ray_controller import check_config
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugin_manager import PluginManager
from tests.test_e2e import FAST

try:
    import ray
except ImportError:
    ray = None
needs_ray = pytest.mark.skipif(ray is None, reason="the Ray controller needs ray (scripts/test.sh installs it)")

RAY = ["trainer.controller=ray", "strategy.name=fsdp", "strategy.num_processes=2", "strategy.device=cpu",
       "logger.backends=[console]", "trainer.val_before_train=false", "data.arith.train_size=512", "data.arith.val_size=8"]


def _config(tmp_path, *extra, algo="grpo"):
    return load_config(algo, [*FAST, *RAY, f"trainer.runs_root={tmp_path}", *extra])


@pytest.fixture(scope="module")
def ray_session():
    """One local cluster for the module's runs (the controller joins a session that is already up)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


@pytest.mark.parametrize(("overrides", "needle"), [
    (["strategy.name=single"], "with strategy.num_processes=2 use strategy.name=fsdp"),
    (["strategy.num_processes=3"], "must split evenly over strategy.num_processes=3"),
    (["rollout.n=6", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size=4"],
     "actor.ppo_micro_batch_size (4 sequences per rank) must divide each rank's share of the mini-batch (6"),
    (["strategy.checkpoint=half"], "full, sharded"),  # the schema's range check words it, then the strategy's
    (["ray.placement_strategy=TIGHT"], "ray.placement_strategy='TIGHT'"),
])
def test_config_mistakes_fail_before_any_worker_starts(tmp_path, overrides, needle):
    with pytest.raises(ConfigError) as info:  # when the config is composed (the controller's validate_config)
        _config(tmp_path, *overrides)
    assert needle in str(info.value)
    cfg = OmegaConf.merge(_config(tmp_path), OmegaConf.from_dotlist(list(overrides)))  # and when the controller starts
    with pytest.raises(ConfigError) as info:
        check_config(cfg, PluginManager(autoload=False).registry.strategy.entry(cfg.strategy.name), needs_critic=False)
    assert needle in str(info.value)


@needs_ray
def test_a_cluster_address_nothing_answers_at_is_refused_by_name(tmp_path):
    """Ray retries an unreachable GCS address for ever; rlforge names ray.address at once and frees the run folder."""
    assert not ray.is_initialized()
    with pytest.raises(RLForgeError, match=r"^ray.address=127.0.0.1:1: nothing answers at 127.0.0.1:1 \("):
        Trainer(_config(tmp_path, "ray.address=127.0.0.1:1", "trainer.experiment=unreachable")).fit()
    assert not ray.is_initialized()
    assert not list((tmp_path / "unreachable").glob("*/config.yaml"))


@needs_ray
def test_placement_a_local_cluster_cannot_hold_fails_at_once_and_stops_it(tmp_path):
    assert not ray.is_initialized()
    cfg = _config(tmp_path, "ray.num_cpus=2", "ray.cpus_per_worker=4", "ray.placement_timeout_s=600")
    def handler(signum, frame):  # the rlforge command's (which stops the run as Ctrl-C does)
        raise AssertionError

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        # a local cluster cannot grow: refused at once, not after the timeout
        with pytest.raises(RLForgeError, match=r"cannot place the 'actor' pool \(2 x CPU 4\).* this run needs 8 CPU, "
                                               r"and the local cluster has 2 \(ray.num_cpus=2"):
            Trainer(cfg).fit()
        assert signal.getsignal(signal.SIGTERM) is handler  # ray.init's own (exit at once) was replaced again
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not ray.is_initialized()  # the controller started this cluster, so it shut it down


class KillWorker:
    """Kills the actor worker of rank 1 (SIGKILL to its pid) when step 2's update starts."""

    def __init__(self):
        self.pid = None

    @hookimpl
    def rlforge_stage_start(self, trainer, stage):
        if trainer.step == 2 and stage == "update_actor":
            self.pid = int(trainer.controller.actor.transport.procs[1].split()[1])
            os.kill(self.pid, signal.SIGKILL)


@needs_ray
@pytest.mark.slow
def test_killed_worker_stops_the_run_with_a_clear_error_then_resume_continues(tmp_path, ray_session):
    common = ["trainer.total_steps=3", "trainer.save_every=1", f"trainer.run_dir={tmp_path / 'run'}"]
    killer = KillWorker()
    with pytest.raises(RLForgeError) as info:
        Trainer(_config(tmp_path, *common), callbacks=[killer]).fit()
    msg = str(info.value)
    assert re.search(rf"The actor worker \(rank 1 of 2, pid {killer.pid} on [\d.]+\) died during 'update'", msg), msg
    assert "trainer.resume=auto" in msg

    resumed = Trainer(_config(tmp_path, *common, "trainer.resume=auto"))
    summary = resumed.fit()
    assert summary["steps"] == 3
    assert [h["step"] for h in resumed.history] == [2, 3]  # continued after the step-1 checkpoint
    assert (tmp_path / "run" / "checkpoints" / "step_000003" / "actor" / "model.safetensors").is_file()


@needs_ray
@pytest.mark.slow
def test_ppo_sharded_checkpoint_resume_is_bit_identical(tmp_path, ray_session):
    common = ["trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_n=0", "strategy.checkpoint=sharded"]
    full = Trainer(_config(tmp_path / "a", *common, algo="ppo"))
    full.fit()

    # the run as a crash after step 1 leaves it (a crash and resume under Ray: the killed-worker test above)
    copy = tmp_path / "b" / full.run_dir.name
    shutil.copytree(full.run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "step_000002")
    resumed = Trainer(_config(tmp_path / "b", *common, f"trainer.run_dir={copy}", "trainer.resume=auto", algo="ppo"))
    resumed.fit()

    step2 = [run.run_dir / "checkpoints" / "step_000002" for run in (full, resumed)]
    for role in ("actor", "critic"):
        assert (step2[1] / "sharded" / role / ".metadata").is_file(), role
    a, b = (load_file(str(p / "actor" / "model.safetensors")) for p in step2)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    critic = [torch.load(p / "trainer_state.pt", weights_only=True)["controller"]["critic"] for p in step2]
    assert critic[0]["scheduler"] == critic[1]["scheduler"]
    assert [h["critic/score/mean"] for h in full.history[1:]] == [h["critic/score/mean"] for h in resumed.history]
    assert full.history[1]["critic/vf_loss"] == resumed.history[0]["critic/vf_loss"]


def test_the_core_imports_and_lists_the_controller_without_ray():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from rlforge.plugin_manager import PluginManager\n"
        "from rlforge.controller.ray_controller import _import_ray\n"
        "assert 'ray' in PluginManager(autoload=False).registry.controller\n"
        "try:\n    _import_ray()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RLForgeError trainer.controller=ray needs Ray" in out.stdout and "rlforge[ray]" in out.stdout


@needs_ray
@pytest.mark.slow
def test_rows_with_images_train_on_two_ranks(tmp_path, ray_session):
    """The vision task's rows carry their pixel values and image grids (a row column) through the Ray controller:
    split over 2 FSDP ranks for generation, log-probs, the reference and the update (an image-pad token without its
    pixels would fail the forward), on the tiny vision-language model."""
    cfg = load_config("grpo", [*RAY, "model.path=builtin:tiny-vlm", "data.name=vision", "data.vision.train_size=16",
                               "data.vision.val_size=4", "data.max_prompt_length=48", "rollout.max_new_tokens=4",
                               "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
                               "actor.ppo_micro_batch_size=4", "actor.use_kl_loss=true", "trainer.total_steps=1",
                               "trainer.val_every=0", "trainer.save_every=0", "trainer.progress=false",
                               f"trainer.runs_root={tmp_path}"])
    trainer = Trainer(cfg)
    summary = trainer.fit()
    assert summary["steps"] == 1
    (step,) = trainer.history
    assert step["actor/kl_loss"] == step["actor/kl_loss"] and step["actor/grad_norm"] > 0  # the reference ran too
