"""Checks of an algorithm's class (an ``RLModule`` subclass, ``rlforge.module``) for mistakes its own code would
not make clear: a ``validate_config`` that raises ValueError or AssertionError stops the run as a ConfigError naming
the algorithm (:func:`validate_config`, which config composition calls), and a method named like a hook that is none
(a Lightning name, a typo) is reported: nothing calls it."""

from __future__ import annotations

import difflib
from pathlib import Path
from traceback import extract_tb
from typing import Any

from rlforge import hookspecs
from rlforge.errors import ConfigError, did_you_mean, first_line


def validate_config(algo_cls: Any, config: Any) -> None:
    """Run the algorithm class's ``validate_config(config)``; a ValueError or AssertionError it raises becomes a
    :class:`ConfigError` that names the algorithm, the class and the reason: one line, as the CLI prints an error,
    rather than a traceback."""
    try:
        algo_cls.validate_config(config)
    except (ValueError, AssertionError) as exc:
        raise ConfigError(f"--algo {config.algorithm.name}: {algo_cls.__qualname__}.validate_config refused the "
                          f"config: {_reason(exc)}. Change the value it names (key=value or --config).") from exc


def _reason(exc: ValueError | AssertionError) -> str:
    """What a failed check says: its message, or for a bare ``assert`` the failing line."""
    if not isinstance(exc, AssertionError):
        return first_line(exc)
    if first_line(exc):
        return f"assertion failed: {first_line(exc)}"
    frame = extract_tb(exc.__traceback__)[-1]
    return f"assertion failed at {Path(frame.filename).name}:{frame.lineno}: {(frame.line or '').strip()}"


def unknown_hooks(cls: type, base: type) -> list[str]:
    """A warning for each method of ``cls`` named ``on_*`` that is no hook of ``base`` (``RLModule``), which nothing
    calls: with the closest of ``base``'s hooks and the plugin hook (``rlforge_*``) for that event, if any."""
    hooks = sorted(n for n in dir(base) if n.startswith("on_"))
    events = [n for n in dir(hookspecs) if n.startswith("rlforge_")]
    out = []
    for name in sorted(n for n in dir(cls) if n.startswith("on_") and n not in hooks and callable(getattr(cls, n))):
        plugin_hook = difflib.get_close_matches(f"rlforge_{name[3:]}", events, n=1, cutoff=0.6)
        other = (f" For other events implement a plugin hook{f' (here {plugin_hook[0]})' if plugin_hook else ''} "
                 f"as an @hookimpl method of a callback, Trainer(callbacks=[...]) (docs/hooks.md).")
        out.append(f"{cls.__name__}.{name} is never called: it is not an RLModule hook (those are "
                   f"{', '.join(hooks)}).{did_you_mean(name, hooks)}{other}")
    return out
