"""``single`` strategy: one device (CPU or one GPU), no sharding."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlforge.capabilities import StrategyCapabilities
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.strategy import BaseStrategy

if TYPE_CHECKING:
    import torch


def pick_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"strategy.device='{name}' but no CUDA device is available. Use auto or cpu.")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"strategy.device='{name}' is not a device (use auto, cpu, cuda or cuda:N).") from None


class SingleDeviceStrategy(BaseStrategy):
    """Everything on one device; gradients are clipped by global norm."""

    # shares_prompts: verified with model.shared_prefix (tests/controller/test_worker.py)
    capabilities = StrategyCapabilities(shares_prompts=True, async_checkpoint=True)

    def __init__(self, config: Any) -> None:
        self.device = pick_device(config.strategy.device)
        self.configure_precision(config)

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def all_reduce_sum(self, value: float) -> float:
        return value

    def all_reduce_max(self, value: float) -> float:
        return value


@hookimpl
def rlforge_register(registry):
    registry.strategy.register("single", SingleDeviceStrategy)
