"""A reward with two components for GDPO tests: ``correct`` (the built-in arithmetic answer) and ``numeric`` (the
response is an integer at all); ``score`` is their weighted sum."""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = solution_str.strip()
    correct = float(answer == str(ground_truth).strip())
    numeric = float(answer.lstrip("-").isdigit())
    return {"score": correct + 0.1 * numeric, "acc": correct, "correct": correct, "numeric": numeric}
