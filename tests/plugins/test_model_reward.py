"""``reward.manager=model``: a reward model trained here (``--algo rm`` on the shipped tiny model, a few steps) scores
rollouts, batched, with the weighted rule reward; the RL step never trains it; it runs under the Ray controller."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

from rlforge import Trainer, load_config
from rlforge import batch as B
from rlforge.build import Builder
from rlforge.cli import main
from rlforge.preferences import collate_preferences, tokenize_preferences
from rlforge.errors import ConfigError
from rlforge.plugin_manager import PluginManager

SMALL = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "data.arith.train_size=512", "data.arith.val_size=8",
         "data.arith.train_size=64", "trainer.val_every=0", "trainer.progress=false", "logger.backends=[]"]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    """(run folder, exported folder) of a reward model trained for 3 steps on arith_pairs."""
    root = tmp_path_factory.mktemp("rm")
    trainer = Trainer(load_config("rm", [*SMALL, "trainer.total_steps=3", "actor.lr=3e-4",
                                         "trainer.val_before_train=false", f"trainer.runs_root={root}"]))
    trainer.fit()
    assert main(["export", str(trainer.run_dir), str(root / "exported")]) == 0
    return trainer.run_dir, root / "exported"


def _manager(pm, path, *extra, tokenizer=None):
    cfg = load_config("grpo", [*SMALL, "reward.manager=model", f"reward.model.path={path}", *extra], plugins=pm)
    builder = Builder(cfg, pm)
    return builder.reward(tokenizer or builder.module().tokenizer)


def _scored_batch(tokenizer) -> B.Batch:
    """Prompts and responses in the rollout layout (two answers each), with the loader columns the rule needs."""
    rows = [{"prompt": "What is 1+2?", "chosen": "3", "rejected": "5", "data_source": "arith",
             "reward_model": {"ground_truth": "3"}},
            {"prompt": "What is 30+12?", "chosen": "42", "rejected": "40", "data_source": "arith",
             "reward_model": {"ground_truth": "42"}}]
    examples = tokenize_preferences(rows, tokenizer, 64, 16, True, "test")
    return collate_preferences(examples, tokenizer.pad_token_id, [0, 1])


def _reference_scores(folder, tokenizer, batch) -> torch.Tensor:
    """Each sample alone, unpadded, through the plain Hugging Face model (no rlforge code)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for ids, mask in zip(batch[B.INPUT_IDS], batch[B.ATTENTION_MASK]):
            out.append(model(input_ids=ids[mask.bool()][None]).logits[0, 0])
    return torch.stack(out)


def test_scores_are_the_reward_models_plus_the_weighted_rule(pm, reward_model):
    run_dir, exported = reward_model
    manager = _manager(pm, run_dir, "reward.model.rule_weight=0.5", "reward.model.batch_size=3")
    try:
        batch = manager.score(_scored_batch(manager.tokenizer))
    finally:
        manager.close()
    expected = _reference_scores(exported, manager.tokenizer, batch)
    assert batch[B.ACC].tolist() == [1.0, 0.0, 1.0, 0.0]  # the rule's exact match
    torch.testing.assert_close(batch[B.SCORES], expected + 0.5 * batch[B.ACC], atol=1e-5, rtol=1e-5)
    last = batch[B.RESPONSE_MASK].sum(-1) - 1
    torch.testing.assert_close(batch[B.TOKEN_LEVEL_SCORES][torch.arange(4), last], batch[B.SCORES])
    assert batch.meta["metrics"]["reward/model/mean"] == pytest.approx(float(expected.mean()), abs=1e-5)


def test_model_only_and_a_policy_with_another_chat_template(pm, reward_model):
    run_dir, exported = reward_model
    same = _manager(pm, exported, "reward.model.rule=false")
    expected = same.score(_scored_batch(same.tokenizer))[B.SCORES]
    policy_tok = copy.deepcopy(same.tokenizer)
    policy_tok.chat_template = "SYSTEM " + policy_tok.chat_template  # other tokens: the manager re-renders
    other = _manager(pm, exported, "reward.model.rule=false", tokenizer=policy_tok)
    assert _worker(same).same_tokens and not _worker(other).same_tokens
    batch = other.score(_scored_batch(policy_tok))
    assert B.ACC not in batch  # no rule: no exact-match verdict
    torch.testing.assert_close(batch[B.SCORES], expected, atol=1e-5, rtol=1e-5)


