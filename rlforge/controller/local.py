"""``local`` controller: every worker in this process (the default; no Ray)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rlforge.controller.groups import GroupController
from rlforge.controller.remote import InProcess, WorkerGroup, placed_roles
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.module_checks import check_configured

if TYPE_CHECKING:
    import torch

    from rlforge.build import Builder
    from rlforge.weight_sync import SyncStats


class LocalController(GroupController):
    """One rank of each role (the actor with its rollout engine, the critic, a plugin's roles) and the reward manager,
    in this process: the dataflow and the checkpoints go through the same worker groups and dispatch as the
    multi-process controllers (``groups.py``), over the ``InProcess`` transport."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        if config.strategy.num_processes != 1 or registry.strategy.entry(config.strategy.name).capabilities.sharded:
            raise ConfigError(
                f"strategy.name={config.strategy.name} with strategy.num_processes={config.strategy.num_processes} "
                f"needs one process per rank, which the local controller (one process) does not start. "
                f"Set trainer.controller=ray, or torchrun under torchrun (see docs/distributed.md)."
            )

    def __init__(self, builder: Builder, module: RLModule) -> None:
        self.config, self.module = builder.config, module
        module.configure_model()
        check_configured(module)
        reg = builder.registry
        # this process's one rank of each role, over the driver's module: no copy, no mirror
        self.ranks = {name: role.worker_class()(name, 0, 1) for name, role in placed_roles(builder, module).items()}
        for rank in self.ranks.values():
            rank.build(builder, module, initial_sync=False)
        self.groups = {role: WorkerGroup(role, type(rank), InProcess([rank]), self.config, reg)
                       for role, rank in self.ranks.items()}
        engine = builder.capabilities("rollout")
        self.logprobs_match_actor = engine.logprobs_match_actor
        # an engine that takes overlapping calls (vllm's async engine): agent loops send each turn at once
        self.continuous_batching = engine.continuous_batching
        # its non-blocking request, awaited on the agent rollout's event loop under continuous batching
        self.submit_tokens = getattr(getattr(self.ranks.get("actor"), "rollout", None), "submit_tokens", None)
        self.reward = builder.reward(module.tokenizer, self.workers)

    def snapshot_weights(self) -> list[tuple[str, torch.Tensor]]:
        """A copy of the weights :meth:`sync_weights` gives the engine now, for :meth:`load_weights` to give it later
        (``trainer.pipeline=async``: the actor trains on while the engine finishes older generations)."""
        return [(name, tensor.clone()) for name, tensor in self.ranks["actor"].weights_for_engine()]

    def load_weights(self, snapshot: Iterable[tuple[str, torch.Tensor]]) -> SyncStats:
        """Give the engine these weights (a :meth:`snapshot_weights` copy, from the thread that generates)."""
        return self.ranks["actor"].load_weights(snapshot)

    def shutdown(self) -> None:
        from rlforge.controller.ray_workers import WorkerProcess

        for rank in self.ranks.values():  # its engine; the process group (if any) is not the controller's to end
            WorkerProcess.shutdown(rank)
        self.reward.close()


@hookimpl
def rlforge_register(registry):
    registry.controller.register("local", LocalController, description="all workers in this process")
