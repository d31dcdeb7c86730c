"""The pluggy plugin manager: built-in plugins, third-party entry points (group ``rlforge``), listing.

Built-ins are loaded by module name, exactly like third-party plugins, so the core never imports
``rlforge.algorithms`` or ``rlforge.plugins`` directly. Set ``RLFORGE_DISABLE_PLUGIN_AUTOLOAD=1`` to
skip entry points, and pass ``disable=[...]`` (config ``plugins.disable``) to block plugins by name. ``modules=[...]``
(config ``plugins.modules``, ``-p`` on the command line) loads more plugins by module name or ``.py`` file, as
pytest's ``-p`` does; unlike an entry point, one that cannot be loaded is an error.

Hygiene, as pytest does it: a plugin that implements an ``rlforge_*`` hook that does not exist (a typo such
as ``rlforge_step_ends``) is refused at load time, naming the plugin and the closest hook; a plugin whose
registration fails half-way leaves nothing behind (registration is all-or-nothing); every plugin that failed
to load or was disabled is named in ``warnings()`` (each CLI command prints them) and in the error for an
unknown component name.

A plugin may replace a built-in component (``override=True``); a name that two plugins that are not built in both
register is contested (``rlforge.registry``): ``warnings()`` names it, and a run that uses it stops naming both plugins
and the ``plugins.disable`` that keeps one. ``provenance(config)`` says which plugin provided each component a run
uses, for its record.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pluggy

from rlforge import hookspecs
from rlforge.errors import RLForgeError, did_you_mean
from rlforge.registry import Registries

ENTRY_POINT_GROUP = "rlforge"
AUTOLOAD_ENV = "RLFORGE_DISABLE_PLUGIN_AUTOLOAD"
HOOK_PREFIX = "rlforge_"

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
    "rlforge.algorithms.policy_losses",
    "rlforge.algorithms.gdpo",
    "rlforge.algorithms.otb",
    "rlforge.algorithms.pf_ppo",
    "rlforge.algorithms.sppo",
    "rlforge.algorithms.vapo",
    "rlforge.algorithms.prime",
    "rlforge.algorithms.distill",
    "rlforge.algorithms.dpo",
    "rlforge.algorithms.kto",
    "rlforge.algorithms.reward_model",
    "rlforge.algorithms.arith_pairs",
    "rlforge.weight_sync",
    "rlforge.plugins.rollout.hf",
    "rlforge.plugins.rollout.vllm",
    "rlforge.plugins.reward.rule",
    "rlforge.plugins.reward.model",
    "rlforge.plugins.reward.generative",
    "rlforge.plugins.reward.trl",
    "rlforge.plugins.strategy.single",
    "rlforge.plugins.strategy.fsdp",
    "rlforge.plugins.strategy.tp",
    "rlforge.plugins.strategy.megatron",
    "rlforge.plugins.strategy.fabric",
    "rlforge.plugins.logger.console",
    "rlforge.plugins.logger.mlflow_logger",
    "rlforge.plugins.logger.tensorboard",
    "rlforge.plugins.logger.wandb_logger",
    "rlforge.plugins.logger.swanlab_logger",
    "rlforge.plugins.logger.trackio_logger",
    "rlforge.plugins.logger.files",
    "rlforge.plugins.logger.profiler",
    "rlforge.plugins.logger.plots",
    "rlforge.plugins.data.builtin",
    "rlforge.plugins.data.arith_tool",
    "rlforge.plugins.data.vision",
    "rlforge.plugins.env.reasoning_gym",
    "rlforge.plugins.env.verifiers_env",
    "rlforge.plugins.env.gym_text",
    "rlforge.plugins.data.hf_datasets",
    "rlforge.plugins.data.verl_class",
    "rlforge.controller.dispatch",
    "rlforge.controller.remote",
    "rlforge.controller.local",
    "rlforge.controller.ray_controller",
    "rlforge.controller.torchrun",
    "rlforge.agent.stage",
    "rlforge.plugins.agent.loops",
    "rlforge.plugins.agent.tools",
    "rlforge.plugins.agent.parsers",
    "rlforge.plugins.agent.interactions",
    "rlforge.plugins.agent.openai_server",
    "rlforge.plugins.agent.verl_loops",
)


class PluginError(RLForgeError):
    """A plugin is malformed (e.g. it implements a hook that does not exist)."""


@dataclass
class PluginInfo:
    name: str
    source: str  # "builtin", "entry point", "module" (plugins.modules / -p) or "object"
    distribution: str = ""  # the package it comes from; for a module, its file
    version: str = ""
    components: list[str] = field(default_factory=list)
    error: str = ""

    def label(self) -> str:
        """The plugin's name and, for an installed package, its distribution (used in error messages)."""
        dist = f"{self.distribution} {self.version}".strip()
        return f"'{self.name}'" + (f" (from {dist})" if dist and self.source != "builtin" else "")


