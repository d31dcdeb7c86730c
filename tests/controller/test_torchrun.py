"""The ``torchrun`` controller: rank 0 drives, the other ranks serve it over a gloo control group.

- the channel itself (2 spawned processes, fake workers): per-rank arguments, skipped ranks, results in rank order,
  a user error raised as it is, any other failure named with its role, rank and method, and the stop;
- a real launch: ``torchrun --nproc-per-node 2 -m rlforge.cli fit ...`` with the ``fsdp`` strategy on CPU (gloo)
  trains, checkpoints and ends with exit status 0; only rank 0 makes a run folder;
- outside torchrun the controller says how to launch it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from rlforge import Trainer, load_config
from rlforge.errors import ConfigError, RLForgeError
from tests.plugins.megatron_cpu import free_port, launch_env

ROOT = Path(__file__).resolve().parents[2]


class FakeWorker:
    def __init__(self, rank):
        self.rank = rank

    def echo(self, x):
        return (self.rank, x)

    def user_error(self):
        raise RLForgeError(f"bad value on rank {self.rank}")

    def crash(self):
        if self.rank == 1:
            raise ValueError("boom")
        return "fine"


def _channel_main(rank: int, port: int, out_dir: str) -> None:
    from rlforge.controller.torchrun import Channel

    launch_env(rank, 2, port)
    torch.distributed.init_process_group("gloo")
    group = torch.distributed.new_group(backend="gloo")
    channel = Channel(group, rank, 2, {"actor": FakeWorker(rank)})
    if rank:
        channel.serve()
        torch.distributed.destroy_process_group()
        return
    out = {"each": channel.run("actor", "echo", [("a",), ("b",)]), "skip": channel.run("actor", "echo", [None, ("b",)])}
    for method in ("user_error", "crash"):
        try:
            channel.run("actor", method, [(), ()])
        except RLForgeError as exc:
            out[method] = str(exc)
    channel.stop()
    torch.save(out, os.path.join(out_dir, "out.pt"))
    torch.distributed.destroy_process_group()


def test_channel_dispatches_to_every_rank_and_reports_failures(tmp_path):
    mp.spawn(_channel_main, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    out = torch.load(tmp_path / "out.pt")
    assert out["each"] == [(0, "a"), (1, "b")]
    assert out["skip"] == [(1, "b")]
    assert out["user_error"] == "bad value on rank 0"  # a user-fixable error stays as it is
    assert out["crash"].startswith("The actor worker (rank 1 of 2) failed during 'crash': ValueError: boom")


def test_outside_torchrun_it_says_how_to_launch(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    cfg = load_config("grpo", ["trainer.controller=torchrun", "strategy.name=fsdp", "strategy.num_processes=2",
                               f"trainer.runs_root={tmp_path}", "logger.backends=[]"])
    with pytest.raises(ConfigError, match=r"runs under torchrun: torchrun --nproc-per-node 2 -m rlforge.cli fit"):
        Trainer(cfg).fit()


@pytest.mark.parametrize("controller", ["local", "ray"])
def test_under_torchrun_another_controller_is_refused_before_the_run_folder(tmp_path, monkeypatch, controller):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    extra = ["strategy.name=fsdp", "strategy.num_processes=2", "ray.rollout_workers=0"] if controller == "ray" else []
    cfg = load_config("grpo", [f"trainer.controller={controller}", f"trainer.runs_root={tmp_path}",
                               "logger.backends=[]", *extra])
    with pytest.raises(ConfigError, match=rf"^This process is one of 2 that torchrun started, but trainer.controller="
                                          rf"{controller} drives a run from one process"):
        Trainer(cfg).fit()
    assert not list(tmp_path.rglob("config.yaml"))


def _torchrun_fit(tmp_path, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "rlforge.cli", "fit", "--algo", "grpo", "trainer.controller=torchrun", "strategy.name=fsdp",
           "strategy.num_processes=2", "strategy.device=cpu", "trainer.save_every=1",
           "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.arith.train_size=512", "data.arith.val_size=8",
           "trainer.val_every=0", "trainer.progress=false", "logger.backends=[console]",
           f"trainer.runs_root={tmp_path}", "strategy.checkpoint=sharded", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLFORGE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    return log


@pytest.mark.slow
def test_torchrun_launch_trains_checkpoints_and_resumes(tmp_path):
    _torchrun_fit(tmp_path, "trainer.total_steps=2")
    runs = list((tmp_path / "default").iterdir())
    assert len(runs) == 1, runs  # rank 1 made no run folder of its own
    step2 = runs[0] / "checkpoints" / "step_000002"
    assert (step2 / "actor" / "model.safetensors").is_file()
    assert (step2 / "sharded" / "actor" / ".metadata").is_file()  # every rank wrote its shard
    assert (runs[0] / "summary.json").is_file()
    log = _torchrun_fit(tmp_path, "trainer.total_steps=3", "trainer.resume=auto")  # the shards reload on 2 ranks
    assert "resumed from" in log and "step    3/3" in log, log[-3000:]
    assert (runs[0] / "checkpoints" / "step_000003" / "actor" / "model.safetensors").is_file()
