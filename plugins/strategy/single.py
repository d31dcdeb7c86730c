"""``single`` strategy: one device (CPU or one GPU), no sharding."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"strategy.device='{name}' but no CUDA device is available. Use auto or cpu.")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"strategy.device='{name}' is not a device (use auto, cpu, cuda or cuda:N).") from None


class SingleDeviceStrategy:
    """Everything on one device; gradients are clipped by global norm."""

    world_size = 1
    rank = 0

    def __init__(self, config: Any) -> None:
        self.device = pick_device(config.strategy.device)

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
        params = [p for p in params if p.grad is not None]
        if max_norm and max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        return float(torch.nn.utils.get_total_norm([p.grad for p in params]))

    def all_reduce_sum(self, value: float) -> float:
        return value

    def all_reduce_max(self, value: float) -> float:
        return value

    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in model.named_parameters():
            yield name, p.detach()


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("single", SingleDeviceStrategy)
