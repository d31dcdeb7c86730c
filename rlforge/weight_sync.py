"""Weight-sync backends (verl's checkpoint engines): how the actor's weights reach a rollout engine.

A backend is registered under ``registry.weight_sync`` and selected by ``rollout.weight_sync`` (``auto``: the
usable backend with the highest ``preference`` among those that serve the run's engine). Built-in ones:

- ``memory`` (``rlforge.plugins.rollout.hf``): the hf engine's model is the actor or a replica in this process; a sync
  copies the tensors that are not already shared (none for the actor itself, LoRA included).
- ``files`` (``rlforge.plugins.rollout.vllm_sync``): the vllm engine; tensors copied to the CPU in size-bounded
  buckets, written to files in ``rollout.vllm.weight_sync_dir`` (a tmpfs) that the engine's workers map, or inside
  vLLM's RPC messages. A LoRA run writes only its adapter (a peft folder) and the engine loads it as a LoRA adapter.
- ``vllm_native`` (``rlforge.plugins.rollout.vllm_native``, CUDA only): vLLM's weight-transfer API, CUDA IPC from
  the actor's GPU memory into the engine that shares its GPU.

Each sync is measured: :class:`SyncStats` (bytes the backend moved, seconds) becomes the step's ``weight_sync/bytes``
and ``weight_sync/seconds`` metrics, summed over the syncs of the step (``weight_sync/count``; the ``sync_weights``
stage; ``timing_s/update_weights`` is that stage's time).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl

if TYPE_CHECKING:
    import torch

AUTO = "auto"


@dataclass(frozen=True)
class SyncStats:
    """What one weight sync moved: ``bytes`` (summed over the engines that received them) and ``seconds`` (wall time
    of the slowest engine, or of the whole sync where the controller gathers first)."""

    bytes: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {"weight_sync/bytes": float(self.bytes), "weight_sync/seconds": self.seconds, "weight_sync/count": 1.0}


SYNC_METRICS = ("weight_sync/bytes", "weight_sync/seconds", "weight_sync/count")


def add_sync_metrics(metrics: dict[str, float], synced: dict[str, float]) -> None:
    """Add the ``weight_sync/*`` entries of ``synced`` (:meth:`SyncStats.metrics`, or a batch's rollout metrics) to a
    step's ``metrics``, popping them from ``synced``. A step in which the engine got weights more than once (under an
    off-policy pipeline: a snapshot the rollout thread loaded for this step's batch, and a sync of the idle engine
    now) reports their sums, and ``weight_sync/count`` how many there were; one would otherwise hide the other."""
    for key in SYNC_METRICS:
        if key in synced:
            metrics[key] = metrics.get(key, 0.0) + synced.pop(key)


def timed(load: Any, *args: Any) -> SyncStats:
    """``load(*args)`` (returns the bytes it moved) as a :class:`SyncStats` with its wall time."""
    start = time.perf_counter()
    moved = load(*args)
    return SyncStats(int(moved or 0), time.perf_counter() - start)  # None: an engine that does not count its bytes


def collect_sync_stats(group: Any, results: list[SyncStats], shares: Any) -> SyncStats:
    """A worker group's syncs as one: the bytes every engine received, the slowest engine's seconds."""
    return SyncStats(sum(r.bytes for r in results), max((r.seconds for r in results), default=0.0))


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def adapter_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA model's adapter tensors under peft's saved names (what its ``adapter_model.safetensors`` holds): what
    an engine that loads LoRA adapters (``RolloutCapabilities.lora_adapters``) receives instead of merged weights."""
    import peft

    # save_embedding_layers=False: peft would look the base model's config up (on the Hub) at every sync
    yield from peft.get_peft_model_state_dict(model, save_embedding_layers=False).items()


class WeightSyncError(RLForgeError):
    """A weight-sync backend's ``load`` failed or returned something else than the bytes it moved."""


class WeightSync:
    """Base of the weight-sync backends. Built as ``backend(config, engine)`` for one rollout engine, which calls
    :meth:`load` from its ``update_weights``.

    Declared on the class: ``engine`` (the rollout engine class it feeds, subclasses included) and ``preference``
    (``auto`` picks the usable backend with the highest). ``unusable(config)`` says why the backend cannot run here
    (device, package, LoRA), ``""`` when it can. A subclass's ``load`` is checked: an exception it raises, or a
    result that is not an int >= 0, is a :class:`WeightSyncError` naming the backend."""

    engine: ClassVar[type]
    preference: ClassVar[int] = 0

    def __init__(self, config: Any, engine: Any) -> None:
        self.config = config
        self.rollout = engine

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "load" in vars(cls):
            cls.load = _checked(cls.load)  # type: ignore[method-assign]

    @classmethod
    def unusable(cls, config: Any) -> str:
        return ""

    def engine_args(self) -> dict[str, Any]:
        """Arguments the backend needs when the engine is created (the vllm engine: ``vllm.LLM`` keyword
        arguments, e.g. ``vllm_native``'s ``weight_transfer_config``); none by default."""
        return {}

    @classmethod
    def serves(cls, engine_cls: Any) -> bool:
        return isinstance(engine_cls, type) and issubclass(engine_cls, cls.engine)

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Give the engine these weights; return the bytes moved."""
        raise NotImplementedError(f"{type(self).__qualname__}.load")

    def close(self) -> None:
        """Release what the backend holds (called when its engine shuts down)."""

    @classmethod
    def validate_config(cls, config: Any, registry: Any) -> None:
        """rollout.weight_sync names a backend of this engine (the device is checked where the engine is built)."""
        engine = registry.rollout.get(config.rollout.name)
        if not cls.serves(engine):
            raise ConfigError(f"rollout.weight_sync={config.rollout.weight_sync} feeds {cls.engine.__name__} "
                              f"engines, not rollout.name={config.rollout.name}. Backends of this engine: "
                              f"{', '.join(backends_of(registry, engine)) or '(none)'}; or rollout.weight_sync=auto.")


def _label(cls: type) -> str:
    return f"weight-sync backend {cls.__qualname__} ({cls.__module__})"


def _checked(load: Any) -> Any:
    """A backend's ``load`` whose exceptions name the backend and whose result must be the bytes moved."""

    @functools.wraps(load)
    def checked(self: WeightSync, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        try:
            moved = load(self, named_tensors)
        except WeightSyncError:
            raise  # a subclass's load calling its base's: named once
        except RLForgeError as exc:  # already in words
            raise WeightSyncError(f"{_label(type(self))}: {exc}") from exc
        except Exception as exc:
            raise WeightSyncError(f"{_label(type(self))}: load raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(moved, int) or isinstance(moved, bool) or moved < 0:
            raise WeightSyncError(f"{_label(type(self))}: load returned {moved!r}; it must return the bytes it "
                                  f"moved, an int >= 0.")
        return moved

    return checked


def backend_problem(name: str, obj: Any) -> str:
    """What is wrong with a class registered as weight-sync backend ``name`` ("" when nothing): checked at
    registration, so a malformed plugin backend never breaks the runs that do not use it."""
    if obj is Auto:
        return ""
    if not (isinstance(obj, type) and issubclass(obj, WeightSync)):
        return f"{obj!r} is not a subclass of rlforge.weight_sync.WeightSync."
    engine = getattr(obj, "engine", None)
    if not isinstance(engine, type):
        return (f"{obj.__qualname__}.engine must be the rollout engine class it feeds (e.g. engine = HFRollout), "
                f"got {'nothing' if engine is None else repr(engine)}.")
    if obj.load is WeightSync.load:
        return f"{obj.__qualname__} defines no load(named_tensors) method."
    return ""


def unusable_reason(cls: type[WeightSync], config: Any) -> str:
    """Why ``cls`` cannot run here, "" when it can: its ``unusable(config)``; one that raises, or returns something
    else than words, is unusable with that as the reason."""
    try:
        reason = cls.unusable(config)
    except Exception as exc:
        return f"{_label(cls)}.unusable() raised {type(exc).__name__}: {exc}"
    if reason and not isinstance(reason, str):
        return f"{_label(cls)}.unusable() returned {reason!r} instead of a reason in words"
    return reason or ""


def backends_of(registry: Any, engine_cls: Any) -> list[str]:
    """The backends that serve ``engine_cls``, most preferred first."""
    found = [e for e in registry.weight_sync.entries() if e.name != AUTO and e.obj.serves(engine_cls)]
    return [e.name for e in sorted(found, key=lambda e: -e.obj.preference)]


def backend_class(config: Any, registry: Any) -> type[WeightSync] | None:
    """The backend ``rollout.weight_sync`` picks for ``rollout.name`` in this process (``auto``: the most preferred
    usable one; None when no backend serves the engine: it loads weights its own way). A named backend that cannot
    run here is an error naming the key, the value and the reason."""
    name = config.rollout.weight_sync
    engine = registry.rollout.get(config.rollout.name)
    if name != AUTO:
        chosen: type[WeightSync] = registry.weight_sync.get(name)
        reason = unusable_reason(chosen, config)
        if reason:
            usable = [b for b in backends_of(registry, engine) if not unusable_reason(registry.weight_sync.get(b),
                                                                                      config)]
            raise ConfigError(f"rollout.weight_sync={name} cannot run here: {reason.rstrip('.')}. Use "
                              f"rollout.weight_sync=auto{' or one of: ' + ', '.join(usable) if usable else ''}.")
        return chosen
    for candidate in backends_of(registry, engine):
        cls = registry.weight_sync.get(candidate)
        if not unusable_reason(cls, config):
            return cls
    return None


class Auto:
    """The most preferred backend of the engine that can run in its process (``rollout.weight_sync=auto``)."""


@hookimpl
def rlforge_register(registry):
    registry.weight_sync.register(AUTO, Auto, description="the engine's most preferred backend that runs here")
    registry.collect_mode.register("sync_stats", collect_sync_stats)
