"""rlforge.plugins.reward: rule functions, the rule reward manager (with user reward files; loading them:
test_reward_file.py) and its fault handling (the ``code`` reward: test_code_reward.py; the sandbox: test_sandbox.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from rlforge.plugins.reward import workers
from rlforge.plugins.reward.code import CodeRewardConfig
from rlforge.plugins.reward.functions import arith_score, gsm8k_score
from rlforge.plugins.reward.results import split_result
from rlforge.plugins.reward.rule import RuleRewardManager, bind_config
from rlforge.plugins.reward.user_file import load_user_function

from rlforge import batch as B
from rlforge.config.schema import RewardConfig
from rlforge.errors import ConfigError, RLForgeError

# --- arith ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("42", "42", 1.0),
        ("  42\n", "42", 1.0),
        ("42", 42, 1.0),
        ("41", "42", 0.0),
        ("42.", "42", 0.0),
        ("The answer is 42", "42", 0.0),
        ("", "42", 0.0),
        ("-3", "-3", 1.0),
    ],
)
def test_arith_score(solution, truth, expected) -> None:
    assert arith_score("arith", solution, truth) == expected


@pytest.mark.parametrize("truth", [["13"], {"target": ["13"]}, None, True])
def test_a_ground_truth_no_answer_can_equal_fails_the_call_naming_it(truth) -> None:
    for score, task in ((arith_score, "arith"), (gsm8k_score, "gsm8k")):
        with pytest.raises(ValueError, match=f"the {task} reward compares the answer with one string or number, and "
                                             f"the ground truth is {type(truth).__name__}"):
            score(task, "#### 13", truth)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"score": 0.5, "acc": 1}, (0.5, 1.0)),
        ({"score": 1.0}, (1.0, 1.0)),
        ({"score": 0.5}, (0.5, 0.0)),
        ({"score": 2, "acc": False}, (2.0, 0.0)),
        (1.0, (1.0, 1.0)),
        (0.3, (0.3, 0.0)),
        (1, (1.0, 1.0)),
        (-1.0, (-1.0, 0.0)),
    ],
)
def test_split_result(result, expected) -> None:
    score, acc = split_result(result)
    assert (score, acc) == pytest.approx(expected)
    assert isinstance(score, float) and isinstance(acc, float)


def test_split_result_accepts_numpy_scalars() -> None:
    assert split_result(np.float32(0.5)) == (0.5, 0.0)
    assert split_result({"score": np.int64(1)}) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (None, "returned NoneType (None), not a number"),
        ("0.5", "returned str ('0.5'), not a number"),
        ({"acc": 1.0}, "returned a dict without a numeric 'score'"),
        ({"score": "1"}, "returned a dict without a numeric 'score'"),
        ([1.0], "returned list"),
        (float("nan"), "returned nan"),
        ({"score": float("-inf")}, "returned -inf"),
    ],
)
def test_split_result_rejects_non_numbers(result, message) -> None:
    with pytest.raises(ValueError) as info:
        split_result(result)
    assert message in str(info.value)


def test_bind_config_passes_matching_keyword_only_parameters() -> None:
    def fn(ds, s, gt, extra=None, *, sandbox_timeout_s=1.0, other=2):
        return (sandbox_timeout_s, other)

    rc = OmegaConf.structured(RewardConfig())
    own = OmegaConf.structured(CodeRewardConfig(sandbox_timeout_s=3.5))
    assert bind_config(fn, rc, own)("d", "s", "g") == (3.5, 2)
    assert bind_config(fn, rc, None)("d", "s", "g") == (1.0, 2)
    assert bind_config(arith_score, rc, own) is arith_score  # no keyword-only parameters: unchanged


# --- the rule reward manager ---------------------------------------------------------------------------


def _reward_config(file: str | None = None, fn: str | None = None, num_workers: int | None = None, **kwargs):
    code = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("sandbox_")}  # the code function's section
    reward = OmegaConf.structured(RewardConfig(file=file, fn=fn, **kwargs))
    OmegaConf.set_struct(reward, False)
    reward.code = OmegaConf.structured(CodeRewardConfig(**code))
    if num_workers is not None:  # not in the schema yet: read with reward.get("num_workers", 1)
        OmegaConf.set_struct(reward, False)
        reward.num_workers = num_workers
    return SimpleNamespace(reward=reward)


@pytest.fixture
def manager_factory():
    """Builds reward managers and stops their worker processes after the test."""
    managers = []

    def make(tok, registry, **kwargs) -> RuleRewardManager:
        managers.append(RuleRewardManager(_reward_config(**kwargs), tok, registry))
        return managers[-1]

    yield make
    for m in managers:
        m.close()


def _response_batch(tok, texts: list[str], sources: list[str], truths: list[str], width: int = 6) -> B.Batch:
    """Right-padded responses: the text's chars, then EOS, then pad; the mask covers text + EOS."""
    rows, masks = [], []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        assert len(ids) <= width
        rows.append(ids + [tok.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    return B.Batch(
        {B.RESPONSES: torch.tensor(rows), B.RESPONSE_MASK: torch.tensor(masks)},
        {B.DATA_SOURCE: sources, B.GROUND_TRUTH: truths, B.EXTRA_INFO: [None] * len(texts),
         B.UID: list(range(len(texts)))},
    )


def test_rule_manager_scores_at_last_valid_token(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["12", "7", "1234"], ["arith"] * 3, ["12", "8", "1234"])
    out = mgr.score(batch)
    assert out[B.RESPONSE_TEXT] == ["12", "7", "1234"]
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(out[B.ACC], torch.tensor([1.0, 0.0, 1.0]))
    expected = torch.zeros(3, 6)
    expected[0, 2] = 1.0  # "12" + EOS: last valid index 2 (the EOS)
    expected[2, 4] = 1.0  # "1234" + EOS
    torch.testing.assert_close(out[B.TOKEN_LEVEL_SCORES], expected)
    assert out[B.TOKEN_LEVEL_SCORES].dtype == torch.float32


def test_rule_manager_uses_data_source(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["#### 5", "#### 5"], ["openai/gsm8k", "arith"], ["5", "5"], width=8)
    out = mgr.score(batch)
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.0]))  # arith wants exactly "5"
    assert out[B.TOKEN_LEVEL_SCORES][0, 6].item() == 1.0


