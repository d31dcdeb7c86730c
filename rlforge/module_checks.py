"""Checks of an algorithm's class (an ``RLModule`` subclass, ``rlforge.module``) for mistakes its own code would
not make clear: a ``validate_config`` that raises ValueError or AssertionError stops the run as a ConfigError naming
the algorithm, and a method named like a hook that is none (a Lightning name, a typo) is reported: nothing calls it."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from pathlib import Path
from traceback import extract_tb
from typing import Any

from rlforge import hookspecs
from rlforge.errors import ConfigError, did_you_mean, first_line


def config_errors(check: Callable[..., None]) -> Callable[..., None]:
    """``check`` (an algorithm's ``validate_config``, the function of its class or static method) with a ValueError or
    AssertionError turned into a :class:`ConfigError` that names the algorithm, the method and the reason: one line, as
    the CLI prints an error, rather than a traceback."""

    @functools.wraps(check)
    def validate_config(*args: Any, **kwargs: Any) -> None:
        try:
            check(*args, **kwargs)
        except (ValueError, AssertionError) as exc:
            config = kwargs.get("config", args[-1] if args else None)
            algo = getattr(getattr(config, "algorithm", None), "name", None)
            raise ConfigError(f"--algo {algo}: {check.__qualname__} refused the config: {_reason(exc)}. Change the "
                              f"value it names (key=value or --config).") from exc

    return validate_config


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
