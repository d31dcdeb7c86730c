"""Tensor-parallel layouts of Llama/Qwen2 weights: the slice of each Hugging Face tensor that rank ``r`` of a
tensor-parallel group of ``tp`` ranks holds. Pure tensor functions, shared by the rollout engines' checks
(vLLM's fused layers: ``qkv_proj``, ``gate_up_proj``) and the Megatron conversion (``linear_qkv``, ``linear_fc1``),
which follow the same rules:

- column parallel (``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj`` and their biases): the output
  rows are split. Attention splits by whole heads; with fewer KV heads than ranks (GQA) each KV head is replicated
  on ``tp / kv_heads`` consecutive ranks, so rank ``r`` keeps the KV head its query heads read;
- row parallel (``o_proj``, ``down_proj``): the input columns are split and the partial outputs are summed
  (all-reduce); a bias stays whole (added once);
- vocab parallel (``embed_tokens``, ``lm_head``): the vocabulary is padded with zero rows to a multiple of ``pad``
  (vLLM: 64) and split in rows; a rank looks up the ids in its range, the others contribute zeros;
- everything else (norms) is replicated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rlforge.heads import Heads
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

VLLM_VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


def _part(t: torch.Tensor, rank: int, parts: int, dim: int) -> torch.Tensor:
    if t.shape[dim] % parts:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split into {parts} equal parts")
    return t.chunk(parts, dim=dim)[rank]


def column(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Column parallel: this rank's rows (output features)."""
    return _part(t, rank, tp, 0)


def row(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Row parallel: this rank's input columns (a 1-D bias stays whole)."""
    return t if t.dim() == 1 else _part(t, rank, tp, -1)


def query_heads(t: torch.Tensor, heads: Heads, rank: int, tp: int) -> torch.Tensor:
    """This rank's query heads: a contiguous block of ``heads / tp`` heads (rows ``head x head_dim``)."""
    return column(t, rank, tp)


def kv_head_index(kv_heads: int, rank: int, tp: int) -> tuple[int, int]:
    """(first KV head, count) that ``rank`` holds: a block when tp divides the KV heads, else the one replicated
    head its query heads read (head ``rank // (tp / kv_heads)``)."""
    if kv_heads >= tp:
        per = kv_heads // tp
        return rank * per, per
    return rank // (tp // kv_heads), 1


def kv_heads_slice(t: torch.Tensor, heads: Heads, rank: int, tp: int) -> torch.Tensor:
    """This rank's K or V rows (weight or bias), replicated when there are fewer KV heads than ranks."""
    first, count = kv_head_index(heads.kv_heads, rank, tp)
    return t[first * heads.head_dim:(first + count) * heads.head_dim]


def vocab(t: torch.Tensor, rank: int, tp: int, pad: int = VLLM_VOCAB_PAD) -> torch.Tensor:
    """Vocab parallel: the vocabulary padded with zero rows to a multiple of ``pad``, then this rank's rows."""
    padded = -(-t.shape[0] // pad) * pad
    full = torch.cat([t, t.new_zeros(padded - t.shape[0], *t.shape[1:])]) if padded > t.shape[0] else t
    return _part(full, rank, tp, 0)


Slicer = Callable[["torch.Tensor", Heads, int, int], "torch.Tensor"]
# the last module name of an HF Llama/Qwen2 parameter -> how it is split
SLICERS: dict[str, Slicer] = {
    "q_proj": query_heads,
    "k_proj": kv_heads_slice,
    "v_proj": kv_heads_slice,
    "gate_proj": lambda t, h, r, tp: column(t, r, tp),
    "up_proj": lambda t, h, r, tp: column(t, r, tp),
    "o_proj": lambda t, h, r, tp: row(t, r, tp),
    "down_proj": lambda t, h, r, tp: row(t, r, tp),
    "embed_tokens": lambda t, h, r, tp: vocab(t, r, tp),
    "lm_head": lambda t, h, r, tp: vocab(t, r, tp),
}
# vLLM's fused layers: HF module -> (fused module, position in it)
VLLM_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def shard(name: str, t: torch.Tensor, heads: Heads, rank: int, tp: int) -> torch.Tensor:
    """The slice of the HF parameter ``name`` that ``rank`` holds (replicated parameters come back whole)."""
    slicer = SLICERS.get(name.split(".")[-2]) if "." in name else None
    return t if slicer is None else slicer(t, heads, rank, tp)


def vllm_shard(named: Mapping[str, torch.Tensor], config: Any, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """The weights vLLM's Llama/Qwen2 model holds on TP rank ``rank`` of ``tp``, from full HF weights: q/k/v fused
    into ``qkv_proj`` and gate/up into ``gate_up_proj`` (this rank's slices, in that order); a tied ``lm_head`` is
    left out (vLLM shares ``embed_tokens``)."""
    heads = Heads.of(config)
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        if name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue
        *prefix, module, kind = name.split(".")
        piece = shard(name, t, heads, rank, tp)
        if module in VLLM_FUSED:
            fused, slot = VLLM_FUSED[module]
            parts.setdefault(".".join([*prefix, fused, kind]), []).append((slot, piece))
        else:
            out[name] = piece
    for name, pieces in parts.items():
        out[name] = torch.cat([p for _, p in sorted(pieces, key=lambda sp: sp[0])])
    return out
