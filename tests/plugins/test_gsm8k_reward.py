"""The built-in gsm8k reward: verl 0.9.1's gsm8k.py, checked case by case against it."""

from __future__ import annotations

import pytest

from rlforge.errors import RLForgeError
from rlforge.plugins.reward.functions import gsm8k_score


# --- gsm8k ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", 1.0),
        ("#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # commas removed
        ("#### 1234", "1,234", 0.0),  # from the answer only
        ("#### $1,234", "1234", 0.0),  # the number must follow '#### '
        ("#### -5", "-5", 1.0),
        ("#### 71", "72", 0.0),  # wrong number -> format_score (0)
        ("The answer is 72", "72", 0.0),  # strict needs '#### '
        ("####72", "72", 0.0),  # no space after ####
        ("#### 10 and later #### 72", "72", 1.0),  # the last '#### ' answer counts
        ("#### 72 then 99", "72", 1.0),  # strict ignores later numbers
        ("so the total is #### 72.", "72", 0.0),  # the period is read with it: '72.'
        ("#### 1,234.", "1234", 0.0),
        ("#### 72" + " (so)" * 60, "72", 0.0),  # past the last 300 characters
        ("x" * 400 + "#### 72", "72", 1.0),
    ],
)
def test_gsm8k_strict(solution, truth, expected) -> None:
    assert gsm8k_score("gsm8k", solution, truth) == expected
    assert gsm8k_score("gsm8k", solution, truth, method="strict") == expected


def test_gsm8k_strict_format_score_and_custom_score() -> None:
    assert gsm8k_score("gsm8k", "#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k_score("gsm8k", "no answer", "72", format_score=0.1) == 0.0  # nothing extracted
    assert gsm8k_score("gsm8k", "#### 72", "72", score=2.0) == 2.0
    # an integer answer read as a float (pandas' int column with a missing value) is the same answer
    assert gsm8k_score("gsm8k", "#### 62", 62.0) == 1.0 and gsm8k_score("gsm8k", "#### 62", 62) == 1.0
    assert gsm8k_score("gsm8k", "#### 62.5", 62.5) == 1.0 and gsm8k_score("gsm8k", "#### 62", 62.5) == 0.0
    with pytest.raises(RLForgeError, match="'strict' or 'flexible', not 'flexable'"):
        gsm8k_score("gsm8k", "#### 62", "62", method="flexable")


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("The answer is 72", "72", 1.0),
        ("3 + 4 = 7", "7", 1.0),  # the last number
        ("7 is not it, 8 is", "7", 0.0),
        ("we get 1,000 apples", "1,000", 1.0),  # the text as written: commas stay
        ("we get 1,000 apples", "1000", 0.0),
        ("#### 72", "72", 1.0),
        ("so -12.", "-12", 0.0),  # '-12.'
        ("so -12 . .", "-12", 1.0),  # a lone '.' is skipped
        ("no digits here", "1", 0.0),
        ("", "1", 0.0),
    ],
)
def test_gsm8k_flexible(solution, truth, expected) -> None:
    assert gsm8k_score("gsm8k", solution, truth, method="flexible") == expected


GSM8K_CASES = [("Natalia sold 48/2 = 24 clips.\n#### 72", "72"), ("#### 1,234", "1234"), ("#### 1234", "1,234"),
               ("#### $1,234", "1234"), ("#### -5", "-5"), ("#### 71", "72"), ("####72", "72"), ("#### 72.", "72"),
               ("#### 10 and later #### 72", "72"), ("#### 72 then 99", "72"), ("#### 1,234.", "1234"),
               ("#### 7.2.", "7.2"), ("#### 72" + " (so)" * 60, "72"), ("x" * 400 + "#### 72", "72"),
               ("The answer is 72", "72"), ("7 is not it, 8 is", "7"), ("we get 1,000 apples", "1,000"),
               ("so -12.", "-12"), ("so -12 . .", "-12"), (". . .", "."), ("no digits", "1"), ("", "1"),
               ("a - 5", "5"), ("--3", "-3"), ("3" * 350, "3" * 300)]


@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_gsm8k_scores_as_verls_own_function(method) -> None:
    """Every case against verl 0.9.1's verl/utils/reward_score/gsm8k.py (ground truths as text, as its data
    preprocessing writes them), with a format score to tell 'wrong' from 'no answer'."""
    from verl.utils.reward_score import gsm8k

    for solution, truth in GSM8K_CASES:
        expected = gsm8k.compute_score(solution, truth, method=method, format_score=0.1)
        assert gsm8k_score("openai/gsm8k", solution, truth, method=method, format_score=0.1) == expected, solution


def test_gsm8k_flexible_format_score() -> None:
    assert gsm8k_score("gsm8k", "it is 5", "6", method="flexible", format_score=0.25) == 0.25
