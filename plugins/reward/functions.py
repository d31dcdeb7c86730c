"""Built-in rule-based reward functions with verl's ``compute_score`` contract.

Each takes ``(data_source, solution_str, ground_truth, extra_info)`` and returns a float, or a dict with
``score`` (and optionally ``acc``).
"""

from __future__ import annotations

import re
import string
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _to_number(text: str) -> str:
    return text.replace(",", "").rstrip(".")


def _scalar_truth(ground_truth: Any, task: str) -> None:
    """A ground truth that one answer can equal (a string or a number), else a ValueError: a list or a dict would
    score every answer 0 without a word (the call fails instead, and is counted: ``reward/error_share``)."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise ValueError(f"the {task} reward compares the answer with one string or number, and the ground truth is "
                         f"{type(ground_truth).__name__} {ground_truth!r}: write reward_model.ground_truth as one "
                         f"value, or score the row with a reward function of your own (reward.file)")


def arith_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """Built-in arithmetic task: 1.0 if the answer (the whole response, stripped) is the right number."""
    _scalar_truth(ground_truth, "arith")
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


def gsm8k_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Any = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """GSM8K as in verl: ``strict`` reads the number after ``####``; ``flexible`` takes the last number.

    Returns ``score`` when it equals the ground truth, ``format_score`` when a number was found but is
    wrong, and 0 when no answer could be extracted.
    """
    _scalar_truth(ground_truth, "gsm8k")
    if method == "strict":
        found = re.findall(r"#### (-?[0-9.,]+)", solution_str)
        answer = _to_number(found[-1]) if found else None
    else:
        numbers = [n for n in _NUMBER.findall(solution_str) if n not in ("", ".")]
        answer = _to_number(numbers[-1]) if numbers else None
    if answer is None:
        return 0.0
    if isinstance(ground_truth, float) and ground_truth.is_integer():  # 62.0: pandas' int column with a missing value
        ground_truth = int(ground_truth)
    return score if answer == _to_number(str(ground_truth)) else format_score


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
MAX_ANSWER_TAGS = 10  # more <answer> tags than this: the reward is quartered (verl's guard against tag spam)


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def qa_em_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Search-R1 exact match: the last ``<answer>...</answer>`` equals one of ``ground_truth["target"]`` (a string
    or a list) after ``normalize_answer``. ``score`` when it does (a quarter with more than ``MAX_ANSWER_TAGS``
    answer tags), ``format_score`` when an answer is there but wrong, 0 without one."""
    found = _ANSWER_TAG.findall(solution_str)
    if not found:
        return 0.0
    targets = ground_truth["target"] if isinstance(ground_truth, dict) else ground_truth
    targets = [targets] if isinstance(targets, str) else list(targets)
    if normalize_answer(found[-1]) not in {normalize_answer(str(t)) for t in targets}:
        return format_score
    tags = max(solution_str.count("<answer>"), solution_str.count("</answer>"))
    return score / 4 if tags > MAX_ANSWER_TAGS else score
