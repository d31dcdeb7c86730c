"""Tensor utilities shared by the core, algorithms and engines (no algorithm math here).

Forward passes over responses (``response_logprobs``, ``response_values``) come in two layouts:

- padded (default): the batch as it is, minus the columns that are padding in every row (the common left
  padding of the prompts and the common right padding of the responses), so a micro-batch of short
  sequences costs what its longest sequence needs, not ``max_prompt_length + max_new_tokens``;
- packed (``remove_padding=True``): the real tokens of all rows concatenated into one row, each sequence's
  ``position_ids`` restarting at 0 and no attention mask, which transformers turns into a block-diagonal
  causal mask (sdpa/eager) or variable-length attention (flash attention). No padding token is computed.
  (transformers only does so without a KV cache: every forward here passes ``use_cache=False``.)

Log-probs and entropy are computed from the logits in chunks of at most ``LOGITS_CHUNK_ELEMENTS`` fp32
elements (recomputed in the backward pass), never as one full-vocabulary fp32 tensor for the whole batch.

A model given to ``compile_forward`` (``model.compile=true``) runs these forward passes through
``torch.compile`` with dynamic shapes; generation still calls the model itself, eagerly.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

LOGITS_CHUNK_ELEMENTS = 1 << 24  # fp32 logits elements per chunk (64 MiB)
_COMPILED = "_rlforge_compiled_forward"  # the attribute of a model that holds its compiled forward


def compile_forward(model: torch.nn.Module) -> None:
    """Make ``response_logprobs``/``response_values`` call ``model`` through ``torch.compile(dynamic=True)``: one
    graph for any batch size and sequence length (a few recompiles at most, e.g. with and without autograd).
    The model itself, its state dict and its other callers (``generate``) are unchanged."""
    # object.__setattr__: kept out of the module tree, so no state-dict keys or submodule appear
    object.__setattr__(model, _COMPILED, torch.compile(model, dynamic=True))


def _forward(model: torch.nn.Module) -> torch.nn.Module:
    return model.__dict__.get(_COMPILED, model)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 where the mask is empty)."""
    if dim is None:
        return masked_sum(x, mask) / mask.sum().clamp(min=1)
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def _logprobs_entropy(logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    # H = -sum p log p = logsumexp(z) - sum softmax(z) z
    return logp, lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool = False,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits)[labels]`` (and the entropy of ``softmax(logits)``) in fp32, shaped like ``labels``.

    The leading dimensions are processed in chunks of ``chunk_elements`` fp32 logits; with autograd on, each
    chunk's fp32 intermediates are recomputed in the backward pass instead of being kept.
    """
    vocab = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    rows = max(1, chunk_elements // vocab)
    if flat.shape[0] <= rows:
        logp, ent = _logprobs_entropy(flat, flat_labels, with_entropy)
    else:
        recompute = torch.is_grad_enabled() and flat.requires_grad
        parts = [
            checkpoint(_logprobs_entropy, flat[i : i + rows], flat_labels[i : i + rows], with_entropy,
                       use_reentrant=False) if recompute
            else _logprobs_entropy(flat[i : i + rows], flat_labels[i : i + rows], with_entropy)
            for i in range(0, flat.shape[0], rows)
        ]
        logp = torch.cat([p[0] for p in parts])
        ent = torch.cat([p[1] for p in parts]) if with_entropy else None
    return logp.view(labels.shape), (ent.view(labels.shape) if ent is not None else None)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens (left padding gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _trim(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
          ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop the columns that are padding in every row; returns (ids, mask, kept response columns)."""
    real_cols = attention_mask.bool().any(0).nonzero()
    start = int(real_cols[0]) if len(real_cols) else 0
    resp_cols = attention_mask[:, -response_len:].bool().any(0).nonzero()
    kept = int(resp_cols[-1]) + 1 if len(resp_cols) else 1
    end = attention_mask.shape[1] - response_len + kept
    return input_ids[:, start:end], attention_mask[:, start:end], kept


def _pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed layout: (ids [1, T], position ids [1, T], the packed index of the token before each real response
    token, the real-response-token mask [B, response_len])."""
    real = attention_mask.bool()
    packed_index = real.flatten().cumsum(0).view_as(real) - 1
    resp_real = real[:, -response_len:]
    before = packed_index[:, -response_len:][resp_real] - 1  # the position whose logits predict the token
    return input_ids[real][None], position_ids_from_mask(attention_mask)[real][None], before, resp_real


def _unpack(values: torch.Tensor, resp_real: torch.Tensor) -> torch.Tensor:
    """Scatter per-real-token ``values`` back to [B, response_len] (0 at padding), keeping autograd."""
    return values.new_zeros(resp_real.shape).masked_scatter(resp_real, values)


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    remove_padding: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of the last ``response_len`` tokens of ``input_ids``, [B, response_len],
    0 at padding positions.

    Logits are divided by ``temperature`` (the sampling distribution), as the rollout engines do. Only the
    logits that predict response tokens are computed (``logits_to_keep``).
    """
    if remove_padding:
        ids, pos, before, resp_real = _pack(input_ids, attention_mask, response_len)
        logits = _forward(model)(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False,
                                 logits_to_keep=before).logits[0]
        labels = input_ids[:, -response_len:][resp_real]
    else:
        ids, mask, kept = _trim(input_ids, attention_mask, response_len)
        logits = _forward(model)(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                                 use_cache=False, logits_to_keep=kept + 1).logits[:, :-1]
        labels = ids[:, -kept:]
    if temperature and temperature != 1.0:
        logits = logits / temperature
    logp, ent = token_logprobs(logits, labels, with_entropy)
    if remove_padding:
        return _unpack(logp, resp_real), (_unpack(ent, resp_real) if ent is not None else None)
    pad = (0, response_len - kept)
    mask = attention_mask[:, -response_len:]
    return torch.nn.functional.pad(logp, pad) * mask, (torch.nn.functional.pad(ent, pad) * mask
                                                       if ent is not None else None)


def response_values(
    critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
    remove_padding: bool = False,
) -> torch.Tensor:
    """Per-token values ``V(s_t)`` of the state before each response token, [B, response_len], 0 at padding,
    from a model with a scalar head (``...ForTokenClassification`` with ``num_labels=1``)."""
    if remove_padding:
        ids, pos, before, resp_real = _pack(input_ids, attention_mask, response_len)
        scores = _forward(critic)(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False).logits[0, :, 0]
        return _unpack(scores[before].float(), resp_real)
    ids, mask, kept = _trim(input_ids, attention_mask, response_len)
    scores = _forward(critic)(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                              use_cache=False).logits
    values = scores[:, -kept - 1 : -1, 0].float()
    return torch.nn.functional.pad(values, (0, response_len - kept)) * attention_mask[:, -response_len:]


def sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    pad_token_id: int) -> torch.Tensor:
    """One score per row [B] (float32) from a ``...ForSequenceClassification`` model with one label, pooled by the
    model's own forward at each row's last real token. Padding positions are set to ``pad_token_id`` first (the
    model finds the last token by it), so left, right or mixed padding pools the same token."""
    ids = input_ids.masked_fill(attention_mask == 0, pad_token_id)
    out = _forward(model)(input_ids=ids, attention_mask=attention_mask,
                          position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    return out.logits[:, 0].float()
