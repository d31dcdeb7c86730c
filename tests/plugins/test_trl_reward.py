"""``reward.manager=trl``: TRL's reward functions, called once per batch with GRPOTrainer's arguments."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import rlforge
from rlforge import batch as B
from rlforge.errors import ConfigError, RLForgeError
from rlforge.evaluation import SCORED_AT
from rlforge.plugins.reward.rule import RewardFailure
from rlforge.plugins.reward.trl import TrlRewardManager, load_function
from tests.plugins.test_reward import _response_batch

CALLS: list[dict] = []


def accuracy_reward(completions, solution, **kwargs):
    CALLS.append({"completions": completions, "solution": solution, **kwargs})
    return [1.0 if c[0]["content"] == s else 0.0 for c, s in zip(completions, solution)]


def format_reward(completions, level, **kwargs):
    return [None if lv == 2 else float(c[0]["content"].isdigit()) for c, lv in zip(completions, level)]


def text_reward(prompts, completions, completion_ids, **kwargs):
    CALLS.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids})
    return torch.tensor([float(len(ids)) for ids in completion_ids])  # a tensor, as some TRL functions return


def shaped_reward(completions, trainer_state, log_metric, log_extra, **kwargs):
    """Shaped by training progress, as TRL's docs show, with a metric and a column logged."""
    CALLS.append({"global_step": trainer_state.global_step, "max_steps": trainer_state.max_steps})
    progress = trainer_state.global_step / trainer_state.max_steps
    lengths = [len(c[0]["content"]) for c in completions]
    log_metric("custom/progress", progress)
    log_extra("length", lengths)
    log_extra("note", ["short" if n < 2 else "long" for n in lengths])
    return [progress] * len(completions)


@pytest.fixture
def rewards_module(monkeypatch):
    module = types.ModuleType("my_trl_rewards")
    for fn in (accuracy_reward, format_reward, text_reward, shaped_reward):
        setattr(module, fn.__name__, fn)
    module.broken = lambda completions, **kwargs: [1.0]  # one value for a whole batch
    module.not_callable = 3

    async def awaited(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    module.awaited = awaited
    module.raises = lambda completions, **kwargs: 1 / 0
    module.strings = lambda completions, **kwargs: ["high"] * len(completions)
    module.logs_inf = lambda completions, log_metric, **kwargs: log_metric("m", float("inf"))
    module.logs_short = lambda completions, log_extra, **kwargs: log_extra("c", [1])
    module.logs_builtin = lambda completions, log_metric, **kwargs: [log_metric("reward/errors", 1.0), [0.0, 0.0]][1]
    module.logs_val = lambda completions, log_metric, **kwargs: log_metric("val/accuracy", 1.0)
    monkeypatch.setitem(sys.modules, "my_trl_rewards", module)
    CALLS.clear()
    return module


def _manager(pm, tokenizer, *overrides):
    cfg = rlforge.load_config("grpo", ["reward.manager=trl", *overrides], plugins=pm)
    return TrlRewardManager(cfg, tokenizer, pm.registry)


def _batch(tok, texts, infos):
    batch = _response_batch(tok, texts, ["t"] * len(texts), ["x"] * len(texts))
    batch[B.EXTRA_INFO] = infos
    batch[B.RAW_PROMPT] = [[{"role": "system", "content": "brief"}, {"role": "user", "content": f"q{i}"}]
                           for i in range(len(texts))]
    return batch


def test_functions_are_called_once_per_batch_weighted_and_none_left_out(pm, char_tokenizer, rewards_module):
    mgr = _manager(pm, char_tokenizer, "reward.trl.functions=[my_trl_rewards:accuracy_reward,"
                   "my_trl_rewards:format_reward]", "reward.trl.weights=[1.0,0.5]", "reward.fallback_score=-1")
    infos = [{"solution": "12", "level": 1}, {"solution": "8", "level": 2}, {"solution": "ab", "level": 0},
             {"level": 2}]
    out = mgr.score(_batch(char_tokenizer, ["12", "7", "ab", "9"], infos))
    (call,) = CALLS  # one call for the batch
    assert call["completions"][0] == [{"role": "assistant", "content": "12"}]
    assert call["solution"] == ["12", "8", "ab", None] and call["level"] == [1, 2, 0, 2]  # extra_info keys as columns
    # 1 + 0.5 x 1; 0 (format declines); 1 + 0.5 x 0; 0 (accuracy: None != "9" -> 0.0; format declines)
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.5, 0.0, 1.0, 0.0]))
    assert out[B.REWARD_EXTRA_INFO][1] == {"accuracy_reward": 0.0}
    assert out[B.REWARD_FAILED].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert out.meta["metrics"]["reward/extra/format_reward/mean"] == 0.5
    assert out[B.TOKEN_LEVEL_SCORES][0, 2] == 1.5  # on the last response token (EOS)


