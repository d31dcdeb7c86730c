"""``torchrun`` controller: several processes on one machine without Ray, started by ``torchrun``.

    torchrun --nproc-per-node 4 -m rlforge.cli fit --algo grpo trainer.controller=torchrun \\
        strategy.name=fsdp strategy.num_processes=4

Every process runs the same command. Rank 0 drives (HybridFlow's single controller, as with Ray): it runs the
Trainer (data, rewards, advantages, loggers, checkpoints) and is also rank 0 of the worker groups. The other
ranks serve it: ``Trainer.fit`` on them builds nothing but their ``RankWorker`` s (``follow``), runs what rank 0
sends and returns ``{"rank": r}`` when the run ends. Every process sets up its workers from its own (identical)
config, in the same order. The dataflow, the dispatch and the checkpoints are the Ray controller's
(``groups.GroupController``); only the transport differs: rank 0 scatters ``(role, method, per-rank arguments)``
over a gloo control group, every rank runs its part (the collectives inside line up), and the results come back
by ``gather_object``.

Each process holds one rank of every role the run places (its actor rank; with a critic its critic rank; a plugin's
roles, such as the ``model`` reward manager's ``reward_model``): the roles share the processes and the default
process group (gloo on CPU, NCCL for CUDA tensors). If a process dies, torchrun stops the others.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rlforge.controller.groups import GroupController, check_layout, rank_module_class
from rlforge.controller.remote import WorkerGroup, placed_roles
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.pipeline import PIPELINES

if TYPE_CHECKING:
    from rlforge.build import Builder

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
CONTROL_TIMEOUT = timedelta(hours=6)  # ranks > 0 wait this long for rank 0's next call (rewards, validation)
STOP = "__stop__"


def _join(config: Any) -> tuple[int, int, Any]:
    """Join the processes torchrun started: (rank, world size, the control group)."""
    import torch

    missing = [k for k in LAUNCH_ENV if k not in os.environ]
    if missing:
        raise ConfigError(
            f"trainer.controller=torchrun runs under torchrun: torchrun --nproc-per-node "
            f"{config.strategy.num_processes} -m rlforge.cli fit ... (missing environment: {', '.join(missing)})."
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.strategy.num_processes:
        raise ConfigError(f"torchrun started {world} processes but strategy.num_processes="
                          f"{config.strategy.num_processes}: make them equal.")
    if not torch.distributed.is_initialized():
        gpu = torch.cuda.is_available() and config.strategy.device != "cpu"
        torch.distributed.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
    return rank, world, torch.distributed.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


class Channel:
    """Rank 0's calls to every process; ``workers``: this process's ``RankWorker`` per role."""

    def __init__(self, group: Any, rank: int, world: int, workers: dict[str, Any]) -> None:
        self.group, self.rank, self.world, self.workers = group, rank, world, workers
        self.busy = False  # a call is in flight (after a failure in it, the ranks may be stuck in a collective)

    def run(self, role: str, method: str, args: list[tuple | None]) -> list[Any]:
        """On rank 0: ``method(*args[r])`` on each rank ``r`` whose args are not None; their results in rank order."""
        import torch

        self.busy = True
        box: list[Any] = [None]
        torch.distributed.scatter_object_list(box, [(role, method, a) for a in args], src=0, group=self.group)
        results: list[Any] = [None] * self.world
        torch.distributed.gather_object(self._execute(role, method, args[0]), results, dst=0, group=self.group)
        self.busy = False
        for rank, (status, value) in enumerate(results):
            if status == "error":
                raise value if isinstance(value, RLForgeError) else RLForgeError(
                    f"The {role} worker (rank {rank} of {self.world}) failed during '{method}': {value}")
        return [value for status, value in results if status == "ok"]

    def serve(self) -> None:
        """On ranks > 0: run rank 0's calls until it stops the run."""
        import torch

        while True:
            box: list[Any] = [None]
            torch.distributed.scatter_object_list(box, None, src=0, group=self.group)
            role, method, args = box[0]
            if method == STOP:
                return
            torch.distributed.gather_object(self._execute(role, method, args), None, dst=0, group=self.group)

    def stop(self) -> None:
        import torch

        if self.rank == 0 and not self.busy:
            try:
                torch.distributed.scatter_object_list([None], [("", STOP, None)] * self.world, src=0, group=self.group)
            except RuntimeError:  # the other ranks have left already: a SIGTERM reaches every rank torchrun started
                pass  # (gloo: "Connection closed by peer"), and nothing is left to stop

    def _execute(self, role: str, method: str, args: tuple | None) -> tuple[str, Any]:
        if args is None:
            return "skip", None
        try:
            return "ok", getattr(self.workers[role], method)(*args)
        except RLForgeError as exc:
            return "error", exc
        except Exception as exc:  # noqa: BLE001 - reported to rank 0 with its traceback
            return "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


