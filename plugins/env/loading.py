"""What the environment adapters share: ``module:attr`` / ``path/to/file.py:attr`` references."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rlforge.errors import ConfigError
from rlforge.plugin_manager import import_file


def split_reference(spec: str) -> tuple[str, str] | None:
    """``(module or file, attribute)`` of ``module:attr`` or ``path/to/file.py:attr``; None without a ``:``."""
    target, sep, name = spec.rpartition(":")
    return (target, name) if sep and target and name else None


def is_file(target: str) -> bool:
    """Whether a reference's target is a ``.py`` file (else a dotted module name)."""
    return target.endswith(".py")


def import_target(target: str, key: str) -> Any:
    """The module ``target`` (a dotted name, or a ``.py`` file imported once per process); ``key`` names the config
    key in errors."""
    try:
        if not is_file(target):
            return importlib.import_module(target)
        path = Path(target).expanduser().resolve()
        name = f"rlforge_env_{path.stem}"
        if not path.is_file():
            raise FileNotFoundError(f"no file {target}")
        return import_file(name, path)  # once per process, in sys.modules: its classes pickle and compare by name
    except Exception as exc:
        raise ConfigError(f"{key}: cannot import '{target}': {type(exc).__name__}: {exc}") from None


def load_reference(spec: str, key: str) -> Any:
    """The object that ``module:attr`` or ``path/to/file.py:attr`` (config key ``key``) names."""
    parts = split_reference(spec)
    if parts is None:
        raise ConfigError(f"{key}={spec!r}: write module:attribute or path/to/file.py:attribute.")
    module = import_target(parts[0], key)
    if not hasattr(module, parts[1]):
        raise ConfigError(f"{key}={spec!r}: '{parts[0]}' has no attribute '{parts[1]}'.")
    return getattr(module, parts[1])


def scored_by_the_loop(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The reward function of an environment whose score the agent loop adds (the env's step rewards, a rubric's
    reward): 0, so the trajectory's rewards are the whole score."""
    return 0.0
