"""PRIME's implicit PRM as a role of the dataflow (``prm``, algorithms/prime.py): placed by the controller beside the
actor, trained on outcome labels (its loss falls, the re-scoring sees the new weights), checkpointed with its optimizer
and resumed bit-identically; a Ray run places it on Ray actors of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rlforge import Trainer, load_config
from rlforge import batch as B
from rlforge.build import Builder
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugin_manager import PluginManager
from tests.test_e2e import CrashAt

QUICK = ["trainer.total_steps=2", "trainer.val_before_train=false", "trainer.save_every=0", "trainer.val_every=0",
         "data.arith.val_size=8", "trainer.progress=false", "logger.backends=[]", "data.train_batch_size=4",
         "actor.ppo_mini_batch_size=4", "algorithm.prm.ppo_mini_batch_size=4", "algorithm.oversample_factor=2",
         "algorithm.prm.lr=1e-3", "rollout.max_new_tokens=6"]


def _config(tmp_path: Path, *extra: str):
    return load_config("prime", [f"trainer.runs_root={tmp_path}", *QUICK, *extra])


def test_the_flow_places_the_prm_role_and_scores_before_the_advantage(tmp_path):
    cfg = _config(tmp_path)
    pm = PluginManager.for_config(cfg)
    builder = Builder(cfg, pm)
    module = builder.module()
    assert builder.roles(module) == ["actor", "prm"]
    assert module.flow().names() == ["rollout", "reward", "prime_filter", "old_logprob", "prm", "advantage",
                                     "update_actor", "sync_weights"]


def _labelled_batch(tokenizer, rows: int = 8) -> B.Batch:
    """Prompt + response rows whose label says whether the response starts with token 5."""
    g = torch.Generator().manual_seed(0)
    prompt, resp = 4, 5
    responses = torch.randint(6, 30, (rows, resp), generator=g)
    responses[::2, 0] = 5
    ids = torch.cat([torch.randint(6, 30, (rows, prompt), generator=g), responses], dim=1)
    acc = torch.tensor([1.0 if i % 2 == 0 else 0.0 for i in range(rows)])
    return B.Batch({B.INPUT_IDS: ids, B.ATTENTION_MASK: torch.ones_like(ids), B.RESPONSES: responses,
                    B.RESPONSE_MASK: torch.ones(rows, resp), B.ACC: acc}, {B.UID: [i // 4 for i in range(rows)]})


def test_prm_updates_lower_its_loss_and_the_rescoring_uses_the_new_weights(tmp_path):
    cfg = _config(tmp_path, "algorithm.prm.ppo_mini_batch_size=2", "rollout.n=4")
    builder = Builder(cfg, PluginManager.for_config(cfg))
    module = builder.module()
    controller = builder.controller(module)
    try:
        prm = controller.workers.prm
        batch = _labelled_batch(module.tokenizer)
        before = prm.implicit_q(batch)
        losses = [prm.update(batch, step)["prm/loss"] for step in range(1, 6)]
        after = prm.implicit_q(batch)
        assert losses[-1] < losses[0], losses
        assert not torch.equal(before, after)
        assert torch.equal(after, prm.implicit_q(batch))  # scoring is deterministic: it reads the current weights
        # the labelled rows' implicit reward rose relative to the others
        sums = (after - before).sum(-1)
        assert float(sums[::2].mean()) > float(sums[1::2].mean())
    finally:
        controller.shutdown()


def test_bad_prime_options_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        _config(tmp_path, "rollout.n=1")
    with pytest.raises(ConfigError, match="accuracy_lower_bound"):
        _config(tmp_path, "algorithm.accuracy_lower_bound=0.9", "algorithm.accuracy_upper_bound=0.5")
    with pytest.raises(ConfigError, match="'algorithm.reward_dpo_coef' and 'algorithm.reward_gt_coef' are both 0"):
        _config(tmp_path, "algorithm.reward_dpo_coef=0", "algorithm.reward_gt_coef=0")
    with pytest.raises(ConfigError, match="'algorithm.filter_groups' .* does not apply to --algo prime"):
        _config(tmp_path, "algorithm.filter_groups=true")
    with pytest.raises(ConfigError, match=r"'algorithm.prm.ppo_mini_batch_size' \(3 prompts\) must divide"):
        _config(tmp_path, "algorithm.prm.ppo_mini_batch_size=3")
    for key in ("use_kl_in_reward=true", "overlong_buffer=4"):
        with pytest.raises(ConfigError, match=rf"'algorithm.{key.split('=')[0]}' shapes the token rewards"):
            _config(tmp_path, f"algorithm.{key}")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(RLForgeError, match=r"\(algorithm.prm.path\) is a file"):
        Trainer(_config(tmp_path, f"algorithm.prm.path={tmp_path / 'weights.bin'}")).fit()
    with pytest.raises(RLForgeError, match="algorithm.prm.path"):
        Trainer(_config(tmp_path, f"algorithm.prm.path={tmp_path / 'no_such_prm'}")).fit()


def _prm_tensors(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """Every tensor of the prm role's checkpointed state (weights, optimizer moments), by path."""
    state = torch.load(run_dir / "checkpoints" / f"step_{step:06d}" / "trainer_state.pt", weights_only=False)
    out: dict[str, torch.Tensor] = {}

    def walk(obj, path):
        if isinstance(obj, torch.Tensor):
            out[path] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}/{k}")

    def find(obj):
        if isinstance(obj, dict):
            if "prm" in obj and isinstance(obj["prm"], dict) and "optimizer" in obj["prm"]:
                walk(obj["prm"], "prm")
                return
            for v in obj.values():
                find(v)

    find(state)
    return out


