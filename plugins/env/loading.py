"""What the environment adapters share: ``module:attr`` / ``path/to/file.py:attr`` references and the rows' plain
values."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlforge.errors import ConfigError


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
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__file__", None) == str(path):
            return loaded
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise FileNotFoundError(f"no file {target}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # classes defined there pickle and compare by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
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


def plain(value: Any) -> Any:
    """A config value (an OmegaConf node or not) as plain Python containers."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
