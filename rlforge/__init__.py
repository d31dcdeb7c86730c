"""rlforge: reinforcement-learning post-training for LLMs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlforge.batch import Batch
from rlforge.dataflow import DataFlow, Stage, StepContext
from rlforge.hookspecs import hookimpl, hookspec

if TYPE_CHECKING:
    from rlforge.module import LossContext, RLModule
    from rlforge.trainer import Trainer

__version__ = "0.1.0"
_LAZY = {"LossContext": "rlforge.module", "RLModule": "rlforge.module", "Trainer": "rlforge.trainer"}


def __getattr__(name: str) -> Any:
    """``rlforge.Trainer`` and friends load on first use: ``import rlforge`` stays cheap (the CLI's speed)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlforge' has no attribute '{name}'")


def load_config(
    algo: str | None = None, overrides: list[str] | tuple[str, ...] = (), config_file: str | None = None,
    plugins: Any = None,
) -> Any:
    """Compose and validate a config as the CLI does (defaults < preset < file < overrides).

    ``plugins``: a PluginManager to validate against; by default the installed plugins minus ``plugins.disable``.
    """
    from rlforge.config import compose, compose_with_plugins

    if plugins is not None:
        return compose(plugins.registry, algo, config_file, list(overrides))
    return compose_with_plugins(algo, config_file, list(overrides))[1]


def get_algorithm(name: str) -> Any:
    """The RLModule class registered as ``name`` (e.g. ``get_algorithm("grpo")``)."""
    from rlforge.plugin_manager import PluginManager

    return PluginManager().registry.algorithm.get(name)


__all__ = [
    "Batch", "DataFlow", "LossContext", "RLModule", "Stage", "StepContext", "Trainer", "get_algorithm", "hookimpl",
    "hookspec",
    "load_config",
]
