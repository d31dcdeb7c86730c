"""Tensor utilities shared by the core, algorithms and engines (no algorithm math here).

Forward passes over responses (``response_logprobs``, ``response_values``) come in two layouts:

- padded (default): the batch as it is, minus the columns that are padding in every row (the common left
  padding of the prompts and the common right padding of the responses), so a micro-batch of short
  sequences costs what its longest sequence needs, not ``max_prompt_length + max_new_tokens``. Rows of very
  different lengths run as separate padded passes, grouped by ``microbatch.length_groups`` (one process only:
  the ranks of a distributed model must run the same passes), so that a heavy-tailed micro-batch (most responses
  short, a few at the length limit) costs about its tokens, not rows x its longest row; the results are put back
  in row order (the gradient is the one of a single pass, up to float rounding);
- packed (``remove_padding=True``): the real tokens of all rows concatenated into one row, each sequence's
  ``position_ids`` restarting at 0 and no attention mask, which transformers turns into a block-diagonal
  causal mask (sdpa/eager) or variable-length attention (flash attention). No padding token is computed.
  (transformers only does so without a KV cache: every packed forward passes ``use_cache=False``.)

A padded forward pass on a model marked by ``share_prompts`` (``model.shared_prefix``, where the worker finds it
applies) runs each distinct prompt of the micro-batch once (rows grouped by identical prompt ids and mask, in any
order: ``prompt_groups``), then every row's response on a copy of its prompt's KV cache; gradients flow through
the cache into the prompt's forward. The results are the padded layout's (same trimming, same positions). A
micro-batch in which no prompt repeats takes the plain padded path, unless the model shares ``SHARE_ALWAYS``.

Log-probs and entropy are computed from the logits in chunks of at most ``LOGITS_CHUNK_ELEMENTS`` fp32
elements (recomputed in the backward pass), never as one full-vocabulary fp32 tensor for the whole batch.

A model marked by ``sequence_parallel`` runs its packed forward passes over the ranks of a sequence-parallel group
(Ulysses): each rank holds a slice of the packed row, the per-token outputs are gathered back, every rank returns the
whole result (``rlforge/ulysses.py``).

A vision-language model's passes take the rows' vision inputs (``multi_modal``: ``B.MULTI_MODAL_INPUTS``, see
``rlforge.multimodal``): padded, with M-RoPE positions (3, B, L) from the model's ``get_rope_index``; packed, with
verl's (4, 1, T) positions (the 1-D positions over the three M-RoPE rows). They never share prompts' KV caches.

A model given to ``compile_forward`` (``model.compile=true``) runs these forward passes through
``torch.compile`` with dynamic shapes; generation still calls the model itself, eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from rlforge import multimodal
from rlforge.lengths import length_groups
from rlforge.errors import RLForgeError

LOGITS_CHUNK_ELEMENTS = 1 << 24  # fp32 logits elements per chunk (64 MiB)
_COMPILED = "_rlforge_compiled_forward"  # the attribute of a model that holds its compiled forward
_SHARED = "_rlforge_shared_prefix"  # the attribute of a model whose padded forward passes share prompts; its value:
SHARE_REPEATED = "repeated"  # split a micro-batch's forward into the prompts' and the responses' where a prompt repeats
SHARE_ALWAYS = "always"  # split every one (the ranks of a sharded model then run the same passes: collectives pair up)
_SEQUENCE_PARALLEL = "_rlforge_sequence_parallel"  # the attribute of a model whose packed passes are sequence-parallel


def compile_forward(model: torch.nn.Module, backend: str = "inductor") -> None:
    """Make ``response_logprobs``/``response_values`` call ``model`` through ``torch.compile(dynamic=True)``: one
    graph for any batch size and sequence length (a few recompiles at most, e.g. with and without autograd).
    The model itself, its state dict and its other callers (``generate``) are unchanged."""
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise RLForgeError(f"Unknown torch.compile backend '{backend}' (model.compile_backend). Available: "
                           f"{', '.join(known)}.")
    # object.__setattr__: kept out of the module tree, so no state-dict keys or submodule appear
    object.__setattr__(model, _COMPILED, torch.compile(model, dynamic=True, backend=backend))


def _forward(model: torch.nn.Module) -> torch.nn.Module:
    return model.__dict__.get(_COMPILED, model)


def share_prompts(model: torch.nn.Module, when: str | None = SHARE_REPEATED) -> None:
    """Make the padded ``response_logprobs``/``response_values`` of ``model`` run each distinct prompt of a
    micro-batch once, the responses on its KV cache (see the module docstring); ``when``: ``SHARE_REPEATED``,
    ``SHARE_ALWAYS``, or None (off). ``model`` must be a transformers decoder whose forward fills a ``DynamicCache``
    (the workers decide where it applies: ``model.shared_prefix``)."""
    object.__setattr__(model, _SHARED, when)  # as compile_forward: no state-dict key


def shares_prompts(model: torch.nn.Module) -> bool:
    return model.__dict__.get(_SHARED) is not None


def sequence_parallel(model: torch.nn.Module, sp: object) -> None:
    """Make the packed (``remove_padding``) forward passes of ``model`` sequence-parallel: ``sp`` runs them
    (``sp.packed_outputs(model, ids, position_ids, before, outputs, logits_to_keep)``, one packed row sliced over
    its ranks; the ``fsdp`` strategy's ``ulysses.SequenceParallel``). Padded forward passes are unchanged."""
    object.__setattr__(model, _SEQUENCE_PARALLEL, sp)  # as compile_forward: no state-dict key


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 where the mask is empty)."""
    if dim is None:
        return masked_sum(x, mask) / mask.sum().clamp(min=1)
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def _logprobs_entropy(logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, at_ids: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """In fp32: ``log softmax(logits)`` at ``labels``, the entropy (``with_entropy``) and the log-softmax at
    ``at_ids`` [..., K] (where given)."""
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    logp = (logits.gather(-1, labels.unsqueeze(-1)) - lse).squeeze(-1)
    # H = -sum p log p = logsumexp(z) - sum softmax(z) z
    ent = lse.squeeze(-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else None
    return logp, ent, (logits.gather(-1, at_ids) - lse if at_ids is not None else None)


def _chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, at_ids: torch.Tensor | None,
                      chunk_elements: int) -> tuple[torch.Tensor | None, ...]:
    """:func:`_logprobs_entropy` over the leading dimensions flattened, in chunks of ``chunk_elements`` fp32 logits;
    with autograd on, each chunk's fp32 intermediates are recomputed in the backward pass instead of being kept.
    Outputs flat (rows first)."""
    vocab = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    flat_ids = at_ids.reshape(-1, at_ids.shape[-1]) if at_ids is not None else None
    rows = max(1, chunk_elements // vocab)
    if flat.shape[0] <= rows:
        return _logprobs_entropy(flat, flat_labels, with_entropy, flat_ids)
    recompute = torch.is_grad_enabled() and flat.requires_grad
    parts = []
    for i in range(0, flat.shape[0], rows):
        args = (flat[i:i + rows], flat_labels[i:i + rows], with_entropy,
                flat_ids[i:i + rows] if flat_ids is not None else None)
        parts.append(checkpoint(_logprobs_entropy, *args, use_reentrant=False) if recompute
                     else _logprobs_entropy(*args))
    return tuple(torch.cat([p[j] for p in parts]) if parts[0][j] is not None else None for j in range(3))


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool = False,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits)[labels]`` (and the entropy of ``softmax(logits)``) in fp32, shaped like ``labels``.

    The leading dimensions are processed in chunks of ``chunk_elements`` fp32 logits; with autograd on, each
    chunk's fp32 intermediates are recomputed in the backward pass instead of being kept.
    """
    logp, ent, _ = _chunked_logprobs(logits, labels, with_entropy, None, chunk_elements)
    return logp.view(labels.shape), (ent.view(labels.shape) if ent is not None else None)