def test_rule_manager_unknown_data_source(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["1"], ["my_task"], ["1"])
    with pytest.raises(RLForgeError, match="No reward function for data_source 'my_task'.*arith"):
        mgr.score(batch)


def test_rule_manager_fixed_fn(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry, fn="gsm8k")
    batch = _response_batch(char_tokenizer, ["#### 3"], ["anything"], ["3"], width=8)
    assert mgr.score(batch)[B.SCORES].tolist() == [1.0]


def test_rule_manager_unknown_fixed_fn(char_tokenizer, registry) -> None:
    with pytest.raises(RLForgeError, match="Unknown reward fn 'gsm9k'.*Did you mean 'gsm8k'"):
        RuleRewardManager(_reward_config(fn="gsm9k"), char_tokenizer, registry)


def test_rule_manager_user_file_with_dict_result(char_tokenizer, registry, manager_factory, tmp_path: Path) -> None:
    path = tmp_path / "reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    right = solution_str == ground_truth\n"
        "    return {'score': 0.5 + 0.5 * right, 'acc': float(right)}\n"
    )
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    batch = _response_batch(char_tokenizer, ["ab", "c"], ["x", "y"], ["ab", "d"])
    out = mgr.score(batch)
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(out[B.ACC], torch.tensor([1.0, 0.0]))
    assert out[B.TOKEN_LEVEL_SCORES][0, 2].item() == 1.0
    assert out[B.TOKEN_LEVEL_SCORES][1, 1].item() == 0.5
    assert out[B.TOKEN_LEVEL_SCORES].sum().item() == pytest.approx(1.5)


def test_rule_manager_passes_fn_kwargs_over_a_reward_key_of_the_same_name(char_tokenizer, registry, manager_factory,
                                                                          tmp_path: Path) -> None:
    path = tmp_path / "kw.py"
    path.write_text("def compute_score(ds, s, gt, extra_info, *, timeout_s=0.0, opts=None):\n"
                    "    return timeout_s + opts['bonus']\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path), fn_kwargs={"timeout_s": 0.5, "opts": {"bonus": 2}})
    batch = _response_batch(char_tokenizer, ["1"], ["x"], ["1"])
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([2.5]))  # plain values, in the worker


