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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.strategy import BaseStrategy, ProcessGroupCollectives

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BACKENDS = ("auto", "nccl", "gloo")


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


class FSDPStrategy(ProcessGroupCollectives, BaseStrategy):
    """FSDP2 data parallelism; parameters, gradients and optimizer state are sharded over the ranks."""

    sharded = True  # workers keep a full replica for the rollout engine and gather state dicts
    shares_prompts = True  # model.shared_prefix (tests/plugins/test_fsdp.py)

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        f = config.strategy.fsdp
        if f.backend not in BACKENDS:
            raise ConfigError(f"strategy.fsdp.backend='{f.backend}'. Allowed: {', '.join(BACKENDS)}.")
        if f.weight_sync_bucket_mb <= 0:
            raise ConfigError(f"strategy.fsdp.weight_sync_bucket_mb must be > 0, got {f.weight_sync_bucket_mb}.")

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
        self.device = _device(s.device)
        backend = f.backend if f.backend != "auto" else ("nccl" if self.device.type == "cuda" else "gloo")
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

    def autocast(self) -> Any:
        return contextlib.nullcontext() if self.fsdp_casts else super().autocast()

    def _init_mesh(self) -> Any:
        """The mesh FSDP shards over: all ranks (a subclass may shard over a part of a larger mesh)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,))

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Shard each decoder layer, then the root (embeddings, norm, head) with what is left."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        model.to(self.device)
        layer_classes = set(getattr(model, "_no_split_modules", None) or ())
        for sub in list(model.modules()):
            if type(sub).__name__ in layer_classes:
                fully_shard(sub, mesh=self.mesh, mp_policy=self.mp_policy)
        fully_shard(model, mesh=self.mesh, mp_policy=self.mp_policy)
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
        for g in grads:
            squares += torch.linalg.vector_norm(g, dtype=torch.float32) ** 2
        torch.distributed.all_reduce(squares)
        total = squares.sqrt()
        if max_norm and max_norm > 0:
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # the formula of clip_grad_norm_
            for g in grads:
                g.mul_(coef.to(g.dtype))
        return float(total)

    def reduce_group(self) -> Any:
        return self.mesh.get_group()

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
            full = p.full_tensor() if isinstance(p, DTensor) else p
            bucket.append((name, full.detach()))
            size += nbytes
        yield from bucket


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("fsdp", FSDPStrategy, config=FSDPConfig, description="FSDP2 fully_shard over N processes (gloo/NCCL)")
