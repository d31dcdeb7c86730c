"""Declared worker methods, roles and the worker groups that call them (HybridFlow's single controller).

A worker class marks each method the driver may call with :func:`remote`, naming how a call's arguments are split
over the group's ranks (a *dispatch mode*) and how the ranks' results are joined (a *collect mode*); both are
registry kinds (``registry.dispatch_mode``, ``registry.collect_mode``: ``rlforge/controller/dispatch.py`` registers
the built-in ones, a plugin may add its own). A :class:`WorkerGroup` binds every declared method of its worker class
when it is built, over a *transport* that runs one method on chosen ranks: the ranks in this process
(:class:`InProcess`, the local controller), Ray actors (``ray_controller.RayTransport``) or the processes torchrun
started (``torchrun.ChannelTransport``). So ``group.compute_log_probs(batch, "ref")`` splits the batch over the
data-parallel groups, runs each share on its ranks and puts the per-row results back in order, whatever the transport:
an operation is written once, where the worker defines it, and called like a local method.

A *role* (``registry.role``) is a worker class plus the models its ranks load (``Role``); the controllers place the
roles an algorithm needs (``actor``, ``critic``; the Ray controller's ``rollout`` group) on ranks and resource pools.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl

REMOTE = "__rlforge_remote__"


@dataclass(frozen=True)
class Remote:
    """How a worker method is called through a group: the names of its dispatch and collect modes."""

    dispatch: str = "all"
    collect: str = "all"


def remote(dispatch: str = "all", collect: str = "all") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a worker method as callable through a :class:`WorkerGroup`.

    ``dispatch``: ``all`` (every rank, the same arguments; a ``PerRank`` argument gives each rank its own value),
    ``dp_score`` / ``dp_update`` (the first argument, a Batch, split over data-parallel groups for a forward pass or
    an update), ``engine_rows`` / ``engine_requests`` (prompts split over the ranks' rollout engines, each seeded).
    ``collect``: ``all`` (the list, in rank order), ``first``, ``max``, ``concat`` (Batches or per-row tensors, back
    in row order), ``flatten``. Call arguments are positional or keyword, as the method's signature allows."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, REMOTE, Remote(dispatch, collect))
        return fn

    return mark


def declared(cls: type) -> dict[str, Remote]:
    """The methods of ``cls`` marked with :func:`remote`, in it or a base class (an override keeps the mark)."""
    out: dict[str, Remote] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            spec = getattr(value, REMOTE, None)
            if isinstance(spec, Remote):
                out[name] = spec
    return out


@dataclass(frozen=True)
class Role:
    """A role of the dataflow: the worker class its ranks run (a class or ``"module:Class"``, imported when a
    controller places the role) and the models of ``RLModule`` each rank loads (``builder.module(roles=models)``)."""

    worker: type | str
    models: tuple[str, ...]

    def worker_class(self) -> type:
        if isinstance(self.worker, type):
            return self.worker
        module, _, name = self.worker.partition(":")
        return getattr(importlib.import_module(module), name)


class Transport(Protocol):
    """Runs one method on chosen ranks of a group: ``call_each(method, args)`` runs ``method(*args[r])`` on each rank
    ``r`` whose args are not None and returns their results in rank order."""

    @property
    def world_size(self) -> int: ...

    def call_each(self, method: str, args: list[tuple | None]) -> list[Any]: ...


class InProcess:
    """The transport of ranks that live in this process (the local controller's one rank of each role)."""

    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers
        self.world_size = len(workers)

    def call_each(self, method: str, args: list[tuple | None]) -> list[Any]:
        return [getattr(w, method)(*a) for w, a in zip(self.workers, args) if a is not None]


class WorkerGroup:
    """The ranks of one role over a transport, with every :func:`remote` method of ``worker_cls`` bound as a method
    of the group (split by its dispatch mode, joined by its collect mode). ``dp_size``: the data-parallel groups the
    ranks form (consecutive ranks of a tensor-parallel group see the same rows); ``config``: the run's config, which
    the modes read (mini-batch sizes, balancing)."""

    def __init__(self, role: str, worker_cls: type, transport: Transport, config: Any, registry: Any,
                 dp_size: int | None = None) -> None:
        self.role, self.transport, self.config = role, transport, config
        self.world_size = transport.world_size
        self.dp_size = dp_size or self.world_size
        self.methods = declared(worker_cls)
        if not self.methods:
            raise RLForgeError(f"Role '{role}': {worker_cls.__qualname__} declares no @remote methods.")
        for name, spec in self.methods.items():
            fn = getattr(worker_cls, name)
            try:
                dispatch, collect = registry.dispatch_mode.get(spec.dispatch), registry.collect_mode.get(spec.collect)
            except RLForgeError as exc:
                raise RLForgeError(f"{worker_cls.__qualname__}.{name} (role '{role}'): {exc}") from None
            setattr(self, name, self._bind(name, inspect.signature(fn), dispatch, collect, fn))

    def _bind(self, name: str, signature: inspect.Signature, dispatch: Any, collect: Any,
              fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(None, *args, **kwargs)  # None stands for the worker's self
            bound.apply_defaults()
            shares = dispatch(self, bound.args[1:])
            results = self.transport.call_each(name, shares.args)
            return collect(self, results[::shares.keep], shares)

        return call

    if TYPE_CHECKING:  # the bound methods are set per worker class
        def __getattr__(self, name: str) -> Any: ...

    def __repr__(self) -> str:
        return f"WorkerGroup({self.role!r}, {self.world_size} ranks, {len(self.methods)} methods)"


@hookimpl
def rlforge_register(registry):
    workers = "rlforge.controller.ray_workers"
    registry.role.register("actor", Role(f"{workers}:RankWorker", ("actor", "ref")),
                           description="the policy, its reference model and (hybrid engine) the rollout engine")
    registry.role.register("critic", Role(f"{workers}:RankWorker", ("critic",)), description="the value model")
    registry.role.register("rollout", Role(f"{workers}:RolloutWorker", ("actor",)),
                           description="the policy and its rollout engine on resources of their own (ray)")
