"""Hugging Face Llama/Qwen2 <-> megatron-core ``GPTModel``: the config mapping, the weight conversion both ways
and the tensor-parallel resharding of the Megatron layout. Pure functions (megatron is imported only to build a
``TransformerConfig``), so the conversion is tested without megatron's forward, which needs CUDA.

Megatron's layout (local layer spec):

- ``linear_qkv`` = q, k and v **interleaved by query group**: for each of the ``kv_heads`` groups, its
  ``heads / kv_heads`` query heads, then its key head, then its value head (rows of ``head_dim``); biases alike;
- ``linear_fc1`` = ``[gate; up]`` (the gated MLP's two column-parallel halves, one matrix);
- ``linear_proj`` = ``o_proj``, ``linear_fc2`` = ``down_proj``; norms keep their weights;
- the vocabulary (embedding, output layer) padded with zero rows to a multiple of
  ``make_vocab_size_divisible_by x tensor_parallel_size``, cut off again on the way back.

Tensor parallel (rank ``r`` of ``tp``): ``linear_qkv`` is split in contiguous rows = whole query groups (so the
KV heads must divide by ``tp``); ``linear_fc1`` per rank is ``[gate_r; up_r]``, not a contiguous block of the full
matrix; ``linear_proj``/``linear_fc2`` split their input columns; embedding and output layer split vocab rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError
from rlforge.lazy import lazy_import
from rlforge.heads import Heads
from rlforge.plugins.strategy.tp_layout import column, row

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# model_type -> q/k/v carry a bias (None: the config's attention_bias decides)
QKV_BIAS: dict[str, bool | None] = {"llama": None, "mistral": None, "qwen2": True}
# HF per-layer name -> Megatron per-layer name (the plain renames)
LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
TOP_RENAMES = {"model.embed_tokens.weight": "embedding.word_embeddings.weight",
               "model.norm.weight": "decoder.final_layernorm.weight", "lm_head.weight": "output_layer.weight"}
TOP_INVERSE = {mg: hf for hf, mg in TOP_RENAMES.items()}
LAYER_INVERSE = {mg: hf for hf, mg in LAYER_RENAMES.items()}
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")
HF_LAYER, MG_LAYER = "model.layers.", "decoder.layers."


@dataclass(frozen=True)
class Layout:
    """What the conversion needs from an HF config."""

    heads: Heads
    layers: int
    vocab: int  # the HF vocabulary
    padded_vocab: int  # Megatron's rows
    tied: bool
    qkv_bias: bool

    @classmethod
    def of(cls, hf: Any, divisible_by: int = 128, tp: int = 1) -> Layout:
        check_supported(hf)
        multiple = divisible_by * tp
        return cls(Heads.of(hf), hf.num_hidden_layers, hf.vocab_size, -(-hf.vocab_size // multiple) * multiple,
                   bool(getattr(hf, "tie_word_embeddings", False)), _qkv_bias(hf))


def _qkv_bias(hf: Any) -> bool:
    fixed = QKV_BIAS[hf.model_type]
    return bool(getattr(hf, "attention_bias", False)) if fixed is None else fixed


def check_supported(hf: Any) -> None:
    """The HF architectures and options the Megatron layout reproduces; anything else is a clear error."""
    kind = getattr(hf, "model_type", "?")
    problems = [] if kind in QKV_BIAS else [f"model_type '{kind}' (supported: {', '.join(QKV_BIAS)})"]
    rope = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"RoPE scaling '{rope.get('rope_type', rope.get('type'))}'")
    if getattr(hf, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act '{hf.hidden_act}'")
    if getattr(hf, "mlp_bias", False):
        problems.append("mlp_bias")
    if getattr(hf, "use_sliding_window", False):
        problems.append("sliding-window attention")
    if problems:
        raise ConfigError(f"strategy.name=megatron cannot represent this model (model.path): {'; '.join(problems)}. "
                          f"Use strategy.name=fsdp or tp for it.")


def rope_theta(hf: Any) -> float:
    rope = getattr(hf, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def transformer_config_kwargs(hf: Any, tp: int, pp: int, dtype: torch.dtype) -> dict[str, Any]:
    """``TransformerConfig`` arguments equivalent to the HF config (no dropout: the RL losses assume none)."""
    check_supported(hf)
    heads = Heads.of(hf)
    return dict(
        num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=heads.heads, num_query_groups=heads.kv_heads, kv_channels=heads.head_dim,
        normalization="RMSNorm", layernorm_epsilon=hf.rms_norm_eps, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=_qkv_bias(hf),
        attention_dropout=0.0, hidden_dropout=0.0, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        use_cpu_initialization=True, bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
    )


def gpt_model_kwargs(hf: Any, layout: Layout) -> dict[str, Any]:
    """``GPTModel`` arguments besides the config and the layer spec (full-vocabulary logits: parallel_output off)."""
    return dict(vocab_size=layout.padded_vocab, max_sequence_length=hf.max_position_embeddings,
                position_embedding_type="rope", rotary_base=rope_theta(hf), rotary_percent=1.0,
                share_embeddings_and_output_weights=layout.tied, parallel_output=False)


# --- weights -----------------------------------------------------------------------------------------------
def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: Heads) -> torch.Tensor:
    """HF q/k/v (weights [rows, hidden] or biases [rows]) -> Megatron's per-query-group ``[q_g; k_g; v_g]``."""
    groups, per = heads.kv_heads, heads.heads // heads.kv_heads
    rest = q.shape[1:]
    parts = (q.reshape(groups, per * heads.head_dim, *rest), k.reshape(groups, heads.head_dim, *rest),
             v.reshape(groups, heads.head_dim, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, heads: Heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`interleave_qkv`."""
    groups, per, d = heads.kv_heads, heads.heads // heads.kv_heads, heads.head_dim
    grouped = qkv.reshape(groups, (per + 2) * d, *qkv.shape[1:])
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return (q.reshape(-1, *qkv.shape[1:]), k.reshape(-1, *qkv.shape[1:]), v.reshape(-1, *qkv.shape[1:]))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if rows > t.shape[0] else t


def hf_to_megatron(hf_state: Mapping[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """Full HF weights -> full Megatron weights (``GPTModel`` names, TP 1)."""
    out = {mg: _pad_rows(hf_state[n], layout.padded_vocab) if mg in VOCAB_ROWS else hf_state[n]
           for n, mg in TOP_RENAMES.items() if n in hf_state and not (layout.tied and mg == "output_layer.weight")}
    for i in range(layout.layers):
        hf, mg = f"{HF_LAYER}{i}.", f"{MG_LAYER}{i}."
        out.update({mg + m: hf_state[hf + h] for h, m in LAYER_RENAMES.items()})
        attn = hf + "self_attn."
        kinds = ("weight", "bias") if layout.qkv_bias else ("weight",)
        for kind in kinds:
            q, k, v = (hf_state[f"{attn}{p}_proj.{kind}"] for p in "qkv")
            out[f"{mg}self_attention.linear_qkv.{kind}"] = interleave_qkv(q, k, v, layout.heads)
        out[f"{mg}mlp.linear_fc1.weight"] = torch.cat([hf_state[f"{hf}mlp.gate_proj.weight"],
                                                       hf_state[f"{hf}mlp.up_proj.weight"]])
    return out


def megatron_param_to_hf(name: str, t: torch.Tensor, layout: Layout) -> list[tuple[str, torch.Tensor]]:
    """One full Megatron parameter -> its HF parameter(s): ``linear_qkv`` gives q, k, v; ``linear_fc1`` gives gate
    and up; the vocabulary loses its padding rows."""
    if name in TOP_INVERSE:
        return [(TOP_INVERSE[name], t[:layout.vocab] if name in VOCAB_ROWS else t)]
    index, rest = name.removeprefix(MG_LAYER).split(".", 1)
    hf = f"{HF_LAYER}{index}."
    if rest in LAYER_INVERSE:
        return [(hf + LAYER_INVERSE[rest], t)]
    kind = rest.rsplit(".", 1)[-1]
    if rest.startswith("self_attention.linear_qkv."):
        return [(f"{hf}self_attn.{p}_proj.{kind}", part) for p, part in zip("qkv", split_qkv(t, layout.heads))]
    if rest == "mlp.linear_fc1.weight":
        return list(zip((f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"), t.chunk(2)))
    raise KeyError(f"no HF counterpart for the Megatron parameter '{name}'")


def megatron_to_hf(mg_state: Mapping[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """Full Megatron weights -> full HF weights (the HF state dict's names; a tied ``lm_head`` is the embedding)."""
    out = dict(pair for name, t in mg_state.items() if not name.endswith("_extra_state")
               for pair in megatron_param_to_hf(name, t, layout))
    if layout.tied:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# --- tensor parallel ---------------------------------------------------------------------------------------
def _kind(name: str) -> str:
    """How a Megatron parameter is split: qkv | fc1 | row | vocab | whole."""
    if name in VOCAB_ROWS:
        return "vocab"
    module = name.split(".")[-2]
    return {"linear_qkv": "qkv", "linear_fc1": "fc1", "linear_proj": "row", "linear_fc2": "row"}.get(module, "whole")


def megatron_tp_shard(name: str, t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """The part of the full Megatron tensor ``name`` that TP rank ``rank`` of ``tp`` holds."""
    kind = _kind(name)
    if kind in ("qkv", "vocab"):
        return column(t, rank, tp)
    if kind == "fc1":
        gate, up = t.chunk(2)
        return torch.cat([column(gate, rank, tp), column(up, rank, tp)])
    return row(t, rank, tp) if kind == "row" else t


def megatron_tp_merge(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor from the parts of all TP ranks (the inverse of :func:`megatron_tp_shard`)."""
    kind = _kind(name)
    if kind in ("qkv", "vocab"):
        return torch.cat(parts)
    if kind == "fc1":
        halves = [p.chunk(2) for p in parts]
        return torch.cat([torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])])
    if kind == "row" and parts[0].dim() > 1:
        return torch.cat(parts, dim=-1)
    return parts[0]
