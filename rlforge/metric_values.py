"""Metric values: every metric a run logs is a number under its name. One that is not stops the run where it was
logged (``RLModule.log``, ``StepContext.log``, a training step's metrics, ``rlforge_step_end``), naming the key and who
logged it, before a logger meets it."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from rlforge.errors import RLForgeError
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def as_number(key: Any, value: Any, who: str) -> Any:
    """``value`` as a metric: a number as it is, a one-element tensor as a float; anything else is an error naming
    ``key`` and ``who`` logged it; so is a ``key`` that is not a name (a non-empty string)."""
    if not isinstance(key, str) or not key.strip():
        raise RLForgeError(f"metric name {key!r} ({who}) is not a name: metrics are logged under non-empty strings "
                           f"(e.g. 'custom/score').")
    if isinstance(value, numbers.Real):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if type(value).__module__ == "numpy" and getattr(value, "size", None) == 1 and value.dtype.kind in "biuf":
        return float(value)  # a one-number numpy array or scalar, as reward functions may return them
    what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    raise RLForgeError(f"metric {key!r} ({who}) is {what}, not a number: metrics are logged as numbers.")


def check_numbers(metrics: dict[str, Any], who: str) -> None:
    """Every metric of ``metrics`` a number (:func:`as_number`, in place), else an error naming the key and ``who``
    set it."""
    for key, value in metrics.items():
        metrics[key] = as_number(key, value, who)


def check_kept(written: dict[str, Any], metrics: dict[str, Any], who: str) -> None:
    """No metric of ``written`` (those rlforge wrote for the step) has another value in ``metrics`` after ``who`` saw
    them: one value would hide the other. Removing one is allowed (a hook may log less)."""
    for key, value in written.items():
        now = metrics.get(key, value)
        if now != value and not (now != now and value != value):  # (NaN == NaN here)
            raise RLForgeError(f"metric {key!r} was replaced in {who} ({value!r} -> {now!r}): rlforge writes it "
                               f"itself this step, and the logged value would hide its own. Log yours under a name "
                               f"of its own (e.g. 'custom/{key.rsplit('/', 1)[-1]}').")
