"""One generic registry; one instance per component kind (algorithm, rollout, reward, ...).

Each kind declares the config key that selects from it, where its components' own options live in the
config tree, and the Protocol its components implement (``rlforge.protocols``). A component may carry a
config dataclass: ``registry.rollout.register("vllm", VLLMRollout, config=VLLMConfig)`` puts its fields at
``rollout.vllm.*``. A plugin without components owns ``plugins.<plugin name>.*`` through
``registry.plugin_config.register("<plugin name>", MyOptions)``.

A plugin may replace a built-in component with ``override=True``. A name that two plugins (neither built in) both
register, with ``override=True`` or not, is *contested*: which one a run would get would depend on the order they
were installed in, so neither is used. Loading goes on (their other components work) and a run that names it stops
with a :class:`ComponentConflictError` naming both plugins and the ``plugins.disable`` that chooses one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, is_dataclass, replace
from typing import Any, Generic, TypeVar

from rlforge.capabilities import (
    DatasetCapabilities,
    LoggerCapabilities,
    RolloutCapabilities,
    StrategyCapabilities,
    declared,
    functions,
    shown,
)
from rlforge.errors import RLForgeError, did_you_mean
from rlforge.weight_sync import backend_problem

T = TypeVar("T")


class UnknownComponentError(RLForgeError):
    """A config named a component that no plugin registered."""


class ComponentConflictError(RLForgeError):
    """A config named a component that two plugins register (a contested name)."""


@dataclass(frozen=True)
class Kind:
    """One kind of component.

    :param key: the config key that names the component(s) to use, e.g. ``rollout.name``.
    :param section: where each component's options go: ``<section>.<component name>``; ``""`` = top level;
        ``None`` = components have no options of their own (algorithms own the whole ``algorithm`` section).
    :param protocol: the name of the contract in ``rlforge.protocols`` (checked by the type checker and when built).
    """

    key: str
    section: str | None
    protocol: str = ""
    capabilities: type | None = None  # what its components declare (rlforge.capabilities), read at registration
    functions: tuple[str, ...] = ()  # optional functions its components' classes may define, besides validate_config
    # what is wrong with a component (its name, the object), "" when nothing: refused at registration
    check: Callable[[str, Any], str] | None = None


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str
    plugin: str
    config: type | None = None  # dataclass of the component's own config section
    capabilities: Any = None  # what it declares (rlforge.capabilities), for kinds that have them
    functions: dict[str, Any] = field(default_factory=dict)  # the optional functions it defines (Kind.functions)
    replaced: str = ""  # the plugin whose component of this name it replaced (override=True), "" when none
    rivals: tuple[str, ...] = ()  # other plugins that register this name too: contested, using it is an error

    def config_path(self, kind: Kind) -> str | None:
        """Where this component's options live in the config (None: it has none)."""
        if self.config is None or kind.section is None:
            return None
        return f"{kind.section}.{self.name}" if kind.section else self.name


