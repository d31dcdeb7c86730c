"""Deferred imports, so that ``rlforge --help``, ``rlforge algos`` and config errors answer without loading
torch (about 2 s by itself on a small CPU machine). Plugin modules that only *register* components must stay
cheap to import: heavy libraries are loaded when a component is first used, not when it is registered.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def lazy_import(name: str) -> ModuleType:
    """The module ``name``, executed on its first attribute access (``importlib.util.LazyLoader``).

    Returns the module itself when it is already imported. ``import name`` elsewhere gets the same object.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named '{name}'", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:  # as the import system does: ``import a.b`` later finds ``a.b`` as an attribute of ``a``
        setattr(sys.modules[parent], child, module)
    return module


def optional_import(name: str, needed_by: str, install: str) -> ModuleType:
    """The optional package ``name``, or one :class:`RLForgeError` saying who needs it and how to install it:
    ``optional_import("swanlab", "logger.backends includes 'swanlab'", "pip install 'rlforge[swanlab]'")``."""
    from rlforge.errors import RLForgeError

    try:
        return importlib.import_module(name)
    except ImportError:
        raise RLForgeError(f"{needed_by} but the {name} package is not installed: {install}.") from None


def is_loaded(name: str) -> bool:
    """Whether ``name`` has really been executed (not just registered for lazy loading)."""
    module = sys.modules.get(name)
    return module is not None and type(module).__name__ != "_LazyModule"


def no_grad(fn: Callable[P, R]) -> Callable[P, R]:
    """``torch.no_grad()`` as a decorator that imports torch only when the function runs."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper
