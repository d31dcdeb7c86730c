"""One generic registry; one instance per component kind (algorithm, rollout, reward, ...).

Each kind declares the config key that selects from it, where its components' own options live in the
config tree, and the Protocol its components implement (``rlforge.protocols``). A component may carry a
config dataclass: ``registry.rollout.register("vllm", VLLMRollout, config=VLLMConfig)`` puts its fields at
``rollout.vllm.*``. A plugin without components owns ``plugins.<plugin name>.*`` through
``registry.plugin_config.register("<plugin name>", MyOptions)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, is_dataclass
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
            if name in self._entries and not override:
                prev = self._entries[name].plugin
                raise RLForgeError(
                    f"{self.kind} '{name}' is already registered (by plugin '{prev}'); "
                    f"pass override=True to replace it."
                )
            problem = self.spec.check(name, o) if self.spec.check is not None else ""
            if problem:
                raise RLForgeError(f"{self.kind} '{name}' (plugin '{self.current_plugin}'): {problem}")
            desc = description or _first_doc_line(o)
            stray = getattr(o, "capabilities", None) if self.spec.capabilities is None else None
            if stray is not None:
                raise RLForgeError(f"{self.kind} '{name}' sets capabilities = {stray!r}, but components of this "
                                   f"kind declare no capabilities: remove it.")
            caps = (None if self.spec.capabilities is None else
                    declared(self.kind, name, o, self.spec.capabilities, capabilities))
            fns = functions(self.kind, name, o, ("validate_config", *self.spec.functions))
            self._entries[name] = Entry(name, o, desc, self.current_plugin, config, caps, fns)
            return o

        if obj is None:
            return add
        return add(obj)

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            where = f" ({self.key})" if self.key else ""
            known = ", ".join(self.available()) or "(none)"
            raise UnknownComponentError(
                f"Unknown {self.kind} '{name}'{where}.{did_you_mean(name, self._entries)} "
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


def _declarations(entry: Entry[Any], kind: Kind) -> str:
    """What ``rlforge plugins list`` shows after a component: ``  (capabilities: ...; defines: ...)`` (the optional
    functions of its kind, ``Kind.functions``; not ``validate_config``, which any component may have), or ``""``."""
    parts = [f"capabilities: {shown(entry.capabilities)}"] if shown(entry.capabilities) else []
    defines = sorted(f for f in entry.functions if f in kind.functions)
    if defines:
        parts.append(f"defines: {', '.join(defines)}")
    return f"  ({'; '.join(parts)})" if parts else ""


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
        "algorithm": Kind("algorithm.name", None, "RLModule"),
        "rollout": Kind("rollout.name", "rollout", "RolloutEngine", RolloutCapabilities),
        "reward_manager": Kind("reward.manager", "reward", "RewardManager",
                               functions=("check_data_sources", "check_function")),
        "reward_fn": Kind("reward.fn", "reward", "RewardFunction"),
        "strategy": Kind("strategy.name", "strategy", "Strategy", StrategyCapabilities, ("export_checkpoint",)),
        "logger": Kind("logger.backends", "logger", "Logger", LoggerCapabilities),
        "dataset": Kind("data.name", "data", "Dataset", DatasetCapabilities),
        "controller": Kind("trainer.controller", "", "Controller", functions=("follow",)),
        "agent_loop": Kind("rollout.agent.loop", "rollout.agent", "AgentLoop"),
        "tool": Kind("rollout.agent.tools", "rollout.agent", "Tool"),
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
        for kind, spec in self.SPECS.items():
            setattr(self, kind, Registry(kind.replace("_", " "), spec.key, spec))

    def all(self) -> dict[str, Registry[Any]]:
        return {kind: getattr(self, kind) for kind in self.SPECS}

    def plugin_options(self, config: type, name: str | None = None) -> type:
        """Declare the options of a plugin without components: ``plugins.<name>.*`` (``name`` defaults to the
        plugin's own name, e.g. its entry-point name). Returns ``config``; read the values from
        ``config.plugins.<name>`` in the plugin's hooks."""
        self.plugin_config.register(name or self.plugin_config.current_plugin, config, config=config)
        return config

    def set_current_plugin(self, name: str) -> None:
        for reg in self.all().values():
            reg.current_plugin = name

    def set_hint(self, hint: str) -> None:
        for reg in self.all().values():
            reg.hint = hint

    def components_of(self, plugin: str) -> list[str]:
        """``kind:name`` of each component ``plugin`` registered, with the capabilities it declares that are on and
        the optional functions it defines (``Kind.functions``)."""
        return [f"{reg.kind}:{e.name}{_declarations(e, reg.spec)}"
                for reg in self.all().values() for e in reg.entries() if e.plugin == plugin]

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
