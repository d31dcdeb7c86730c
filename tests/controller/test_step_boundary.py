"""The driver/worker boundary of ``RLModule`` (rlforge/module.py): a policy loss that reads the step and logs a metric
sees the driver's step and delivers the metric under the local, Ray and torchrun controllers; ``log`` in a worker
process outside an update raises instead of dropping the value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlforge import RLModule, Trainer, load_config
from rlforge.errors import ConfigError, RLForgeError
from tests.controller.test_ray import RAY, needs_ray
from tests.plugins.megatron_cpu import free_port
from tests.test_e2e import FAST

PROBE = str(Path(__file__).with_name("step_probe.py"))
ROOT = Path(__file__).resolve().parents[2]
STEPS = [1.0, 2.0]


def _fit(tmp_path, *extra):
    cfg = load_config("step_probe", [*FAST, f"plugins.modules=[{PROBE}]", "trainer.total_steps=2",
                                     "logger.backends=[console]", f"trainer.runs_root={tmp_path}", *extra])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer.history


def _seen(history):
    return [h["probe/ctx_step"] for h in history], [h["probe/module_step"] for h in history]


def test_local_policy_loss_sees_the_step_and_its_metric_arrives(tmp_path):
    assert _seen(_fit(tmp_path)) == (STEPS, STEPS)


@needs_ray
@pytest.mark.slow
def test_ray_ranks_see_the_drivers_step_and_their_metric_arrives(tmp_path):
    assert _seen(_fit(tmp_path, *RAY)) == (STEPS, STEPS)


@pytest.mark.slow
def test_torchrun_ranks_see_the_drivers_step_and_their_metric_arrives(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "rlforge.cli", "fit", "--algo", "step_probe", "-p", PROBE, "trainer.controller=torchrun",
           "strategy.name=fsdp", "strategy.num_processes=2", "strategy.device=cpu", *FAST, "trainer.total_steps=2",
           "logger.backends=[jsonl]", f"trainer.runs_root={tmp_path}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLFORGE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    (metrics,) = tmp_path.glob("*/*/metrics.jsonl")
    history = [row for row in map(json.loads, metrics.read_text().splitlines()) if "probe/ctx_step" in row]
    assert _seen(history) == (STEPS, STEPS)


def test_log_outside_an_update_raises_in_a_worker_and_is_ignored_in_the_driver(pm):
    cfg = load_config("grpo", [], plugins=pm)
    module = RLModule(cfg)
    module.log("x", 1.0)  # the driver, between steps: ignored, as in Lightning
    module._on_worker = True
    with pytest.raises(RLForgeError, match=r"log\('x'\) was called in a worker process outside an update"):
        module.log("x", 1.0)


def test_a_module_with_constructor_arguments_is_refused_where_ranks_rebuild_it(pm):
    from rlforge.controller.groups import rank_module_class

    class WithBeta(RLModule):
        def __init__(self, config, beta=0.1, *args, **kwargs):
            super().__init__(config)
            self.beta = beta

    class NeedsBeta(RLModule):
        def __init__(self, config, beta):
            super().__init__(config)

    cfg = load_config("grpo", ["trainer.controller=ray", "strategy.name=fsdp", "strategy.num_processes=2",
                               "data.train_batch_size=8"], plugins=pm)
    assert rank_module_class(RLModule(cfg)) is RLModule
    assert rank_module_class(WithBeta(cfg)) is WithBeta  # what the ranks rebuild: WithBeta(config)
    with pytest.raises(ConfigError, match=r"NeedsBeta.__init__ needs beta besides the config; under "
                                          r"trainer.controller=ray every rank rebuilds"):
        rank_module_class(NeedsBeta(cfg, 0.2))
    for args, kwargs, named in (((0.2,), {}, "beta"), ((), {"beta": 0.2}, "beta"),
                                ((0.2, 1), {"k": 2}, "beta, args, kwargs")):  # given: the ranks would not get them
        with pytest.raises(ConfigError, match=rf"WithBeta.__init__ is given {named} besides the config"):
            rank_module_class(WithBeta(cfg, *args, **kwargs))