class Registry(Generic[T]):
    """Name -> object map for one kind of component.

    ``register`` works as a call or a decorator; a duplicate name needs ``override=True``.
    ``key`` is the config key that selects from this registry, used in error messages.
    """

    def __init__(self, kind: str, key: str = "", spec: Kind | None = None) -> None:
        self.kind = kind
        self.key = key
        self.spec = spec or Kind(key, None)
        self._entries: dict[str, Entry[T]] = {}
        self.current_plugin = "<unknown>"
        # plugins that are not built in -> how messages name them (with their distribution); no other plugin may
        # replace their components (Registries shares one dict between its registries; the plugin manager fills it)
        self.labels: dict[str, str] = {}
        self.hint = ""  # appended to unknown-name errors (e.g. plugins that failed to load or were disabled)

    def register(
        self, name: str, obj: T | None = None, *, description: str = "", override: bool = False,
        config: type | None = None, capabilities: Any = None,
    ) -> Any:
        """Register ``obj`` under ``name``; ``config`` is the dataclass of its options (see the module doc);
        ``capabilities`` what it declares, for a factory that cannot carry it as a class attribute
        (``rlforge.capabilities``)."""
        if config is not None and not (isinstance(config, type) and is_dataclass(config)):
            raise RLForgeError(f"{self.kind} '{name}': config= must be a dataclass, got {config!r}.")
        if config is not None and self.spec.section is None:
            raise RLForgeError(f"{self.kind} '{name}': components of this kind take no config= section.")
        if capabilities is not None and self.spec.capabilities is None:
            raise RLForgeError(f"{self.kind} '{name}': components of this kind declare no capabilities=.")

        def add(o: T) -> T:
            new = self._entry(name, o, description, config, capabilities)
            prev = self._entries.get(name)
            self._entries[name] = new if prev is None else self._resolved(prev, new, override)
            return o

        if obj is None:
            return add
        return add(obj)

    def _entry(self, name: str, o: T, description: str, config: type | None, capabilities: Any) -> Entry[T]:
        """The entry of ``o`` registered by the current plugin, after the checks of its kind."""
        problem = self.spec.check(name, o) if self.spec.check is not None else ""
        if problem:
            raise RLForgeError(f"{self.kind} '{name}' (plugin '{self.current_plugin}'): {problem}")
        stray = getattr(o, "capabilities", None) if self.spec.capabilities is None else None
        if stray is not None:
            raise RLForgeError(f"{self.kind} '{name}' sets capabilities = {stray!r}, but components of this "
                               f"kind declare no capabilities: remove it.")
        caps = (None if self.spec.capabilities is None else
                declared(self.kind, name, o, self.spec.capabilities, capabilities))
        fns = functions(self.kind, name, o, ("validate_config", *self.spec.functions))
        return Entry(name, o, description or _first_doc_line(o), self.current_plugin, config, caps, fns)

    def _resolved(self, prev: Entry[T], new: Entry[T], override: bool) -> Entry[T]:
        """What ``name`` holds once ``new`` is registered over ``prev``: the earlier entry marked contested when two
        plugins that are not built in claim it; else ``new`` (``override=True``), recording whose entry it replaced.
        A built-in's name needs ``override=True`` whichever plugin holds it now, so the outcome never depends on the
        order the plugins load in."""
        rival = new.plugin != prev.plugin and new.plugin in self.labels and prev.plugin in self.labels
        if not override and not (rival and not prev.replaced):
            raise RLForgeError(
                f"{self.kind} '{new.name}' is already registered (by plugin '{prev.replaced or prev.plugin}'); "
                f"pass override=True to replace it."
            )
        if rival:
            return replace(prev, rivals=(*prev.rivals, new.plugin))
        return replace(new, replaced=prev.replaced if prev.plugin == new.plugin else prev.plugin)

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``: an :class:`UnknownComponentError` when none is registered, a
        :class:`ComponentConflictError` when two plugins register it."""
        found = self._lookup(name)
        if found.rivals:
            raise ComponentConflictError(self.conflict(found))
        return found

    def conflict(self, entry: Entry[T]) -> str:
        """What is wrong with a contested entry, and how to choose one of its plugins."""
        plugins = [entry.plugin, *entry.rivals]
        named = " and ".join(self.labels.get(p, f"'{p}'") for p in plugins)
        what = (f"{self.kind} '{entry.name}' (built in, from plugin '{entry.replaced}') is replaced by"
                if entry.replaced else f"{self.kind} '{entry.name}' is registered by")
        return (f"{what} {len(plugins)} plugins: {named}. Which one a run got would depend on the order they load "
                f"in (for installed packages, the order they were installed in), so none is used: choose one by "
                f"disabling the others for the run, e.g. "
                f"'plugins.disable=[{','.join(plugins[1:])}]' keeps '{plugins[0]}' (or uninstall one).")

    def conflicts(self) -> list[str]:
        """:meth:`conflict` of every contested name, sorted by name."""
        return [self.conflict(e) for e in self.entries() if e.rivals]

    def _lookup(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            where = f" ({self.key})" if self.key else ""
            known = ", ".join(self.available()) or "(none)"
            raise UnknownComponentError(
                f"Unknown {self.kind} '{name}'{where}."
                f"{did_you_mean(name, [n for n, e in self._entries.items() if not e.rivals])} "
                f"Available: {known}.{self.hint} Run 'rlforge plugins list' to see what each plugin registers."
            ) from None

    def available(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        return (self._entries[n] for n in self.available())

    def remove_plugin(self, plugin: str) -> None:
        """Forget everything ``plugin`` registered (its registration failed half-way)."""
        self._entries = {k: e for k, e in self._entries.items() if e.plugin != plugin}

    def snapshot(self) -> dict[str, Entry[T]]:
        return dict(self._entries)

    def restore(self, snapshot: dict[str, Entry[T]]) -> None:
        self._entries = dict(snapshot)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def _declarations(entry: Entry[Any], kind: Kind, plugin: str) -> str:
    """What ``rlforge plugins list`` shows after ``plugin``'s component: ``  (capabilities: ...; defines: ...)`` (the
    optional functions of its kind, ``Kind.functions``; not ``validate_config``, which any component may have), what
    it replaces and whether another plugin registers it too, or ``""``."""
    if entry.rivals:
        others = [p for p in (entry.plugin, *entry.rivals) if p != plugin]
        return f"  (CONTESTED: also registered by {', '.join(others)}; not usable until one is disabled)"
    parts = [f"replaces the one of {entry.replaced}"] if entry.replaced else []
    parts += [f"capabilities: {shown(entry.capabilities)}"] if shown(entry.capabilities) else []
    defines = sorted(f for f in entry.functions if f in kind.functions)
    if defines:
        parts.append(f"defines: {', '.join(defines)}")
    return f"  ({'; '.join(parts)})" if parts else ""


def reward_fn_problem(name: str, obj: Any) -> str:
    """What is wrong with ``obj`` registered as reward function ``name`` ("" when nothing): checked at registration
    (its signature is checked where a run uses it: ``rlforge.plugins.reward.rule.check_registered``; an ``async def``
    one is run to its end in the reward worker, as ``reward.file``'s)."""
    if not callable(obj):
        return (f"{obj!r} is not callable: register a function compute_score(data_source, solution_str, "
                f"ground_truth, extra_info) returning a number or a dict with 'score'.")
    return ""


def algorithm_problem(name: str, obj: Any) -> str:
    """What is wrong with ``obj`` registered as algorithm ``name`` ("" when nothing): an algorithm is an ``RLModule``
    subclass whose ``validate_config`` takes the config alone. (``rlforge.module`` imports this module, through the
    dataflow and the plugin manager, so the base class is found by its qualified name among the class's bases.)"""
    import inspect

    if not (isinstance(obj, type) and any(f"{c.__module__}.{c.__qualname__}" == "rlforge.module.RLModule"
                                          for c in obj.__mro__)):
        what = f"{'class' if isinstance(obj, type) else type(obj).__name__} {getattr(obj, '__qualname__', repr(obj))}"
        return (f"{what} is not an RLModule subclass: register a class that extends rlforge.RLModule, or an algorithm "
                f"such as rlforge.algorithms.grpo.GRPO (docs/concepts.md, \"RLModule\").")
    if not isinstance(inspect.getattr_static(obj, "validate_config"), (classmethod, staticmethod)):
        return (f"{obj.__qualname__}.validate_config is a plain method, but it runs on the class when the config is "
                f"composed, before any module exists: make it a @classmethod validate_config(cls, config).")
    return _config_class_problem(obj)


_PLAIN_TYPES = {"int", "float", "str", "bool"}


def _config_class_problem(obj: type) -> str:
    """What is wrong with an algorithm's ``config_class`` ("" when nothing): a dataclass (the ``algorithm:``
    section's schema) that keeps the type of every field it inherits (``epsilon: str`` over GRPO's float would let a
    text through to the algorithm's checks and math)."""
    import dataclasses

    config = getattr(obj, "config_class", None)
    section = "rlforge.config.schema.AlgorithmConfig"
    if not (isinstance(config, type) and "__dataclass_fields__" in vars(config)  # decorated itself, not by inheritance
            and any(f"{c.__module__}.{c.__qualname__}" == section for c in config.__mro__)):
        return (f"{obj.__qualname__}.config_class = {getattr(config, '__qualname__', repr(config))} is not a "
                f"dataclass that extends the algorithm section's: decorate it with @dataclass and extend the base "
                f"algorithm's config (e.g. rlforge.algorithms.grpo.GRPOConfig, or {section}).")

    def named(kind: Any) -> str:
        return kind if isinstance(kind, str) else getattr(kind, "__name__", repr(kind).replace("typing.", ""))

    own = {f.name: named(f.type) for f in dataclasses.fields(config)}
    for base in config.__mro__[1:]:
        if not dataclasses.is_dataclass(base):
            continue
        for f in dataclasses.fields(base):
            inherited = named(f.type)
            if inherited in _PLAIN_TYPES and own[f.name] != inherited:
                return (f"{obj.__qualname__}.config_class {config.__qualname__} declares '{f.name}' as "
                        f"{own[f.name]}, and {base.__qualname__} (which it extends) as {inherited}: the algorithm's "
                        f"checks and math read it as {inherited}. Keep the type, or give your option another name.")
    return ""


def tool_problem(name: str, obj: Any) -> str:
    """What is wrong with ``obj`` registered as tool ``name`` ("" when nothing): a ``rlforge.agent.Tool`` subclass
    that keeps the base's ``execute`` (which raises) would fail every call the model makes, and the run train on."""
    cls = obj if isinstance(obj, type) else type(obj)
    base = next((c for c in cls.__mro__ if f"{c.__module__}.{c.__qualname__}" == "rlforge.agent.base.Tool"), None)
    if base is not None and (getattr(cls, "execute", None) is base.__dict__["execute"]
                             or not callable(getattr(cls, "execute", None))):
        return (f"{cls.__qualname__} extends rlforge.agent.Tool without an execute method: implement "
                f"execute(self, arguments, state), sync or async, returning the tool's text or a ToolResult "
                f"(docs/agentic.md).")
    return ""


def _first_doc_line(obj: object) -> str:
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


class Registries:
    """The set of registries handed to ``rlforge_register``: one attribute per component kind."""

    algorithm: Registry[Any]
    rollout: Registry[Any]
    reward_manager: Registry[Any]
    reward_fn: Registry[Any]
    strategy: Registry[Any]
    logger: Registry[Any]
    dataset: Registry[Any]
    controller: Registry[Any]
    policy_loss: Registry[Any]
    plugin_config: Registry[Any]
    dispatch_mode: Registry[Any]
    collect_mode: Registry[Any]
    role: Registry[Any]
    weight_sync: Registry[Any]

    SPECS: dict[str, Kind] = {
        "algorithm": Kind("algorithm.name", None, "RLModule", check=algorithm_problem),
        "rollout": Kind("rollout.name", "rollout", "RolloutEngine", RolloutCapabilities),
        "reward_manager": Kind("reward.manager", "reward", "RewardManager",
                               functions=("check_data_sources", "check_function")),
        "reward_fn": Kind("reward.fn", "reward", "RewardFunction", check=reward_fn_problem),
        "strategy": Kind("strategy.name", "strategy", "Strategy", StrategyCapabilities, ("export_checkpoint",)),
        "logger": Kind("logger.backends", "logger", "Logger", LoggerCapabilities),
        "dataset": Kind("data.name", "data", "Dataset", DatasetCapabilities),
        "controller": Kind("trainer.controller", "", "Controller", functions=("follow",)),
        "agent_loop": Kind("rollout.agent.loop", "rollout.agent", "AgentLoop"),
        "tool": Kind("rollout.agent.tools", "rollout.agent", "Tool", check=tool_problem),
        "tool_parser": Kind("rollout.agent.tool_parser", "rollout.agent", "ToolParser"),
        "interaction": Kind("rollout.agent.interaction", "rollout.agent", "Interaction"),
        "policy_loss": Kind("actor.policy_loss", "actor", "PolicyLoss"),
        "plugin_config": Kind("", "plugins", ""),
        "dispatch_mode": Kind("", None, ""),  # how a worker group splits a call over its ranks (rlforge.controller)
        "collect_mode": Kind("", None, ""),  # how it joins the ranks' results
        "role": Kind("", None, ""),  # a worker class and the models it loads (rlforge.controller.remote.Role)
        "weight_sync": Kind("rollout.weight_sync", None, "WeightSync", check=backend_problem),  # how weights reach the engine (rlforge.weight_sync)
    }
    KINDS: dict[str, str] = {kind: spec.key for kind, spec in SPECS.items()}

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}  # Registry.labels, shared by every kind
        for kind, spec in self.SPECS.items():
            reg: Registry[Any] = Registry(kind.replace("_", " "), spec.key, spec)
            reg.labels = self.labels
            setattr(self, kind, reg)

    def all(self) -> dict[str, Registry[Any]]:
        return {kind: getattr(self, kind) for kind in self.SPECS}

    def plugin_options(self, config: type, name: str | None = None) -> type:
        """Declare the options of a plugin without components: ``plugins.<name>.*`` (``name`` defaults to the
        plugin's own name, e.g. its entry-point name). Returns ``config``; read the values from
        ``config.plugins.<name>`` in the plugin's hooks."""
        self.plugin_config.register(name or self.plugin_config.current_plugin, config, config=config)
        return config

    def set_current_plugin(self, name: str, label: str = "") -> None:
        """Components registered from now on are ``name``'s; ``label`` (how messages name it) marks a plugin that is
        not built in: a name it shares with another such plugin is contested (see the module doc)."""
        if label:
            self.labels[name] = label
        for reg in self.all().values():
            reg.current_plugin = name

    def conflicts(self) -> list[str]:
        """The message of every contested name (:meth:`Registry.conflict`)."""
        return [line for reg in self.all().values() for line in reg.conflicts()]

    def set_hint(self, hint: str) -> None:
        for reg in self.all().values():
            reg.hint = hint

    def components_of(self, plugin: str) -> list[str]:
        """``kind:name`` of each component ``plugin`` registered, with the capabilities it declares that are on and
        the optional functions it defines (``Kind.functions``)."""
        return [f"{reg.kind}:{e.name}{_declarations(e, reg.spec, plugin)}"
                for reg in self.all().values() for e in reg.entries() if plugin in (e.plugin, *e.rivals)]

    def snapshot(self) -> dict[str, dict[str, Entry[Any]]]:
        return {kind: reg.snapshot() for kind, reg in self.all().items()}

    def restore(self, snapshot: dict[str, dict[str, Entry[Any]]]) -> None:
        for kind, reg in self.all().items():
            reg.restore(snapshot[kind])

    def config_sections(self) -> dict[str, tuple[type, Entry[Any]]]:
        """Every component's config section: ``path -> (dataclass, entry)``. Two components that claim the same
        path (e.g. a reward manager and a reward function of the same name, both with options) are an error."""
        out: dict[str, tuple[type, Entry[Any]]] = {}
        for kind, reg in self.all().items():
            for e in reg.entries():
                path = e.config_path(self.SPECS[kind])
                if path is None:
                    continue
                if path in out:
                    other = out[path][1]
                    raise RLForgeError(
                        f"Config section '{path}' is claimed twice: by {reg.kind} '{e.name}' (plugin '{e.plugin}') "
                        f"and by '{other.name}' (plugin '{other.plugin}'). Rename one of them."
                    )
                assert e.config is not None
                out[path] = (e.config, e)
        return out