def test_text_rows_and_completion_ids(pm, char_tokenizer, rewards_module):
    mgr = _manager(pm, char_tokenizer, "reward.trl.functions=[my_trl_rewards:text_reward]",
                   "reward.trl.conversational=false")
    out = mgr.score(_batch(char_tokenizer, ["12", "7"], [None, None]))
    (call,) = CALLS
    assert call["prompts"] == ["brief\nq0", "brief\nq1"] and call["completions"] == ["12", "7"]
    eos = char_tokenizer.eos_token_id
    assert call["completion_ids"] == [[*char_tokenizer.encode("12", add_special_tokens=False), eos],
                                      [*char_tokenizer.encode("7", add_special_tokens=False), eos]]
    torch.testing.assert_close(out[B.SCORES], torch.tensor([3.0, 2.0]))


def test_a_sample_every_function_declines_gets_the_fallback_and_a_batch_of_them_stops(pm, char_tokenizer,
                                                                                      rewards_module):
    mgr = _manager(pm, char_tokenizer, "reward.trl.functions=[my_trl_rewards:format_reward]",
                   "reward.fallback_score=-1")
    out = mgr.score(_batch(char_tokenizer, ["1", "2"], [{"level": 2}, {"level": 0}]))
    assert out[B.SCORES].tolist() == [-1.0, 1.0] and out[B.REWARD_FAILED].tolist() == [1.0, 0.0]
    assert out.meta["metrics"]["reward/error_share"] == 0.5
    with pytest.raises(RewardFailure, match=r"2 of 2 samples got None from every TRL reward function "
                                            r"\(format_reward\)"):
        mgr.score(_batch(char_tokenizer, ["1", "2"], [{"level": 2}, {"level": 2}]))


def test_an_async_function_is_awaited(pm, char_tokenizer, rewards_module):
    mgr = _manager(pm, char_tokenizer, "reward.trl.functions=[my_trl_rewards:awaited]")
    out = mgr.score(_batch(char_tokenizer, ["12", "7"], [None, None]))
    torch.testing.assert_close(out[B.SCORES], torch.tensor([2.0, 1.0]))
    mgr.close()


def test_a_column_named_like_an_argument_is_refused(pm, char_tokenizer, rewards_module):
    mgr = _manager(pm, char_tokenizer, "reward.trl.functions=[my_trl_rewards:text_reward]")
    with pytest.raises(RLForgeError, match=r"extra_info has the key 'prompts', which is an argument TRL's contract"):
        mgr.score(_batch(char_tokenizer, ["1", "2"], [{"prompts": "x"}, None]))


def test_trainer_state_log_metric_and_log_extra_are_passed_as_trl_does(pm, char_tokenizer, rewards_module):
    mgr = _manager(pm, char_tokenizer, "reward.trl.functions=[my_trl_rewards:shaped_reward]", "trainer.total_steps=8")
    batch = _batch(char_tokenizer, ["12", "7"], [None, None])
    batch.meta[SCORED_AT] = 2  # the reward stage of step 3: two updates made
    out = mgr.score(batch)
    assert CALLS == [{"global_step": 2, "max_steps": 8}]
    torch.testing.assert_close(out[B.SCORES], torch.tensor([0.25, 0.25]))
    assert out.meta["metrics"]["custom/progress"] == 0.25
    assert out[B.REWARD_EXTRA_INFO] == [{"shaped_reward": 0.25, "length": 2.0, "note": "long"},
                                        {"shaped_reward": 0.25, "length": 1.0, "note": "short"}]
    assert out.meta["metrics"]["reward/extra/length/mean"] == 1.5