class _Pluggy(pluggy.PluginManager):
    """pluggy's manager: hook implementations are the ``rlforge_*`` functions of a plugin, marked with
    ``@hookimpl`` or not (as pytest reads ``pytest_*``). Other attributes are never looked at, so a plugin's
    lazily imported modules (``rlforge.lazy``) stay unloaded."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        if not name.startswith(HOOK_PREFIX):
            return None
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and callable(getattr(plugin, name, None)):
            return {}  # pluggy fills in the defaults of an unmarked implementation
        return opts


class PluginManager:
    """Loads plugins, fills the registries through ``rlforge_register`` and exposes ``hook``."""

    def __init__(self, disable: Iterable[str] = (), autoload: bool | None = None, modules: Iterable[str] = ()) -> None:
        self.pm = _Pluggy("rlforge")
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registries()
        self.infos: dict[str, PluginInfo] = {}
        self.disabled = set(disable)
        self.skipped: list[str] = []  # disabled plugins that were found (named in the warnings)
        for name in self.disabled:
            self.pm.set_blocked(name)
        self.pm.hook.rlforge_register.call_historic(kwargs={"registry": self.registry})
        if autoload is None:
            autoload = os.environ.get(AUTOLOAD_ENV, "").lower() in ("", "0", "false", "no")
        self.autoload = autoload  # whether entry-point plugins were loaded
        version = _version("rlforge")  # read from the installed metadata once, not per built-in plugin
        with _real_interrupts() as interrupted:
            for mod in BUILTIN_PLUGINS:
                self._load(PluginInfo(mod, "builtin", "rlforge", version),
                           lambda m=mod: importlib.import_module(m), interrupted)
            if autoload:
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    dist = ep.dist.name if ep.dist else ""
                    self._load(PluginInfo(ep.name, "entry point", dist, ep.dist.version if ep.dist else ""), ep.load,
                               interrupted)
        self.modules: list[str] = []  # plugins.modules as every process loads them: files as absolute paths
        self.hookless: list[str] = []  # a warning per plugins.modules entry that implements no hook
        for spec in modules:
            self._load_module(str(spec))
        self._update_hint()

    @classmethod
    def for_config(cls, config: Any) -> PluginManager:
        """The plugins of a composed config (``plugins.disable``, ``plugins.modules``): what a process that rebuilds
        the run from its config (a Ray worker, a module made without a Builder) loads."""
        plugins = config.plugins
        return cls(disable=list(plugins.disable), modules=list(plugins.get("modules") or []))

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def register(self, plugin: object, name: str | None = None, source: str = "object") -> None:
        """Register a plugin object (module or instance with hookimpls), e.g. a Trainer callback.

        All or nothing: if its hooks are malformed or its ``rlforge_register`` raises, nothing it registered stays.
        """
        name = name or getattr(plugin, "__name__", None) or f"{type(plugin).__name__}-{id(plugin)}"
        if name in self.disabled or self.pm.is_registered(plugin):
            return
        info = self.infos.setdefault(name, PluginInfo(name, source))
        self._check_hooks(plugin, info)
        before = self.registry.snapshot()
        self.registry.set_current_plugin(name, "" if info.source == "builtin" else info.label())
        # rlforge_register is historic: pluggy calls the new plugin's implementation during register()
        try:
            self.pm.register(plugin, name=name)
        except BaseException:
            self.registry.restore(before)
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            raise
        finally:
            self.registry.set_current_plugin("<direct>")
        info.components = self.registry.components_of(name)

    def _check_hooks(self, plugin: object, info: PluginInfo) -> None:
        """Every ``rlforge_*`` implementation names a hook and only arguments the hook has (pluggy's own error names a
        callback object by its id)."""
        known = {n for n in dir(hookspecs) if n.startswith(HOOK_PREFIX)}
        who = _who(plugin, info)
        for attr in dir(plugin):
            if not attr.startswith(HOOK_PREFIX) or self.pm.parse_hookimpl_opts(plugin, attr) is None:
                continue
            if attr not in known:
                raise PluginError(f"{who} implements '{attr}', which is not an rlforge hook."
                                  f"{did_you_mean(attr, known)} The hooks are listed in docs/hooks.md.")
            takes, given = _arguments(getattr(hookspecs, attr)), _arguments(getattr(plugin, attr))
            unfilled = _unfilled(getattr(plugin, attr))
            if unfilled:
                raise PluginError(f"{who} implements {attr} with {unfilled}, which pluggy never fills: it passes a "
                                  f"hook's arguments by name ({', '.join(takes)}) to the parameters that name them, "
                                  f"without a default. Name the ones you use (docs/hooks.md).")
            stray = [a for a in given if a not in takes]
            if isinstance(plugin, type) and stray[:1] == ["self"]:  # Trainer(callbacks=[MyCallback]): the class
                raise PluginError(f"{who} is a class whose {attr} is a method: register an instance "
                                  f"(Trainer(callbacks=[{plugin.__name__}()])).")
            if stray:
                raise PluginError(f"{who} implements {attr}({', '.join(given)}), but the hook has no argument "
                                  f"{', '.join(repr(a) for a in stray)}.{did_you_mean(stray[0], takes)} It passes "
                                  f"{', '.join(takes)}: take any of them, by these names (docs/hooks.md).")

    def _load(self, info: PluginInfo, load: Any, interrupted: threading.Event) -> None:
        """Import and register one plugin. Whatever its code raises, ``sys.exit`` and a ``KeyboardInterrupt``
        it raises itself included, is recorded as its error and the other plugins still load; only a real
        Ctrl-C (a SIGINT that arrived while loading) stops the command."""
        if info.name in self.disabled:
            self.skipped.append(info.name)
            return
        self.infos[info.name] = info
        try:
            self.register(load(), name=info.name, source=info.source)
        except BaseException as exc:  # a broken plugin is reported, the rest keeps working
            if isinstance(exc, KeyboardInterrupt) and interrupted.is_set():
                raise
            info.error = _describe(exc)

    def _load_module(self, spec: str) -> None:
        """Import and register one ``plugins.modules`` entry; any failure is a :class:`PluginError` naming it."""
        name, path = module_source(spec)
        if name in self.disabled:
            self.skipped.append(name)
            return
        resolved = str(path) if path is not None else name
        if resolved in self.modules:
            return
        try:
            module = import_file(name, path) if path is not None else importlib.import_module(name)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | PluginError):
                raise
            raise PluginError(f"Cannot import plugin module '{spec}' (plugins.modules / -p): {_describe(exc)}"
                              f"{_where(exc, path)}.{_import_hint(spec, exc)}") from exc
        info = PluginInfo(name, "module", getattr(module, "__file__", None) or resolved)
        self.infos[name] = info
        try:
            self.register(module, name=name, source="module")
        except BaseException as exc:
            del self.infos[name]
            if path is not None and sys.modules.get(name) is module:
                del sys.modules[name]  # the next manager imports the (fixed) file again
            if isinstance(exc, KeyboardInterrupt | PluginError):
                raise
            raise PluginError(f"Plugin module {info.label()} failed to register: {_describe(exc)}"
                              f"{_where(exc, path)}.") from exc
        self.modules.append(resolved)
        if not self.pm.get_hookcallers(module):  # e.g. -p json: the standard library's module, not the user's file
            here = (f" (./{spec}.py in this folder has the name of that installed module, which -p {spec} imports: "
                    f"rename the file and give -p its path)" if path is None and Path(f"{spec}.py").is_file() else "")
            self.hookless.append(f"plugin module '{spec}' ({info.distribution}) implements no rlforge hook (no "
                                 f"rlforge_register, no other rlforge_* function): it registers nothing. Give the "
                                 f"module or .py file that holds your hooks{here}.")

    def file_modules(self) -> list[Any]:
        """The modules loaded from ``.py`` files (``plugins.modules``): no other process can import them by name, so
        a controller that sends their classes to workers pickles them by value."""
        return [sys.modules[i.name] for i in self.infos.values()
                if i.source == "module" and i.distribution in self.modules and i.name in sys.modules]

    def _update_hint(self) -> None:
        """What an unknown-name error adds: the plugins that did not load, whether entry points were skipped, and the
        names two plugins register (listed, but unusable)."""
        notes = [f"{i.name} (failed to load: {i.error.splitlines()[0]})" for i in self.errors()]
        notes += [f"{n} (disabled by plugins.disable)" for n in self.skipped]
        hint = f" Plugins not loaded: {'; '.join(notes)}." if notes else ""
        if not self.autoload:
            hint += (f" Entry-point plugins are off ({AUTOLOAD_ENV}): no installed plugin package was loaded; unset "
                     f"it, or load the plugin's module with -p.")
        self.registry.set_hint(hint)
        for reg in self.registry.all().values():
            contested = [f"'{e.name}'" for e in reg.entries() if e.rivals]
            if contested:
                reg.hint += (f" Contested, so not usable: {', '.join(contested)} (two plugins register it; disable "
                             f"one of them with plugins.disable, 'rlforge plugins list' names them).")

    def plugins(self) -> list[PluginInfo]:
        """Every plugin found; a component a later plugin contests shows it in the earlier one's ``components``."""
        for info in self.infos.values():
            if info.source != "builtin" and not info.error:
                info.components = self.registry.components_of(info.name)
        return list(self.infos.values())

    def provenance(self, config: Any) -> dict[str, str]:
        """``kind:name -> plugin (distribution version)`` of each component the config's keys name (``Kind.key``:
        ``algorithm.name``, ``logger.backends``, ...), and which plugin's component it replaced (``override=True``):
        what a run records of where its components came from."""
        from omegaconf import OmegaConf

        out: dict[str, str] = {}
        for kind, reg in self.registry.all().items():
            chosen = OmegaConf.select(config, reg.key) if reg.key else None
            names = list(chosen) if OmegaConf.is_list(chosen) or isinstance(chosen, list) else [chosen]
            for name in names:
                if isinstance(name, str) and name in reg:
                    out[f"{reg.kind}:{name}"] = self._source(reg.entry(name))
        return out

    def _source(self, entry: Any) -> str:
        """How :meth:`provenance` names the plugin of a registry entry."""
        info = self.infos.get(entry.plugin)
        dist = f"{info.distribution} {info.version}".strip() if info is not None else ""
        replaced = f", replacing the one of {entry.replaced}" if entry.replaced else ""
        return f"{entry.plugin}{f' ({dist})' if dist else ''}{replaced}"

    def errors(self) -> list[PluginInfo]:
        return [i for i in self.infos.values() if i.error]

    def warnings(self) -> list[str]:
        """One line per plugin that failed to load or was disabled, and per name two plugins register (the CLI prints
        them on every command)."""
        lines = [f"plugin {i.label()} failed to load: {i.error.splitlines()[0]}" for i in self.errors()]
        lines += [f"plugin '{n}' is disabled (plugins.disable)" for n in self.skipped]
        lines += self.registry.conflicts() + self.hookless
        known = [*self.infos, *self.skipped]
        lines += [f"plugins.disable names '{n}', which is no plugin here.{did_you_mean(n, known)} 'rlforge plugins "
                  f"list' shows their names." for n in sorted(self.disabled - set(known))]
        return lines


