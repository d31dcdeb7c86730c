"""``tp`` strategy: tensor parallelism on torch DTensor, without Megatron, combined with FSDP2 on a 2-D mesh.

``strategy.num_processes = dp x strategy.tp.size`` ranks form a mesh ``(dp, tp)``; rank ``r`` is data-parallel
rank ``r // tp`` and tensor-parallel rank ``r % tp``. Inside each decoder layer (Llama/Qwen2 blocks) the
attention and MLP projections are split over the ``tp`` ranks (``parallelize_module``): q/k/v and gate/up column
parallel (whole heads per rank), o/down row parallel; embeddings, norms and the LM head stay whole. FSDP2 then
shards every parameter over the ``dp`` ranks with the options of ``strategy.fsdp.*`` (backend, mixed precision,
weight-sync bucket).

- ``world_size``/``rank`` are the *data-parallel* ones: the workers split batches over them and sum counts over
  them, and the ranks of one tensor-parallel group see the same rows.
- Gradient clipping: the gradients live on two meshes (the ``(dp, tp)`` mesh of the split projections and the
  ``dp`` mesh of the rest) and ``clip_grad_norm_`` refuses to mix them: the norm is taken per mesh and placement
  (DTensor reduces each correctly), then combined.
- ``named_weights`` gathers full tensors (both dimensions) for the rollout engine, bucket by bucket.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.plugins.strategy.fsdp import FSDPStrategy
from rlforge.plugins.strategy.tp_layout import Heads

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# sub-module of a decoder layer -> how it is split (the Llama/Qwen2 block; the names of transformers' classes)
LAYER_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
              "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
              "mlp.down_proj": "rowwise"}


@dataclass
class TPConfig:
    """The ``tp`` strategy (``strategy.name=tp``); its FSDP side takes ``strategy.fsdp.*``."""

    size: int = 2  # ranks per tensor-parallel group; data-parallel size = strategy.num_processes / size


class TPStrategy(FSDPStrategy):
    """FSDP2 over data-parallel groups x DTensor tensor parallelism inside each decoder layer."""

    shares_prompts = False  # model.shared_prefix: not verified with tensor-parallel attention (plain forward passes)

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        FSDPStrategy.validate_config(config, registry)
        size, n = config.strategy.tp.size, config.strategy.num_processes
        if size < 1 or n % size:
            raise ConfigError(f"strategy.tp.size={size} must be >= 1 and divide strategy.num_processes={n} "
                              f"(data-parallel groups x tensor-parallel size).")

    @staticmethod
    def data_parallel_size(config: Any) -> int:
        """How many data-parallel groups the ranks form (the controllers split batches over them)."""
        return int(config.strategy.num_processes) // int(config.strategy.tp.size)

    def __init__(self, config: Any) -> None:
        self.tp_size = int(config.strategy.tp.size)
        super().__init__(config)  # sets rank/world_size from the launcher, then builds the mesh (_init_mesh)

    def _init_mesh(self) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        if self.world_size % self.tp_size:
            raise ConfigError(f"strategy.tp.size={self.tp_size} must divide the {self.world_size} launched ranks.")
        self.process_rank = self.rank
        mesh = init_device_mesh(self.device.type, (self.world_size // self.tp_size, self.tp_size),
                                mesh_dim_names=("dp", "tp"))
        self.tp_mesh = mesh["tp"]
        self.tp_rank = self.tp_mesh.get_local_rank()
        self.rank, self.world_size = mesh["dp"].get_local_rank(), mesh["dp"].size()  # data-parallel
        return mesh["dp"]

    def setup_model(self, model: torch.nn.Module, offload: bool = False) -> torch.nn.Module:
        """Split each decoder layer's projections over the tensor-parallel ranks, then FSDP over the rest (``offload``:
        never set, strategy.fsdp.offload_params is refused on tp)."""
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        Heads.of(model.config).check_even(self.tp_size, "strategy.tp.size")
        model.to(self.device)
        for layer in _decoder_layers(model):
            parallelize_module(layer, self.tp_mesh, {name: styles[kind]() for name, kind in LAYER_PLAN.items()})
        return super().setup_model(model, offload)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip by the total norm of all gradients, taken per (mesh, placements) group; the same on every rank."""
        from torch.distributed.tensor import DTensor

        groups: dict[Any, list[torch.Tensor]] = defaultdict(list)
        for p in model.parameters():
            if p.grad is not None:
                key = (p.grad.device_mesh, p.grad.placements) if isinstance(p.grad, DTensor) else None
                groups[key].append(p.grad)
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for grads in groups.values():
            norm = torch.nn.utils.get_total_norm(grads)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            squares += norm.double() ** 2
        total = float(squares.sqrt())
        if max_norm and max_norm > 0:  # the formula of clip_grad_norm_; a Python scalar scales DTensors in place
            coef = min(max_norm / (total + 1e-6), 1.0)
            for grads in groups.values():
                for g in grads:
                    g.mul_(coef)
        return total


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    missing = sorted({n for m in layers for n in LAYER_PLAN if not _has(m, n)} if layers else set(LAYER_PLAN))
    if missing:
        raise ConfigError(
            f"strategy.name=tp splits Llama/Qwen2-style decoder layers ({', '.join(LAYER_PLAN)}); "
            f"{type(model).__name__} has no {', '.join(missing)}. Use strategy.name=fsdp for this model."
        )
    return layers


def _has(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return True


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("tp", TPStrategy, config=TPConfig,
                               description="tensor parallel (DTensor) x FSDP2 on a 2-D mesh, Llama/Qwen2 blocks")
