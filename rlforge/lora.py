"""LoRA adapters through ``peft`` (``model.lora.*``), shared by RL, SFT and the offline algorithms.

With ``model.lora.rank > 0`` the actor is the base model wrapped by ``peft.get_peft_model``: only the adapter
weights train (they alone are in the optimizer and in checkpoints), and the reference policy is the same
model with the adapter disabled, so no second copy of the weights is held. Rollout engines that keep their
own copy of the weights (vLLM) receive the merged weights under the base model's names (``merged_weights``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError

if TYPE_CHECKING:
    import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # what peft's save_pretrained writes for an adapter
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."  # peft's name prefix over the base model's parameters


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (``model.lora.rank > 0``); the reference is the base model."""

    rank: int = 0  # adapter rank r; 0 = no LoRA (full fine-tuning)
    alpha: int = 16  # scaling alpha (the update is alpha / r x B A)
    dropout: float = 0.0  # dropout on the adapter's input
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # module names, or [all-linear]


def enabled(config: Any) -> bool:
    return int(config.model.lora.rank) > 0


def validate(config: Any) -> None:
    lora = config.model.lora
    if lora.rank and config.strategy.num_processes > 1:
        raise ConfigError(
            f"LoRA (model.lora.rank={lora.rank}) runs on one device so far: set strategy.num_processes=1 "
            f"(got {config.strategy.num_processes}). LoRA with FSDP is not supported yet (docs/models.md)."
        )
    if lora.rank < 0:
        raise ConfigError(f"'model.lora.rank' must be >= 0 (0 = off), got {lora.rank}.")
    if lora.rank and lora.alpha <= 0:
        raise ConfigError(f"'model.lora.alpha' must be > 0, got {lora.alpha}.")
    if not 0.0 <= lora.dropout < 1.0:
        raise ConfigError(f"'model.lora.dropout' must be in [0, 1), got {lora.dropout}.")
    if lora.rank and not lora.target_modules:
        raise ConfigError("'model.lora.target_modules' is empty: name modules (e.g. [q_proj,v_proj]) or [all-linear].")


def wrap(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """``model`` with fresh LoRA adapters (``peft.get_peft_model``); the base weights are frozen."""
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora.rank > 0 needs the peft package: pip install peft.") from None
    from rlforge.multimodal import lora_excluded

    lora = config.model.lora
    targets = list(lora.target_modules)
    every = targets == ["all-linear"]
    spec = peft.LoraConfig(
        r=int(lora.rank), lora_alpha=int(lora.alpha), lora_dropout=float(lora.dropout),
        target_modules="all-linear" if every else targets, task_type="CAUSAL_LM",
        exclude_modules=lora_excluded(model) if every else None,  # all-linear: a vision tower is left out
    )
    try:
        return peft.get_peft_model(model, spec)
    except ValueError as exc:  # e.g. a target module that the model does not have
        raise ConfigError(f"LoRA cannot be applied (model.lora.target_modules={targets}): {exc}") from None


def is_lora(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def base_model_context(model: Any) -> Any:
    """The context in which ``model`` computes as its base (the adapter off): the LoRA run's reference."""
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights with the adapter merged in, under the base model's parameter names (for an engine that holds
    a plain copy of the model). The adapter is merged for the iteration and unmerged after it."""
    import torch

    with torch.no_grad():
        model.merge_adapter()
        try:
            for name, param in model.named_parameters():
                if "lora_" in name:
                    continue
                yield name.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."), param.detach()
        finally:
            model.unmerge_adapter()


def merged_model(model: Any) -> torch.nn.Module:
    """A plain model with the adapter merged in, leaving ``model`` (the adapter model) as it is."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold: all of them, or only the adapter's with LoRA."""
    return [p for p in model.parameters() if p.requires_grad]