def implementers(hook: Any, name: str) -> str:
    """The plugins implementing hook ``rlforge_<name>`` of ``hook`` (a plugin manager's hook relay), for a message:
    module names, and the class name of a callback object; rlforge's own plugins only where no other implements it
    (a message points at the code the user brought)."""
    names = {implementer_name(i) for i in getattr(hook, f"rlforge_{name}").get_hookimpls()}
    brought = {n for n in names if not n.startswith("rlforge.")}
    return ", ".join(sorted(brought or names)) or "no plugin"


def implementer_name(impl: Any) -> str:
    """A hook implementation's plugin as a message names it: a callback object (registered as Class-<id>,
    ``PluginManager.register``) by its class."""
    cls = type(impl.plugin).__name__
    return cls if impl.plugin_name == f"{cls}-{id(impl.plugin)}" else impl.plugin_name


def _who(plugin: object, info: PluginInfo) -> str:
    """How a message names a plugin: a callback object (registered as ``Class-<id>``) by its class."""
    cls = type(plugin)
    if info.name == f"{cls.__name__}-{id(plugin)}":
        return f"The callback {cls.__module__}.{cls.__qualname__}"
    return f"Plugin {info.label()}"


def _arguments(fn: Any) -> list[str]:
    """The arguments pluggy passes a hook function (as pluggy reads them: positional, without a default, ``self`` of a
    bound method left out)."""
    import inspect

    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _unfilled(fn: Any) -> str:
    """The parameters of a hook implementation that pluggy never fills (``*args``, ``**kwargs``, one with a default),
    in words; "" where there are none."""
    import inspect

    shown: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    unfilled = [f"{shown.get(p.kind, '')}{p.name}" + ("=..." if p.default is not p.empty else "")
                for p in inspect.signature(fn).parameters.values()
                if p.kind in shown or (p.default is not p.empty and p.kind != p.KEYWORD_ONLY)]
    return ", ".join(unfilled)


