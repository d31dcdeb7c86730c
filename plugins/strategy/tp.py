"""``tp`` strategy: tensor parallelism on torch DTensor, without Megatron, combined with FSDP2 on a 2-D mesh.

``strategy.num_processes = dp x strategy.tp.size`` ranks form a mesh ``(dp, tp)``; rank ``r`` is data-parallel
rank ``r // tp`` and tensor-parallel rank ``r % tp``. Inside each decoder layer the projections are split over the
``tp`` ranks (``parallelize_module``) as the model's own plan says: transformers ships one per architecture in the
model config's ``base_model_tp_plan`` (``"layers.*.self_attn.q_proj": "colwise"``, ...), and each of its styles
becomes the torch ``ParallelStyle`` that computes the same (``STYLES``); a config without a plan gets the
Llama/Qwen2 layout (``FALLBACK_PLAN``: q/k/v and gate/up column parallel, whole heads per rank, o/down row
parallel). Embeddings, the final norm and the LM head stay whole. FSDP2 then shards every parameter over the ``dp``
ranks with the options of ``strategy.fsdp.*`` (backend, mixed precision, weight-sync bucket).

- ``world_size``/``rank`` are the *data-parallel* ones: the workers split batches over them and sum counts over
  them, and the ranks of one tensor-parallel group see the same rows.
- Gradient clipping: the gradients live on two meshes (the ``(dp, tp)`` mesh of the split projections and the
  ``dp`` mesh of the rest) and ``clip_grad_norm_`` refuses to mix them: the norm is taken per mesh and placement
  (DTensor reduces each correctly), then combined.
- ``named_weights`` gathers full tensors (both dimensions) for the rollout engine, bucket by bucket.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge.capabilities import StrategyCapabilities
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.plugins.strategy.fsdp import FSDPStrategy
from rlforge.heads import Heads

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

PLAN_ATTR = "base_model_tp_plan"  # transformers' per-architecture plan, on the model config
# the plan of a config without one: the Llama/Qwen2 block (what transformers' LlamaConfig and Qwen2Config ship)
FALLBACK_PLAN = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
                 "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
                 "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                 "layers.*.mlp.down_proj": "rowwise"}
# transformers' plan style -> the torch ParallelStyle that computes the same (transformers' own ParallelInterface
# defines them alike), built from the modules torch.distributed.tensor.parallel and torch.distributed.tensor; a style
# missing here is refused, naming the module pattern and the style
STYLES: dict[str, Callable[[Any, Any], Any]] = {
    # output features split, the output left split (whole heads per rank) for the row-parallel layer after it
    "colwise": lambda tp, dt: tp.ColwiseParallel(),
    # input features split, the partial outputs all-reduced
    "rowwise": lambda tp, dt: tp.RowwiseParallel(),
    # a fused projection (Phi-3's qkv_proj, gate_up_proj): output features split, then gathered, so that the
    # model's own slicing of the fused output sees all of it
    "colwise_gather_output": lambda tp, dt: tp.ColwiseParallel(output_layouts=dt.Replicate()),
    "colwise_rep": lambda tp, dt: tp.ColwiseParallel(output_layouts=dt.Replicate()),
    # after a gathered output: the whole input is cut to this rank's features here, the partial outputs all-reduced
    "rowwise_split_input": lambda tp, dt: tp.RowwiseParallel(input_layouts=dt.Replicate()),
    "rowwise_rep": lambda tp, dt: tp.RowwiseParallel(input_layouts=dt.Replicate()),
    # a norm over each head (Qwen3's and Gemma-3's q_norm/k_norm) that sees only this rank's heads: its weight is a
    # replicated DTensor and its input this rank's shard along a dimension other than the normalized last one, so the
    # weight's gradient is summed over the tensor-parallel ranks (what torch's SequenceParallel does)
    "replicated_with_grad_allreduce": lambda tp, dt: tp.SequenceParallel(sequence_dim=1, use_local_output=True),
}


@dataclass
class TPConfig:
    """The ``tp`` strategy (``strategy.name=tp``); its FSDP side takes ``strategy.fsdp.*``."""

    size: int = 2  # ranks per tensor-parallel group; data-parallel size = strategy.num_processes / size


class TPStrategy(FSDPStrategy):
    """FSDP2 over data-parallel groups x DTensor tensor parallelism inside each decoder layer."""

    # model.shared_prefix: not verified with tensor-parallel attention (plain forward passes)
    capabilities = StrategyCapabilities(sharded=True, async_checkpoint=True, same_rows_key="strategy.tp.size")

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        FSDPStrategy.validate_config(config, registry)
        size, n = config.strategy.tp.size, config.strategy.num_processes
        if size < 1 or n % size:
            raise ConfigError(f"strategy.tp.size={size} must be >= 1 and divide strategy.num_processes={n} "
                              f"(data-parallel groups x tensor-parallel size).")

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
        """Split the decoder layers' projections over the tensor-parallel ranks as ``module_plan`` says, then FSDP
        over the rest (``offload``: never set, strategy.fsdp.offload_params is refused on tp)."""
        from torch.distributed import tensor as dtensor
        from torch.distributed.tensor import parallel

        plan = module_plan(model)
        Heads.of(model.config).check_even(self.tp_size, "strategy.tp.size")
        model.to(self.device)
        parallel.parallelize_module(model, self.tp_mesh,
                                    {name: STYLES[style](parallel, dtensor) for name, style in plan.items()})
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


def module_plan(model: torch.nn.Module) -> dict[str, str]:
    """Module name -> transformers' style name for every module of ``model`` the tp strategy splits: the patterns of
    the decoder's config ``base_model_tp_plan`` (``FALLBACK_PLAN`` when it has none), relative to the decoder
    (``get_decoder()``: ``model.`` in a causal LM or a value model), each ``*`` one layer index.

    :raises ConfigError: for a style that ``STYLES`` does not honour, or a pattern that names no module of the model,
        naming the pattern and the style.
    """
    from transformers.integrations.tensor_parallel import replace_layer_number_by_wildcard

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    plan = getattr(getattr(decoder, "config", None), PLAN_ATTR, None)
    where = f"{type(model).__name__}'s config {PLAN_ATTR}" if plan else "rlforge's Llama/Qwen2 plan (FALLBACK_PLAN)"
    plan = dict(plan or FALLBACK_PLAN)
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ConfigError(
                f"strategy.name=tp cannot split '{pattern}' as '{style}' ({where}): the styles it honours are "
                f"{', '.join(STYLES)}. Use strategy.name=fsdp for this model."
            )
    prefix = next(f"{name}." if name else "" for name, m in model.named_modules() if m is decoder)
    generic = {name: replace_layer_number_by_wildcard(name) for name, _ in decoder.named_modules()}
    unmatched = sorted(set(plan) - set(generic.values()))
    if unmatched:
        raise ConfigError(
            f"strategy.name=tp splits the modules of {where}, but {type(model).__name__} has no module "
            f"{', '.join(repr(p) for p in unmatched)} (each '*' a layer index). Use strategy.name=fsdp for this model."
        )
    return {prefix + name: plan[pattern] for name, pattern in generic.items() if pattern in plan}


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("tp", TPStrategy, config=TPConfig,
                               description="tensor parallel (DTensor, base_model_tp_plan) x FSDP2 on a 2-D mesh")
