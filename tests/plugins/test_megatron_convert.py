"""HF Llama/Qwen2 <-> megatron-core GPTModel (``plugins/strategy/megatron_convert.py``), in one CPU process.

- the QKV interleaving by query group and ``fc1 = [gate; up]`` against hand-written layouts;
- HF -> Megatron -> HF is bit-identical (Llama with GQA, untied; Qwen2 with q/k/v biases and tied embeddings),
  and the Megatron names and shapes are exactly a real ``GPTModel``'s (built with megatron's local layer spec);
- tensor-parallel slices: each rank's ``linear_qkv``/``linear_fc1`` equal the Megatron layout of that rank's HF
  slices (``tp_layout``), and merging the slices gives the full tensors back;
- the config mapping builds a ``TransformerConfig``; what it cannot represent is a clear error;
- numerics (through ``megatron_cpu``'s test-only shim): the strategy's converted model gives the HF logits on
  left-padded and on packed rows.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlforge import load_config
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugins.strategy.megatron_convert import (
    Layout,
    check_supported,
    hf_to_megatron,
    interleave_qkv,
    megatron_to_hf,
    megatron_tp_merge,
    megatron_tp_shard,
    transformer_config_kwargs,
)
from rlforge.heads import Heads
from rlforge.plugins.strategy.tp_layout import shard
from tests.plugins.megatron_cpu import allow_megatron_forward_on_cpu, free_port, launched

pytest.importorskip("megatron.core", reason="megatron-core is not installed: pip install 'rlforge[megatron]'")

DIMS = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**DIMS, tie_word_embeddings=False)).eval()


def _qwen2():
    torch.manual_seed(1)
    return Qwen2ForCausalLM(Qwen2Config(**DIMS, tie_word_embeddings=True)).eval()


def test_qkv_interleaving_and_fc1_by_hand():
    heads = Heads(heads=4, kv_heads=2, head_dim=1)
    q, k, v = torch.tensor([0.0, 1, 2, 3]), torch.tensor([10.0, 11]), torch.tensor([20.0, 21])
    # group 0: its two query heads, its key, its value; then group 1
    assert interleave_qkv(q, k, v, heads).tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    model = _llama()
    layout = Layout.of(model.config)
    mg = hf_to_megatron(model.state_dict(), layout)
    layer = "model.layers.1.mlp."
    assert torch.equal(mg["decoder.layers.1.mlp.linear_fc1.weight"],
                       torch.cat([model.state_dict()[layer + "gate_proj.weight"],
                                  model.state_dict()[layer + "up_proj.weight"]]))
    assert mg["embedding.word_embeddings.weight"].shape == (128, 64)  # 100 padded to a multiple of 128
    assert (mg["embedding.word_embeddings.weight"][100:] == 0).all()


@pytest.mark.parametrize("build", [_llama, _qwen2])
def test_hf_to_megatron_to_hf_is_bit_identical(build):
    model = build()
    layout = Layout.of(model.config)
    hf = model.state_dict()
    back = megatron_to_hf(hf_to_megatron(hf, layout), layout)
    assert back.keys() == hf.keys()
    for name, t in hf.items():
        assert torch.equal(back[name], t), name


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("build", [_llama, _qwen2])
def test_tensor_parallel_slices_match_the_hf_slices(build, tp):
    model = build()
    layout = Layout.of(model.config, tp=tp)
    hf = model.state_dict()
    full = hf_to_megatron(hf, layout)
    heads, local = layout.heads, Heads(layout.heads.heads // tp, layout.heads.kv_heads // tp, layout.heads.head_dim)
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
    kinds = ("weight", "bias") if layout.qkv_bias else ("weight",)
    for rank in range(tp):
        for kind in kinds:
            qkv = [shard(f"{attn}{p}_proj.{kind}", hf[f"{attn}{p}_proj.{kind}"], heads, rank, tp) for p in "qkv"]
            assert torch.equal(megatron_tp_shard(f"decoder.layers.0.self_attention.linear_qkv.{kind}",
                                                 full[f"decoder.layers.0.self_attention.linear_qkv.{kind}"], rank, tp),
                               interleave_qkv(*qkv, local))
        gate_up = [shard(f"{mlp}{p}.weight", hf[f"{mlp}{p}.weight"], heads, rank, tp) for p in ("gate_proj", "up_proj")]
        assert torch.equal(megatron_tp_shard("decoder.layers.0.mlp.linear_fc1.weight",
                                             full["decoder.layers.0.mlp.linear_fc1.weight"], rank, tp),
                           torch.cat(gate_up))
    for name, t in full.items():
        assert torch.equal(megatron_tp_merge(name, [megatron_tp_shard(name, t, r, tp) for r in range(tp)]), t), name


@pytest.mark.parametrize(("change", "needle"), [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}, "RoPE scaling 'llama3'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_what_megatron_cannot_represent_is_a_clear_error(change, needle):
    with pytest.raises(ConfigError, match=f"strategy.name=megatron cannot represent this model.*{needle}"):
        check_supported(LlamaConfig(**{**DIMS, **change}))


def test_config_mapping_builds_a_transformer_config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(**transformer_config_kwargs(_qwen2().config, 1, 1, torch.float32))
    assert (config.num_layers, config.num_query_groups, config.kv_channels, config.ffn_hidden_size) == (2, 2, 16, 96)
    assert config.add_qkv_bias and not config.add_bias_linear and config.gated_linear_unit
    assert config.normalization == "RMSNorm" and config.layernorm_epsilon == 1e-6


@pytest.fixture(scope="module")
def strategy(pm):
    """The megatron strategy on a one-process gloo group, its forward allowed on CPU (``megatron_cpu``)."""
    from megatron.core import parallel_state

    allow_megatron_forward_on_cpu()
    cfg = load_config("grpo", ["strategy.name=megatron", "strategy.device=cpu", "strategy.checkpoint=sharded",
                               "trainer.controller=ray"], plugins=pm)
    with launched(0, 1, free_port()):
        yield pm.registry.strategy.get("megatron")(cfg)
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("build", [_llama, _qwen2])
def test_converted_model_has_gptmodels_names_and_gives_the_hf_logits(strategy, build):
    hf = build()
    wrapped = strategy.setup_model(build())
    assert dict(wrapped.gpt.named_parameters()).keys() == hf_to_megatron(hf.state_dict(), wrapped.layout).keys()
    named = dict(strategy.named_weights(wrapped))
    assert named.keys() == dict(hf.named_parameters()).keys()  # a tied head once, as in HF
    assert all(torch.equal(named[k], v) for k, v in hf.named_parameters())
    ids = torch.randint(3, 100, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    mask[1, :2] = 0
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        expected = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = wrapped(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=5).logits
        torch.testing.assert_close(got, expected[:, -5:], rtol=1e-4, atol=1e-5)
        packed_ids, packed_pos = ids[mask.bool()][None], pos[mask.bool()][None]  # three sequences in one row
        packed = wrapped(input_ids=packed_ids, position_ids=packed_pos, attention_mask=None).logits[0]
        torch.testing.assert_close(packed, expected[mask.bool()], rtol=1e-4, atol=1e-5)


def test_the_strategy_without_cuda_is_refused_when_it_starts(pm, monkeypatch) -> None:
    """megatron-core's forward asks torch.cuda for its device: where that fails (a CPU build of torch, no GPU) the
    strategy refuses to start, naming the reason, instead of failing at the first step of a started run."""
    def no_cuda() -> int:
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "current_device", no_cuda)
    cfg = load_config("grpo", ["strategy.name=megatron", "strategy.device=cpu", "strategy.checkpoint=sharded",
                               "trainer.controller=ray"], plugins=pm)
    with launched(0, 1, free_port()), pytest.raises(RLForgeError, match=r"^strategy.name=megatron needs a CUDA GPU: "
                                                                        r".*\(Torch not compiled with CUDA enabled\)"):
        pm.registry.strategy.get("megatron")(cfg)