def topk_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, topk_ids: torch.Tensor, chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For losses over the distribution at given tokens (top-k distillation), from ``logits`` [..., V] in fp32:
    ``log softmax(logits)`` at ``labels`` [...] and at ``topk_ids`` [..., K], the entropy [...], and the ids of the
    K largest logits [..., K] (no gradient). As :func:`token_logprobs`, chunked by ``chunk_elements`` fp32 logits
    with each chunk's intermediates recomputed in the backward pass: the [..., V] log-softmax is never held whole."""
    logp, entropy, at_ids = _chunked_logprobs(logits, labels, True, topk_ids, chunk_elements)
    k, flat = topk_ids.shape[-1], logits.detach().reshape(-1, logits.shape[-1])
    rows = max(1, chunk_elements // flat.shape[-1])
    own = torch.cat([flat[i:i + rows].topk(k, dim=-1).indices for i in range(0, flat.shape[0], rows)])
    return (logp.view(labels.shape), entropy.view(labels.shape), at_ids.view(topk_ids.shape),
            own.view(topk_ids.shape))


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


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows grouped by identical prompt (ids and mask), in any order: (one row of each distinct prompt [U], the
    position in it of each row's prompt [B]), or None when no prompt repeats."""
    unique, inverse = torch.unique(torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1), dim=0,
                                   return_inverse=True)
    if len(unique) == len(prompt_ids):
        return None
    rows = torch.arange(len(prompt_ids), device=prompt_ids.device)
    first = torch.full((len(unique),), len(prompt_ids), device=prompt_ids.device).scatter_reduce(0, inverse, rows, "amin")
    return first, inverse


def _groups(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, kept: int
            ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The prompt groups of the trimmed rows when ``model`` shares prompts and one repeats (or it shares them
    ``SHARE_ALWAYS``: then each row its own group), else None (the plain path)."""
    when = model.__dict__.get(_SHARED)
    groups = prompt_groups(ids[:, :-kept], mask[:, :-kept]) if when is not None else None
    if groups is None and when == SHARE_ALWAYS:
        rows = torch.arange(len(ids), device=ids.device)
        return rows, rows
    return groups


def _shared_prefix_forward(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, kept: int,
                           groups: tuple[torch.Tensor, torch.Tensor], **prompt_kwargs: object) -> torch.Tensor:
    """The model's ``logits`` at the positions before each of the last ``kept`` tokens of the trimmed rows
    ``ids``/``mask`` ([B, kept, ...]), as one padded forward would give them: each distinct prompt (``groups``) runs
    once, then the response tokens on its KV cache (but the last, which predicts nothing kept: always at least one
    token, so that every call runs the same two forward passes)."""
    from transformers import DynamicCache

    first, inverse = groups
    width = ids.shape[1] - kept
    pos = position_ids_from_mask(mask)
    cache = DynamicCache()
    out = model(input_ids=ids[first, :width], attention_mask=mask[first, :width], position_ids=pos[first, :width],
                past_key_values=cache, use_cache=True, **prompt_kwargs)
    if cache.get_seq_length() != width:
        raise RLForgeError(f"model.shared_prefix=true, but {type(model).__name__} did not fill the prompts' KV cache (a "
                           "forward that ignores past_key_values, or gradient-checkpointed layers in training mode "
                           "drop it). Set model.shared_prefix=false for this model.")
    cache.reorder_cache(inverse)
    end = width + max(kept - 1, 1)
    rest = model(input_ids=ids[:, width:end], attention_mask=mask[:, :end], position_ids=pos[:, width:end],
                 past_key_values=cache, use_cache=True).logits
    return torch.cat([out.logits[:, -1:][inverse], rest[:, : kept - 1]], 1)


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


Outputs = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor | None, ...]]


def _packed_outputs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
                    outputs: Outputs, logits_to_keep: bool = True, multi_modal: list | None = None
                    ) -> tuple[torch.Tensor | None, ...]:
    """``outputs(logits, labels)`` at the positions that predict the response tokens, from one packed forward pass
    (sequence-parallel where the model is marked by :func:`sequence_parallel`), each put back as [B, response_len]
    (0 at padding). ``logits_to_keep``: the model computes logits only there (causal LMs); else it returns every
    position (token classifiers) and they are picked. ``multi_modal``: the rows' vision inputs; the packed row then
    has verl's (4, 1, T) positions: the 1-D positions (which mark where each sequence starts) over the M-RoPE rows."""
    ids, pos, before, resp_real = _pack(input_ids, attention_mask, response_len)
    sp = model.__dict__.get(_SEQUENCE_PARALLEL)
    vision = multimodal.forward_inputs(model, input_ids, attention_mask, multi_modal) if multi_modal else None
    if vision is not None:
        if sp is not None:
            raise RLForgeError("Sequence parallelism (strategy.fsdp.sequence_parallel_size > 1) does not take rows with "
                               "images yet: set it to 1 for a vision-language model (docs/multimodal.md).")
        rope = vision.pop("position_ids")[:, attention_mask.bool()]  # (3, T): each row's real tokens, in order
        vision["position_ids"] = torch.cat([pos, rope])[:, None]
    if sp is not None:
        values = sp.packed_outputs(model, ids, pos, before, outputs, logits_to_keep)
    else:
        keep = {"logits_to_keep": before} if logits_to_keep else {}
        out = _forward(model)(input_ids=ids, attention_mask=None, use_cache=False,
                              **(vision or {"position_ids": pos}), **keep).logits[0]
        values = outputs(out if logits_to_keep else out[before], input_ids[:, -response_len:][resp_real])
    return tuple(None if v is None else _unpack(v, resp_real) for v in values)


def _by_length(attention_mask: torch.Tensor, padded: Callable[[torch.Tensor], tuple[torch.Tensor | None, ...]]
               ) -> tuple[torch.Tensor | None, ...]:
    """``padded(rows)`` (a padded pass over those rows of the batch: per-row results) on each group of rows of similar
    length (``microbatch.length_groups``), the results put back in row order; one pass over all rows where grouping
    saves nothing, or where several processes run the model (their forward passes must pair up)."""
    rows = torch.arange(len(attention_mask), device=attention_mask.device)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1
    groups = [rows.tolist()] if distributed else length_groups(attention_mask.sum(1).tolist())
    if len(groups) == 1:
        return padded(rows)
    parts = [padded(torch.tensor(g, device=rows.device)) for g in groups]
    back = torch.empty_like(rows)
    back[torch.tensor([i for g in groups for i in g], device=rows.device)] = rows
    return tuple(None if part[0] is None else torch.cat(list(part))[back] for part in zip(*parts))


def _response_outputs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      response_len: int, temperature: float, remove_padding: bool, outputs: Outputs,
                      multi_modal: list | None = None) -> tuple[torch.Tensor | None, ...]:
    """``outputs(logits, labels)`` on the logits (divided by ``temperature``) that predict the response tokens and
    those tokens, each result put back into the [B, response_len] layout (0 at padding). ``multi_modal``: the rows'
    vision inputs (``B.MULTI_MODAL_INPUTS``) for a vision-language model."""
    def scaled(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return outputs(logits / temperature if temperature and temperature != 1.0 else logits, labels)

    vision = multi_modal is not None and any(row is not None for row in multi_modal)
    if remove_padding:
        return _packed_outputs(model, input_ids, attention_mask, response_len, scaled, multi_modal=multi_modal)
    if vision:
        return _padded_outputs(model, input_ids, attention_mask, response_len, scaled, multi_modal)
    return _by_length(attention_mask, lambda rows: _padded_outputs(model, input_ids[rows], attention_mask[rows],
                                                                   response_len, scaled))


def _padded_outputs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    response_len: int, outputs: Outputs, multi_modal: list | None = None
                    ) -> tuple[torch.Tensor | None, ...]:
    """:func:`_response_outputs` in one padded forward pass (trimmed, prompts shared where the model shares them)."""
    vision = multi_modal is not None and any(row is not None for row in multi_modal)
    ids, mask, kept = _trim(input_ids, attention_mask, response_len)
    groups = None if vision else _groups(model, ids, mask, kept)
    if groups is not None:
        logits = _shared_prefix_forward(model, ids, mask, kept, groups, logits_to_keep=1)
    else:
        extra = multimodal.forward_inputs(model, ids, mask, multi_modal) if vision else None
        extra = extra or {"position_ids": position_ids_from_mask(mask)}
        logits = _forward(model)(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=kept + 1,
                                 **extra).logits[:, :-1]
    resp_mask = attention_mask[:, -response_len:]
    return tuple(None if v is None else torch.nn.functional.pad(v, (0, response_len - kept)) * resp_mask
                 for v in outputs(logits, ids[:, -kept:]))


def response_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    remove_padding: bool = False,
    multi_modal: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of the last ``response_len`` tokens of ``input_ids``, [B, response_len],
    0 at padding positions.

    Logits are divided by ``temperature`` (the sampling distribution), as the rollout engines do. Only the
    logits that predict response tokens are computed (``logits_to_keep``). ``multi_modal``: the rows' vision
    inputs (``B.MULTI_MODAL_INPUTS``, one dict or None per row) for a vision-language model.
    """
    logp, ent = _response_outputs(model, input_ids, attention_mask, response_len, temperature, remove_padding,
                                  lambda logits, labels: token_logprobs(logits, labels, with_entropy), multi_modal)
    return logp, ent


def response_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    response_len: int, temperature: float = 1.0) -> torch.Tensor:
    """The logits (divided by ``temperature``) that predict each of the last ``response_len`` tokens of
    ``input_ids``, [B, response_len, V], from one padded forward pass (no shared prompts or length groups): for
    losses over the whole distribution, e.g. top-k distillation. Mask the positions past each row's response."""
    logits = _forward(model)(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids_from_mask(attention_mask), use_cache=False,
                             logits_to_keep=response_len + 1).logits[:, :-1]
    return logits / temperature if temperature and temperature != 1.0 else logits


def sum_pi_squared(logits: torch.Tensor, chunk_elements: int = LOGITS_CHUNK_ELEMENTS) -> torch.Tensor:
    """``sum_v softmax(logits)_v^2`` over the last dimension, in fp32 (``exp(logsumexp(2z) - 2 logsumexp(z))``),
    in chunks of ``chunk_elements`` fp32 logits; no gradient is kept."""
    vocab = logits.shape[-1]
    flat = logits.detach().reshape(-1, vocab)
    rows = max(1, chunk_elements // vocab)
    parts = []
    for i in range(0, flat.shape[0], rows):
        z = flat[i : i + rows].float()
        parts.append(torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1)))
    return torch.cat(parts).view(logits.shape[:-1]) if parts else flat.new_zeros(logits.shape[:-1], dtype=torch.float32)