def _worker(manager):
    """The reward model's rank in this process (the manager's in-process ``reward_model`` group)."""
    return manager.model.transport.workers[0]


@pytest.mark.parametrize("overrides, message", [
    ([], "needs 'reward.model.path'"),
    (["reward.model.path=/no/such/folder"], "'reward.model.path' does not exist"),
    (["reward.model.path=builtin:tiny-arith", "reward.model.rule=false", "reward.model.rule_weight=1"],
     "turn the rule reward on"),
    (["reward.model.path=builtin:tiny-arith", "reward.model.dtype=int8"], "Allowed: float32, bfloat16, float16"),
    (["reward.model.path=builtin:tiny-arith", "reward.model.device=tpu"], "Allowed: auto, cpu, cuda or cuda:N"),
])
def test_config_mistakes(pm, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("grpo", ["reward.manager=model", *overrides], plugins=pm)


def test_a_causal_lm_is_refused_as_the_reward_model(pm):
    with pytest.raises(ConfigError, match=r"is a LlamaForCausalLM, not a reward model \(\.\.\.ForSequenceClassification\)"):
        _manager(pm, "builtin:tiny-arith")


def test_grpo_trains_against_the_learned_reward_and_never_trains_it(tmp_path, reward_model):
    _, exported = reward_model
    cfg = load_config("grpo", [*SMALL, "rollout.n=4", "trainer.total_steps=2", f"trainer.runs_root={tmp_path}",
                               "reward.manager=model", f"reward.model.path={exported}"])
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in _worker(_manager(PluginManager(autoload=False), exported)).model.state_dict().items()}
    summary = trainer.fit()
    scorer = trainer.controller.workers.reward_model  # the local run's one in-process rank of the role
    assert trainer.controller.reward.model is scorer
    after = _worker(trainer.controller.reward).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in _worker(trainer.controller.reward).model.parameters())
    first = trainer.history[0]
    assert {"critic/score/mean", "reward/model/mean", "reward/rule/mean", "critic/acc/mean"} <= set(first)
    assert first["critic/score/mean"] == pytest.approx(first["reward/model/mean"])  # model_weight 1, rule_weight 0
    assert summary["accuracy_after"] is not None  # validation reports the rule's exact match


try:
    import ray
except ImportError:
    ray = None


@pytest.mark.skipif(ray is None, reason="the Ray controller needs ray")
def test_the_reward_model_scores_on_ray_workers_of_its_own(tmp_path, reward_model):
    """Under Ray the reward model is a role of its own (``reward_model``): a resource pool of
    ``reward.model.num_workers`` Ray actors scores, the driver holds no reward model."""
    _, exported = reward_model
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cfg = load_config("grpo", [*SMALL, "rollout.n=4", "trainer.total_steps=1", f"trainer.runs_root={tmp_path}",
                               "trainer.controller=ray", "strategy.device=cpu", "ray.num_cpus=3",
                               "trainer.val_before_train=false", "reward.manager=model",
                               f"reward.model.path={exported}", "reward.model.num_workers=2"])
    trainer = Trainer(cfg)
    trainer.fit()
    assert trainer.history[0]["reward/model/mean"] == pytest.approx(trainer.history[0]["critic/score/mean"])
    group = trainer.controller.workers.reward_model
    assert type(group.transport).__name__ == "RayTransport" and group.world_size == 2
    assert trainer.controller.reward.model is group


@pytest.mark.slow
def test_the_rlhf_path_end_to_end(tmp_path):
    """scripts/rlhf_demo.py with its --quick sizes: sampled pairs -> reward model -> GRPO on it; DPO on the pairs."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "rlhf_demo.py"
    spec = importlib.util.spec_from_file_location("rlhf_demo", script)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = demo  # dataclasses look their module up
    try:
        spec.loader.exec_module(demo)
    finally:
        del sys.modules[spec.name]
    results = demo.run(tmp_path, demo.QUICK)
    assert results["pairs_train"] > 0 and results["pairs_heldout"] > 0
    assert (tmp_path / "reward_model" / "config.json").is_file()
    for run in ("rm", "grpo_model_reward", "grpo_model_and_rule", "dpo"):
        assert results[run]["accuracy_before"] is not None and results[run]["accuracy_after"] is not None, run
    assert "val/rewards/accuracies" in results["dpo"]["val_after"]  # the held-out pairs, besides exact match
    assert "| reward model (3 steps) | held-out pairwise accuracy |" in demo.report(results)
