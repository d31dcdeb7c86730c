"""The ``code`` reward: the last fenced block run against stdin/stdout tests in rlforge's sandbox, alone and through
the rule reward manager (the sandbox itself is tested in test_sandbox.py)."""

from __future__ import annotations

import json

import pytest
import torch
from rlforge.plugins.reward.code import code_exec_score, extract_code, load_tests, outputs_match

from rlforge import batch as B
from tests.plugins.test_reward import _response_batch, manager_factory  # noqa: F401 (fixture)

DOUBLE_TESTS = {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10"]}


def test_extract_code_takes_the_last_fenced_block() -> None:
    text = "Try:\n```python\nprint(1)\n```\nBetter:\n```\nprint(2)\n```\n"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("print(3)") == "print(3)"


def test_load_tests_and_outputs_match() -> None:
    assert load_tests(json.dumps(DOUBLE_TESTS)) == [("2\n", "4\n"), ("5\n", "10")]
    with pytest.raises(ValueError, match="ground_truth must be"):
        load_tests("[1, 2]")
    with pytest.raises(ValueError, match="2 inputs and 1 outputs"):
        load_tests({"inputs": ["1", "2"], "outputs": ["1"]})
    assert outputs_match("4  \n\n", "4")
    assert not outputs_match("4\n5", "4")


@pytest.mark.parametrize(
    ("program", "score", "acc"),
    [
        ("print(int(input()) * 2)", 1.0, 1.0),
        ("```python\nn = int(input())\nprint(4 if n == 2 else 0)\n```", 0.5, 0.0),
        ("print(int(input()) * 2); raise SystemExit(1)", 0.0, 0.0),  # a failing exit status fails the test
        ("while True: pass", 0.0, 0.0),
    ],
)
def test_code_exec_score(program, score, acc) -> None:
    result = code_exec_score("code", program, DOUBLE_TESTS, None, sandbox_timeout_s=1.0)
    assert result == {"score": score, "acc": acc}


def test_code_reward_through_the_manager(char_tokenizer, registry, manager_factory) -> None:
    mgr = manager_factory(char_tokenizer, registry, sandbox_timeout_s=1.0)
    programs = ["print(int(input())*2)", "print(4)", "while 1: pass"]
    truth = json.dumps(DOUBLE_TESTS)
    out = mgr.score(_response_batch(char_tokenizer, programs, ["code"] * 3, [truth] * 3, width=24))
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.5, 0.0]))
    assert out[B.ACC].tolist() == [1.0, 0.0, 0.0]
    assert out.meta["metrics"] == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/error_share": 0.0}
