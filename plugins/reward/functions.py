"""Built-in rule-based reward functions with verl's ``compute_score`` contract.

Each takes ``(data_source, solution_str, ground_truth, extra_info)`` and returns a float, or a dict with
``score`` (and optionally ``acc``).
"""

from __future__ import annotations

import re
import string
from typing import Any

from rlforge.errors import RLForgeError

GSM8K_CLIP = 300  # verl reads a GSM8K answer in the response's last 300 characters


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
    """GSM8K as verl 0.9.1 scores it (``verl/utils/reward_score/gsm8k.py``), in the response's last ``GSM8K_CLIP``
    characters: ``strict`` reads the number after the last ``#### `` (commas and ``$`` removed; a period after it
    stays, so ``#### 72.`` is ``72.``, not 72), ``flexible`` the last run of digits, commas and periods other than
    ``.``. Returns ``score`` when that text equals the ground truth's, ``format_score`` when a number was found but is
    wrong, and 0 when none was. One difference: a ground truth read as a number counts as its text (``72``, and ``72.0``
    from a pandas column with a gap, are ``"72"``), where verl compares the number with the text and scores 0.
    """
    _scalar_truth(ground_truth, "gsm8k")
    if method not in ("strict", "flexible"):
        raise RLForgeError(f"The gsm8k reward's method is 'strict' or 'flexible', not {method!r} (reward.fn_kwargs).")
    tail = solution_str[-GSM8K_CLIP:]
    if method == "strict":
        found = re.findall(r"#### (-?[0-9.,]+)", tail)
        answer = found[-1].replace(",", "").replace("$", "") if found else None
    else:
        runs = re.findall(r"-?[0-9.,]+", tail)  # verl's pick: the last that is not '.', else the first
        answer = next((r for r in reversed(runs) if r != "."), runs[0] if runs else None)
    if answer is None:
        return 0.0
    if isinstance(ground_truth, float) and ground_truth.is_integer():  # 62.0: pandas' int column with a missing value
        ground_truth = int(ground_truth)
    return score if answer == str(ground_truth) else format_score


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
