"""User-facing errors: the CLI prints these as one clear message, without a traceback."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable


class RLForgeError(Exception):
    """A mistake the user can fix (bad config, missing file, unknown name). Printed without traceback."""


class ConfigError(RLForgeError):
    """The configuration is invalid: the message names the key, the value and what is allowed."""


class DataError(RLForgeError):
    """A data file or row is malformed: the message names the file and the row."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none): what an error message quotes of a cause."""
    return (str(exc).strip().splitlines() or [""])[0]


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """Return ``" Did you mean '<prefix>x'?"`` for the closest choice, or an empty string."""
    choices = list(choices)
    close = ([c for c in choices if c.casefold() == name.casefold()]  # AUTO: 'auto'
             or difflib.get_close_matches(name, choices, n=1, cutoff=0.6))
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""


class UndeclaredMethod(RLForgeError, AttributeError):
    """A worker group has no such callable method (not declared with ``@remote``): an attribute error to Python
    (``hasattr``), one line to the user."""


class NonFiniteError(RLForgeError):
    """Too many optimizer steps in a row had a NaN/Inf loss or gradient."""


STOP_UNDERWAY = threading.Event()  # an interrupt reached a run's clean-up (the Trainer's): a repeated SIGTERM is ignored
SHIELDED = threading.Event()  # a short step that must not be cut (a background checkpoint made): a SIGTERM waits


class Terminated(KeyboardInterrupt):
    """A SIGTERM (a scheduler's preemption, ``kill``, ``docker stop``) while an ``rlforge`` command runs: it stops the
    command as Ctrl-C does, through the same clean-up (checkpoint written in the background settled, hooks, loggers
    closed, workers shut down), and the command exits with 143."""
