"""Roles a plugin adds (``registry.role``, docs/plugins.md "Add a role"): a third-party package, pip-installed, adds a
``anchor`` role (a frozen copy of the policy on ranks of its own) and an algorithm whose flow calls it; the local and
Ray controllers place it. Under torchrun every process holds a rank of each role: PRIME's ``prm`` and the ``model``
reward manager's ``reward_model`` train and score there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlforge import Trainer, load_config
from rlforge.controller.remote import Role
from rlforge.errors import RLForgeError
from rlforge.plugin_manager import AUTOLOAD_ENV
from tests.controller.test_ray import needs_ray
from tests.plugins.megatron_cpu import free_port
from tests.plugin_dist import installed_package

ROOT = Path(__file__).resolve().parents[2]
DIST = "rlforge-anchor-role"
QUICK = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2", "rollout.max_new_tokens=6",
         "data.arith.val_size=8", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.progress=false",
         "trainer.total_steps=1", "logger.backends=[]"]

PLUGIN = '''
"""A third-party role: a frozen copy of the initial policy ("anchor") on ranks of its own, and GRPO that logs the
policy's KL to it (a distillation flow's first half)."""
import torch

from rlforge import batch as B
from rlforge import ops
from rlforge.algorithms.grpo import GRPO
from rlforge.controller.ray_workers import WorkerProcess
from rlforge.controller.remote import Role
from rlforge.dataflow import Stage
from rlforge.hookspecs import hookimpl
from rlforge.worker import remote


class AnchorWorker(WorkerProcess):
    def build(self, builder, module, engine=True, initial_sync=True):
        from rlforge.models import load_model

        self.anchor = load_model(builder.config.model.path).eval()
        self.pid = __import__("os").getpid()

    @remote("rows", "concat")
    def anchor_log_probs(self, batch):
        with torch.no_grad():
            return ops.response_logprobs(self.anchor, batch[B.INPUT_IDS], batch[B.ATTENTION_MASK],
                                         batch[B.RESPONSES].shape[1])[0]

    @remote(collect="first")
    def process_id(self):
        return self.pid


class AnchorKL(Stage):
    name = "anchor_kl"
    requires = frozenset({B.OLD_LOG_PROBS})

    def run(self, ctx, batch):
        anchor = ctx.workers.anchor.anchor_log_probs(batch)
        mask = batch[B.RESPONSE_MASK]
        ctx.log({"anchor/kl": float(((batch[B.OLD_LOG_PROBS] - anchor) * mask).sum() / mask.sum()),
                 "anchor/pid": float(ctx.workers.anchor.process_id())})
        return batch


class GRPOWithAnchor(GRPO):
    preset = {"algorithm": {"name": "grpo_anchor"}}

    def worker_roles(self):
        return [*super().worker_roles(), "anchor"]

    def flow(self):
        return super().flow().insert_after(Stage.OLD_LOGPROB, AnchorKL())


@hookimpl
def rlforge_register(registry):
    registry.role.register("anchor", Role(AnchorWorker, pool="anchor"))
    registry.algorithm.register("grpo_anchor", GRPOWithAnchor)
'''


@pytest.fixture(scope="module")
def anchor_plugin(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("anchor_dist"), DIST, "anchor_role",
                           {"anchor_role": ("plugin", PLUGIN)}):
        yield DIST


def _fit(tmp_path, *extra):
    trainer = Trainer(load_config("grpo_anchor", [f"trainer.runs_root={tmp_path}", *QUICK, *extra]))
    trainer.fit()
    return trainer


def test_a_pip_installed_plugin_adds_a_role_the_local_controller_places(anchor_plugin, tmp_path, monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    trainer = _fit(tmp_path)
    (step,) = trainer.history
    assert step["anchor/kl"] == pytest.approx(0.0, abs=1e-5)  # before the first update the policy is the anchor
    assert step["anchor/pid"] == os.getpid()  # local: the role's one rank lives in this process
    assert "anchor" in trainer.controller.workers


@needs_ray
def test_the_ray_controller_gives_the_plugin_role_ray_actors_of_its_own(anchor_plugin, tmp_path, monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    trainer = _fit(tmp_path, "trainer.controller=ray", "strategy.device=cpu", "ray.num_cpus=2")
    (step,) = trainer.history
    assert step["anchor/kl"] == pytest.approx(0.0, abs=1e-6)
    assert step["anchor/pid"] != os.getpid()
    assert type(trainer.controller.workers.anchor.transport).__name__ == "RayTransport"


def _reward_model_folder(root: Path) -> Path:
    """A sequence-classification model on the tiny policy's body (an untrained head: enough to be placed and run)."""
    from rlforge.models import load_reward_model, load_tokenizer

    tokenizer = load_tokenizer("builtin:tiny-arith")
    folder = root / "rm"
    load_reward_model("builtin:tiny-arith", tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_under_torchrun_prime_trains_its_prm_and_the_reward_model_scores_on_every_rank(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "rlforge.cli", "fit", "--algo", "prime", "trainer.controller=torchrun", "strategy.name=fsdp",
           "strategy.num_processes=2", "strategy.device=cpu", *QUICK[:-1], "logger.backends=[jsonl]",
           "trainer.total_steps=2", "algorithm.oversample_factor=1", "algorithm.prm.ppo_mini_batch_size=4",
           "reward.manager=model", f"reward.model.path={_reward_model_folder(tmp_path)}", "reward.model.rule_weight=1",
           f"trainer.runs_root={tmp_path / 'runs'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLFORGE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    (metrics,) = (tmp_path / "runs").glob("*/*/metrics.jsonl")
    steps = [row for row in map(json.loads, metrics.read_text().splitlines()) if "prm/loss" in row]
    assert len(steps) == 2
    assert all({"reward/model/mean", "prm/grad_norm", "prm/heldout_pairwise_acc"} <= set(row) for row in steps)


class _NotAWorker:
    pass


@pytest.mark.parametrize("role, message", [
    (_NotAWorker, r"is <class .*_NotAWorker'>, not a rlforge.controller.remote.Role"),
    (Role("anchor_role.worker"), r"names its worker as 'anchor_role.worker'; give a class or 'package.module:Class'"),
    (Role("no_such_package_xyz:Worker"), r"its worker 'no_such_package_xyz:Worker' cannot be imported"),
    (Role(_NotAWorker), r"is not a subclass of rlforge.controller.ray_workers.WorkerProcess"),
    (Role("rlforge.controller.ray_workers:RankWorker", ranks="trainer.project"), r"takes its number of ranks from "
                                                                                  r"'trainer.project', which is 'rlforge'"),
    (Role("rlforge.controller.ray_workers:RankWorker", ranks="no.such.key"), r"from 'no.such.key', which is None"),
])
def test_a_role_that_cannot_be_placed_is_refused_naming_it_and_its_plugin(role, message, tmp_path):
    from rlforge.algorithms.grpo import GRPO
    from rlforge.build import Builder
    from rlforge.controller.remote import placed_roles
    from rlforge.plugin_manager import PluginManager

    pm = PluginManager(autoload=False)
    pm.registry.role.current_plugin = "my_plugin"
    pm.registry.role.register("odd", role)
    config = load_config("grpo", QUICK, plugins=pm)
    module = GRPO(config)
    module.worker_roles = lambda: ["actor", "odd"]
    with pytest.raises(RLForgeError, match=rf"The role 'odd' \(registered by plugin 'my_plugin'\)[ :].*{message}"):
        placed_roles(Builder(config, pm), module)



def test_worker_roles_given_as_a_string_is_refused_naming_the_algorithm(pm):
    from rlforge.algorithms.grpo import GRPO
    from rlforge.build import Builder

    config = load_config("grpo", QUICK, plugins=pm)
    module = GRPO(config)
    module.worker_roles = lambda: "actor"
    with pytest.raises(RLForgeError, match=r"The algorithm GRPO: its worker_roles\(\) must be a list or tuple of "
                                           r"role names, got 'actor'"):
        Builder(config, pm).roles(module)
