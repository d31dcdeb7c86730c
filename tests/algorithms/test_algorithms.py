"""The algorithm classes: registration, presets, dataflows, DAPO hooks, ReMax baseline, KL-in-reward state."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import hookimpl, load_config
from rlforge.algorithms import shaping
from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.plugin_manager import PluginManager
from rlforge.testing import fake_controller

ALGOS = ["dapo", "dpo", "dr_grpo", "gdpo", "gpg", "grpo", "gspo", "ipo", "kto", "opd", "opo", "orpo", "otb", "pf_ppo", "ppo", "prime",
         "reinforce_pp", "reinforce_pp_baseline", "remax", "rloo", "rm", "simpo", "sppo", "tir_otb", "vapo"]
CRITIC_ALGOS = {"ppo", "pf_ppo", "vapo"}


@pytest.fixture(scope="module")
def pm():
    return PluginManager(autoload=False)


def test_every_algorithm_is_registered_with_a_description(pm, capsys):
    assert pm.registry.algorithm.available() == ALGOS
    assert main(["algos"]) == 0
    out = capsys.readouterr().out
    for name in ALGOS:
        assert name in out
        assert pm.registry.algorithm.entry(name).description
    assert "actor.clip_ratio_high=0.28" in out  # dapo's preset


@pytest.mark.parametrize("algo", ALGOS)
def test_flow_compiles_and_preset_applies(pm, algo):
    cfg = load_config(algo, plugins=pm)
    module = pm.registry.algorithm.get(algo)(cfg)
    names = module.flow().compile().names()
    assert cfg.algorithm.name == algo
    assert ("values" in names and "update_critic" in names) == (algo in CRITIC_ALGOS)
    assert ("greedy_baseline" in names) == (algo == "remax")


def test_presets(pm):
    assert load_config("dr_grpo", plugins=pm).actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert load_config("dr_grpo", plugins=pm).algorithm.norm_adv_by_std is False
    gspo = load_config("gspo", plugins=pm).actor
    assert (gspo.clip_ratio_low, gspo.clip_ratio_high, gspo.loss_agg_mode) == (3e-4, 4e-4, "seq-mean-token-mean")
    dapo = load_config("dapo", plugins=pm)
    assert dapo.algorithm.filter_groups and dapo.actor.clip_ratio_high == 0.28


def _scored(uids, scores, lengths, width=4):
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    n = len(uids)
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), torch.tensor(lengths) - 1] = torch.tensor(scores, dtype=torch.float32)
    return B.Batch({B.PROMPTS: torch.ones(n, 3, dtype=torch.long), B.PROMPT_MASK: torch.ones(n, 3, dtype=torch.long),
                    B.RESPONSES: torch.ones(n, width, dtype=torch.long), B.RESPONSE_MASK: mask,
                    B.INPUT_IDS: torch.ones(n, 3 + width, dtype=torch.long),
                    B.ATTENTION_MASK: torch.cat([torch.ones(n, 3, dtype=torch.long), mask], 1),
                    B.TOKEN_LEVEL_REWARDS: rewards, B.SCORES: torch.tensor(scores, dtype=torch.float32)},
                   {B.UID: uids})


class FakeTrainer:
    """What the overlong-shaping hook reads: the config."""

    def __init__(self, cfg):
        self.config = cfg


def _ctx(cfg, more=(), controller=None):
    """A step context whose ``regenerate`` serves pre-made batches, as dynamic sampling asks for more."""
    from rlforge.testing import step_context

    more = list(more)
    return step_context(cfg, more, controller=controller), more


def test_dapo_flow_has_the_dynamic_sampling_stage_and_others_can_turn_it_on(pm):
    names = pm.registry.algorithm.get("dapo")(load_config("dapo", plugins=pm)).flow().names()
    assert names.index("reward") < names.index("dynamic_sampling") < names.index("old_logprob")
    cfg = load_config("rloo", ["algorithm.filter_groups=true"], plugins=pm)
    assert "dynamic_sampling" in pm.registry.algorithm.get("rloo")(cfg).flow().compile().names()
    assert "dynamic_sampling" not in pm.registry.algorithm.get("grpo")(load_config("grpo", plugins=pm)).flow().names()


def test_dynamic_sampling_drops_uniform_groups_and_refills(pm):
    cfg = load_config("dapo", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2"], plugins=pm)
    first = _scored(["a", "a", "b", "b"], [1, 1, 0, 1], [2, 2, 2, 2])  # a uniform -> dropped, b kept
    second = _scored(["c", "c", "d", "d"], [0, 0, 1, 0], [1, 3, 2, 2])  # c dropped, d kept
    ctx, more = _ctx(cfg, [second])
    out = shaping.DynamicSampling().run(ctx, first)
    assert out[B.UID] == ["b", "b", "d", "d"]
    assert more == []
    assert ctx.metrics == {"train/gen_batches": 2.0, "train/kept_groups": 2.0}
    # prompt layout stays [left-padded prompt | response] after concatenation
    assert out[B.INPUT_IDS].shape[1] == out[B.PROMPTS].shape[1] + out[B.RESPONSES].shape[1]


def test_dynamic_sampling_merges_what_each_round_logs_over_every_generated_row(pm):
    cfg = load_config("dapo", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2"], plugins=pm)
    first = _scored(["a", "a", "b", "b"], [1, 1, 1, 1], [2, 2, 2, 2])  # 4 rows, all uniform
    second = _scored(["c", "c", "d", "d", "e", "e", "f", "f"], [0, 1, 1, 0, 0, 0, 1, 1], [2] * 8)  # 8 rows
    ctx, _ = _ctx(cfg)
    rounds = iter([(second, {"critic/overlong/ratio": 0.5, "agent/engine_calls": 3.0, "num_turns/max": 2.0,
                             "reward/errors": 1.0, "timing_s/gen": 2.0, "custom/new": 7.0})])

    def regenerate(before):
        batch, logged = next(rounds)
        ctx.log(logged)
        return batch

    ctx.regenerate = regenerate
    ctx.metrics.update({"critic/overlong/ratio": 0.25, "agent/engine_calls": 2.0, "num_turns/max": 4.0,
                        "reward/errors": 0.0, "timing_s/gen": 1.0})  # what the first round's stages logged
    out = shaping.DynamicSampling().run(ctx, first)
    assert out[B.UID] == ["c", "c", "d", "d"]
    assert ctx.metrics["critic/overlong/ratio"] == (0.25 * 4 + 0.5 * 8) / 12  # the mean over the 12 rows generated
    assert ctx.metrics["agent/engine_calls"] == 5.0 and ctx.metrics["reward/errors"] == 1.0  # counts add up
    assert ctx.metrics["num_turns/max"] == 4.0 and ctx.metrics["timing_s/gen"] == 3.0
    assert ctx.metrics["custom/new"] == 7.0


def test_dynamic_sampling_stops_at_the_generation_cap(pm):
    cfg = load_config("dapo", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2",
                               "algorithm.max_gen_batches=2"], plugins=pm)
    uniform = _scored(["a", "a"], [1, 1], [2, 2])
    ctx, more = _ctx(cfg, [_scored(["c", "c"], [0, 0], [2, 2])])
    out = shaping.DynamicSampling().run(ctx, uniform)
    assert more == []
    assert out[B.UID] == ["a", "a"]  # nothing informative: the original batch trains (zero advantages)
    assert ctx.metrics["train/kept_groups"] == 0.0


def test_dynamic_sampling_keeps_a_number_of_rows_the_data_parallel_ranks_split_evenly(pm, monkeypatch):
    """When the rounds run out with fewer informative groups than data.train_batch_size, as many are kept as make
    rows that split evenly over the data-parallel ranks (3 groups of 3 rows over 2 ranks: 2 groups); with one rank,
    all of them (an odd count crashed an FSDP update before)."""
    from rlforge.dataflow import StepContext
    from rlforge.microbatch import groups_splitting_evenly

    assert groups_splitting_evenly([*"aaabbbccc"], ["a", "b", "c"], 2) == ["a", "b"]
    assert groups_splitting_evenly([*"aaabbbccc"], ["a", "b", "c"], 1) == ["a", "b", "c"]
    assert groups_splitting_evenly([*"aaa"], ["a"], 2) == []
    cfg = load_config("dapo", ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=3",
                               "algorithm.max_gen_batches=1"], plugins=pm)
    batch = _scored([*"aaabbbcccddd"], [1, 0, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1], [2] * 12)  # a, b, c informative
    ctx, _ = _ctx(cfg, [])
    monkeypatch.setattr(StepContext, "data_parallel_size", property(lambda self: 2))  # as FSDP over 2 ranks
    out = shaping.DynamicSampling().run(ctx, batch)
    assert out[B.UID] == [*"aaabbb"] and ctx.metrics["train/kept_groups"] == 2.0


def test_dynamic_sampling_filters_on_the_metric_named(pm):
    """algorithm.filter_metric (verl's filter_groups.metric): a group whose shaped reward varies but whose score or
    acc does not is kept on reward, dropped on score and acc."""
    batch = _scored(["a", "a", "b", "b"], [1, 1, 0, 1], [2, 2, 2, 2])
    batch[B.TOKEN_LEVEL_REWARDS][0, 0] = -0.5  # an overlong penalty on one answer of a
    batch[B.ACC] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    kept = {}
    for metric in ("reward", "score", "acc"):
        cfg = load_config("dapo", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2",
                                   "algorithm.max_gen_batches=1", f"algorithm.filter_metric={metric}"], plugins=pm)
        ctx, _ = _ctx(cfg, [])
        kept[metric] = shaping.DynamicSampling().run(ctx, batch)[B.UID]
    assert kept == {"reward": ["a", "a", "b", "b"], "score": ["b", "b"], "acc": ["b", "b"]}
    # verl's acc, as its DAPO filter reads it: a number result's score (partial credit 0.5 and 0.75 differ: a kept,
    # where B.ACC, score >= 1, has 0 and 0)
    batch[B.ACC] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    batch[B.REWARD_EXTRA_INFO] = [{"acc": 0.5}, {"acc": 0.75}, {"acc": 0.0}, {"acc": 1.0}]
    ctx, _ = _ctx(cfg, [])
    assert shaping.DynamicSampling().run(ctx, batch)[B.UID] == ["a", "a", "b", "b"]
    ctx, _ = _ctx(cfg, [])
    with pytest.raises(RLForgeError, match="algorithm.filter_metric=acc: the reward manager gives no accuracy"):
        shaping.DynamicSampling().run(ctx, _scored(["a", "a"], [1, 0], [2, 2]))  # no acc column


def _shape(cfg, batch, *plugins):
    """``rlforge_shape_rewards`` as a run fires it: the built-in implementations and ``plugins``."""
    manager = PluginManager(autoload=False)
    for plugin in plugins:
        manager.register(plugin)
    return manager.hook.rlforge_shape_rewards(trainer=FakeTrainer(cfg), batch=batch)


def test_overlong_hook_is_off_unless_enabled(pm):
    cfg = load_config("grpo", plugins=pm)
    assert _shape(cfg, _scored(["a"], [1], [2])) is None


def test_overlong_shaping_penalizes_the_last_token(pm):
    cfg = load_config("dapo", ["rollout.max_new_tokens=4", "algorithm.overlong_buffer=2",
                               "algorithm.overlong_penalty=1.0"], plugins=pm)
    batch = _scored(["a", "a", "a"], [1, 1, 1], [2, 3, 4])
    out = _shape(cfg, batch)
    # expected length 4 - 2 = 2: lengths 2, 3, 4 exceed it by 0, 1, 2 -> penalties 0, -0.5, -1
    assert out[B.TOKEN_LEVEL_REWARDS].sum(-1).tolist() == [1.0, 0.5, 0.0]
    assert out[B.TOKEN_LEVEL_REWARDS][1, 2] == 0.5
    assert out.meta["metrics"] == {"critic/overlong_penalty/mean": -0.5, "critic/overlong/ratio": pytest.approx(2 / 3)}


class KeepsTheBatch:
    @hookimpl
    def rlforge_shape_rewards(self, batch):
        return batch


class DoublesTheRewards:
    @hookimpl
    def rlforge_shape_rewards(self, batch):
        out = batch.select(list(range(len(batch))))  # a new batch, without the given one's metrics
        out[B.TOKEN_LEVEL_REWARDS] = batch[B.TOKEN_LEVEL_REWARDS] * 2
        return out


@pytest.mark.parametrize("plugin, rewards", [(KeepsTheBatch(), [1.0, 0.5, 0.0]), (DoublesTheRewards(), [2.0, 1.0, 0.0])])
def test_a_plugins_reward_shaping_shapes_the_penalized_rewards(pm, plugin, rewards):
    """The overlong penalty is part of the reward: a plugin's rlforge_shape_rewards (first result wins) neither
    replaces nor drops it, and sees the penalized rewards."""
    cfg = load_config("dapo", ["rollout.max_new_tokens=4", "algorithm.overlong_buffer=2",
                               "algorithm.overlong_penalty=1.0"], plugins=pm)
    out = _shape(cfg, _scored(["a", "a", "a"], [1, 1, 1], [2, 3, 4]), plugin)
    assert out[B.TOKEN_LEVEL_REWARDS].sum(-1).tolist() == rewards
    assert out.meta["metrics"]["critic/overlong_penalty/mean"] == -0.5


def test_overlong_log_off_shapes_without_metrics(pm):
    cfg = load_config("dapo", ["rollout.max_new_tokens=4", "algorithm.overlong_log=false"], plugins=pm)
    out = _shape(cfg, _scored(["a", "a"], [1, 1], [2, 4]))
    assert out[B.TOKEN_LEVEL_REWARDS].sum(-1).tolist() == [1.0, 0.0]
    assert "critic/overlong_penalty/mean" not in out.meta.get("metrics", {})


def test_remax_baseline_is_the_greedy_score(pm):
    cfg = load_config("remax", plugins=pm)
    module = pm.registry.algorithm.get("remax")(cfg)
    calls = []

    def generate(batch, params):
        calls.append(params)
        return batch

    def score(batch):
        batch[B.SCORES] = torch.tensor([0.25 if u == "p" else 0.75 for u in batch[B.UID]])
        return batch

    ctx, _ = _ctx(cfg, controller=fake_controller(generate=generate, score=score))
    batch = _scored(["p", "p", "q", "q"], [1, 0, 0, 1], [2, 2, 2, 2])
    batch[B.RAW_PROMPT] = [[{"content": "x"}]] * 4
    for col in (B.DATA_SOURCE, B.GROUND_TRUTH, B.EXTRA_INFO):
        batch[col] = [None] * 4
    stage = next(s for s in module.flow().stages if s.name == "greedy_baseline")
    out = stage.run(ctx, batch)
    assert ctx.metrics["critic/greedy_score/mean"] == 0.5
    assert calls[0].temperature == 0 and calls[0].n == 1
    assert out[B.REWARD_BASELINES].tolist() == [0.25, 0.25, 0.75, 0.75]
    adv = module.compute_advantages(out)[B.ADVANTAGES]
    assert adv[:, 0].tolist() == [0.75, -0.25, -0.75, 0.25]


def test_kl_in_reward_controller_state_round_trips(pm):
    cfg = load_config("grpo", ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl=adaptive",
                               "algorithm.kl_coef=0.2", "algorithm.kl_target=0.01", "algorithm.kl_horizon=10"],
                      plugins=pm)
    module = pm.registry.algorithm.get("grpo")(cfg)
    assert module.needs_reference()
    batch = _scored(["a", "a"], [1, 0], [2, 2])
    batch[B.OLD_LOG_PROBS] = torch.full((2, 4), -1.0)
    batch[B.REF_LOG_PROBS] = torch.full((2, 4), -2.0)  # k1 = 1 per valid token
    out = module.compute_rewards(batch)
    assert out[B.TOKEN_LEVEL_REWARDS].sum(-1).tolist() == pytest.approx([1 - 0.2 * 2, 0 - 0.2 * 2])
    # KL 1 >> target 0.01: error clipped to 0.2, value *= 1 + 0.2 * 2 / 10
    assert module.kl_ctrl.value == pytest.approx(0.2 * 1.04)
    fresh = pm.registry.algorithm.get("grpo")(cfg)
    fresh.load_state_dict(module.state_dict())
    assert fresh.kl_ctrl.value == module.kl_ctrl.value


@pytest.mark.parametrize("override, key", [
    ("algorithm.kl_ctrl=pid", "algorithm.kl_ctrl"),
    ("algorithm.kl_penalty=k9", "algorithm.kl_penalty"),
    ("algorithm.overlong_buffer=8", "algorithm.overlong_buffer"),
    ("critic.ppo_mini_batch_size=5", "critic.ppo_mini_batch_size"),
])
def test_algorithm_option_errors_name_the_key(pm, override, key):
    from rlforge.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("ppo", [override], plugins=pm)
