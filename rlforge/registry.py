"""One generic registry; one instance per component kind (algorithm, rollout, reward, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rlforge.errors import RLForgeError, did_you_mean

T = TypeVar("T")

class UnknownComponentError(RLForgeError):
    """A config named a component that no plugin registered."""

@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str
    plugin: str

class Registry(Generic[T]):
    """Name -> object map for one kind of component.

    ``register`` works as a call or a decorator; a duplicate name needs ``override=True``.
    ``key`` is the config key that selects from this registry, used in error messages.
    """

    def __init__(self, kind: str, key: str = "") -> None:
        self.kind = kind
        self.key = key
        self._entries: dict[str, Entry[T]] = {}
        self.current_plugin = "<unknown>"

    def register(
        self, name: str, obj: T | None = None, *, description: str = "", override: bool = False
    ) -> Any:
        def add(o: T) -> T:
            if name in self._entries and not override:
                prev = self._entries[name].plugin
                raise RLForgeError(
                    f"{self.kind} '{name}' is already registered (by plugin '{prev}'); "
                    f"pass override=True to replace it."
                )
            desc = description or _first_doc_line(o)
            self._entries[name] = Entry(name, o, desc, self.current_plugin)
            return o

        if obj is None:
            return add
        return add(obj)

    def get(self, name: str) -> T:
        try:
            return self._entries[name].obj
        except KeyError:
            where = f" ({self.key})" if self.key else ""
            known = ", ".join(self.available()) or "(none)"
            raise UnknownComponentError(
                f"Unknown {self.kind} '{name}'{where}.{did_you_mean(name, self._entries)} "
                f"Available: {known}. Run 'rlforge plugins list' to see what each plugin registers."
            ) from None

    def entry(self, name: str) -> Entry[T]:
        self.get(name)
        return self._entries[name]

    def available(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        return (self._entries[n] for n in self.available())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

def _first_doc_line(obj: object) -> str:
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""

class Registries:
    """The set of registries handed to ``rlforge_register``: one attribute per component kind."""

    KINDS: dict[str, str] = {
        "algorithm": "algorithm.name",
        "rollout": "rollout.name",
        "reward_manager": "reward.manager",
        "reward_fn": "reward.fn",
        "strategy": "strategy.name",
        "logger": "logger.backends",
        "dataset": "data.name",
        "controller": "trainer.controller",
    }

    def __init__(self) -> None:
        for kind, key in self.KINDS.items():
            setattr(self, kind, Registry(kind.replace("_", " "), key))

    def all(self) -> dict[str, Registry[Any]]:
        return {kind: getattr(self, kind) for kind in self.KINDS}

    def set_current_plugin(self, name: str) -> None:
        for reg in self.all().values():
            reg.current_plugin = name

    def components_of(self, plugin: str) -> list[str]:
        return [
            f"{reg.kind}:{e.name}" for reg in self.all().values() for e in reg.entries() if e.plugin == plugin
        ]

