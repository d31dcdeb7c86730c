"""Numerical precision (``model.precision``), shared by RL, SFT and the offline algorithms.

The names are Lightning's:

| precision    | weights and optimizer state | forward/backward compute | loss scaling |
|--------------|-----------------------------|--------------------------|--------------|
| ``32-true``  | fp32                        | fp32                     | no           |
| ``bf16-mixed`` | fp32 (master weights)     | bf16 (autocast)          | no           |
| ``16-mixed`` | fp32 (master weights)       | fp16 (autocast)          | yes (dynamic, ``torch.amp.GradScaler``) |
| ``bf16-true`` | bf16                       | bf16                     | no           |
| ``auto``     | ``bf16-mixed`` on CUDA, ``32-true`` elsewhere |           |              |

Log-probs, entropies and losses are computed in fp32 from the logits in every mode (``rlforge.ops``). A frozen
model (the reference policy) is stored in the compute dtype of a mixed mode: it is never updated, so it needs
no fp32 master copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")


@dataclass(frozen=True)
class Precision:
    name: str
    weights: str  # torch dtype name of trained weights and optimizer state
    compute: str | None  # autocast dtype; None = the weights' dtype, no autocast
    scaler: bool = False  # dynamic loss scaling (fp16)

    @property
    def frozen(self) -> str:
        """Dtype of a frozen model (the reference): the compute dtype of a mixed mode."""
        return self.compute or self.weights

    def dtype(self, which: str = "weights") -> torch.dtype:
        import torch

        return getattr(torch, getattr(self, which))


_TABLE = {
    "32-true": Precision("32-true", "float32", None),
    "bf16-mixed": Precision("bf16-mixed", "float32", "bfloat16"),
    "16-mixed": Precision("16-mixed", "float32", "float16", scaler=True),
    "bf16-true": Precision("bf16-true", "bfloat16", None),
}


def check(name: str) -> None:
    """Raise a ConfigError naming ``model.precision`` and the choices unless ``name`` is one of them."""
    if name not in PRECISIONS:
        raise ConfigError(f"'model.precision' is '{name}'. Allowed: {', '.join(PRECISIONS)}.")


def resolve(name: str, device: Any = None) -> Precision:
    """The precision ``name`` means on ``device`` (a torch.device or its type; ``auto`` depends on it)."""
    check(name)
    if name == "auto":
        kind = getattr(device, "type", device)
        name = "bf16-mixed" if kind == "cuda" else "32-true"
    return _TABLE[name]


def for_config(config: Any) -> Precision:
    """The run's precision, ``auto`` resolved by where ``strategy.device`` puts the models."""
    device = config.strategy.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return resolve(config.model.precision, str(device).split(":")[0])
