"""Math rewards checked with ``math-verify`` (symbolic equivalence: ``\\frac{1}{2}`` = ``0.5`` = ``1/2``).

The answer is found as verl finds it, then compared by math-verify rather than by string equality:

- ``math_boxed_score`` (MATH, MATH-500, NuminaMath): the last ``\\boxed{...}`` of the response; 1 or 0.
- ``math_dapo_score`` (DAPO-Math, AIME): the last ``Answer: ...`` line in the response's last 300 characters;
  1 or -1, with ``acc`` and the extracted ``pred``.
- ``geo3k_score`` (Geometry3K): 0.9 x the boxed answer's correctness + 0.1 x the ``<think>...</think>`` format.

Each takes ``(data_source, solution_str, ground_truth, extra_info)``, verl's ``compute_score`` contract.
"""

from __future__ import annotations

import re
import threading
from typing import Any

BOX_COMMANDS = ("\\boxed", "\\fbox")
VERIFY_TIMEOUT_S = 5  # math-verify's own limit on parsing and on comparing (seconds)
DAPO_TAIL_CHARS = 300  # verl's math_dapo reads only the end of the response (MATH-500's longest answer: 159)
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_THINK_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; ``\\boxed 5``
    gives ``5``. None when there is none or its braces do not close."""
    start, command = max((text.rfind(cmd), cmd) for cmd in BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(command):]
    if rest.startswith(" "):  # \boxed 5: up to the next space or $
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0] or None
    depth = 0
    for i, ch in enumerate(rest if rest.startswith("{") else ""):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None


def equivalent(answer: str, ground_truth: str) -> bool:
    """Whether math-verify finds the two answers equal (numbers, fractions, expressions, sets, intervals).
    An answer math-verify cannot parse is not equal to anything.

    math-verify bounds parsing and comparison with ``signal.alarm`` (``VERIFY_TIMEOUT_S``), which works in a main
    thread only (where the reward workers call it); elsewhere the reward manager's ``reward.timeout_s`` applies.
    """
    from math_verify import parse, verify

    limit = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=limit)
    pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=limit)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=limit))


def math_boxed_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the last ``\\boxed{}`` answer equals the ground truth (math-verify), else 0.0."""
    answer = last_boxed(solution_str)
    return 1.0 if answer is not None and equivalent(answer, str(ground_truth)) else 0.0


def math_dapo_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    """DAPO's reward: 1 when the last ``Answer: X`` line of the response's end equals the ground truth, else -1."""
    found = _ANSWER_LINE.findall(solution_str[-DAPO_TAIL_CHARS:])
    pred = found[-1].strip() if found else ""
    boxed = last_boxed(pred)
    pred = (boxed if boxed is not None else pred).strip().strip("$").strip()
    correct = bool(pred) and equivalent(pred, str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": pred}


def geo3k_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                format_score: float = 0.1) -> dict[str, float]:
    """Geometry3K as in verl: ``(1 - format_score) * correct + format_score * format``, where ``format`` is 1 for
    ``<think>...</think> ... \\boxed{...}``."""
    answer = last_boxed(solution_str)
    correct = float(answer is not None and equivalent(answer, str(ground_truth)))
    form = float(_THINK_FORMAT.fullmatch(solution_str) is not None)
    return {"score": (1.0 - format_score) * correct + format_score * form, "acc": correct, "format": form}
