"""Ulysses sequence parallelism (DeepSpeed-Ulysses, arXiv 2309.14509) for transformers decoders, on any backend
with ``all_to_all_single`` (gloo included) and PyTorch SDPA or eager attention.

The ``sp`` ranks of a group see the same packed micro-batch (one row, each sequence's position ids restarting at 0).
Each rank runs the model on its ``1/sp`` slice of that row: embeddings, norms, MLPs and the head see only the slice.
Around attention an all-to-all gathers the whole sequence and scatters the heads (each rank attends over all
tokens with ``heads/sp`` heads), and a second one brings the heads back and the sequence slices out again.

- The row is padded to a multiple of ``sp`` (padding tokens form a causal segment of their own at the end, which no
  real token sees) and sliced along the sequence. Labels (the next token of each position) are shifted on the whole
  row *before* slicing, so the last position of a slice predicts the first token of the next (verl issue #6068).
- Attention goes through transformers' attention-function registry: models are switched to the implementation
  ``rlforge_ulysses`` (:func:`use_ulysses`), which wraps ``sdpa`` or the model's own ``eager`` function; model code
  is not patched. The packed row's attention is block-diagonal causal (a sequence starts wherever the position id
  does not follow the previous one): after the exchange each sequence is attended on its own, causally (``sdpa``
  with ``is_causal``, no mask; ``eager`` with the sequence's own causal mask), so no ``T x T`` mask is built and the
  cost is the sum of the squared sequence lengths, not the square of the row's. transformers builds no mask for
  ``rlforge_ulysses`` (no mask function is registered for it), and a forward of a switched model outside
  :meth:`SequenceParallel.packed_outputs` is refused (the rollout engines generate with a copy made before).
- KV heads are repeated ``sp / kv_heads`` times when there are fewer of them than ranks. ``sp`` must divide the query
  heads, and divide or be a multiple of the KV heads (``Heads.check``).
- Outputs (log-probs, entropy, values) are computed on each rank's slice and gathered back along the sequence
  (:func:`gather_seq`). Every sp rank then computes the same loss from the same gathered tensor; the gather's
  backward keeps each rank's slice of the gradient unscaled, so the parameter gradients of the sp ranks *sum* to
  the one-rank gradient. The ``fsdp`` strategy sums gradients over all ``dp x sp`` ranks and normalizes losses by
  counts summed over the ``dp`` groups only, which is then exactly the one-rank gradient of the mini-batch (a
  strategy that averaged gradients over ``dp x sp`` ranks would have to scale this backward by ``sp``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError, RLForgeError
from rlforge.lazy import lazy_import
from rlforge.heads import Heads

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

ATTENTION = "rlforge_ulysses"  # the name registered in transformers' AttentionInterface
INNER = ("sdpa", "eager")  # the attention implementations it wraps
SP_KWARG = "rlforge_sequence_parallel"  # the forward argument that carries the SequenceParallel to the attention

Outputs = Callable[["torch.Tensor", "torch.Tensor"], tuple["torch.Tensor | None", ...]]


@dataclass(frozen=True)
class SequenceParallel:
    """One rank's place in a sequence-parallel group, and the attention implementation the model wraps."""

    group: Any  # the torch.distributed process group of the sp ranks (None: the default group)
    size: int
    rank: int
    inner: str = "sdpa"
    segments: tuple[int, ...] = ()  # in one forward: where each sequence of the padded row starts, and its length

    def packed_outputs(self, model: torch.nn.Module, ids: torch.Tensor, position_ids: torch.Tensor,
                       before: torch.Tensor, outputs: Outputs, logits_to_keep: bool = True
                       ) -> tuple[torch.Tensor | None, ...]:
        """Per-position outputs of ``model`` on the packed row ``ids``/``position_ids`` ([1, T]) at the positions
        ``before`` ([N], indices into the row), as one rank's forward would give them, on every rank of the group.

        ``outputs(logits, labels)`` maps the logits at this rank's share of ``before`` ([n, ...]) and the labels there
        (the next token of each position) to a tuple of [n] tensors (or None). ``logits_to_keep``: pass the local
        positions to the model (causal LMs); else the model returns all positions (token classifiers) and they are
        picked afterwards. Collective over the group: every rank calls it with the same row."""
        ids, position_ids = pad_packed(ids, position_ids, self.size)
        labels = shift_labels(ids)  # on the whole row, before slicing (verl #6068)
        call = replace(self, segments=segment_bounds(position_ids))
        length = ids.shape[1] // self.size
        start = self.rank * length
        mine = (before >= start) & (before < start + length)
        local = before[mine] - start
        keep = {"logits_to_keep": local} if logits_to_keep else {}
        out = model(input_ids=shard(ids, self), position_ids=shard(position_ids, self), attention_mask=None,
                    use_cache=False, **{SP_KWARG: call}, **keep).logits[0]
        values = outputs(out if logits_to_keep else out[local], shard(labels, self)[0, local])
        return tuple(None if v is None else gather_seq(v.new_zeros(length, *v.shape[1:]).index_copy(0, local, v),
                                                       self)[before] for v in values)


