"""``ray`` controller: the Trainer process drives worker groups of Ray actors (HybridFlow's single controller).

- Worker groups, one Ray actor per data-parallel rank (``strategy.num_processes``): ``actor`` (policy,
  reference model and rollout engine colocated) and ``critic`` (algorithms with a value model). Each group is
  its own torch.distributed world; the strategy (``fsdp``) shards the models over it. Each actor rank owns one
  rollout engine: the hf engine generates with a full replica of the policy, an engine that keeps its own weights
  (vllm) gets the gathered weight stream and the rank keeps no replica.
- With ``ray.rollout_workers`` >= 1 the engines move to a ``rollout`` group of their own (verl's one-step-off and
  fully-async layout): those workers hold the policy and its engine only; the actor ranks hold neither engine nor
  replica. Every weight sync gathers the actor's full weights (all ranks; rank 0 returns them), puts them in the
  object store once and has every rollout worker load them. ``snapshot_weights`` is that object-store copy, taken
  now and loaded later (``trainer.pipeline=async``). The off-policy pipelines need this group: their rollout thread
  calls it while the trainer's thread calls the actor group.
- Resource pools: a placement group with one bundle per rank (``ray.cpus_per_worker``/``gpus_per_worker``);
  each role names its pool (``Role.pool``): the critic shares the actor's bundles (``ray.colocate_critic``) or gets
  a pool of its own, a plugin's role likewise (the ``model`` reward manager's ``reward_model`` has a pool of
  ``reward.model.num_workers`` ranks); the roles on one pool split each bundle's resources; the rollout group
  always has a pool of its own (``ray.rollout_cpus_per_worker``/``rollout_gpus_per_worker``). Placement that
  cannot be satisfied within ``ray.placement_timeout_s`` fails with the cluster's resources in the message; on a
  local cluster (no ``ray.address``), pools that need more than it has fail at once.
- Dispatch: prompts are split over the engines' workers for generation; training batches are split so that every
  rank gets its slice of every mini-batch (``shard_for_update``); results are gathered in order.
- The reward manager runs here, in the driver (a learned reward model scores on its ``reward_model`` group). The
  driver loads no model (the tokenizer only): a checkpoint's plain HF ``actor/`` is written from the weights the
  actor ranks gather (``groups.GroupController.state_dict``). Each rank builds its own role's models through
  ``rlforge.build``.
- A worker that dies or fails ends the run with a ``WorkerError`` naming its role, rank, pid and node.

Ray is imported when this controller is built, never by the core.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rlforge.config.schema import option
from rlforge.controller.dispatch import PerRank
from rlforge.controller.groups import GroupController, check_layout, rank_module_class
from rlforge.controller.remote import WorkerGroup, placed_roles
from rlforge.errors import ConfigError, RLForgeError, first_line
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.pipeline import PIPELINES
from rlforge.weight_sync import SyncStats

if TYPE_CHECKING:
    from rlforge.build import Builder
    from rlforge.registry import Entry


@dataclass
class RayConfig:
    """The Ray cluster of ``trainer.controller=ray`` (see docs/distributed.md)."""

    address: Optional[str] = None  # None = start a local cluster; auto | host:port = join a running cluster
    num_cpus: Optional[int] = option(None, ge=1)  # CPUs of the local cluster; None = all of this machine's
    cpus_per_worker: float = option(1.0, gt=0)  # CPUs per rank's placement bundle (shared by the roles colocated on it)
    gpus_per_worker: Optional[float] = option(None, ge=0)  # GPUs per bundle; None = 1 if the cluster has GPUs and strategy.device != cpu
    colocate_critic: bool = True  # critic ranks share the actor's bundles (one pool); False = a pool of its own
    placement_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD (Ray placement group)
    placement_timeout_s: float = option(120.0, gt=0)  # fail with a clear error if the workers cannot be placed by then
    rollout_workers: int = option(0, ge=0)  # 0 = engines in the actor ranks (hybrid engine); N = a rollout group of N workers (one_step_off, async need it)
    rollout_cpus_per_worker: float = option(1.0, gt=0)  # CPUs per rollout worker's placement bundle
    rollout_gpus_per_worker: Optional[float] = option(None, ge=0)  # GPUs per rollout worker; None = as ray.gpus_per_worker resolves


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
SHUTDOWN_WAIT_S = 10.0
DEATH_GRACE_S = 5.0  # after a failed collective, how long to look for a dead peer to blame


class WorkerError(RLForgeError):
    """A Ray worker died or failed; the message names its role, rank, process and the operation."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RLForgeError(
            "trainer.controller=ray needs Ray, which is not installed: pip install 'rlforge[ray]'."
        ) from None
    return ray


