"""The pluggy plugin manager: built-in plugins, third-party entry points (group ``rlforge``), listing.

Built-ins are loaded by module name, exactly like third-party plugins, so the core never imports
``rlforge.algorithms`` or ``rlforge.plugins`` directly. Set ``RLFORGE_DISABLE_PLUGIN_AUTOLOAD=1`` to
skip entry points, and pass ``disable=[...]`` (config ``plugins.disable``) to block plugins by name.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from rlforge import hookspecs
from rlforge.registry import Registries

ENTRY_POINT_GROUP = "rlforge"
AUTOLOAD_ENV = "RLFORGE_DISABLE_PLUGIN_AUTOLOAD"

BUILTIN_PLUGINS: tuple[str, ...] = (
    "rlforge.algorithms.grpo",
    "rlforge.algorithms.dapo",
    "rlforge.algorithms.ppo",
    "rlforge.algorithms.rloo",
    "rlforge.algorithms.reinforce",
    "rlforge.algorithms.remax",
    "rlforge.algorithms.gspo",
    "rlforge.algorithms.opo",
    "rlforge.algorithms.gpg",
    "rlforge.algorithms.shaping",
    "rlforge.plugins.rollout.hf",
    "rlforge.plugins.rollout.vllm",
    "rlforge.plugins.reward.rule",
    "rlforge.plugins.strategy.single",
    "rlforge.plugins.strategy.fsdp",
    "rlforge.plugins.logger.console",
    "rlforge.plugins.logger.mlflow_logger",
    "rlforge.plugins.logger.tensorboard",
    "rlforge.plugins.logger.wandb_logger",
    "rlforge.plugins.logger.plots",
    "rlforge.plugins.data.builtin",
    "rlforge.controller.local",
    "rlforge.controller.ray_controller",
)


@dataclass
class PluginInfo:
    name: str
    source: str  # "builtin", "entry point" or "object"
    distribution: str = ""
    version: str = ""
    components: list[str] = field(default_factory=list)
    error: str = ""


class PluginManager:
    """Loads plugins, fills the registries through ``rlforge_register`` and exposes ``hook``."""

    def __init__(self, disable: Iterable[str] = (), autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager("rlforge")
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registries()
        self.infos: dict[str, PluginInfo] = {}
        self.disabled = set(disable)
        for name in self.disabled:
            self.pm.set_blocked(name)
        self.pm.hook.rlforge_register.call_historic(kwargs={"registry": self.registry})
        if autoload is None:
            autoload = os.environ.get(AUTOLOAD_ENV, "").lower() in ("", "0", "false", "no")
        self.autoload = autoload  # whether entry-point plugins were loaded
        for mod in BUILTIN_PLUGINS:
            self._load_module(mod, PluginInfo(mod, "builtin", "rlforge", _version("rlforge")))
        if autoload:
            self._load_entry_points()

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def register(self, plugin: object, name: str | None = None, source: str = "object") -> None:
        """Register a plugin object (module or instance with hookimpls), e.g. a Trainer callback."""
        name = name or getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{id(plugin)}"
        if name in self.disabled or self.pm.is_registered(plugin):
            return
        info = self.infos.setdefault(name, PluginInfo(name, source))
        self.registry.set_current_plugin(name)
        # rlforge_register is historic: pluggy calls the new plugin's implementation during register()
        try:
            self.pm.register(plugin, name=name)
        finally:
            self.registry.set_current_plugin("<direct>")
        info.components = self.registry.components_of(name)

    def _load_module(self, module: str, info: PluginInfo) -> None:
        if info.name in self.disabled:
            return
        self.infos[info.name] = info
        try:
            plugin = importlib.import_module(module)
            self.register(plugin, name=info.name, source=info.source)
        except Exception as exc:  # a broken plugin is reported, the rest keeps working
            info.error = f"{type(exc).__name__}: {exc}"

    def _load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist else ""
            ver = ep.dist.version if ep.dist else ""
            info = PluginInfo(ep.name, "entry point", dist, ver)
            if ep.name in self.disabled:
                continue
            self.infos[ep.name] = info
            try:
                self.register(ep.load(), name=ep.name, source="entry point")
            except Exception as exc:
                info.error = f"{type(exc).__name__}: {exc}"

    def plugins(self) -> list[PluginInfo]:
        return list(self.infos.values())

    def errors(self) -> list[PluginInfo]:
        return [i for i in self.infos.values() if i.error]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""
