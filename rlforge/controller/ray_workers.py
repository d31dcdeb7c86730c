"""The body of one worker process: one rank of a role (a Ray actor, or a process torchrun started).

Roles (verl's layout): ``actor`` holds the policy being trained, the reference model and, unless a rollout group
generates, the rollout engine (colocated: the hybrid engine); ``critic`` holds the value model. Each of their ranks
(:class:`RankWorker`) joins its role's torch.distributed process group (the torchrun variables), so the strategy
(e.g. ``fsdp``) runs as under any launcher. ``rollout`` (:class:`RolloutWorker`, the Ray controller's
``ray.rollout_workers``) holds only the policy and its engine, on resources of its own, and loads the weights the
actor ranks gather. This is plain Python: ``ray_controller`` wraps it with ``ray.remote``; the ``torchrun``
controller calls :class:`RankWorker` in place.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlforge import batch as B
from rlforge import checkpoint as ckpt
from rlforge import lora
from rlforge.sampling import Generation, SamplingParams
from rlforge.weight_sync import SyncStats, adapter_weights, timed
from rlforge.capabilities import declared_methods, remote
from rlforge.controller.rendezvous import rendezvous_port
from rlforge.module_checks import check_configured
from rlforge.worker import ActorWorker, CriticWorker, TrainWorker

if TYPE_CHECKING:
    from rlforge.build import Builder
    from rlforge.module import RLModule

class WorkerProcess:
    """What every worker process shares: its place, its models built through ``rlforge.build.Builder`` as in the
    driver, and the rollout engine it may own (``generate``, ``generate_tokens``)."""

    def __init__(self, role: str, rank: int, world_size: int) -> None:
        self.role, self.rank, self.world_size = role, rank, world_size
        self.rollout: Any = None  # the rollout engine, where this process owns one
        self.engine_model: Any = None  # the model the engine was built with

    @remote(collect="all")
    def address(self) -> tuple[str, int, int]:
        """(node IP, a free port there, pid): rank 0's IP and port become the process group's rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), rendezvous_port(), os.getpid()

    @remote()
    def setup(self, config: Any, module_cls: type, master: tuple[str, int] | None = None, engine: bool = True) -> None:
        """In a process of its own: join the role's process group, load this role's models (``registry.role``) into
        ``module_cls(config)`` and :meth:`build` on them. ``master``: rank 0's address (Ray); None when a launcher
        (torchrun) has set the environment. ``engine``: whether the actor builds its rollout engine (False: a
        rollout worker group generates)."""
        if master is not None:
            os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK="0",
                              MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))  # Ray isolates each worker's GPU
        builder, module = self._module(config, module_cls)
        self.build(builder, module, engine)

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        """This rank's part over ``module`` (its role's models loaded): what the role's worker does. The local
        controller calls it in place, with the driver's module (``initial_sync=False``: no first weight sync)."""
        raise NotImplementedError(f"{type(self).__qualname__}.build")  # abstract: each role's

    def _module(self, config: Any, module_cls: type) -> tuple[Builder, RLModule]:
        """The builder (hooks fire in this process) and the module with this role's models loaded."""
        from rlforge.build import Builder
        from rlforge.plugin_manager import PluginManager

        random.seed(config.trainer.seed + self.rank)
        torch.manual_seed(config.trainer.seed + self.rank)  # ranks sample different responses
        builder = Builder(config, PluginManager.for_config(config))
        module = builder.module(module_cls(config), roles=builder.registry.role.get(self.role).models)
        module._on_worker = True  # its log() outside an update raises: no logger is here
        module.configure_model()
        check_configured(module)
        return builder, module

    def _start_engine(self, builder: Builder, model: Any, tokenizer: Any) -> None:
        from rlforge.agent.engine import token_generator  # the agent machinery loads where an engine runs

        self.engine_model = model
        self.rollout = builder.rollout(model, tokenizer)
        self.tokens = token_generator(self.rollout, tokenizer, builder.capabilities("rollout").token_io)

    @remote("engine_rows", "concat")
    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        return self.rollout.generate(batch, params)

    @remote("engine_requests", "flatten")
    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams],
                        multi_modal: list[dict[str, Any] | None] | None = None) -> list[Generation]:
        from rlforge.agent.engine import call_backend

        return call_backend(self.tokens, prompts, params, multi_modal)

    @remote()
    def hold_engine(self, held: bool) -> None:
        """Keep this process's rollout engine awake across the calls of an agent rollout (``held``), or let it sleep
        again: the engine's ``hold`` where it has one (vllm with sleep mode), nothing otherwise."""
        hold = getattr(self.rollout, "hold", None)
        if hold is not None:
            hold(held)

    @remote(collect="sync_stats")
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> SyncStats:
        """Give this process's engine these weights (the actor's stream, a snapshot, ``ActorRank.full_weights``)
        through its weight-sync backend (``rollout.weight_sync``); the bytes it moved and the seconds taken."""
        return timed(self.rollout.update_weights, iter(weights))

    @remote()
    def engine_weights(self) -> list[dict[str, torch.Tensor]]:
        """What this process's rollout engine computes with, one dict per engine worker: read back from engines with
        ``read_weights`` (vllm), else the weights of the model it generates with (hf). A check that the engine holds
        the trained weights."""
        read = getattr(self.rollout, "read_weights", None)
        if read is not None:
            return read()
        return [{name: t.detach().cpu().clone() for name, t in self.engine_model.state_dict().items()}]

    @remote()
    def rng_state(self) -> dict[str, Any]:
        return ckpt.rng_state()

    @remote()
    def set_rng(self, rng: dict[str, Any] | None) -> None:
        if rng is not None:  # None: a checkpoint written with another number of ranks
            ckpt.set_rng_state(rng)

    @remote()
    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.shutdown()


