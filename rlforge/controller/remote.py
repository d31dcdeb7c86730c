"""Declared worker methods, roles and the worker groups that call them (HybridFlow's single controller).

A worker class marks each method the driver may call with ``rlforge.worker.remote``, naming how a call's arguments
are split over the group's ranks (a *dispatch mode*) and how the ranks' results are joined (a *collect mode*); both are
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
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.capabilities import declared_methods

if TYPE_CHECKING:
    from rlforge.build import Builder

@dataclass(frozen=True)
class Role:
    """A role of the dataflow (``registry.role``), which the controllers place on ranks.

    :param worker: the worker class its ranks run (a class or ``"module:Class"``, imported when a controller places
        the role): ``Class(role, rank, world_size)`` with :func:`rlforge.worker.remote` methods, ``setup(config, module_cls, master)``
        in a process of its own and ``build(builder, module)`` in the driver's (``ray_workers.WorkerProcess``).
    :param models: the models of ``RLModule`` each rank loads (``builder.module(roles=models)``).
    :param section: the config section of its batch options (``ppo_mini_batch_size``, ...: what the ``dp_update``
        dispatch reads); ``""``: the role's name.
    :param pool: where the Ray controller puts its ranks: ``"actor"`` beside the actor's ranks (each rank's resources
        split between the roles there), another name a placement group of its own; or a function of the config.
    :param ranks: the config key of its number of ranks (``reward.model.num_workers``; a pool of its own under Ray,
        while torchrun gives every role one rank per process). None: ``strategy.num_processes``, one process group laid
        out like the actor's.
    """

    worker: type | str
    models: tuple[str, ...] = ()
    section: str = ""
    pool: str | Callable[[Any], str] = "actor"
    ranks: str | None = None

    def worker_class(self) -> type:
        if isinstance(self.worker, type):
            return self.worker
        module, _, name = self.worker.partition(":")
        return getattr(importlib.import_module(module), name)

    def pool_of(self, config: Any) -> str:
        return self.pool(config) if callable(self.pool) else self.pool

    def ranks_of(self, config: Any) -> int:
        """Its number of ranks under the Ray controller."""
        from omegaconf import OmegaConf

        return int(OmegaConf.select(config, self.ranks)) if self.ranks else int(config.strategy.num_processes)

    def check(self, name: str, plugin: str, config: Any) -> None:
        """Refuse, naming the role and its plugin, a worker that cannot be imported or is not a ``WorkerProcess``,
        and a ``ranks`` key that does not give a positive number of ranks."""
        from omegaconf import OmegaConf

        from rlforge.controller.ray_workers import WorkerProcess

        where = f"The role '{name}' (registered by plugin '{plugin}')"
        if isinstance(self.worker, str) and not re.fullmatch(r"[\w.]+:\w+", self.worker):
            raise RLForgeError(f"{where} names its worker as {self.worker!r}; give a class or 'package.module:Class'.")
        try:
            worker = self.worker_class()
        except (ImportError, AttributeError) as e:
            raise RLForgeError(f"{where}: its worker {self.worker!r} cannot be imported: {e}") from None
        if not (isinstance(worker, type) and issubclass(worker, WorkerProcess)):
            raise RLForgeError(f"{where}: its worker {worker!r} is not a subclass of "
                               "rlforge.controller.ray_workers.WorkerProcess (docs/plugins.md, 'Add a role').")
        if self.ranks:
            value = OmegaConf.select(config, self.ranks, default=None)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RLForgeError(f"{where} takes its number of ranks from '{self.ranks}', which is {value!r}: it "
                                   "must be a config key holding a whole number >= 1.")


def placed_roles(builder: Builder, module: Any) -> dict[str, Role]:
    """The roles a controller places for ``module`` (``Builder.roles``), each checked (:meth:`Role.check`)."""
    out = {}
    for name in builder.roles(module):
        entry = builder.registry.role.entry(name)
        if not isinstance(entry.obj, Role):
            raise RLForgeError(f"The role '{name}' (registered by plugin '{entry.plugin}') is {entry.obj!r}, not a "
                               "rlforge.controller.remote.Role: register Role(worker=..., models=(...)).")
        entry.obj.check(name, entry.plugin, builder.config)
        out[name] = entry.obj
    return out


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
    """The ranks of one role over a transport, with every :func:`rlforge.worker.remote` method of ``worker_cls`` bound as a method
    of the group (split by its dispatch mode, joined by its collect mode). ``dp_size``: the data-parallel groups the
    ranks form (consecutive ranks of a tensor-parallel group see the same rows); ``config``: the run's config, which
    the modes read (mini-batch sizes, balancing)."""

    def __init__(self, role: str, worker_cls: type, transport: Transport, config: Any, registry: Any,
                 dp_size: int | None = None) -> None:
        self.role, self.transport, self.config = role, transport, config
        spec = registry.role.get(role) if role in registry.role else None
        self.section = (spec.section if spec is not None else "") or role  # its batch options' config section
        self.world_size = transport.world_size
        self.dp_size = dp_size or self.world_size
        self.methods = declared_methods(worker_cls)
        if not self.methods:
            raise RLForgeError(f"Role '{role}': {worker_cls.__qualname__} declares no @remote methods.")
        for name, spec in self.methods.items():
            fn = getattr(worker_cls, name)
            try:
                dispatch, collect = registry.dispatch_mode.get(spec.dispatch), registry.collect_mode.get(spec.collect)
            except RLForgeError as exc:
                raise RLForgeError(f"{worker_cls.__qualname__}.{name} (role '{role}'): {exc}") from None
            setattr(self, name, self._bind(name, spec.dispatch, dispatch, collect, fn))

    def _bind(self, name: str, mode: str, dispatch: Any, collect: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
        from rlforge.controller.dispatch import Shares

        signature = inspect.signature(fn)
        shown = signature.replace(parameters=list(signature.parameters.values())[1:])  # without the worker's self

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(None, *args, **kwargs)  # None stands for the worker's self
            except TypeError as exc:
                raise RLForgeError(f"{self.role}.{name}{shown}: {exc}") from None
            bound.apply_defaults()
            where = f"Dispatch mode '{mode}' (role '{self.role}', method {name})"
            try:
                shares = dispatch(self, bound.args[1:])
            except (TypeError, AttributeError) as exc:  # arguments the mode cannot split (not a Batch where one goes)
                given = ", ".join(type(a).__name__ for a in bound.args[1:])
                raise RLForgeError(f"{where} cannot split the arguments {self.role}.{name}({given}): "
                                   f"{type(exc).__name__}: {exc}. The batch modes (rows, dp_*, engine_rows) split "
                                   f"an rlforge.batch.Batch given first.") from None
            if not isinstance(shares, Shares):
                raise RLForgeError(f"{where} returned {type(shares).__name__}, not a "
                                   "rlforge.controller.dispatch.Shares.")
            if len(shares.args) != self.world_size:
                raise RLForgeError(f"{where} gave {len(shares.args)} entries in Shares.args for {self.world_size} "
                                   "ranks: give one per rank (None for a rank that sits out).")
            results = self.transport.call_each(name, shares.args)
            return collect(self, results[::shares.keep], shares)

        return call

    def __getattr__(self, name: str) -> Any:
        from rlforge.errors import UndeclaredMethod, did_you_mean

        methods = self.__dict__.get("methods")
        if methods is None or name.startswith("_"):
            raise AttributeError(name)
        raise UndeclaredMethod(f"Role '{self.role}' has no method {name!r} the driver can call: its declared (@remote) "
                             f"methods are {', '.join(sorted(methods))}.{did_you_mean(name, methods)} A worker "
                             "method is callable through its group when it is declared with @remote.")

    def __repr__(self) -> str:
        return f"WorkerGroup({self.role!r}, {self.world_size} ranks, {len(self.methods)} methods)"


def _critic_pool(config: Any) -> str:
    return "actor" if config.ray.colocate_critic else "critic"


@hookimpl
def rlforge_register(registry):
    workers = "rlforge.controller.ray_workers"
    registry.role.register("actor", Role(f"{workers}:ActorRank", ("actor", "ref")),
                           description="the policy, its reference model and (hybrid engine) the rollout engine")
    registry.role.register("critic", Role(f"{workers}:CriticRank", ("critic",), pool=_critic_pool),
                           description="the value model")
    registry.role.register("rollout", Role(f"{workers}:RolloutWorker", ("actor",), pool="rollout",
                                           ranks="ray.rollout_workers"),
                           description="the policy and its rollout engine on resources of their own (ray)")