# --- pure functions -----------------------------------------------------------------------------------------------

def pad_packed(ids: torch.Tensor, position_ids: torch.Tensor, sp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed row ([1, T]) padded at the end to a multiple of ``sp``: token 0 and positions 0, 1, ... (a sequence
    of its own, after every real one)."""
    pad = -ids.shape[-1] % sp
    if not pad:
        return ids, position_ids
    tail = torch.arange(pad, device=position_ids.device, dtype=position_ids.dtype).expand(*position_ids.shape[:-1], pad)
    return torch.nn.functional.pad(ids, (0, pad)), torch.cat([position_ids, tail], -1)


def shard(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """This rank's slice of the last dimension (its length must be a multiple of ``sp.size``)."""
    if x.shape[-1] % sp.size:
        raise RLForgeError(f"a sequence of {x.shape[-1]} tokens does not split into {sp.size} equal slices: pad it "
                           "first (pad_packed)")
    length = x.shape[-1] // sp.size
    return x[..., sp.rank * length:(sp.rank + 1) * length]


def shift_labels(ids: torch.Tensor) -> torch.Tensor:
    """The next token of each position of the row (the last position gets the first token: never a label)."""
    return torch.roll(ids, -1, dims=-1)


def segment_bounds(position_ids: torch.Tensor) -> tuple[int, ...]:
    """Where each sequence of a packed row ([1, T]) starts (a new one wherever the position does not follow the
    previous one), and ``T``: ``[0, 1, 2, 0, 1]`` -> ``(0, 3, 5)``."""
    pos = position_ids.reshape(-1)
    starts = (torch.diff(pos) != 1).nonzero().reshape(-1) + 1
    return (0, *starts.tolist(), pos.shape[0])


def causal_mask(n: int, inner: str, device: Any = None) -> torch.Tensor | None:
    """The causal mask of one sequence of ``n`` tokens for the wrapped attention: None for ``sdpa`` (``is_causal``),
    additive float32 [1, 1, n, n] (0 or the float32 minimum above the diagonal) for ``eager``."""
    if inner == "sdpa":
        return None
    return torch.full((n, n), torch.finfo(torch.float32).min, device=device).triu_(1)[None, None]


def kv_repeats(kv_heads: int, sp: int) -> int:
    """How many times each KV head is repeated so that the KV heads split over ``sp`` ranks."""
    return max(sp // kv_heads, 1)


# --- collectives with autograd ------------------------------------------------------------------------------------

def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> torch.Tensor:
    if x.shape[scatter_dim] % sp.size:
        raise RLForgeError(f"Ulysses sequence parallelism over {sp.size} ranks cannot split dimension {scatter_dim} of "
                           f"size {x.shape[scatter_dim]} (shape {tuple(x.shape)}) into equal parts.")
    send = torch.stack(x.chunk(sp.size, dim=scatter_dim))  # [sp, ...]: part j goes to rank j
    received = torch.empty_like(send)
    torch.distributed.all_to_all_single(received, send, group=sp.group)
    return torch.cat(received.unbind(0), dim=gather_dim)  # part j came from rank j


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> torch.Tensor:
        ctx.dims, ctx.sp = (scatter_dim, gather_dim), sp
        return _exchange(x, scatter_dim, gather_dim, sp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad.contiguous(), gather_dim, scatter_dim, ctx.sp), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, sp: SequenceParallel) -> torch.Tensor:
    """Split ``x`` in ``sp.size`` parts along ``scatter_dim``, send part j to rank j, and join the parts received
    along ``gather_dim`` in rank order. Sequence to heads: ``[b, h, s/sp, d] -> [b, h/sp, s, d]`` with
    ``scatter_dim=1, gather_dim=2``; the reverse swaps them. Its gradient is the reverse exchange."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, sp)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        ctx.sp, ctx.length = sp, x.shape[0]
        out = x.new_empty(sp.size * x.shape[0], *x.shape[1:])
        torch.distributed.all_gather_into_tensor(out, x.contiguous(), group=sp.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = ctx.sp.rank * ctx.length
        return grad[start:start + ctx.length].contiguous(), None  # unscaled: see the module docstring


def gather_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """The ranks' slices ([L, ...] each) joined along dimension 0 in rank order ([sp x L, ...]); the gradient of
    each rank's slice is its part of the gradient of the whole, unscaled."""
    return _GatherSeq.apply(x, sp)


# --- attention ----------------------------------------------------------------------------------------------------

class _LocalHeads:
    """The attention module as the wrapped function sees it after the exchange: ``groups`` query heads per KV head."""

    def __init__(self, module: torch.nn.Module, groups: int) -> None:
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _inner(module: torch.nn.Module, name: str) -> Callable[..., Any]:
    if name == "eager":  # each modeling file has its own (softcapping, sinks, ...)
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise RLForgeError(f"{type(module).__name__} has no eager_attention_forward in its modeling file: use "
                               "attention 'sdpa' with Ulysses sequence parallelism.")
        return fn
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function ``rlforge_ulysses``: ``query`` [1, heads, s/sp, d] and ``key``/``value``
    [1, kv_heads, s/sp, d] of this rank's slice of a packed row; returns [1, s/sp, heads, d]. ``attention_mask`` is
    unused (None): the sequences of the row are in the ``rlforge_sequence_parallel`` argument."""
    sp: SequenceParallel | None = kwargs.pop(SP_KWARG, None)
    if sp is None:
        raise RLForgeError(f"{type(module).__name__} uses attention '{ATTENTION}', which runs only in the packed "
                           "sequence-parallel forward passes (rlforge.ops with remove_padding, on a model marked by "
                           "ops.sequence_parallel). Generate with a copy of the model made before use_ulysses.")
    if kwargs.get("sliding_window") is not None:
        raise RLForgeError(f"{type(module).__name__} uses sliding-window attention, which Ulysses sequence parallelism "
                           "does not implement.")
    repeats = kv_repeats(key.shape[1], sp.size)
    if repeats > 1:
        key, value = key.repeat_interleave(repeats, dim=1), value.repeat_interleave(repeats, dim=1)
    q, k, v = (all_to_all(t, 1, 2, sp) for t in (query, key, value))  # [1, h/sp, s, d]
    inner, local = _inner(module, sp.inner), _LocalHeads(module, q.shape[1] // k.shape[1])
    out = torch.cat([inner(local, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal_mask(b - a, sp.inner, q.device),
                           **kwargs)[0] for a, b in zip(sp.segments, sp.segments[1:])], 1)
    return all_to_all(out, 1, 2, sp), None  # [1, s, h/sp, d] -> [1, s/sp, h, d]


def register_attention() -> None:
    """Register ``rlforge_ulysses`` in transformers' attention functions (and no mask function: none is built)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)


def use_ulysses(model: torch.nn.Module, sp: SequenceParallel, key: str) -> SequenceParallel:
    """Switch ``model``'s attention to ``rlforge_ulysses`` after checking that ``sp.size`` fits its heads (``key``
    names the setting in errors); returns ``sp`` with the implementation it wraps (the model's: sdpa or eager)."""
    from rlforge.multimodal import is_multimodal

    if is_multimodal(model):  # its image inputs do not go through the sequence-parallel packed passes
        raise ConfigError(f"{key}={sp.size}: sequence parallelism does not take vision-language models "
                          f"({type(model).__name__}) yet: set {key}=1 (docs/multimodal.md).")
    Heads.of(model.config).check(sp.size, key)
    current = model.config._attn_implementation
    inner = sp.inner if current == ATTENTION else current
    if inner not in INNER:
        raise ConfigError(f"{key}={sp.size} needs attention 'sdpa' or 'eager'; {type(model).__name__} uses "
                          f"'{current}'. Load the model with attn_implementation='sdpa'.")
    register_attention()
    model.set_attn_implementation(ATTENTION)
    return replace(sp, inner=inner)


def sequence_parallel_mesh(device_type: str, world_size: int, sp: int) -> Any:
    """The ``(dp, sp)`` device mesh of ``world_size`` ranks: rank r is in data-parallel group ``r // sp`` at
    sequence-parallel rank ``r % sp`` (the ranks of one sequence are neighbours, on one node where possible)."""
    from torch.distributed.device_mesh import init_device_mesh

    if sp < 1 or world_size % sp:
        raise ConfigError(f"sequence parallel size {sp} must be >= 1 and divide the {world_size} ranks.")
    return init_device_mesh(device_type, (world_size // sp, sp), mesh_dim_names=("dp", "sp"))


def from_mesh(mesh: Any) -> SequenceParallel:
    """This rank's :class:`SequenceParallel` on the ``sp`` dimension of a ``(dp, sp)`` mesh."""
    sub = mesh["sp"]
    return SequenceParallel(sub.get_group(), sub.size(), sub.get_local_rank())