def test_an_async_reward_function_is_run_to_its_result(char_tokenizer, registry, manager_factory, tmp_path: Path) -> None:
    path = tmp_path / "async_reward.py"  # verl awaits a coroutine function
    path.write_text("import asyncio\n"
                    "async def compute_score(data_source, solution_str, ground_truth, extra_info, *, bonus=0.0):\n"
                    "    await asyncio.sleep(0)\n"
                    "    return {'score': float(solution_str == ground_truth) + bonus}\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path), fn_kwargs={"bonus": 0.5})
    batch = _response_batch(char_tokenizer, ["1", "2"], ["x", "x"], ["1", "3"])
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([1.5, 0.5]))


async def _async_by_keyword(*, data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str == ground_truth) + bonus


class _AsyncScorer:
    async def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 2.0 * (solution_str == ground_truth)}


def test_an_async_function_registered_by_a_plugin_is_run_as_reward_files_are(char_tokenizer, manager_factory) -> None:
    """reward.file awaited an async compute_score while the registry refused one (helper-81): both doors run it."""
    import functools

    from rlforge.plugin_manager import PluginManager

    registry = PluginManager(autoload=False).registry
    registry.reward_fn.register("x", _async_by_keyword)
    registry.reward_fn.register("y", functools.partial(_async_by_keyword, bonus=0.5))
    registry.reward_fn.register("z", _AsyncScorer())
    batch = _response_batch(char_tokenizer, ["1", "2", "3"], ["x", "y", "z"], ["1", "2", "3"])
    assert manager_factory(char_tokenizer, registry).score(batch)[B.SCORES].tolist() == [1.0, 1.5, 2.0]


def test_functions_verl_calls_by_keyword_run_and_async_ones_share_one_loop_per_worker(
        char_tokenizer, registry, manager_factory, tmp_path: Path) -> None:
    # verl-recipe's FAPO baseline: async, two named parameters, the rest through **kwargs (verl calls by keyword)
    path = tmp_path / "by_keyword.py"
    path.write_text("import asyncio\n"
                    "LOOPS = set()\n"
                    "async def compute_score(solution_str, ground_truth, **kwargs):\n"
                    "    LOOPS.add(id(asyncio.get_running_loop()))  # a client kept between calls needs a live loop\n"
                    "    return float(solution_str == ground_truth) + kwargs['cfg'].bonus + len(LOOPS) - 1\n"
                    "def reordered(solution_str, ground_truth, data_source=None, extra_info=None):\n"
                    "    return float(data_source == 'x' and solution_str == ground_truth)\n"
                    "def keyword_only(*, data_source, solution_str, ground_truth, extra_info=None, scale):\n"
                    "    return scale * float(solution_str == ground_truth)\n")
    batch = _response_batch(char_tokenizer, ["1", "2", "3"], ["x", "x", "x"], ["1", "3", "3"])
    mgr = manager_factory(char_tokenizer, registry, file=str(path), fn_kwargs={"cfg": {"bonus": 0.5}})
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([1.5, 0.5, 1.5]))  # cfg.bonus: as verl's
    mgr = manager_factory(char_tokenizer, registry, file=str(path), fn_name="reordered")
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([1.0, 0.0, 1.0]))
    mgr = manager_factory(char_tokenizer, registry, file=str(path), fn_name="keyword_only", fn_kwargs={"scale": 2})
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([2.0, 0.0, 2.0]))
    with pytest.raises(ConfigError, match="requires the keyword argument 'scale'.*set reward.fn_kwargs.scale"):
        load_user_function(str(path), "keyword_only")
    # only reward.fn_kwargs reach the user's function, as verl passes only reward_kwargs: a parameter named like a
    # reward key keeps its own default
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, *, timeout_s=5.0):\n"
                    "    return timeout_s\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path), timeout_s=10.0)
    assert mgr.score(batch)[B.SCORES].tolist() == [5.0, 5.0, 5.0]