def module_source(spec: str) -> tuple[str, Path | None]:
    """(plugin name, file) of a ``plugins.modules`` entry: a path (``.py`` or with a ``/``) is that file, named after
    it; a module name is imported as it is (file None), unless no installed module has that name and the current
    folder holds ``NAME.py`` (the way ``python -m`` would find it)."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        path = Path(spec).expanduser()
        if path.is_dir():
            raise PluginError(f"Plugin path {spec} (plugins.modules / -p) is a folder: give a .py file in it "
                              f"(-p {path / 'plugin.py'}), or a package as its module name (-p my_package.plugin) "
                              f"with the folder above the package on PYTHONPATH.")
        if not path.is_file():
            raise PluginError(f"Plugin file not found: {spec} (plugins.modules / -p).")
        if not path.stem.isidentifier():
            raise PluginError(f"Plugin file {spec} (plugins.modules / -p): '{path.stem}' is not a valid module name; "
                              f"rename the file (letters, digits and _).")
        return path.stem, path.resolve()
    if not spec or not all(part.isidentifier() for part in spec.split(".")):
        raise PluginError(f"'{spec}' (plugins.modules / -p) is neither a module name nor a .py file.")
    local = Path(f"{spec}.py").resolve()
    if "." not in spec and spec not in sys.modules and local.is_file():
        found = importlib.util.find_spec(spec)
        if found is None or (found.origin and Path(found.origin).resolve() == local):
            return spec, local  # recorded as its path: a process started elsewhere finds it too
    return spec, None


def import_file(name: str, path: Path) -> Any:
    """The module of a plugin file, imported as ``name`` (in ``sys.modules``, so its classes pickle by name); the same
    file is imported once per process."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise PluginError(f"Plugin file {path} would be imported as '{name}', but a module of that name is already "
                          f"loaded (from {getattr(loaded, '__file__', None) or 'built in'}): rename the file.")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"Plugin file {path} cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _where(exc: BaseException, path: Path | None) -> str:
    """`` (at FILE:LINE)``: the innermost line of the plugin's own file that raised, where there is one."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if path is not None and Path(f.filename) == path]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _import_hint(spec: str, exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name == spec.split(".")[0]:
        return (" Give an importable module name (installed, or on PYTHONPATH) or the path of a .py file "
                "(e.g. ./my_plugin.py).")
    return ""


def _describe(exc: BaseException) -> str:
    """A plugin's failure in one phrase: ``ImportError: no module named x``, ``called sys.exit(3)``."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}) while loading"
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"raised {type(exc).__name__} while loading"


@contextmanager
def _real_interrupts() -> Iterator[threading.Event]:
    """While plugins load, tell a Ctrl-C (a SIGINT) from a ``KeyboardInterrupt`` that plugin code raises: the
    event is set when the signal arrived. Where Python's own handler cannot be wrapped (off the main thread,
    or a default action the process set) the event is set from the start: every ``KeyboardInterrupt`` then
    stops the command, as it would without plugins."""
    seen = threading.Event()
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if not callable(previous):
        if previous != signal.SIG_IGN:  # an ignored SIGINT never arrives: any KeyboardInterrupt is a plugin's
            seen.set()
        yield seen
        return

    def on_sigint(signum: int, frame: Any) -> None:
        seen.set()
        previous(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""
