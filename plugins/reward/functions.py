"""Built-in rule-based reward functions with verl's ``compute_score`` contract.

Each takes ``(data_source, solution_str, ground_truth, extra_info)`` and returns a float, or a dict with
``score`` (and optionally ``acc``).
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _to_number(text: str) -> str:
    return text.replace(",", "").rstrip(".")


def arith_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """Built-in arithmetic task: 1.0 if the answer (the whole response, stripped) is the right number."""
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
    if method == "strict":
        found = re.findall(r"#### (-?[0-9.,]+)", solution_str)
        answer = _to_number(found[-1]) if found else None
    else:
        numbers = [n for n in _NUMBER.findall(solution_str) if n not in ("", ".")]
        answer = _to_number(numbers[-1]) if numbers else None
    if answer is None:
        return 0.0
    return score if answer == _to_number(str(ground_truth)) else format_score
