"""Tensor-parallel slices of Llama/Qwen2 weights (``plugins/strategy/tp_layout.py``) against reference layouts:

- hand-written index layouts (which rows/columns/heads each rank holds, GQA replication, vocab padding);
- the math: per-rank HF attention / MLP modules built from the slices, their row-parallel outputs summed (the
  all-reduce), equal the full module; vocab-parallel lookups summed and logits concatenated equal the full ones;
- vLLM's fused layout (``qkv_proj`` = [q; k; v] and ``gate_up_proj`` = [gate; up] of this rank's slices).
The same slices read back from a real vLLM engine with 2 workers: ``tests/plugins/test_vllm_tp.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRotaryEmbedding

from rlforge.errors import ConfigError
from rlforge.heads import Heads
from rlforge.plugins.strategy.tp_layout import kv_head_index, shard, vllm_shard, vocab

HEAD_DIM = 8


def _config(heads=4, kv=2, ffn=48, **kw):
    return LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=ffn, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=HEAD_DIM, num_hidden_layers=1, attn_implementation="eager",
                       **kw)


def test_index_layouts_by_hand():
    heads = Heads(4, 2, 2)  # q rows: 4 heads x 2 = 8; k rows: 2 heads x 2 = 4
    q, k = torch.arange(8.0)[:, None], torch.arange(4.0)[:, None]
    assert shard("model.layers.0.self_attn.q_proj.weight", q, heads, 1, 2).flatten().tolist() == [4, 5, 6, 7]
    assert shard("model.layers.0.self_attn.k_proj.weight", k, heads, 1, 2).flatten().tolist() == [2, 3]
    # 4 ranks, 2 KV heads: ranks 0,1 read KV head 0 and ranks 2,3 KV head 1 (their query heads' group)
    assert [kv_head_index(2, r, 4) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [shard("x.v_proj.bias", k.flatten(), heads, r, 4).tolist() for r in range(4)] == [[0, 1], [0, 1], [2, 3],
                                                                                             [2, 3]]
    o = torch.arange(8.0).reshape(1, 8)  # row parallel: input columns
    assert shard("x.o_proj.weight", o, heads, 0, 2).tolist() == [[0, 1, 2, 3]]
    assert torch.equal(shard("x.o_proj.bias", torch.ones(3), heads, 1, 2), torch.ones(3))  # added once, whole
    assert torch.equal(shard("model.norm.weight", torch.ones(3), heads, 1, 2), torch.ones(3))  # replicated
    # vocab 5 padded to 8 (pad 4): rank 1 holds ids 4..7, i.e. id 4 and three zero rows
    emb = torch.arange(1.0, 6.0)[:, None]
    assert vocab(emb, 1, 2, pad=4).flatten().tolist() == [5, 0, 0, 0]
    assert shard("model.embed_tokens.weight", emb, heads, 0, 1).shape == (64, 1)  # vLLM pads to 64


@pytest.mark.parametrize("tp", [2, 4])  # 4 > 2 KV heads: each KV head replicated on two ranks
def test_sharded_attention_summed_equals_full(tp):
    torch.manual_seed(0)
    cfg = _config()
    full = LlamaAttention(cfg, 0).eval()
    x = torch.randn(2, 5, cfg.hidden_size)
    cos_sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(5)[None].expand(2, 5))
    mask = torch.full((5, 5), float("-inf")).triu(1)[None, None]
    expected = full(x, cos_sin, mask)[0]
    heads = Heads.of(cfg)
    total = torch.zeros_like(expected)
    for rank in range(tp):
        kv = kv_head_index(heads.kv_heads, rank, tp)[1]
        part = LlamaAttention(_config(heads=heads.heads // tp, kv=kv), 0).eval()
        part.load_state_dict({n: shard(f"self_attn.{n}", t, heads, rank, tp) for n, t in full.state_dict().items()})
        total += part(x, cos_sin, mask)[0]  # row parallel o_proj: partial sums, all-reduced
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-6)


def test_sharded_mlp_summed_equals_full():
    torch.manual_seed(0)
    cfg = _config()
    full = LlamaMLP(cfg)
    x = torch.randn(3, cfg.hidden_size)
    heads = Heads.of(cfg)
    total = torch.zeros(3, cfg.hidden_size)
    for rank in range(2):
        part = LlamaMLP(_config(ffn=cfg.intermediate_size // 2))
        part.load_state_dict({n: shard(f"mlp.{n}", t, heads, rank, 2) for n, t in full.state_dict().items()})
        total += part(x)
    torch.testing.assert_close(total, full(x), rtol=1e-5, atol=1e-6)


def test_vocab_parallel_lookup_and_logits_equal_full():
    torch.manual_seed(0)
    table, hidden = torch.randn(50, 6), torch.randn(4, 6)
    ids = torch.tensor([0, 17, 31, 49])
    tp, looked_up, logits = 2, torch.zeros(4, 6), []
    for rank in range(tp):
        part = vocab(table, rank, tp)  # 64 rows padded, 32 per rank
        start = rank * part.shape[0]
        mine = (ids >= start) & (ids < start + part.shape[0])
        looked_up += torch.where(mine[:, None], part[(ids - start).clamp(0, part.shape[0] - 1)], 0.0)
        logits.append(hidden @ part.T)
    assert torch.equal(looked_up, table[ids])
    full_logits = torch.cat(logits, -1)
    assert torch.equal(full_logits[:, :50], hidden @ table.T) and (full_logits[:, 50:] == 0).all()


def test_vllm_fused_layout():
    cfg = _config(heads=4, kv=2, tie_word_embeddings=True)
    p = "model.layers.0"
    q, k, v = torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32)
    gate, up = torch.randn(48, 32), torch.randn(48, 32)
    named = {f"{p}.self_attn.q_proj.weight": q, f"{p}.self_attn.k_proj.weight": k, f"{p}.self_attn.v_proj.weight": v,
             f"{p}.mlp.gate_proj.weight": gate, f"{p}.mlp.up_proj.weight": up, "lm_head.weight": torch.randn(50, 32),
             "model.embed_tokens.weight": torch.randn(50, 32)}
    out = vllm_shard(named, cfg, 1, 2)
    assert sorted(out) == ["model.embed_tokens.weight", f"{p}.mlp.gate_up_proj.weight",
                           f"{p}.self_attn.qkv_proj.weight"]  # the tied lm_head is the embedding
    assert torch.equal(out[f"{p}.self_attn.qkv_proj.weight"], torch.cat([q[16:], k[8:], v[8:]]))
    assert torch.equal(out[f"{p}.mlp.gate_up_proj.weight"], torch.cat([gate[24:], up[24:]]))


@pytest.mark.parametrize(("heads", "kv", "tp"), [(4, 2, 3), (8, 3, 2), (4, 4, 8)])
def test_tp_sizes_that_do_not_fit_the_heads_are_a_clear_error(heads, kv, tp):
    with pytest.raises(ConfigError, match=f"rollout.vllm.tensor_parallel_size={tp} does not fit"):
        Heads(heads, kv, 8).check(tp, "rollout.vllm.tensor_parallel_size")