FORWARDS = "__rlforge_runs_on_worker__"


def _run_on_worker(cls: type[RankWorker]) -> None:
    """Give ``cls`` each ``@remote`` method of its ``trains`` class that it does not write itself: a method of the same
    name, signature and dispatch that runs it on ``self.worker`` (real methods, so Ray's actor class has them)."""
    for name in declared_methods(cls.trains):
        own = getattr(cls, name, None)
        if own is None or getattr(own, FORWARDS, False):
            setattr(cls, name, _on_worker(name, getattr(cls.trains, name)))


def _on_worker(name: str, target: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(target)  # the signature and the @remote mark of the TrainWorker's method
    def run(self: RankWorker, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, name)(*args, **kwargs)

    setattr(run, FORWARDS, True)
    return run


class RankWorker(WorkerProcess):
    """One rank of a trained role: a :class:`rlforge.worker.TrainWorker` (``self.worker``, made by
    :meth:`train_worker`) on the strategy, with its update and state methods. The ``@remote`` methods of the
    ``trains`` class (``update``, ``compute_log_probs``, ...) are this rank's as well, each running on ``self.worker``:
    a plugin's trainable role sets ``trains`` to its ``TrainWorker`` and declares its methods there, once."""

    trains: type = TrainWorker  # the role's TrainWorker class (abstract here: each role's loss)

    def __init__(self, role: str, rank: int, world_size: int) -> None:
        super().__init__(role, rank, world_size)
        self.worker: Any = None  # the role's TrainWorker, after setup

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _run_on_worker(cls)

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        self.worker = self.train_worker(builder, module, builder.strategy(), engine)

    def train_worker(self, builder: Builder, module: RLModule, strategy: Any, engine: bool) -> Any:
        """The role's ``TrainWorker`` over ``module`` on ``strategy``: ``trains(config, module, strategy, hook)``."""
        return self.trains(builder.config, module, strategy, builder.hook)

    # --- state ---------------------------------------------------------------------------------------
    @remote()
    def state_dict(self, with_model: bool) -> dict[str, Any]:
        """Gathered optimizer state (and weights); complete on rank 0 only. Plus this rank's RNG state."""
        state = self.worker.state_dict()
        if with_model:
            state["model"] = self.worker.model_state_dict()
        return {**state, "rng": ckpt.rng_state()}

    @remote()
    def load_state_dict(self, state: dict[str, Any], rng: dict[str, Any] | None) -> None:
        if "model" in state:
            self.worker.load_model_state_dict(state["model"])
        self.worker.load_state_dict(state)
        self.set_rng(rng)

    @remote()
    def save_sharded(self, path: str, background: bool = False) -> dict[str, Any]:
        return {**self.worker.save_sharded(Path(path), background), "rng": ckpt.rng_state()}

    @remote()
    def load_sharded(self, path: str, state: dict[str, Any], rng: dict[str, Any] | None) -> None:
        self.worker.load_sharded(Path(path), state)
        self.set_rng(rng)

    def shutdown(self) -> None:
        super().shutdown()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


_run_on_worker(RankWorker)


class ActorRank(RankWorker):
    """A rank of the ``actor`` role: the policy, the reference model and (unless a rollout group generates) the
    rollout engine (the hybrid engine)."""

    trains = ActorWorker

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        super().build(builder, module, engine)
        # an engine that loads LoRA adapters gets the adapter alone (the rollout group's engines too)
        self.adapters = builder.capabilities("rollout").lora_adapters and lora.is_lora(module.actor)
        if engine:
            self._start_engine(builder, self.worker.rollout_model, module.tokenizer)
            # the engine starts from model.path: give it the actor's weights (collective over the ranks)
            if builder.capabilities("rollout").owns_weights and initial_sync:
                self.sync_weights()

    def train_worker(self, builder: Builder, module: RLModule, strategy: Any, engine: bool) -> Any:
        # the engines of a rollout worker group keep weights of their own: no replica here either
        return ActorWorker(builder.config, module, strategy, builder.hook,
                           engine_owns_weights=builder.capabilities("rollout").owns_weights or not engine)

    @remote(collect="sync_stats")
    def sync_weights(self) -> SyncStats:
        return self.load_weights(self.weights_for_engine())

    def weights_for_engine(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What a sync gives the engine: a LoRA actor's adapter where the engine loads adapters (``lora_adapters``),
        else the actor's full weights (``ActorWorker.named_weights``: merged with LoRA; gathered when sharded)."""
        if self.adapters:
            return adapter_weights(self.worker.module.actor)
        return self.worker.named_weights()

    @remote(collect="first")
    def full_weights(self) -> list[tuple[str, torch.Tensor]] | None:
        """The actor's weights for the engine on the CPU, for a rollout worker group (``ray.rollout_workers``).
        Collective: every rank takes part in the gather (``named_weights`` of a sharded strategy); rank 0 returns
        them, the others None."""
        keep = self.rank == 0
        weights = [(name, t.to("cpu", copy=True)) for name, t in self.weights_for_engine() if keep]  # all iterate
        return weights if keep else None

    @remote()
    def holds_replica(self) -> bool:
        """Whether this rank keeps a full copy of the policy for its rollout engine (see ``ActorWorker``)."""
        return self.worker.rollout_model is not self.worker.model


class CriticRank(RankWorker):
    """A rank of the ``critic`` role: the value model (``compute_values``, ``update``)."""

    trains = CriticWorker


class RolloutWorker(WorkerProcess):
    """One worker of the ``rollout`` group (``ray.rollout_workers``): the policy and its rollout engine on resources of
    their own, so that generation runs beside the actor's updates (``trainer.pipeline=one_step_off|async``). No
    optimizer, no reference model, no process group with the actor ranks: its weights arrive whole
    (``load_weights``)."""

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        """Load the policy and build the rollout engine on it, as the actor ranks do."""
        config = builder.config
        model = module.actor
        if lora.is_lora(model) and not builder.capabilities("rollout").lora_adapters:
            model = lora.merged_model(model)  # the actor sends merged weights under the base model's names
        model.requires_grad_(False)
        if not builder.capabilities("rollout").owns_weights:  # an engine with weights of its own reads only the config
            gpu = torch.cuda.is_available() and config.strategy.device != "cpu"
            model = model.to("cuda" if gpu else "cpu")  # the GPU Ray gave this worker
        self._start_engine(builder, model, module.tokenizer)
