"""``fabric`` strategy: the model handed to a Lightning Fabric strategy, for users who already run DeepSpeed or
Lightning (``strategy.fabric.strategy``: ``ddp``, ``deepspeed_stage_2``/``_3`` with or without ``_offload``,
``fsdp``), with rlforge's own parts on top:

- summed gradients: Fabric's strategies average gradients over the ranks, rlforge's losses are normalized by
  global counts (the workers sum them over the ranks), so the loss is scaled by the number of ranks before the
  backward pass: the average of ``world_size x`` the local gradients is their sum;
- the weight stream for the rollout engine (``named_weights``): full tensors, gathered where the strategy
  partitions them (DeepSpeed ZeRO-3: ``GatheredParameters`` per bucket; FSDP: ``summon_full_params``);
- checkpoints: ``strategy.checkpoint=sharded`` goes through ``fabric.save``/``fabric.load`` (each strategy's own
  layout: one file for ddp, DeepSpeed's checkpoint folder, FSDP's sharded folder).

Processes are started by a launcher, as for ``fsdp`` (the Ray controller or torchrun); Fabric joins them through
its TorchElastic cluster environment. What has run where: ``ddp`` on CPU over gloo (equal to the ``fsdp``
strategy's updates, ``tests/plugins/test_fabric.py``); DeepSpeed and Fabric's FSDP need a GPU here and have not
run (docs/distributed.md). On a CPU, Lightning refuses DeepSpeed ("only supported on CUDA GPUs").
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.capabilities import StrategyCapabilities
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.plugins.strategy.fsdp import LAUNCH_ENV, _device
from rlforge.strategy import BaseStrategy, ProcessGroupCollectives

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

STRATEGIES = ("ddp", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
              "deepspeed_stage_3_offload", "fsdp")
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed")


@dataclass
class FabricConfig:
    """The ``fabric`` strategy (``strategy.name=fabric``)."""

    strategy: str = "ddp"  # ddp | deepspeed_stage_2 | deepspeed_stage_2_offload | deepspeed_stage_3 | deepspeed_stage_3_offload | fsdp
    precision: str = "32-true"  # Fabric precision: 32-true | bf16-mixed | bf16-true | 16-mixed
    weight_sync_bucket_mb: float = 256.0  # gathered weights streamed to the rollout engine per bucket


def _original(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside Fabric's wrapper (the same parameters)."""
    return getattr(model, "_original_module", model)


