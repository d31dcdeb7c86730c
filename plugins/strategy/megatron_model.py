"""The HF causal-LM face of a megatron-core ``GPTModel`` (imported when the ``megatron`` strategy builds a model)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from rlforge.ops import position_ids_from_mask
from rlforge.plugins.strategy.megatron_convert import Layout


class MegatronCausalLM(torch.nn.Module):
    """A ``GPTModel`` behind the HF causal-LM call: ``model(input_ids=..., attention_mask=..., position_ids=...,
    logits_to_keep=...).logits`` with the HF vocabulary. ``config`` is the HF config (the engines size by it)."""

    def __init__(self, gpt: torch.nn.Module, config: Any, layout: Layout) -> None:
        super().__init__()
        self.gpt, self.config, self.layout = gpt, config, layout

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int | torch.Tensor = 0,
                **_: Any) -> SimpleNamespace:
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask) if attention_mask is not None else (
                torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids))
        logits = self.gpt(input_ids, position_ids, blocked(attention_mask, position_ids))  # (CUDA: the strategy checks)
        logits = logits[..., :self.layout.vocab]
        if isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        elif logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)


def blocked(attention_mask: torch.Tensor | None, position_ids: torch.Tensor) -> torch.Tensor:
    """Megatron's attention mask, ``[B, 1, S, S]``, True = may not attend: causal, no padding keys, and for packed
    rows (no attention mask, positions restarting at 0) no attention across the sequences."""
    s = position_ids.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=position_ids.device).triu(1)[None, None]
    if attention_mask is not None:
        return causal | ~attention_mask.bool()[:, None, None, :]
    seq = (position_ids == 0).cumsum(-1)
    return causal | (seq[:, None, :, None] != seq[:, None, None, :])