def check_config(config: Any, strategy: Entry[Any], needs_critic: bool) -> None:
    """:func:`rlforge.controller.groups.check_layout` (``strategy``: its registry entry) and the Ray options."""
    check_layout(config, strategy, needs_critic)
    if config.ray.placement_strategy not in PLACEMENT_STRATEGIES:
        raise ConfigError(
            f"ray.placement_strategy='{config.ray.placement_strategy}'. Allowed: {', '.join(PLACEMENT_STRATEGIES)}."
        )
    pipeline = config.trainer.pipeline
    if PIPELINES[pipeline].own_rollout_weights and not config.ray.rollout_workers:
        raise ConfigError(
            f"trainer.pipeline={pipeline} with trainer.controller=ray generates on a rollout worker group of its own "
            f"while the actor ranks train: set ray.rollout_workers=1 (or more; got 0). With 0 the engines live in the "
            f"actor ranks (the hybrid engine), where a generation would only queue behind the update "
            f"(docs/pipelines.md)."
        )


def _plain_resources(resources: dict[str, float]) -> dict[str, float]:
    """A Ray resource dict without the entries Ray adds for each placement group and bundle."""
    return {k: v for k, v in resources.items() if "_group_" not in k}


class ResourcePool:
    """A placement group with one bundle per rank; the roles colocated on it split each bundle."""

    def __init__(self, ray: Any, name: str, ranks: int, cpus: float, gpus: float, cfg: Any, keys: str) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group

        self.ranks, self.cpus, self.gpus = ranks, cpus, gpus
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        self.pg = placement_group([dict(bundle) for _ in range(ranks)], strategy=cfg.placement_strategy)
        if not self.pg.wait(timeout_seconds=cfg.placement_timeout_s):
            remove_placement_group(self.pg)
            raise RLForgeError(
                f"Ray could not place the '{name}' pool ({ranks} x {bundle}, {cfg.placement_strategy}) within "
                f"ray.placement_timeout_s={cfg.placement_timeout_s}s. Cluster resources: "
                f"{_plain_resources(ray.cluster_resources())}, free: {_plain_resources(ray.available_resources())}. "
                f"Lower {keys}, or add nodes."
            )

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)