class ChannelTransport:
    """One role's ranks in torchrun's processes, reached through the :class:`Channel`: a ``remote.WorkerGroup``'s
    transport."""

    def __init__(self, channel: Channel, role: str) -> None:
        self.channel, self.role = channel, role
        self.world_size = channel.world

    def call_each(self, method: str, args: list[tuple | None]) -> list[Any]:
        return self.channel.run(self.role, method, args)


def _workers(builder: Builder, rank: int, world: int, module: RLModule) -> dict[str, Any]:
    """This process's rank of each role the run places (``Builder.roles``: ``registry.role``'s worker classes). Every
    role has one rank per process (a role's own ``Role.ranks`` count is the Ray controller's)."""
    return {name: role.worker_class()(name, rank, world) for name, role in placed_roles(builder, module).items()}


class TorchrunController(GroupController):
    """Rank 0 of a torchrun launch: drives the run and dispatches the dataflow to every process."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        check_layout(config, registry.strategy.entry(config.strategy.name), needs_critic=False)
        pipeline = config.trainer.pipeline
        if PIPELINES[pipeline].own_rollout_weights:
            raise ConfigError(
                f"trainer.pipeline={pipeline} generates while the trainer trains, which trainer.controller=torchrun "
                f"does not support: its engines live in the training processes, where a generation would only queue "
                f"behind the update. Use trainer.controller=ray with ray.rollout_workers=1 (or more), "
                f"trainer.controller=local, or trainer.pipeline=sync (docs/pipelines.md)."
            )

    @staticmethod
    def follow(builder: Builder, module: RLModule) -> dict[str, Any] | None:
        """On ranks > 0: serve rank 0 until the run ends and return ``{"rank": r}``; None on rank 0 (it drives)."""
        if int(os.environ.get("RANK", "0")) == 0:
            return None
        rank, world, group = _join(builder.config)
        workers = _workers(builder, rank, world, module)
        try:
            for worker in workers.values():  # as rank 0 does, in the same order: their collectives line up
                worker.setup(builder.config, type(module), None)
            Channel(group, rank, world, workers).serve()
        finally:
            for worker in workers.values():
                worker.shutdown()
        return {"rank": rank}

    def __init__(self, builder: Builder, module: RLModule) -> None:
        config, reg = builder.config, builder.registry
        entry = reg.strategy.entry(config.strategy.name)
        check_layout(config, entry, module.needs_critic())
        module_cls = rank_module_class(module)
        self.config, self.module = config, module
        rank, world, group = _join(config)
        self.channel = Channel(group, rank, world, _workers(builder, rank, world, module))
        module.roles = frozenset()  # the driver loads no model (the tokenizer only): the ranks hold the trained ones
        module.configure_model()
        self.logprobs_match_actor = builder.capabilities("rollout").logprobs_match_actor
        dp = entry.capabilities.data_parallel_size(config)
        ranks = {role: world if reg.role.get(role).ranks else dp for role in self.channel.workers}
        self.groups = {role: WorkerGroup(role, type(worker), ChannelTransport(self.channel, role), config, reg,
                                         ranks[role]) for role, worker in self.channel.workers.items()}
        for worker in self.channel.workers.values():  # every process sets up its own (same config, same order)
            worker.setup(config, module_cls, None)
        self.reward = builder.reward(module.tokenizer, self.workers)

    def shutdown(self) -> None:
        self.reward.close()
        self.channel.stop()
        for worker in self.channel.workers.values():
            worker.shutdown()


@hookimpl
def rlforge_register(registry):
    registry.controller.register("torchrun", TorchrunController,
                                 description="processes started by torchrun on one machine, rank 0 drives (no Ray)")