class FabricStrategy(ProcessGroupCollectives, BaseStrategy):
    """A Lightning Fabric strategy under rlforge's workers (summed gradients, gathered weight stream)."""

    capabilities = StrategyCapabilities(sharded=True)  # several processes; the workers keep a replica for hf

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        f = config.strategy.fabric
        if f.strategy not in STRATEGIES:
            raise ConfigError(f"strategy.fabric.strategy='{f.strategy}'. Allowed: {', '.join(STRATEGIES)}.")
        if f.precision not in PRECISIONS:
            raise ConfigError(f"strategy.fabric.precision='{f.precision}'. Allowed: {', '.join(PRECISIONS)}.")
        if f.strategy != "ddp" and config.strategy.device == "cpu":
            raise ConfigError(f"strategy.fabric.strategy={f.strategy} needs a GPU (Lightning: DeepSpeed and FSDP do "
                              f"not run on CPU); on CPU use ddp.")
        if f.strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(f"strategy.fabric.strategy={f.strategy} needs DeepSpeed, which is not installed here: "
                              f"pip install 'rlforge[deepspeed]' (on every machine of the run), or use ddp or fsdp.")

    def __init__(self, config: Any) -> None:
        try:
            from lightning.fabric import Fabric
            from lightning.fabric.plugins.environments import TorchElasticEnvironment
        except ImportError as exc:
            raise RLForgeError(f"strategy.name=fabric needs Lightning ({exc}): pip install lightning "
                               f"(and 'rlforge[deepspeed]' for the deepspeed strategies).") from None
        missing = [k for k in LAUNCH_ENV if k not in os.environ]
        if missing:
            raise ConfigError("strategy.name=fabric runs one process per rank, started by a launcher: set "
                              "trainer.controller=ray or torchrun (strategy.num_processes=N). Missing environment: "
                              f"{', '.join(missing)}.")
        self.validate_config(config, None)
        f = config.strategy.fabric
        self.kind = f.strategy
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        os.environ.setdefault("LOCAL_RANK", "0")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        os.environ.setdefault("GROUP_RANK", str(self.rank // local))
        self.device = _device(config.strategy.device)
        self.fabric = Fabric(accelerator=self.device.type, devices=local, num_nodes=self.world_size // local,
                             strategy=f.strategy, precision=f.precision, plugins=[TorchElasticEnvironment()])
        self.fabric.launch()  # joins the launched processes (the process group, if not there yet)
        self.bucket_bytes = max(1, int(f.weight_sync_bucket_mb * 2**20))

    # --- model and training ---------------------------------------------------------------------------
    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """ddp and fsdp wrap the model now; DeepSpeed wraps it with its optimizer (:meth:`setup_optimizer`)."""
        if self.kind.startswith("deepspeed"):
            return model.to(self.device)
        return self.fabric.setup_module(model)

    def setup_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
                        ) -> tuple[torch.nn.Module, Any]:
        """Called by the workers once the optimizer exists: DeepSpeed builds its engine from both."""
        if self.kind.startswith("deepspeed"):
            return self.fabric.setup(model, optimizer)
        return model, self.fabric.setup_optimizers(optimizer)

    def backward(self, loss: torch.Tensor) -> None:
        self.fabric.backward(loss * self.world_size)  # the strategy averages: x world_size makes it the sum

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        """ddp: every rank holds the summed gradients, clipped as on one device. DeepSpeed clips inside its
        optimizer (its ``gradient_clipping``) and reports no norm before the step: 0 is returned."""
        if self.kind.startswith("deepspeed"):
            return 0.0
        if self.kind == "fsdp":
            return float(self.fabric.clip_gradients(model, _raw(model), max_norm=max_norm or float("inf")))
        return super().clip_grad_norm(_original(model), max_norm)


    # --- weights ---------------------------------------------------------------------------------------
    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in buckets; gathered first where the strategy partitions them. Collective."""
        params = list(_original(model).named_parameters())
        for bucket in _buckets(params, self.bucket_bytes):
            with self._gathered(model, [p for _, p in bucket]):
                yield from ((name, p.detach().clone()) for name, p in bucket)

    def _gathered(self, model: torch.nn.Module, params: list[torch.nn.Parameter]) -> Any:
        import contextlib

        if self.kind.startswith("deepspeed_stage_3"):
            import deepspeed

            return deepspeed.zero.GatheredParameters(params)
        if self.kind == "fsdp":
            from torch.distributed.fsdp import FullyShardedDataParallel

            return FullyShardedDataParallel.summon_full_params(model, writeback=False)
        return contextlib.nullcontext()

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self.kind == "ddp":
            return super().model_state_dict(_original(model))
        out = {n: t.cpu() for n, t in self.named_weights(model)}
        return out if self.rank == 0 else {}

    def _full_state_only_on_ddp(self) -> None:
        if self.kind != "ddp":
            raise RLForgeError(f"strategy.fabric.strategy={self.kind} checkpoints its training state sharded (its own "
                               f"layout): set strategy.checkpoint=sharded.")

    def load_model_state_dict(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        self._full_state_only_on_ddp()
        super().load_model_state_dict(_original(model), weights)

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        self._full_state_only_on_ddp()
        return super().optimizer_state_dict(_original(model), _raw(optimizer))

    def load_optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        super().load_optimizer_state_dict(_original(model), _raw(optimizer), state)

    def save_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.fabric.save(Path(path), {"model": model, "optimizer": optimizer})

    def load_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.fabric.load(Path(path), {"model": model, "optimizer": optimizer})


def _raw(optimizer: Any) -> Any:
    """The torch optimizer inside Fabric's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def _buckets(params: list[tuple[str, Any]], limit: int) -> Iterator[list[tuple[str, Any]]]:
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, p in params:
        nbytes = getattr(p, "ds_numel", p.numel()) * p.element_size()  # ZeRO-3 leaves an empty local tensor
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, p))
        size += nbytes
    if bucket:
        yield bucket


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("fabric", FabricStrategy, config=FabricConfig,
                               description="a Lightning Fabric strategy (ddp, deepspeed, fsdp) with summed gradients")
