"""``fsdp`` strategy: FSDP2 (``fully_shard``) over N data-parallel processes, gloo on CPU and NCCL on GPU.

One process per rank. The processes are started by a launcher that sets the torchrun variables
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_RANK``): the Ray controller does
(one worker actor per rank, ``trainer.controller=ray strategy.num_processes=N``), and so do ``torchrun``
and ``torch.multiprocessing`` when the workers are used as a library (the tests do).

- Each decoder layer (the model's ``_no_split_modules``) and then the root are ``fully_shard``-ed.
- Gradients are *summed* over ranks, not averaged: the workers normalize every loss by counts summed over
  the ranks (``all_reduce_sum``), so the summed gradient is the one-process gradient of the mini-batch.
- Gradient clipping uses the total norm over all shards (one all-reduce of the squared local norms).
- Mixed precision (``model.precision``): on GPUs a mixed mode becomes FSDP2's ``MixedPrecisionPolicy`` (parameters
  cast to the compute dtype for the forward/backward, gradients reduced in fp32, fp32 master shards); on CPU
  the forward runs under autocast, as with the single strategy.
- ``named_weights`` streams gathered full tensors in buckets of ``strategy.fsdp.weight_sync_bucket_mb`` to the
  rollout replica: no more than one bucket of gathered weights is alive beyond the model itself.
- Ulysses sequence parallelism (``strategy.fsdp.sequence_parallel_size`` = sp > 1, ``ulysses.py``): the ranks form a
  ``(dp, sp)`` mesh (rank ``r``: data-parallel group ``r // sp``, sequence-parallel rank ``r % sp``). FSDP still
  shards over all ranks; ``world_size``/``rank`` are the *data-parallel* ones (the controllers split batches over the
  ``dp`` groups, the ``sp`` ranks of a group get the same rows) and counts are summed over the ``dp`` group of this
  rank (``reduce_group``). The actor, reference and critic (every model put on the strategy) run their packed forward
  passes sequence-parallel; each rank's gradient is its slice's part of the one-rank gradient of its group's rows, so
  FSDP's sum over all ``dp x sp`` ranks, with losses normalized by counts summed over ``dp``, is the one-process
  gradient: nothing is rescaled. Token budgets (``<role>.max_tokens_per_micro_batch``) stay per rank: a group's
  packed micro-batch holds up to ``sp x`` the budget (``sequence_parallel_size``, read by the workers), as in verl.
- Parameter offload (``strategy.fsdp.offload_params``: the roles ``actor``, ``ref``, ``critic``): those models are
  sharded with FSDP2's ``CPUOffloadPolicy``. Their parameter and gradient shards live in CPU memory; each layer's
  parameters are gathered onto the device only while it computes, and the optimizer steps on the CPU (so its state
  is in CPU memory too). What is computed does not change, only where the tensors wait (verl's
  ``fsdp_config.param_offload``; its reference model is always offloaded). Not yet run on a GPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlforge.capabilities import StrategyCapabilities
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.strategy import BaseStrategy, ProcessGroupCollectives

if TYPE_CHECKING:
    import torch

    from rlforge import ulysses
else:
    torch = lazy_import("torch")
    ulysses = lazy_import("rlforge.ulysses")  # its autograd functions subclass torch's at import

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BACKENDS = ("auto", "nccl", "gloo")
SP_KEY = "strategy.fsdp.sequence_parallel_size"
OFFLOAD_KEY = "strategy.fsdp.offload_params"
ROLES = ("actor", "ref", "critic")  # the models a worker puts on the strategy


def _device(name: str) -> torch.device:
    if name not in ("auto", "cpu") and not name.startswith("cuda"):
        raise ConfigError(f"strategy.device='{name}' is not a device for fsdp (use auto, cpu or cuda).")
    if name == "cpu" or not torch.cuda.is_available():
        if name.startswith("cuda"):
            raise ConfigError(f"strategy.device='{name}' but no CUDA device is available. Use auto or cpu.")
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


@dataclass
class FSDPConfig:
    """The ``fsdp`` strategy (``strategy.name=fsdp``)."""

    backend: str = "auto"  # torch.distributed backend: auto (nccl on GPU, gloo on CPU) | nccl | gloo
    weight_sync_bucket_mb: float = 256.0  # gathered weights streamed to the rollout replica per bucket
    sequence_parallel_size: int = 1  # Ulysses: ranks that share one packed sequence (needs model.remove_padding=true)
    offload_params: list[str] = field(default_factory=list)  # models whose parameter and gradient shards wait in CPU memory, each layer gathered onto the device only while it computes; the optimizer then steps on the CPU: any of actor, ref, critic (FSDP2 CPUOffloadPolicy; verl's fsdp_config.param_offload)


def _nccl_on_cpu(why: str) -> ConfigError:
    return ConfigError(f"strategy.fsdp.backend=nccl reduces CUDA tensors only, and {why}: set "
                       f"strategy.fsdp.backend=gloo or auto (gloo on CPU).")


class FSDPStrategy(ProcessGroupCollectives, BaseStrategy):
    """FSDP2 data parallelism; parameters, gradients and optimizer state are sharded over the ranks."""

    # workers keep a full replica for the rollout engine and gather state dicts; model.shared_prefix verified by
    # tests/plugins/test_fsdp.py
    capabilities = StrategyCapabilities(sharded=True, shares_prompts=True, async_checkpoint=True,
                                        same_rows_key="strategy.fsdp.sequence_parallel_size")

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        f = config.strategy.fsdp
        if f.backend not in BACKENDS:
            raise ConfigError(f"strategy.fsdp.backend='{f.backend}'. Allowed: {', '.join(BACKENDS)}.")
        if f.backend == "nccl" and str(config.strategy.device).split(":")[0] == "cpu":
            raise _nccl_on_cpu("strategy.device=cpu")
        if f.weight_sync_bucket_mb <= 0:
            raise ConfigError(f"strategy.fsdp.weight_sync_bucket_mb must be > 0, got {f.weight_sync_bucket_mb}.")
        check_sequence_parallel(config, registry)
        check_offload(config, registry)

    def __init__(self, config: Any) -> None:
        s, f = config.strategy, config.strategy.fsdp
        missing = [k for k in LAUNCH_ENV if k not in os.environ]
        if missing:
            raise ConfigError(
                "strategy.name=fsdp runs one process per rank, started by a launcher: set trainer.controller=ray "
                f"(strategy.num_processes=N), or launch with torchrun. Missing environment: {', '.join(missing)}."
            )
        self.validate_config(config, None)
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.sp: ulysses.SequenceParallel | None = None  # this rank's sequence-parallel group, with sp > 1
        self._sp_size = int(f.sequence_parallel_size)
        self.device = _device(s.device)
        backend = f.backend if f.backend != "auto" else ("nccl" if self.device.type == "cuda" else "gloo")
        if backend == "nccl" and self.device.type != "cuda":  # (strategy.device=auto on a rank that sees no GPU)
            raise _nccl_on_cpu(f"this rank's device is {self.device}")
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        from torch.distributed.fsdp import MixedPrecisionPolicy

        self.mesh = self._init_mesh()
        self.configure_precision(config)
        compute = self.precision.compute
        self.fsdp_casts = compute is not None and self.device.type == "cuda"  # FSDP2 casts: no autocast needed
        dtype = getattr(torch, compute) if self.fsdp_casts else None
        self.mp_policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
        self.bucket_bytes = max(1, int(f.weight_sync_bucket_mb * 2**20))
        self.offload_roles = frozenset(f.offload_params)

    @property
    def sequence_parallel_size(self) -> int:
        """The ranks that share each packed micro-batch (1: none); the workers scale token budgets by it."""
        return 1 if self.sp is None else self.sp.size

    def autocast(self) -> Any:
        return contextlib.nullcontext() if self.fsdp_casts else super().autocast()

    def _init_mesh(self) -> Any:
        """The mesh FSDP shards over: all ranks (a subclass may shard over a part of a larger mesh). With sequence
        parallelism also the ``(dp, sp)`` mesh: this rank's sp group, and ``rank``/``world_size`` become the
        data-parallel ones."""
        from torch.distributed.device_mesh import init_device_mesh

        self.process_rank = self.rank
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        if self._sp_size > 1:
            grid = ulysses.sequence_parallel_mesh(self.device.type, self.world_size, self._sp_size)
            self.sp, self.dp_mesh = ulysses.from_mesh(grid), grid["dp"]
            self.rank, self.world_size = self.dp_mesh.get_local_rank(), self.dp_mesh.size()
        return mesh

    def setup_model_for(self, model: torch.nn.Module, role: str) -> torch.nn.Module:
        """``setup_model`` for the worker's model of ``role`` (actor, ref, critic): offloaded when
        ``strategy.fsdp.offload_params`` names the role."""
        return self.setup_model(model, offload=True) if role in self.offload_roles else self.setup_model(model)

    def setup_model(self, model: torch.nn.Module, offload: bool = False) -> torch.nn.Module:
        """Shard each decoder layer, then the root (embeddings, norm, head) with what is left; ``offload``: with
        FSDP2's ``CPUOffloadPolicy`` (shards in CPU memory). With sequence parallelism the model's attention becomes
        Ulysses' first (its heads checked) and its packed forward passes run over this rank's sp group
        (``ops.sequence_parallel``)."""
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

        from rlforge import ops

        if self.sp is not None:
            ops.sequence_parallel(model, ulysses.use_ulysses(model, self.sp, SP_KEY))
        model.to(self.device)
        policy = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if offload else OffloadPolicy()
        shard = {"mesh": self.mesh, "mp_policy": self.mp_policy, "offload_policy": policy}
        layer_classes = set(getattr(model, "_no_split_modules", None) or ())
        for sub in list(model.modules()):
            if type(sub).__name__ in layer_classes:
                fully_shard(sub, **shard)
        fully_shard(model, **shard)
        for sub in model.modules():
            if isinstance(sub, FSDPModule):  # sum gradients over ranks (gloo has no pre-multiplied sum)
                sub.set_gradient_divide_factor(1.0)
                sub.set_force_sum_reduction_for_comms(True)
        return model

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip by the norm over all shards of all gradients; returns that norm (the same on every rank)."""
        from torch.distributed.tensor import DTensor

        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()
                 if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for g in grads:  # an offloaded model's gradients are in CPU memory: its squares come to the device
            squares += (torch.linalg.vector_norm(g, dtype=torch.float32) ** 2).to(self.device)
        torch.distributed.all_reduce(squares)
        total = squares.sqrt()
        if max_norm and max_norm > 0:
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # the formula of clip_grad_norm_
            for g in grads:
                g.mul_(coef.to(g.device, g.dtype))
        return float(total)

    def reduce_group(self) -> Any:
        """Counts and metrics are summed over the data-parallel ranks (all of them without sequence parallelism)."""
        return (self.mesh if self.sp is None else self.dp_mesh).get_group()

    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Gathered full parameters, one bucket at a time. Collective: every rank iterates to the end."""
        from torch.distributed.tensor import DTensor

        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, p in model.named_parameters():
            nbytes = p.numel() * p.element_size()
            if bucket and size + nbytes > self.bucket_bytes:
                yield from bucket
                bucket, size = [], 0
            if isinstance(p, DTensor) and p.to_local().device != self.device:  # offloaded: gather on the device
                p = DTensor.from_local(p.to_local().to(self.device), p.device_mesh, p.placements, shape=p.shape,
                                      stride=p.stride())
            full = p.full_tensor() if isinstance(p, DTensor) else p
            bucket.append((name, full.detach()))
            size += nbytes
        yield from bucket


def check_sequence_parallel(config: Any, registry: Any) -> None:
    """``strategy.fsdp.sequence_parallel_size``: >= 1, dividing the ranks, with packed forward passes, on the fsdp
    strategy itself (a subclass that lays out its own mesh, like ``tp``, does not read it). The heads are checked
    when the model is set up (``ulysses.use_ulysses``)."""
    sp, n = config.strategy.fsdp.sequence_parallel_size, config.strategy.num_processes
    if sp < 1 or n % sp:
        raise ConfigError(f"{SP_KEY}={sp} must be >= 1 and divide strategy.num_processes={n} (data-parallel groups x "
                          "sequence-parallel size).")
    if sp == 1:
        return
    if not config.model.remove_padding:
        raise ConfigError(f"{SP_KEY}={sp} slices packed sequences: set model.remove_padding=true (it is false).")
    factory = registry.strategy.get(config.strategy.name) if registry is not None else FSDPStrategy
    if getattr(factory, "_init_mesh", None) is not FSDPStrategy._init_mesh:
        raise ConfigError(f"{SP_KEY}={sp} is read by strategy.name=fsdp; strategy.name={config.strategy.name} lays "
                          f"out its own device mesh. Set {SP_KEY}=1 or strategy.name=fsdp.")


def check_offload(config: Any, registry: Any) -> None:
    """``strategy.fsdp.offload_params``: role names, on the fsdp strategy itself (a subclass that lays out its own mesh,
    like ``tp``, is not verified with offloaded shards)."""
    roles = list(config.strategy.fsdp.offload_params)
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ConfigError(f"{OFFLOAD_KEY}={roles}: unknown role(s) {', '.join(map(repr, unknown))}. Allowed: "
                          f"{', '.join(ROLES)}.")
    factory = registry.strategy.get(config.strategy.name) if registry is not None else FSDPStrategy
    if roles and getattr(factory, "_init_mesh", None) is not FSDPStrategy._init_mesh:
        raise ConfigError(f"{OFFLOAD_KEY} is read by strategy.name=fsdp; strategy.name={config.strategy.name} is not "
                          f"verified with offloaded shards. Set {OFFLOAD_KEY}=[] or strategy.name=fsdp.")


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("fsdp", FSDPStrategy, config=FSDPConfig, description="FSDP2 fully_shard over N processes (gloo/NCCL)")
