"""Tensor utilities shared by the core, algorithms and engines (no algorithm math here)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 where the mask is empty)."""
    if dim is None:
        return masked_sum(x, mask) / mask.sum().clamp(min=1)
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels], computed in fp32 without keeping a full fp32 copy per row."""
    logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) along the last dimension."""
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of the last ``response_len`` tokens of ``input_ids``.

    Logits are divided by ``temperature`` (the sampling distribution), as the rollout engines do.
    Only the response positions' logits are materialized.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        logits_to_keep=response_len + 1,
    )
    logits = out.logits[:, -response_len - 1 : -1, :]
    if temperature and temperature != 1.0:
        logits = logits / temperature
    labels = input_ids[:, -response_len:]
    logp = logprobs_from_logits(logits, labels)
    ent = entropy_from_logits(logits) if with_entropy else None
    return logp, ent


def response_values(
    critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
) -> torch.Tensor:
    """Per-token values ``V(s_t)`` of the state before each response token, from a model with a scalar head
    (``...ForTokenClassification`` with ``num_labels=1``)."""
    out = critic(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    )
    return out.logits[:, -response_len - 1 : -1, 0].float()