class RayTransport:
    """The ranks of one role as Ray actors (``worker``: a ``ray_workers`` class) on a resource pool: the transport of
    a ``remote.WorkerGroup``. A failing or dead rank becomes a :class:`WorkerError` naming it."""

    def __init__(self, ray: Any, role: str, worker: type, pool: ResourcePool, share: float, n: int) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.role = ray, role
        remote = ray.remote(worker)
        self.handles = [
            remote.options(
                num_cpus=pool.cpus * share, num_gpus=pool.gpus * share, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pool.pg,
                                                                     placement_group_bundle_index=rank),
            ).remote(role, rank, n)
            for rank in range(n)
        ]
        self.procs = ["starting"] * n

    @property
    def world_size(self) -> int:
        return len(self.handles)

    def call_each(self, method: str, args: list[tuple | None]) -> list[Any]:
        """Run ``method(*args[rank])`` on each rank whose args are not None; their results in rank order."""
        refs = {getattr(self.handles[r], method).remote(*a): r for r, a in enumerate(args) if a is not None}
        results: dict[int, Any] = {}
        while refs:  # first failure first: a dead rank's peers may be blocked in a collective
            ready, _ = self.ray.wait(list(refs), num_returns=1)
            rank = refs.pop(ready[0])
            try:
                results[rank] = self.ray.get(ready[0])
            except Exception as exc:
                raise self._error(exc, rank, method, refs) from None
        return [results[r] for r in sorted(results)]

    def _error(self, exc: Exception, rank: int, method: str, others: dict[Any, int]) -> Exception:
        """The error to raise for ``rank``'s failure. A collective that fails because a peer died is reported as
        that peer's death, so the peers still running get a moment to report theirs."""
        from ray.exceptions import RayActorError, RayTaskError

        if isinstance(exc, RayTaskError) and others:
            done, _ = self.ray.wait(list(others), num_returns=len(others), timeout=DEATH_GRACE_S)
            for ref in done:
                try:
                    self.ray.get(ref)
                except RayActorError as dead:
                    return self._error(dead, others[ref], method, {})
                except Exception:
                    continue
        who = f"The {self.role} worker (rank {rank} of {self.world_size}, {self.procs[rank]})"
        if isinstance(exc, RayActorError):
            text = " ".join(str(exc).split())
            exit_type = re.search(r"Worker exit type: (\w+)", text)
            reason = text.split(". ")[0] + (f" (exit type {exit_type.group(1)})" if exit_type else "")
            return WorkerError(
                f"{who} died during '{method}': {reason}. It was killed, ran out of memory or crashed; its log is "
                f"under the Ray session's logs/ folder. Rerun the same command with trainer.resume=auto to continue "
                f"from the last checkpoint."
            )
        if not isinstance(exc, RayTaskError):
            return exc
        if isinstance(exc.cause, RLForgeError):  # a user-fixable error raised in the worker: keep it as it is
            return exc.cause
        cause = exc.cause
        # the worker's traceback: Ray's error of a builtin exception type (RayTaskError(AttributeError)) may lack
        # traceback_str, and its text then holds the traceback
        trace = exc.__dict__.get("traceback_str") or str(exc)
        return WorkerError(f"{who} failed during '{method}': {type(cause).__name__}: {cause}\n{trace}")

    def kill(self) -> None:
        pending = [h.shutdown.remote() for h in self.handles]
        self.ray.wait(pending, num_returns=len(pending), timeout=SHUTDOWN_WAIT_S)
        for h in self.handles:
            self.ray.kill(h)