@pytest.mark.parametrize("update", ["before", "after"])
def test_prime_resumes_bit_identically(tmp_path, update):
    from safetensors.torch import load_file

    common = ["trainer.total_steps=3", "trainer.save_every=2", "trainer.keep_last_n=0", f"algorithm.prm.update={update}"]
    full = Trainer(_config(tmp_path / "a", *common))
    full.fit()
    with pytest.raises(KeyboardInterrupt):
        Trainer(_config(tmp_path / "b", *common), callbacks=[CrashAt(3)]).fit()
    resumed = Trainer(_config(tmp_path / "b", *common, "trainer.resume=auto"))
    resumed.fit()
    a, b = (load_file(str(t.run_dir / "checkpoints" / "step_000003" / "actor" / "model.safetensors"))
            for t in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    pa, pb = _prm_tensors(full.run_dir, 3), _prm_tensors(resumed.run_dir, 3)
    assert any("model" in k for k in pa) and any("optimizer" in k for k in pa), sorted(pa)[:5]
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    keys = ("prm/loss", "prm/reward", "critic/score/mean")
    assert [[h[k] for k in keys] for h in full.history[2:]] == [[h[k] for k in keys] for h in resumed.history]


try:
    import ray
except ImportError:
    ray = None


@pytest.mark.skipif(ray is None, reason="the Ray controller needs ray")
def test_under_ray_the_prm_role_has_ray_actors_of_its_own(tmp_path):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cfg = _config(tmp_path, "trainer.controller=ray", "strategy.device=cpu", "ray.num_cpus=2",
                  "algorithm.oversample_factor=1", "trainer.total_steps=1")
    trainer = Trainer(cfg)
    trainer.fit()
    group = trainer.controller.workers.prm
    assert type(group.transport).__name__ == "RayTransport" and group.world_size == 1
    assert trainer.module.prm is None  # the driver holds the actor mirror only
    assert {"prm/loss", "prm/reward", "prm/heldout_pairwise_acc"} <= set(trainer.history[0])


def test_update_none_only_scores_and_before_rescores_with_the_trained_prm(tmp_path):
    """``algorithm.prm.update`` is read as the option (a DictConfig also has a mapping method of that name)."""
    none = Trainer(_config(tmp_path / "none", "algorithm.prm.update=none", "trainer.total_steps=1"))
    none.fit()
    assert "prm/loss" not in none.history[0] and abs(none.history[0]["prm/raw_reward"]) < 1e-5  # PRM = its ref
    before = Trainer(_config(tmp_path / "before", "algorithm.prm.lr=0.05", "trainer.total_steps=1"))
    before.fit()
    assert "prm/loss" in before.history[0] and abs(before.history[0]["prm/raw_reward"]) > 1e-3


def test_the_batchs_advantages_are_zero_at_padding(tmp_path):
    from rlforge.algorithms.prime import PRIME, PRM_SCORES

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    batch = B.Batch({PRM_SCORES: torch.tensor([[0.1, 0.0, 0.0], [-0.2, 0.3, 0.0]]), B.ACC: torch.tensor([1.0, 0.0]),
                     B.RESPONSE_MASK: mask}, {B.UID: ["a", "a"]})
    adv = PRIME(_config(tmp_path, "rollout.n=2")).compute_advantages(batch)[B.ADVANTAGES]
    assert adv[0, 2] == 0 and (adv[mask.bool()] != 0).all()
