"""What the rule reward manager says and writes (adversarial review of plugins/reward, rlforge.evaluation and the
samples a run writes): rows no reward function scores are named by file and row; a batch whose reward calls all
failed says whether it was validation or a training step, and how to change reward.max_error_share under rlforge
verl; scores are written as the reward function returned them, not float32's digits; a registered reward function
with the wrong signature is refused before any model loads, not after the first step's generation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from rlforge.plugins.data.builtin import files_dataset
from rlforge.plugins.reward.rule import RewardFailure, RuleRewardManager, check_data_sources

from rlforge import batch as B
from rlforge.config.schema import RewardConfig
from rlforge.data import first_rows
from rlforge.errors import ConfigError, RLForgeError
from rlforge.batch import as_returned, reported_scores
from rlforge.evaluation import SCORED_FOR, Evaluator
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.trainer.metrics import sample_records, val_generations
from tests.plugins.test_reward import _response_batch, _reward_config, manager_factory  # noqa: F401 (fixture)

ALWAYS_FAILS = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    raise KeyError("answer")
"""


def _config(**reward):
    return SimpleNamespace(reward=OmegaConf.structured(RewardConfig(**reward)))


def _chat(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": text}] for text in texts]


# --- 1. a data_source without a reward function: the file and the row -------------------------------------------
def test_an_unknown_data_source_names_its_file_and_first_row(registry, tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [{"data_source": source, "prompt": "What is 1+1?", "reward_model": {"ground_truth": "2"}}
            for source in ("arith", "my_task", "my_task", "other_task")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = files_dataset(SimpleNamespace(data=SimpleNamespace(train_files=[str(path)], val_files=[])), "train")
    where = first_rows(loaded, "data_source", "files (train)")
    assert where == {"arith": f"{path}, row 1", "my_task": f"{path}, row 2", "other_task": f"{path}, row 4"}
    with pytest.raises(ConfigError) as err:
        check_data_sources(_config(), registry, where)
    message = str(err.value)
    assert message.startswith(f"No reward function for data_source 'my_task' (first row: {path}, row 2), "
                              f"'other_task' (first row: {path}, row 4). Reward functions: ")
    assert ("Register one under the data_source's name in a plugin (registry.reward_fn.register('my_task', "
            "compute_score) in its rlforge_register hook: docs/plugins.md), or set reward.fn=NAME or "
            "reward.file=path.py (a compute_score function) to score every row with one function.") in message
    check_data_sources(_config(), registry, {"arith": f"{path}, row 1"})  # a known one passes


def test_a_null_data_source_is_said_to_be_null(registry) -> None:
    """Not 'No reward function for data_source 'None'' (helper-59): the data lacks one."""
    with pytest.raises(ConfigError, match=r"^A row's data_source is null \(first row: t.jsonl, row 2\): each row's "):
        check_data_sources(_config(), registry, {"arith": "t.jsonl, row 1", None: "t.jsonl, row 2"})
    check_data_sources(_config(fn="arith"), registry, {None: "t.jsonl, row 2"})  # one function for every row


def test_rows_without_a_file_are_named_by_dataset_and_row_from_1(registry) -> None:
    rows = [{"data_source": "arith"}, {"prompt": "no data_source"}, "not a row", {"data_source": "my_task"}]
    assert first_rows(rows, "data_source", "arith (val)") == {"arith": "arith (val), row 1",
                                                              "my_task": "arith (val), row 4"}


def test_an_unknown_data_source_at_score_time_names_the_sample_and_its_prompt(
        char_tokenizer, registry, manager_factory) -> None:  # noqa: F811
    mgr = manager_factory(char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["1", "2", "3"], ["arith", "my_task", "my_task"], ["1", "2", "3"])
    batch[B.RAW_PROMPT] = _chat(["What is 0+1?", "What is 1+1?", "What is 1+2?"])
    with pytest.raises(RLForgeError, match=r"^No reward function for data_source 'my_task' \(sample 1 of this "
                                           r"batch, prompt 'What is 1\+1\?'\)\. Reward functions: "):
        mgr.score(batch)


# --- 2. every call failed: validation or the training step; rlforge verl's `--` ------------------------------------
def test_a_validation_whose_reward_calls_all_failed_says_validation(
        char_tokenizer, registry, manager_factory, tmp_path) -> None:  # noqa: F811
    path = tmp_path / "fails.py"
    path.write_text(ALWAYS_FAILS)
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    batch = _response_batch(char_tokenizer, ["a", "b"], ["mine"] * 2, ["ok"] * 2)
    evaluate = Evaluator(SimpleNamespace(generate=lambda rows, params: rows), mgr.score)  # type: ignore[arg-type]
    with pytest.raises(RewardFailure) as err:
        evaluate.score(batch)
    assert ("which reaches reward.max_error_share=1: the validation would measure reward.fallback_score alone, not "
            "the model's answers. The first:") in str(err.value)
    assert "train" not in str(err.value)
    assert SCORED_FOR not in batch.meta  # the mark is gone: the same rows scored for training say so
    with pytest.raises(RewardFailure, match="reward.max_error_share=1: the training step would train on "
                                            "reward.fallback_score alone. The first:"):
        mgr.score(batch)


def test_max_error_share_0_says_where_rlforge_verl_takes_it(
        char_tokenizer, registry, manager_factory, tmp_path) -> None:  # noqa: F811
    path = tmp_path / "fails.py"
    path.write_text(ALWAYS_FAILS)
    batch = _response_batch(char_tokenizer, ["a"], ["mine"], ["ok"])
    with pytest.raises(RewardFailure) as err:
        manager_factory(char_tokenizer, registry, file=str(path), max_error_share=0.0).score(batch)
    assert str(err.value).endswith(
        "or, to tolerate more failures, raise reward.max_error_share (1 stops only when every call fails; a run "
        "started with `rlforge verl`, which sets it to 0 as verl stops, takes it after `--`: rlforge verl "
        "VERL_ARGS... -- reward.max_error_share=1).")
    with pytest.raises(RewardFailure) as err:  # a tolerance of the user's own: no word of rlforge verl
        manager_factory(char_tokenizer, registry, file=str(path), max_error_share=0.5).score(batch)
    assert str(err.value).endswith("raise reward.max_error_share (1 stops only when every call fails).")


# --- 3. scores as the reward function returned them -----------------------------------------------------------------
def test_written_scores_are_the_returned_values_not_float32_digits(char_tokenizer) -> None:
    values = [0.3, 0.1, -0.7, 1.0, 0.0, 1 / 3, 2.5e-8]
    batch = B.Batch({B.SCORES: torch.tensor(values), B.PROMPTS: torch.ones(len(values), 2, dtype=torch.long),
                     B.PROMPT_MASK: torch.ones(len(values), 2, dtype=torch.long)},
                    {B.RAW_PROMPT: _chat(["q"] * len(values)), B.RESPONSE_TEXT: ["a"] * len(values),
                     B.GROUND_TRUTH: ["a"] * len(values)})
    assert float(batch[B.SCORES][0]) == 0.30000001192092896  # what was written before
    records = sample_records(batch, len(values))
    assert [r["score"] for r in records] == [0.3, 0.1, -0.7, 1.0, 0.0, 0.33333334, 2.5e-8]
    assert '"score": 0.3}' in json.dumps(records[0])  # a JSON number, as returned
    assert sorted(r["score"] for r in val_generations(batch, char_tokenizer, len(values))) == sorted(
        r["score"] for r in records)  # trainer.log_val_generations' files too
    for value, shown in zip(batch[B.SCORES].tolist(), reported_scores(batch)):
        assert np.float32(shown) == np.float32(value)  # the same float32: nothing lost
        assert len(repr(shown)) <= len(repr(value))
    assert as_returned(3.4e38) == 3.4e38 and as_returned(float(np.float32(123456.789))) == 123456.79


def test_samples_scored_by_a_reward_file_show_its_value(char_tokenizer, registry, manager_factory, tmp_path) -> None:  # noqa: F811
    path = tmp_path / "r.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 0.3\n")
    batch = _response_batch(char_tokenizer, ["a"], ["mine"], ["ok"])
    batch[B.RAW_PROMPT] = _chat(["q"])
    out = manager_factory(char_tokenizer, registry, file=str(path)).score(batch)
    assert json.loads(json.dumps(sample_records(out, 1)[0]))["score"] == 0.3


# --- 4. a registered reward function's signature, before any model loads ---------------------------------------------
def wrong_signature(solution_str, ground_truth):  # verl's scorer signature, not the contract
    return 1.0


def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None):  # verl calls by keyword: it works
    return 1.0 if solution_str == ground_truth else 0.0


def needs_option(data_source, solution_str, ground_truth, extra_info=None, *, weight):  # nothing gives `weight`
    return weight


class MyTask:
    @hookimpl
    def rlforge_register(self, registry):
        registry.reward_fn.register("my_task", wrong_signature)
        registry.reward_fn.register("my_kw_task", keyword_only)
        registry.reward_fn.register("my_option_task", needs_option)


@pytest.fixture
def plugged():
    pm = PluginManager(autoload=False)
    pm.register(MyTask(), name="my_plugin")
    return pm.registry


def test_a_registered_function_with_a_wrong_signature_is_refused_with_the_data_check(plugged) -> None:
    with pytest.raises(ConfigError) as err:
        check_data_sources(_config(), plugged, {"my_task": "train.jsonl, row 1", "arith": "train.jsonl, row 2"})
    message = str(err.value)
    assert message.startswith(
        f"Reward function 'my_task' (registry.reward_fn, plugin 'my_plugin', {__file__}:"
        f"{wrong_signature.__code__.co_firstlineno}): wrong_signature(solution_str, ground_truth) does not follow the "
        f"reward-function contract wrong_signature(data_source, solution_str, ground_truth, extra_info): its "
        f"parameter 'solution_str' is argument 1, where rlforge passes 'data_source', so every call would fail or "
        f"misread its arguments.")
    with pytest.raises(ConfigError, match=r"^Reward function 'my_task' \(registry.reward_fn, plugin 'my_plugin'"):
        check_data_sources(_config(fn="my_task"), plugged, {"anything": "train.jsonl, row 1"})  # reward.fn's too
    with pytest.raises(ConfigError, match=r"needs_option\(data_source, solution_str, ground_truth, extra_info=None, "
                                          r"\*, weight\) requires the keyword argument 'weight', which its config "
                                          r"section does not give: register it with config= a dataclass with the "
                                          r"field 'weight' \(reward.my_option_task.weight\), or give the parameter a "
                                          r"default\."):
        check_data_sources(_config(), plugged, ["my_option_task"])
    check_data_sources(_config(), plugged, ["my_kw_task", "arith", "codecontests"])  # the built-ins' options bind


def test_reward_fn_with_a_wrong_signature_fails_when_the_manager_is_built(char_tokenizer, plugged) -> None:
    with pytest.raises(ConfigError, match=r"^Reward function 'my_task' .*wrong_signature\(solution_str, "
                                          r"ground_truth\) does not follow"):
        RuleRewardManager(_reward_config(fn="my_task"), char_tokenizer, plugged)


def test_a_registered_function_taking_the_contract_by_keyword_is_called_so(char_tokenizer, plugged) -> None:
    mgr = RuleRewardManager(_reward_config(), char_tokenizer, plugged)
    try:
        out = mgr.score(_response_batch(char_tokenizer, ["5", "6"], ["my_kw_task"] * 2, ["5", "5"]))
    finally:
        mgr.close()
    assert out[B.SCORES].tolist() == [1.0, 0.0] and out.meta["metrics"]["reward/errors"] == 0
