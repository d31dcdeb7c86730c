"""The body of one worker process: one rank of a role (a Ray actor, or a process torchrun started).

Roles (verl's layout): ``actor`` holds the policy being trained, the reference model and the rollout engine
(colocated: the hybrid engine); ``critic`` holds the value model. Each rank joins its role's
torch.distributed process group (the torchrun variables), so the strategy (e.g. ``fsdp``) runs as under any
launcher. This is plain Python: ``ray_controller`` wraps it with ``ray.remote``; the ``torchrun`` controller
calls it in place.
"""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import torch

from rlforge import batch as B
from rlforge import checkpoint as ckpt
from rlforge.agent.engine import token_generator
from rlforge.controller.worker import ActorWorker, CriticWorker
from rlforge.protocols import Generation, SamplingParams

ROLE_MODELS = {"actor": ("actor", "ref"), "critic": ("critic",)}  # the models each role's ranks load


class RankWorker:
    """One rank of the ``actor`` or ``critic`` worker group; its methods are what the controller dispatches."""

    def __init__(self, role: str, rank: int, world_size: int) -> None:
        self.role, self.rank, self.world_size = role, rank, world_size
        self.worker: Any = None  # ActorWorker or CriticWorker, after setup
        self.rollout: Any = None

    def address(self) -> tuple[str, int, int]:
        """(node IP, a free port there, pid): rank 0's IP and port become the process group's rendezvous."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port, os.getpid()

    def setup(self, config: Any, module_cls: type, master: tuple[str, int] | None) -> None:
        """Join the process group, load this role's models on the strategy, build the rollout engine (actor).
        Everything is built through ``rlforge.build.Builder``, as in the driver; only this role's models load.
        ``master``: rank 0's address (Ray); None when a launcher (torchrun) has set the environment."""
        from rlforge.build import Builder
        from rlforge.plugin_manager import PluginManager

        if master is not None:
            os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK="0",
                              MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))  # Ray isolates each worker's GPU
        random.seed(config.trainer.seed + self.rank)
        torch.manual_seed(config.trainer.seed + self.rank)  # ranks sample different responses
        builder = Builder(config, PluginManager(disable=config.plugins.disable))  # hooks fire in this process
        module = builder.module(module_cls(config), roles=ROLE_MODELS[self.role])
        module.configure_model()
        strategy = builder.strategy()
        if self.role == "actor":
            owns = bool(getattr(builder.registry.rollout.get(config.rollout.name), "owns_weights", False))
            self.worker = ActorWorker(config, module, strategy, builder.hook, engine_owns_weights=owns)
            self.rollout = builder.rollout(self.worker.rollout_model, module.tokenizer)
            self.tokens = token_generator(self.rollout, module.tokenizer)
            if owns:  # the engine starts from model.path: give it the actor's weights (collective over the ranks)
                self.sync_weights()
        else:
            self.worker = CriticWorker(config, module, strategy, builder.hook)

    # --- dataflow ------------------------------------------------------------------------------------
    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        return self.rollout.generate(batch, params)

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        return self.tokens(prompts, params)

    def compute_log_probs(self, batch: B.Batch, role: str) -> torch.Tensor:
        return self.worker.compute_log_probs(batch, role)

    def compute_values(self, batch: B.Batch) -> torch.Tensor:
        return self.worker.compute_values(batch)

    def update(self, batch: B.Batch) -> dict[str, float]:
        return self.worker.update(batch)

    def sync_weights(self) -> float:
        start = time.perf_counter()
        self.rollout.update_weights(self.worker.named_weights())
        return time.perf_counter() - start

    def holds_replica(self) -> bool:
        """Whether this rank keeps a full copy of the policy for its rollout engine (see ``ActorWorker``)."""
        return self.worker.rollout_model is not self.worker.model

    def engine_weights(self) -> list[dict[str, torch.Tensor]]:
        """What this rank's rollout engine computes with, one dict per engine worker (engines with
        ``read_weights``, e.g. vllm): a check that the engine holds the trained weights."""
        return self.rollout.read_weights()

    # --- state ---------------------------------------------------------------------------------------
    def state_dict(self, with_model: bool) -> dict[str, Any]:
        """Gathered optimizer state (and weights); complete on rank 0 only. Plus this rank's RNG state."""
        state = self.worker.state_dict()
        if with_model:
            state["model"] = self.worker.model_state_dict()
        return {**state, "rng": ckpt.rng_state()}

    def load_state_dict(self, state: dict[str, Any], rng: dict[str, Any] | None) -> None:
        if "model" in state:
            self.worker.load_model_state_dict(state["model"])
        self.worker.load_state_dict(state)
        self._set_rng(rng)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        return self.worker.model_state_dict()

    def load_model_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        self.worker.load_model_state_dict(weights)

    def save_sharded(self, path: str) -> dict[str, Any]:
        return {**self.worker.save_sharded(Path(path)), "rng": ckpt.rng_state()}

    def load_sharded(self, path: str, state: dict[str, Any], rng: dict[str, Any] | None) -> None:
        self.worker.load_sharded(Path(path), state)
        self._set_rng(rng)

    def _set_rng(self, rng: dict[str, Any] | None) -> None:
        if rng is not None:  # None: a checkpoint written with another number of ranks
            ckpt.set_rng_state(rng)

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.shutdown()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