def test_reward_extra_info_is_set_in_every_rows_extra_info(char_tokenizer, registry, manager_factory,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "exp.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return float('qwen' in extra_info['experiment_name']) + extra_info.get('own', 0)\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path), extra_info={"experiment_name": "qwen3_8b"})
    batch = _response_batch(char_tokenizer, ["1", "2"], ["x", "x"], ["1", "3"])
    batch[B.EXTRA_INFO] = [None, {"own": 2, "experiment_name": "llama"}]  # the setting goes over the row's own
    assert mgr.score(batch)[B.SCORES].tolist() == [1.0, 3.0]


def test_rule_manager_passes_extra_info(char_tokenizer, registry, manager_factory, tmp_path: Path) -> None:
    path = tmp_path / "extra.py"
    path.write_text("def compute_score(ds, s, gt, extra_info):\n    return float(extra_info['w'])\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    batch = _response_batch(char_tokenizer, ["1", "2"], ["x", "x"], ["1", "2"])
    batch[B.EXTRA_INFO] = [{"w": 0.25}, {"w": 0.75}]
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([0.25, 0.75]))


def test_extra_info_carries_num_turns_and_rollout_reward_scores_as_in_verl(char_tokenizer, registry, manager_factory,
                                                                           tmp_path: Path) -> None:
    """verl's naive reward manager adds num_turns (2 for a single-turn rollout: the prompt and the answer) and
    rollout_reward_scores ({}) to each row's extra_info; retool's reward, for one, reads extra_info['num_turns']."""
    path = tmp_path / "turns.py"
    path.write_text("def compute_score(ds, s, gt, extra_info):\n"
                    "    assert extra_info['rollout_reward_scores'] == {}\n"
                    "    return float(extra_info['num_turns']) + float(extra_info.get('w', 0))\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    batch = _response_batch(char_tokenizer, ["1", "2", "3"], ["x"] * 3, ["1"] * 3)
    batch[B.EXTRA_INFO] = [{"w": 0.5}, None, {}]
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([2.5, 2.0, 2.0]))
    assert batch[B.EXTRA_INFO] == [{"w": 0.5}, None, {}]  # the rows' own extra_info is not changed
    batch[B.NUM_TURNS] = [2, 5, 3]  # an agent rollout's turns
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([2.5, 5.0, 3.0]))
    batch[B.EXTRA_INFO] = ["text", None, {}]  # not a dict: passed as it is
    path.write_text("def compute_score(ds, s, gt, extra_info):\n    return 1.0 if extra_info == 'text' else 0.0\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([1.0, 0.0, 0.0]))


# --- faults in reward functions -------------------------------------------------------------------------

FAULTY_REWARD = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise ValueError("bad row")
    if solution_str == "hang":
        while True:
            pass
    if solution_str == "sleep":
        time.sleep(60)
    if solution_str == "nan":
        return float("nan")
    if solution_str == "inf":
        return {"score": float("inf")}
    if solution_str == "none":
        return None
    if solution_str == "str":
        return "0.5"
    if solution_str == "dict":
        return {"acc": 1.0}
    if solution_str == "exit":
        os._exit(3)
    return float(solution_str == ground_truth)
"""


@pytest.fixture
def faulty_file(tmp_path: Path) -> str:
    path = tmp_path / "faulty.py"
    path.write_text(FAULTY_REWARD)
    return str(path)


@pytest.fixture
def short_backstop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall-clock backstop of 4 x reward.timeout_s (10 x by default), so "sleep" samples end sooner."""
    monkeypatch.setattr(workers, "WALL_BACKSTOP", 4.0)


def _fault_batch(tok, texts: list[str]) -> B.Batch:
    return _response_batch(tok, texts, ["faulty"] * len(texts), ["ok"] * len(texts), width=8)


@pytest.mark.parametrize("fault", ["raise", "nan", "inf", "none", "str", "dict", "exit"])
def test_fault_gives_fallback_and_counts_an_error(
    fault, char_tokenizer, registry, manager_factory, faulty_file
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=faulty_file, fallback_score=-1.0)
    out = mgr.score(_fault_batch(char_tokenizer, ["ok", fault, "no"]))
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, -1.0, 0.0]))
    assert out[B.ACC].tolist() == [1.0, 0.0, 0.0]
    assert out[B.TOKEN_LEVEL_SCORES][1].sum().item() == -1.0  # the fallback goes on the last token too
    assert out.meta["metrics"] == {"reward/errors": 1.0, "reward/timeouts": 0.0, "reward/error_share": 1 / 3}