@pytest.mark.parametrize(("name", "message"), [
    ("logs_inf", r"<lambda> \(reward.trl.functions\[0\]\): log_metric\('m', inf\): the value must be a finite"),
    ("logs_short", r"log_extra\('c', ...\) got 1 values for 2 samples: give one value per completion"),
    ("logs_val", r"log_metric\('val/accuracy', ...\): names under val/ are validation's metrics"),
    ("logs_builtin", r"called log_metric\('reward/errors', ...\): the trl reward manager logs that metric itself"),
    ("broken", r"TRL reward function <lambda> \(reward.trl.functions\[0\]\) returned 1 values for 2 samples"),
    ("raises", r"<lambda> \(reward.trl.functions\[0\]\) raised on a batch of 2 samples: ZeroDivisionError"),
    ("strings", r"returned 'high' \(str\) for sample 0: each value must be a number, or None"),
])
def test_a_function_that_breaks_the_contract_stops_naming_it(pm, char_tokenizer, rewards_module, name, message):
    mgr = _manager(pm, char_tokenizer, f"reward.trl.functions=[my_trl_rewards:{name}]")
    with pytest.raises(RLForgeError, match=message):
        mgr.score(_batch(char_tokenizer, ["1", "2"], [None, None]))


def test_config_errors_name_the_key(pm, tmp_path, rewards_module):
    with pytest.raises(ConfigError, match=r"reward.manager=trl needs 'reward.trl.functions'"):
        rlforge.load_config("grpo", ["reward.manager=trl"], plugins=pm)
    with pytest.raises(ConfigError, match=r"'reward.trl.weights' has 1 values for 2 functions"):
        rlforge.load_config("grpo", ["reward.manager=trl", "reward.trl.functions=[a:b,c:d]", "reward.trl.weights=[1]"],
                            plugins=pm)
    (tmp_path / "r.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                                   "    return 0\n")
    with pytest.raises(ConfigError, match=r"'reward.trl.weights\[1\]' is nan: a weight must be a finite number"):
        rlforge.load_config("grpo", ["reward.manager=trl", "reward.trl.functions=[a:b,c:d]",
                                     "reward.trl.weights=[1,.nan]"], plugins=pm)
    with pytest.raises(ConfigError, match=r"reward.file names a per-sample reward function"):
        rlforge.load_config("grpo", ["reward.manager=trl", "reward.trl.functions=[a:b]",
                                     f"reward.file={tmp_path / 'r.py'}"], plugins=pm)
    (tmp_path / "bad.py").write_text("import nowhere_to_be_found\n")
    for spec, message in [
        ("no_colon", r"reward.trl.functions\[0\]: 'no_colon' must be 'module:function' or 'path/to/file.py:function'"),
        ("missing_module_xyz:f", r"importing missing_module_xyz failed: ModuleNotFoundError"),
        (f"{tmp_path}/nope.py:f", r"file not found: .*nope.py"),
        (f"{tmp_path}/bad.py:f", r"importing .*bad.py failed: ModuleNotFoundError"),
        ("my_trl_rewards:nothing", r"my_trl_rewards has no function 'nothing'"),
        ("my_trl_rewards:not_callable", r"my_trl_rewards's 'not_callable' is not a function \(int\)"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_function(spec, "reward.trl.functions[0]")
    assert load_function("my_trl_rewards:accuracy_reward", "k") is accuracy_reward


def test_a_run_passes_the_updates_made_as_global_step(pm, tmp_path, rewards_module):
    from rlforge import Trainer
    from rlforge.testing import fast_config

    cfg = fast_config("grpo", tmp_path, "reward.manager=trl", "reward.trl.functions=[my_trl_rewards:shaped_reward]",
                      "trainer.total_steps=2", "trainer.val_before_train=true", "trainer.val_at_end=true",
                      "data.arith.val_size=2", plugins=pm)
    Trainer(cfg, plugins=pm).fit()
    # validation before training, steps 1 and 2 (before their updates), validation after the 2 updates
    assert [c["global_step"] for c in CALLS] == [0, 0, 1, 2] and {c["max_steps"] for c in CALLS} == {2}