class RayController(GroupController):
    """Starts (or joins) a Ray cluster, places the worker groups, and dispatches the dataflow to them."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        check_config(config, registry.strategy.entry(config.strategy.name), needs_critic=False)

    def __init__(self, builder: Builder, module: RLModule) -> None:
        config, reg = builder.config, builder.registry
        entry = reg.strategy.entry(config.strategy.name)
        self.strategy_caps = entry.capabilities
        check_config(config, entry, module.needs_critic())
        ray = self.ray = _import_ray()
        for plugin_file in builder.plugins.file_modules():  # the workers load them too, but unpickle classes first
            ray.cloudpickle.register_pickle_by_value(plugin_file)
        self.config, self.module = config, module
        module.roles = frozenset()  # the driver loads no model (the tokenizer only): the ranks hold the trained ones
        module.configure_model()
        self.started_ray = self._connect(config.ray)
        self.reward: Any = None
        # the engines generate with a replica kept equal to the actor: their log-probs are the actor's if the
        # engine's are with the actor itself
        self.logprobs_match_actor = builder.capabilities("rollout").logprobs_match_actor
        self.registry = reg
        self.pools: list[ResourcePool] = []
        self.transports: list[RayTransport] = []
        self.masters: dict[str, tuple[str, int]] = {}
        self.groups: dict[str, WorkerGroup] = {}
        self.rollout = None
        try:
            cfg = config.ray
            gpus = cfg.gpus_per_worker
            if gpus is None:
                gpus = 1.0 if ray.cluster_resources().get("GPU", 0) and config.strategy.device != "cpu" else 0.0
            self._place(list(placed_roles(builder, module)), rank_module_class(module), gpus)
            if cfg.rollout_workers:
                self.rollout = self._rollout_group(cfg, gpus, rank_module_class(module))
                self.sync_weights()  # the engines start from model.path: give them the actor's weights
        except BaseException:
            self.shutdown()
            raise
        self.reward = builder.reward(module.tokenizer, self.workers)

    def _connect(self, cfg: Any) -> bool:
        """Join this process's Ray session, the cluster at ``ray.address``, or start a local one."""
        if self.ray.is_initialized():
            return False
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        with _sigterm_kept():
            self._init(cfg)
        return True

    def _init(self, cfg: Any) -> None:
        if cfg.address:
            _reachable(cfg.address)
            try:
                self.ray.init(address=cfg.address)
            except ConnectionError as exc:  # 'auto' with no cluster running here
                raise RLForgeError(f"ray.address={cfg.address}: {first_line(exc)}. Start the cluster first (ray start "
                                   f"--head), give its address (host:port), or leave ray.address unset for a private "
                                   f"Ray instance of this run.") from None
        else:
            self.ray.init(num_cpus=cfg.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1")

    def _pool(self, name: str, ranks: int, cpus: float, gpus: float, keys: str) -> ResourcePool:
        """A placement group of ``ranks`` bundles; ``keys``: the options that size it, named when it cannot be placed."""
        if not self.config.ray.address:  # a local cluster cannot grow: what it cannot hold is refused at once
            self._check_fits(name, ranks, {"CPU": cpus, "GPU": gpus}, keys)
        pool = ResourcePool(self.ray, name, ranks, cpus, gpus, self.config.ray, keys)
        self.pools.append(pool)
        return pool

    def _check_fits(self, name: str, ranks: int, bundle: dict[str, float], keys: str) -> None:
        """Refuse a pool that, with the pools already placed, needs more CPUs or GPUs than the local cluster has (it
        would wait ``ray.placement_timeout_s`` for resources that cannot come)."""
        total = _plain_resources(self.ray.cluster_resources())
        for resource, each in bundle.items():
            placed = sum(p.ranks * (p.cpus if resource == "CPU" else p.gpus) for p in self.pools)
            if each and placed + ranks * each > total.get(resource, 0.0) + 1e-9:
                raise RLForgeError(
                    f"Ray cannot place the '{name}' pool ({ranks} x {resource} {each:g}): with the pools already "
                    f"placed ({placed:g} {resource}) this run needs {placed + ranks * each:g} {resource}, and the local "
                    f"cluster has {total.get(resource, 0.0):g} (ray.num_cpus={self.config.ray.num_cpus}; None = all of "
                    f"this machine's). Lower {keys}, or give the cluster more (ray.num_cpus, or ray.address of a "
                    f"bigger one).")

    def _group(self, role: str, pool: ResourcePool, share: float, n: int, dp: int) -> WorkerGroup:
        """``n`` Ray actors of ``role``'s worker class (``registry.role``) on ``pool``, started (not set up yet)."""
        worker = self.registry.role.get(role).worker_class()
        transport = RayTransport(self.ray, role, worker, pool, share, n)
        self.transports.append(transport)
        group = WorkerGroup(role, worker, transport, self.config, self.registry, dp)
        addresses = group.address()
        transport.procs = [f"pid {pid} on {ip}" for ip, _, pid in addresses]
        self.masters[role] = addresses[0][:2]  # rank 0's (IP, free port): the process group's rendezvous
        return group

    def _place(self, roles: list[str], module_cls: type, gpus: float) -> None:
        """Each role's ranks on its resource pool (``Role.pool``): the roles on one pool split each of its bundles;
        a role with ``Role.ranks`` has that many ranks (and as many data-parallel groups), else
        ``strategy.num_processes`` in one process group like the actor's."""
        config, cfg = self.config, self.config.ray
        pools: dict[str, list[str]] = {}
        for role in roles:
            pools.setdefault(self.registry.role.get(role).pool_of(config), []).append(role)
        for name, members in pools.items():
            specs = {role: self.registry.role.get(role) for role in members}
            counts = {role: spec.ranks_of(config) for role, spec in specs.items()}
            if len(set(counts.values())) > 1:
                raise ConfigError(f"Roles {', '.join(members)} share the Ray resource pool '{name}' but have different "
                                  f"numbers of ranks ({counts}): give the role with its own count a pool of its own.")
            n = counts[members[0]]
            keys = sorted({spec.ranks or "strategy.num_processes" for spec in specs.values()})
            pool = self._pool(name, n, cfg.cpus_per_worker, gpus, f"{' or '.join(keys)} or ray.cpus_per_worker / "
                                                                  f"ray.gpus_per_worker")
            for role in members:
                dp = n if specs[role].ranks else self.strategy_caps.data_parallel_size(config)
                group = self.groups[role] = self._group(role, pool, 1.0 / len(members), n, dp)
                group.setup(config, module_cls, self.masters[role], not cfg.rollout_workers)

    def _rollout_group(self, cfg: Any, actor_gpus: float, module_cls: type) -> WorkerGroup:
        """``ray.rollout_workers`` workers, each with the policy and an engine, on a pool of their own."""
        n = cfg.rollout_workers
        gpus = actor_gpus if cfg.rollout_gpus_per_worker is None else cfg.rollout_gpus_per_worker
        keys = "ray.rollout_workers or ray.rollout_cpus_per_worker / ray.rollout_gpus_per_worker"
        group = self._group("rollout", self._pool("rollout", n, cfg.rollout_cpus_per_worker, gpus, keys), 1.0, n, n)
        group.setup(self.config, module_cls, None)
        return group

    def _share(self, obj: Any) -> Any:
        return self.ray.put(obj)  # one copy in the object store for all ranks

    # --- weights for a rollout group ------------------------------------------------------------------
    def sync_weights(self) -> SyncStats:
        if self.rollout is None:
            return super().sync_weights()
        start = time.perf_counter()
        stats = self.load_weights(self.snapshot_weights())
        return SyncStats(stats.bytes, time.perf_counter() - start)  # the gather and the object store too

    def snapshot_weights(self) -> Any:
        """The actor's full weights as they are now, for the rollout group (``ray.rollout_workers``): gathered by every
        actor rank, returned by rank 0, put once in the object store. The reference to that copy is the snapshot
        (freed when the last reference is dropped)."""
        assert self.rollout is not None, "check_config: the off-policy pipelines need ray.rollout_workers >= 1"
        return self.ray.put(self.actor.full_weights())

    def load_weights(self, snapshot: Any) -> SyncStats:
        """Every rollout worker loads a :meth:`snapshot_weights` copy; the bytes they received, the slowest one's
        seconds. Called by
        the pipelines' rollout thread while the trainer's thread uses the actor group."""
        return self.rollout.load_weights(snapshot)

    # --- checkpoints: the rollout workers' RNG (a sync run samples from it) ---------------------------
    def state_dict(self, staging: Path, background: bool = False) -> dict[str, Any]:
        state = super().state_dict(staging, background)
        if self.rollout is not None:
            state["rng"]["rollout"] = self.rollout.rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        super().load_state_dict(state, folder)
        rngs = state.get("rng", {}).get("rollout") if self.rollout is not None else None
        if rngs is not None and len(rngs) == self.rollout.world_size:
            self.rollout.set_rng(PerRank(rngs))

    def shutdown(self) -> None:
        if self.reward is not None:  # None when placing the roles failed (the manager is built after them)
            self.reward.close()
        for transport in self.transports:
            transport.kill()
        # the private instance's shutdown removes every placement group, and its GCS may be gone already (a SIGTERM
        # to the process group ends it too), where removing one waits for the GCS forever
        for pool in () if self.started_ray else self.pools:
            pool.remove()
        self.transports, self.pools = [], []
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False


@hookimpl
def rlforge_register(registry):
    registry.controller.register(
        "ray", RayController, config=RayConfig, description="worker groups as Ray actors on placement groups (pip install rlforge[ray])"
    )



@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """``ray.init`` makes a SIGTERM exit the driver at once (``sys.exit``; its workers' shutdown then aborted the
    process with a dump of Ray's stack): the handler the process had (the ``rlforge`` command's, which stops the run
    as Ctrl-C does) is put back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:  # (None: set outside Python, cannot be restored)
            signal.signal(signal.SIGTERM, previous)


def _reachable(address: str) -> None:
    """Refuse a ``ray.address`` (``host:port`` or ``ray://host:port``) nothing answers at (``rlforge.reach``): Ray
    itself retries such an address for ever. ``auto`` finds the cluster itself."""
    from rlforge import reach

    why = "" if address == "auto" else reach.silent(address)
    if why:
        raise RLForgeError(f"ray.address={address}: {why}. Check the address of the cluster's head (ray status on "
                           f"it), or leave ray.address unset for a private Ray instance of this run.")
