"""``local`` controller: every worker in this process (the default; no Ray)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.controller.groups import GroupController
from rlforge.controller.remote import InProcess, WorkerGroup, placed_roles
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule

if TYPE_CHECKING:
    import torch

    from rlforge.build import Builder
    from rlforge.protocols import RewardManager
    from rlforge.weight_sync import SyncStats

log = logging.getLogger("rlforge")


class LocalController(GroupController):
    """One rank of each role (the actor with its rollout engine, the critic, a plugin's roles) and the reward manager,
    in this process:
    the dataflow goes through the same worker groups and dispatch as the multi-process controllers (``groups.py``),
    over the ``InProcess`` transport; the checkpoint layout is this controller's own."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        if config.strategy.num_processes != 1 or registry.strategy.entry(config.strategy.name).capabilities.sharded:
            raise ConfigError(
                f"strategy.name={config.strategy.name} with strategy.num_processes={config.strategy.num_processes} "
                f"needs one process per rank, which the local controller (one process) does not start. "
                f"Set trainer.controller=ray, or torchrun under torchrun (see docs/distributed.md)."
            )
        ray = config.get("ray")
        if ray is not None and ray.get("rollout_workers"):
            log.warning("ray.rollout_workers=%s is ignored: trainer.controller=local generates in this process "
                        "(rollout workers are the Ray controller's; set trainer.controller=ray).", ray.rollout_workers)

    def __init__(self, builder: Builder, module: RLModule) -> None:
        self.config, self.module = builder.config, module
        module.configure_model()
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
        self.reward = builder.reward(module.tokenizer, self.workers)

    def snapshot_weights(self) -> list[tuple[str, torch.Tensor]]:
        """A copy of the weights :meth:`sync_weights` gives the engine now, for :meth:`load_weights` to give it later
        (``trainer.pipeline=async``: the actor trains on while the engine finishes older generations)."""
        return [(name, tensor.clone()) for name, tensor in self.ranks["actor"].weights_for_engine()]

    def load_weights(self, snapshot: Iterable[tuple[str, torch.Tensor]]) -> SyncStats:
        """Give the engine these weights (a :meth:`snapshot_weights` copy, from the thread that generates)."""
        return self.ranks["actor"].load_weights(snapshot)

    def _trained(self) -> dict[str, Any]:
        """The TrainWorker of each role that has state to checkpoint (actor first)."""
        return {role: self.ranks[role].worker for role, group in self.groups.items() if "state_dict" in group.methods}

    def state_dict(self, staging: Path, background: bool = False) -> dict[str, Any]:
        """Optimizer/scheduler state of every trained role, and the weights of all but the actor (saved as HF); with
        ``strategy.checkpoint=async`` the workers' shards, as the other controllers write them (``groups.py``)."""
        if self.config.strategy.checkpoint == "async":
            return super().state_dict(staging, background)
        return {role: worker.state_dict() if role == "actor" else {**worker.state_dict(), "model": worker.model_state_dict()}
                for role, worker in self._trained().items()}

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        if state.get("sharded"):  # strategy.checkpoint=async
            super().load_state_dict(state, folder)
            return
        if "sharded_step" in state:
            raise RLForgeError("This checkpoint holds sharded state (strategy.checkpoint=sharded): resume it with "
                               "trainer.controller=ray, or save with strategy.checkpoint=full.")
        for role, worker in self._trained().items():
            if role not in state:
                raise RLForgeError(f"This checkpoint holds no state of the '{role}' role (it has: "
                                   f"{', '.join(state)}): it was saved by "
                                   f"a run with other roles (another algorithm or reward manager).")
            if role != "actor":
                worker.load_model_state_dict(state[role]["model"])
            worker.load_state_dict(state[role])

    def shutdown(self) -> None:
        from rlforge.controller.ray_workers import WorkerProcess

        for rank in self.ranks.values():  # its engine; the process group (if any) is not the controller's to end
            WorkerProcess.shutdown(rank)
        self.reward.close()


def close_reward(manager: RewardManager) -> None:
    """Stop a reward manager's processes (``close``, part of ``rlforge.protocols.RewardManager``)."""
    manager.close()


@hookimpl
def rlforge_register(registry):
    registry.controller.register("local", LocalController, description="all workers in this process")
