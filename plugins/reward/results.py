"""What a reward call gave: a score and an accuracy checked to fit the reward tensor, or the kind of fault.

A call's outcome is ``(OK, (score, acc, extras))`` or ``(kind, reason)`` with kind ``RAISED``, ``BAD_VALUE``,
``CRASHED`` (its worker died) or ``TIMEOUT``; ``FATAL`` is a function that raised ``RLForgeError`` (a
configuration mistake), which stops the run. A score is a real number (``numbers.Real``: float, int, bool and
the numpy number types, and numpy's bool, which verl reads as 0/1; or a torch tensor or numpy array of one such
number, of any shape) that is finite and within the float32 range.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from rlforge.errors import RLForgeError

ScoreFn = Callable[..., Any]
Outcome = tuple[str, Any]  # (OK, (score, acc, extras)) or (error kind, reason)

OK, RAISED, BAD_VALUE, CRASHED, TIMEOUT = "ok", "raised", "bad value", "crashed", "timeout"
FATAL = "fatal"  # the function raised RLForgeError: the run stops
ERROR_KINDS = (RAISED, BAD_VALUE, CRASHED)  # counted in reward/errors; TIMEOUT in reward/timeouts
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max (scores go into float32 tensors); no torch import at registration

EXTRA_METRIC = "reward/extra/{key}/mean"  # batch mean of a numeric extra key


def split_result(result: Any) -> tuple[float, float]:
    """A reward function's result -> (score, accuracy). Accuracy is ``acc`` if given, else score >= 1.

    Raises ``ValueError`` naming the problem unless the score (and ``acc``, when given) is a real number
    (a float, int, bool or numpy scalar, numpy's bool included) that is finite and within the float32 range of
    the reward tensor. Both stay Python floats (float64) here; the manager builds the float32 tensor from them.
    """
    if isinstance(result, dict):
        if not _is_real(result.get("score")):
            raise ValueError(f"returned a dict without a numeric 'score' ({_short(result)})")
        score = _real(result["score"], "score")
        acc = _real(result["acc"], "'acc'") if "acc" in result else float(score >= 1.0)
        return score, acc
    if not _is_real(result):
        raise ValueError(f"returned {type(result).__name__} ({_short(result)}), not a number")
    score = _real(result, "score")
    return score, float(score >= 1.0)


def _is_real(value: Any) -> bool:
    """A real number: ``numbers.Real``, numpy's bool (not registered there; verl treats bools as 0/1), or a torch
    tensor or numpy array holding one real number, of any shape (verl's reward managers write such a score into the
    reward tensor as it is, and its agent loop's float field converts it)."""
    value = _one(value)
    kind = type(value)
    return isinstance(value, numbers.Real) or (kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"))


def _one(value: Any) -> Any:
    """The number a one-element torch tensor or numpy array holds (``.item()``: no autograd warning); anything else
    as it is."""
    if getattr(value, "ndim", None) is not None and type(value).__module__.split(".")[0] in ("torch", "numpy"):
        size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 0)
        if size == 1:
            return value.item()
    return value


def _real(value: Any, what: str) -> float:
    value = _one(value)
    if not _is_real(value):
        raise ValueError(f"returned {what} {type(value).__name__} ({_short(value)}), not a number")
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError) as exc:
        raise ValueError(f"returned {what} {_short(value)}, which is not a float ({exc})") from None
    if not math.isfinite(number):
        raise ValueError(f"returned {number}" if what == "score" else f"returned {what} {number}")
    if abs(number) > FLOAT32_MAX:
        raise ValueError(f"returned {what} {number:g}, beyond the float32 range of the reward tensor "
                         f"(|x| <= {FLOAT32_MAX:.4g})")
    return number


def _short(value: Any, limit: int = 100) -> str:
    """``repr`` cut to ``limit`` characters; never raises (a huge int's repr does, past 4300 digits)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any broken __repr__
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception; never raises."""
    try:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except Exception:  # noqa: BLE001 - a broken __str__
        return type(exc).__name__


def extra_values(result: Any) -> dict[str, float | str]:
    """verl's ``reward_extra_info`` of a checked result (:func:`split_result`): a dict's keys besides ``score`` whose
    values are finite numbers (as floats) or strings, other values dropped; a number's ``acc``, the number itself
    (verl's reward managers record a number so, and its validation's core metric reads ``acc``)."""
    if not isinstance(result, dict):
        return {"acc": float(_one(result))}
    plain = {k: _one(v) for k, v in result.items() if k != "score"}
    return {str(k): v if isinstance(v, str) else float(v) for k, v in plain.items()
            if isinstance(v, str) or _is_real(v) and math.isfinite(v)}


def extra_metrics(extras: list[dict[str, Any]]) -> dict[str, float]:
    """``EXTRA_METRIC`` for each numeric extra key but ``acc`` (``critic/acc/mean``): its mean over the samples that
    returned it."""
    values: dict[str, list[float]] = {}
    for sample in extras:
        for key, value in sample.items():
            if isinstance(value, float) and key != "acc":
                values.setdefault(key, []).append(value)
    return {EXTRA_METRIC.format(key=key): sum(v) / len(v) for key, v in sorted(values.items())}


def evaluate(fn: ScoreFn, args: tuple[Any, ...]) -> Outcome:
    """Call ``fn(*args)`` and check its result: never raises (a worker must answer every call)."""
    try:
        result = fn(*args)
    except RLForgeError as exc:
        return FATAL, str(exc)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the worker must answer
        return RAISED, f"raised {describe(exc)}"
    try:
        return OK, (*split_result(result), extra_values(result))
    except Exception as exc:  # noqa: BLE001 - ValueError, or a number type whose __float__ misbehaves
        return BAD_VALUE, str(exc) if isinstance(exc, ValueError) else f"returned a value that broke: {describe(exc)}"
