"""``megatron`` strategy: megatron-core's ``GPTModel`` with tensor parallelism, for Llama/Qwen2 models.

``pip install 'rlforge[megatron]'`` (megatron-core 0.16; imported only when this strategy is built). One process
per rank, launched like ``fsdp`` (``trainer.controller=ray`` or ``torchrun``). ``strategy.num_processes = dp x
strategy.megatron.tensor_parallel_size``; ``world_size``/``rank`` are the data-parallel ones (as in ``tp``).

- ``setup_model`` converts the HF model (``megatron_convert``) into a ``GPTModel`` holding this rank's tensor-parallel
  slices and wraps it in :class:`MegatronCausalLM`, which takes and returns what an HF causal LM does
  (``input_ids``, ``attention_mask``/``position_ids`` incl. packed rows, ``logits_to_keep`` -> ``.logits``), so the
  workers and losses run unchanged. The reference model goes through the same path.
- Gradients are summed over the data-parallel ranks (rlforge's losses are normalized by global counts) when
  they are clipped, once per optimizer step; the norm counts tensor-parallel slices once and replicated weights
  once.
- ``named_weights`` gathers each parameter's TP slices and converts it back to HF names, one parameter at a time,
  for the rollout engine; ``model_state_dict`` is the full HF state dict (rank 0), so checkpoints keep the HF
  folder. Training state is checkpointed with megatron's ``dist_checkpointing`` (``strategy.checkpoint=sharded``,
  reloadable with another tensor-parallel size).
- Pipeline parallelism is not built (rlforge's update loop has no pipeline schedule): ``pipeline_parallel_size``
  must be 1. megatron-core's forward needs CUDA (``torch.cuda.current_device()`` in RoPE and the memory buffer).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.capabilities import StrategyCapabilities
from rlforge.errors import ConfigError, RLForgeError, first_line
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.plugins.strategy.fsdp import LAUNCH_ENV, _device
from rlforge.plugins.strategy.megatron_convert import (
    Layout,
    gpt_model_kwargs,
    hf_to_megatron,
    megatron_param_to_hf,
    megatron_tp_merge,
    megatron_tp_shard,
    transformer_config_kwargs,
)
from rlforge.strategy import BaseStrategy, ProcessGroupCollectives

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

INSTALL_HINT = "pip install 'rlforge[megatron]'"


@dataclass
class MegatronConfig:
    """The ``megatron`` strategy (``strategy.name=megatron``)."""

    tensor_parallel_size: int = 1  # ranks per model replica; must divide the KV heads and strategy.num_processes
    pipeline_parallel_size: int = 1  # only 1: rlforge's update loop has no pipeline schedule
    make_vocab_size_divisible_by: int = 128  # vocabulary rows padded to a multiple of this x tensor_parallel_size


def import_megatron() -> Any:
    try:
        import megatron.core
    except ImportError as exc:
        raise RLForgeError(f"strategy.name=megatron needs megatron-core, which cannot be imported ({exc}): "
                           f"{INSTALL_HINT}.") from None
    return megatron.core


class MegatronStrategy(ProcessGroupCollectives, BaseStrategy):
    """megatron-core tensor parallelism x data parallelism (summed gradients) over N processes."""

    capabilities = StrategyCapabilities(sharded=True, same_rows_key="strategy.megatron.tensor_parallel_size")

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        m, n = config.strategy.megatron, config.strategy.num_processes
        if m.pipeline_parallel_size != 1:
            raise ConfigError(f"strategy.megatron.pipeline_parallel_size={m.pipeline_parallel_size}: only 1 is "
                              f"supported (rlforge's update loop has no pipeline schedule).")
        if m.tensor_parallel_size < 1 or n % m.tensor_parallel_size:
            raise ConfigError(f"strategy.megatron.tensor_parallel_size={m.tensor_parallel_size} must be >= 1 and "
                              f"divide strategy.num_processes={n}.")
        if config.strategy.checkpoint != "sharded":
            raise ConfigError("strategy.name=megatron checkpoints its training state with megatron's "
                              "dist_checkpointing: set strategy.checkpoint=sharded.")

    def __init__(self, config: Any) -> None:
        missing = [k for k in LAUNCH_ENV if k not in os.environ]
        if missing:
            raise ConfigError("strategy.name=megatron runs one process per rank, started by a launcher: set "
                              "trainer.controller=ray or torchrun (strategy.num_processes=N). Missing environment: "
                              f"{', '.join(missing)}.")
        self.validate_config(config, None)
        import_megatron()
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        self.config = config
        self.tp = int(config.strategy.megatron.tensor_parallel_size)
        self.device = _device(config.strategy.device)
        try:  # what megatron-core's forward asks for the device of RoPE's frequencies and of its memory buffer
            torch.cuda.current_device()
        except (AssertionError, RuntimeError) as exc:  # a CPU build of torch; no GPU visible
            raise RLForgeError(f"strategy.name=megatron needs a CUDA GPU: megatron-core's forward calls "
                               f"torch.cuda.current_device() (RoPE, its memory buffer), which fails here "
                               f"({first_line(exc)}). Use strategy.name=fsdp or tp on CPU.") from None
        if not torch.distributed.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend, rank=int(os.environ["RANK"]),
                                                 world_size=int(os.environ["WORLD_SIZE"]))
        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=1)
        if self.device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(int(config.trainer.seed))
        self.ps = ps
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.rank, self.world_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.global_rank = torch.distributed.get_rank()

    # --- the model ------------------------------------------------------------------------------------
    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The HF model as this rank's slices of a ``GPTModel``, behind :class:`MegatronCausalLM`."""
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        from rlforge.plugins.strategy.megatron_model import MegatronCausalLM

        hf = model.config
        m = self.config.strategy.megatron
        layout = Layout.of(hf, m.make_vocab_size_divisible_by, self.tp)
        kwargs = transformer_config_kwargs(hf, self.tp, 1, model.dtype)
        if self.config.model.gradient_checkpointing:
            kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        gpt = GPTModel(config=TransformerConfig(**kwargs),
                       transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                       **gpt_model_kwargs(hf, layout))
        trainable = any(p.requires_grad for p in model.parameters())
        wrapped = MegatronCausalLM(gpt, hf, layout)
        self.load_model_state_dict(wrapped, model.state_dict())
        return wrapped.to(self.device).requires_grad_(trainable).train(model.training)

    def load_model_state_dict(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        """Full HF weights into this rank's slices."""
        full = hf_to_megatron(weights, model.layout)
        params = dict(model.gpt.named_parameters())
        missing = sorted(set(params) - set(full))
        if missing:
            raise RLForgeError(f"strategy.name=megatron: no weights for {missing[:3]} in the HF state dict.")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(megatron_tp_shard(name, full[name], self.tp_rank, self.tp))

    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF weights, one Megatron parameter at a time (its TP slices gathered). Collective over the ranks.
        A tied output layer is the embedding: it comes once, as in the HF model's ``named_parameters``."""
        for name, p in model.gpt.named_parameters():
            yield from megatron_param_to_hf(name, self._gather(name, p), model.layout)

    def _gather(self, name: str, p: torch.nn.Parameter) -> torch.Tensor:
        """The full Megatron tensor of ``p`` (megatron marks its split parameters ``tensor_model_parallel``)."""
        if self.tp == 1 or not getattr(p, "tensor_model_parallel", False):
            return p.detach()
        parts = [torch.empty_like(p) for _ in range(self.tp)]
        torch.distributed.all_gather(parts, p.detach().contiguous(), group=self.ps.get_tensor_model_parallel_group())
        return megatron_tp_merge(name, parts)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full HF state dict on the CPU on rank 0 (empty elsewhere). Collective."""
        out = {n: t.cpu() for n, t in self.named_weights(model)}
        if model.layout.tied:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out if self.global_rank == 0 else {}

    # --- training -------------------------------------------------------------------------------------
    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        """Sum the gradients over the data-parallel ranks (once per optimizer step: the workers clip right before
        stepping), then clip by the total norm: TP slices summed over the TP group, replicated weights once."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        params = [p for p in model.parameters() if p.grad is not None]
        if self.world_size > 1:
            for p in params:
                torch.distributed.all_reduce(p.grad, group=self.ps.get_data_parallel_group())
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in params:
            if param_is_not_tensor_parallel_duplicate(p):
                squares += torch.linalg.vector_norm(p.grad, dtype=torch.float32).double() ** 2
        if self.tp > 1:
            torch.distributed.all_reduce(squares, group=self.ps.get_tensor_model_parallel_group())
        total = float(squares.sqrt())
        if max_norm and max_norm > 0:
            coef = min(max_norm / (total + 1e-6), 1.0)
            for p in params:
                p.grad.mul_(coef)
        return total

    def reduce_group(self) -> Any:
        return self.ps.get_data_parallel_group()

    # --- checkpoints ----------------------------------------------------------------------------------
    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        raise RLForgeError("strategy.name=megatron keeps its optimizer state sharded: set strategy.checkpoint=sharded.")

    def load_optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        self.optimizer_state_dict(model, optimizer)

    def save_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Model and optimizer state with megatron's ``dist_checkpointing`` (global offsets per TP slice). Collective."""
        from megatron.core import dist_checkpointing

        Path(path).mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(_sharded_state(model, optimizer, optimizer.state_dict()), str(path))

    def load_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load what :meth:`save_sharded` wrote, with any tensor-parallel size. Collective."""
        from megatron.core import dist_checkpointing

        template = _sharded_state(model, optimizer, _optimizer_template(optimizer))
        state = dist_checkpointing.load(template, str(path))
        model.gpt.load_state_dict(state["model"], strict=False)
        optimizer.load_state_dict(_steps_into_state(state["optimizer"]))


def _optimizer_template(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state dict with a state slot for every parameter (a fresh optimizer has none yet; torch's
    own initializer takes a zero-learning-rate step on zero gradients)."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)
    return optimizer.state_dict()


def _sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   optimizer_state: dict[str, Any]) -> dict[str, Any]:
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    model_state = model.gpt.sharded_state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # Adam's per-parameter step counts are scalars, equal within a group: kept in the group (common state)
    for group in optimizer_state["param_groups"]:
        steps = {float(optimizer_state["state"][pid]["step"]) for pid in group["params"]
                 if "step" in optimizer_state["state"].get(pid, {})}
        if steps:
            group["step"] = max(steps)
    optim_state_to_sharding_state(optimizer_state, get_param_id_to_sharded_param_map(model_state, params),
                                  exclude_keys=("step",))
    return {"model": model_state, "optimizer": optimizer_state}


def _steps_into_state(state: dict[str, Any]) -> dict[str, Any]:
    """Put each group's step count back into its parameters' state (the inverse of :func:`_sharded_state`)."""
    for group in state["param_groups"]:
        step = group.pop("step", None)
        if step is not None:
            for pid in group["params"]:
                state["state"][pid]["step"] = torch.tensor(step, dtype=torch.float32)
    return state


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("megatron", MegatronStrategy, config=MegatronConfig,
                               description="megatron-core GPTModel, tensor parallel x data parallel "
                                           "(pip install rlforge[megatron])")