@torch.no_grad()
def response_sum_pi_squared(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    remove_padding: bool = False,
    multi_modal: list | None = None,
) -> torch.Tensor:
    """``sum_v pi(v)^2`` of the next-token distribution (at ``temperature``) before each of the last ``response_len``
    tokens, [B, response_len], 0 at padding: the collision probability the optimal token baseline needs
    (``rlforge.algorithms.token_baseline``). One forward pass, like :func:`response_logprobs` (``multi_modal``
    likewise)."""
    (out,) = _response_outputs(model, input_ids, attention_mask, response_len, temperature, remove_padding,
                               lambda logits, _: (sum_pi_squared(logits),), multi_modal=multi_modal)
    return out


def response_values(
    critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
    remove_padding: bool = False,
) -> torch.Tensor:
    """Per-token values ``V(s_t)`` of the state before each response token, [B, response_len], 0 at padding,
    from a model with a scalar head (``...ForTokenClassification`` with ``num_labels=1``)."""
    if remove_padding:
        (values,) = _packed_outputs(critic, input_ids, attention_mask, response_len,
                                    lambda scores, _: (scores[:, 0].float(),), logits_to_keep=False)
        return values
    (values,) = _by_length(attention_mask, lambda rows: (_padded_values(critic, input_ids[rows], attention_mask[rows],
                                                                        response_len),))
    return values


def _padded_values(critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
                   ) -> torch.Tensor:
    """:func:`response_values` in one padded forward pass."""
    ids, mask, kept = _trim(input_ids, attention_mask, response_len)
    groups = _groups(critic, ids, mask, kept)
    if groups is not None:
        values = _shared_prefix_forward(critic, ids, mask, kept, groups)[..., 0].float()
    else:
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