@pytest.mark.parametrize("fault", ["hang", "sleep"])
def test_hung_function_is_stopped_at_the_timeout(
    fault, char_tokenizer, registry, manager_factory, faulty_file, short_backstop
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=faulty_file, timeout_s=0.5)
    start = time.monotonic()
    out = mgr.score(_fault_batch(char_tokenizer, ["ok", fault, "ok", "no"]))
    assert time.monotonic() - start < 5.0
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.0, 1.0, 0.0]))  # samples after it still scored
    assert out.meta["metrics"] == {"reward/errors": 0.0, "reward/timeouts": 1.0, "reward/error_share": 0.25}


def test_all_faults_in_one_batch_with_two_workers(
    char_tokenizer, registry, manager_factory, faulty_file, short_backstop
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=faulty_file, timeout_s=0.5, num_workers=2)
    texts = ["ok", "raise", "hang", "nan", "none", "ok", "str", "exit", "sleep", "dict", "ok", "no"]
    batch = _fault_batch(char_tokenizer, texts)
    batch.meta["metrics"] = {"earlier/metric": 7.0}
    out = mgr.score(batch)
    expected = [1.0 if t == "ok" else 0.0 for t in texts]
    torch.testing.assert_close(out[B.SCORES], torch.tensor(expected))
    assert out.meta["metrics"] == {"earlier/metric": 7.0, "reward/errors": 6.0, "reward/timeouts": 2.0,
                                   "reward/error_share": 8 / 12}


def test_workers_are_reused_across_steps_and_replaced_after_a_timeout(
    char_tokenizer, registry, manager_factory, faulty_file
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=faulty_file, timeout_s=0.5)
    mgr.score(_fault_batch(char_tokenizer, ["ok"]))
    first = mgr.workers.workers[0].process.pid
    mgr.score(_fault_batch(char_tokenizer, ["ok", "no"]))
    assert mgr.workers.workers[0].process.pid == first
    out = mgr.score(_fault_batch(char_tokenizer, ["hang", "ok"]))
    assert out.meta["metrics"]["reward/timeouts"] == 1.0
    replacement = mgr.workers.workers[0].process
    assert replacement.pid != first and replacement.is_alive()
    assert mgr.score(_fault_batch(char_tokenizer, ["ok"]))[B.SCORES].tolist() == [1.0]
    mgr.close()
    assert not replacement.is_alive()
    assert mgr.score(_fault_batch(char_tokenizer, ["ok"]))[B.SCORES].tolist() == [1.0]  # restarts after close()


def test_unpicklable_arguments_are_a_clear_error(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["1", "2"], ["arith"] * 2, ["1", "2"])
    batch[B.EXTRA_INFO] = [{"fn": lambda: 0}, None]
    with pytest.raises(RLForgeError, match=r"arguments \(ground_truth, extra_info\) of samples 0..1 cannot be sent"):
        mgr.score(batch)


def test_first_fault_of_each_kind_is_logged_once(
    char_tokenizer, registry, manager_factory, faulty_file, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=faulty_file, timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="rlforge.reward"):
        mgr.score(_fault_batch(char_tokenizer, ["ok", "raise", "raise", "none", "hang"]))
        mgr.score(_fault_batch(char_tokenizer, ["raise", "none", "hang", "ok"]))
    messages = [r.getMessage() for r in caplog.records if "failed on sample" in r.getMessage()]
    assert len(messages) == 3
    raised, bad, timeout = messages
    assert "data_source 'faulty' failed on sample 1 (raised): raised ValueError: bad row" in raised
    assert "reward.fallback_score=0" in raised and "reward/errors" in raised
    assert "on sample 3 (bad value): returned NoneType (None), not a number" in bad
    assert "on sample 4 (timeout): used more than reward.timeout_s=0.5 s of CPU time" in timeout
    assert "reward/timeouts" in timeout


def test_clean_batch_reports_zero_faults(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry)
    out = mgr.score(_response_batch(char_tokenizer, ["1", "2"], ["arith"] * 2, ["1", "1"]))
    assert out.meta["metrics"] == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/error_share": 0.0}


def test_non_positive_timeout_is_refused(char_tokenizer, registry) -> None:
    with pytest.raises(RLForgeError, match=r"reward.timeout_s must be > 0 seconds, got 0.0"):
        RuleRewardManager(_reward_config(timeout_s=0.0), char_tokenizer, registry)
