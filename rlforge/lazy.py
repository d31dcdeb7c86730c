"""Deferred imports, so that ``rlforge --help``, ``rlforge algos`` and config errors answer without loading
torch (about 2 s by itself on a small CPU machine). Plugin modules that only *register* components must stay
cheap to import: heavy libraries are loaded when a component is first used, not when it is registered.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class _AlreadyLoaded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """First on ``sys.meta_path`` once a package is imported lazily. ``import pkg.sub`` while ``pkg`` is still lazy
    reads ``pkg.__path__``, which executes ``pkg`` there and then; when that (as torch's ``__init__`` does) imports
    ``pkg.sub`` itself, the import system would go on to execute ``pkg.sub`` a second time (torch: "cannot initialize
    type GradBucket: an object with that name is already defined", and the process aborts). This finder gives the
    import system the module that is already there instead."""

    packages: set[str] = set()  # the top-level packages lazy_import has deferred

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> ModuleSpec | None:
        module = sys.modules.get(fullname)
        if target is not None or module is None or fullname.partition(".")[0] not in self.packages:
            return None  # a reload (target) or a module not yet imported: the normal finders
        return importlib.util.spec_from_loader(fullname, self, origin=getattr(module.__spec__, "origin", None))

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return sys.modules[spec.name]

    def exec_module(self, module: ModuleType) -> None:
        """Already executed (by its package's ``__init__``)."""


_ALREADY_LOADED = _AlreadyLoaded()


def lazy_import(name: str) -> ModuleType:
    """The module ``name``, executed on its first attribute access (``importlib.util.LazyLoader``).

    Returns the module itself when it is already imported. ``import name`` elsewhere gets the same object, and
    ``import name.sub`` before any attribute was read loads ``name`` once, then ``name.sub`` once.
    """
    if name in sys.modules:
        return sys.modules[name]
    if _ALREADY_LOADED not in sys.meta_path:
        sys.meta_path.insert(0, _ALREADY_LOADED)
    _AlreadyLoaded.packages.add(name.partition(".")[0])
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
