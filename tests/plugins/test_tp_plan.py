"""The ``tp`` strategy's plan from transformers' ``base_model_tp_plan`` (``plugins/strategy/tp.py``), with tiny random
models of real classes (Llama, Qwen2, Qwen3, Mistral, Gemma-3 text, Phi-3), configs built offline:

- the plan read from Llama's and Qwen2's configs splits exactly the modules the hand-written Llama/Qwen2 plan split
  (today's fallback for configs without one), in the same styles;
- styles the strategy cannot honour, and patterns that name no module, are refused naming the pattern and style;
- 2 ranks over gloo (one tensor-parallel group) give the logits, the gradients and the gradient norm of one process
  for the classes the hand-written plan did not cover: Qwen3 and Gemma-3 (per-head q/k norms, replicated with their
  gradients summed) and Phi-3 (fused qkv_proj / gate_up_proj, gathered outputs).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
import transformers

from rlforge import load_config
from rlforge.errors import ConfigError
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.strategy.tp import FALLBACK_PLAN, TPStrategy, module_plan
from tests.plugins.megatron_cpu import free_port

SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, tie_word_embeddings=False)
# class name -> (config class, causal LM class, extra config keys)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 4, "query_pre_attn_scalar": 8}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
}
NOT_IN_THE_OLD_PLAN = ["qwen3", "gemma3", "phi3"]
TP_KEYS = ["strategy.name=tp", "strategy.tp.size=2", "strategy.device=cpu", "strategy.num_processes=2",
           "trainer.controller=ray"]


def _tiny(name: str, seed: int = 0) -> torch.nn.Module:
    config_cls, model_cls, extra = MODELS[name]
    config = getattr(transformers, config_cls)(**SIZES, **extra, attn_implementation="eager")
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def _old_plan(layers: int) -> dict[str, str]:
    """What the hand-written Llama/Qwen2 plan split in a causal LM: these modules of every decoder layer."""
    per_layer = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
                 "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                 "mlp.down_proj": "rowwise"}
    return {f"model.layers.{i}.{m}": style for i in range(layers) for m, style in per_layer.items()}


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
def test_the_config_plan_of_llama_and_qwen2_splits_what_the_hand_written_plan_did(name):
    model = _tiny(name)
    assert type(model.config).base_model_tp_plan == FALLBACK_PLAN  # the fallback is transformers' Llama plan
    assert module_plan(model) == _old_plan(2)
    model.config.base_model_tp_plan = None  # a config without a plan: the fallback, the same modules
    assert module_plan(model) == _old_plan(2)


def test_the_plans_of_the_classes_the_old_plan_did_not_cover():
    qwen3, phi3 = module_plan(_tiny("qwen3")), module_plan(_tiny("phi3"))
    assert qwen3["model.layers.1.self_attn.q_norm"] == "replicated_with_grad_allreduce"
    assert {k: v for k, v in qwen3.items() if "norm" not in k} == _old_plan(2)
    assert module_plan(_tiny("gemma3")) == qwen3
    assert phi3 == {f"model.layers.{i}.{m}": s for i in range(2) for m, s in [
        ("self_attn.qkv_proj", "colwise_gather_output"), ("self_attn.o_proj", "rowwise_split_input"),
        ("mlp.gate_up_proj", "colwise_gather_output"), ("mlp.down_proj", "rowwise_split_input")]}
    critic = transformers.Qwen3ForTokenClassification(_tiny("qwen3").config)  # a value model: the same body
    assert module_plan(critic) == qwen3


def test_styles_it_cannot_honour_and_patterns_that_match_nothing_are_refused():
    model = _tiny("llama")
    model.config.base_model_tp_plan = {**FALLBACK_PLAN, "embed_tokens": "embedding_rowwise"}
    with pytest.raises(ConfigError, match=r"cannot split 'embed_tokens' as 'embedding_rowwise' \(LlamaForCausalLM's "
                                          r"config base_model_tp_plan\): the styles it honours are colwise, rowwise"):
        module_plan(model)
    model.config.base_model_tp_plan = {**FALLBACK_PLAN, "layers.*.mlp.experts.*.w1": "colwise"}
    with pytest.raises(ConfigError, match=r"LlamaForCausalLM has no module 'layers.\*.mlp.experts.\*.w1'"):
        module_plan(model)
    with pytest.raises(ConfigError, match=r"rlforge's Llama/Qwen2 plan \(FALLBACK_PLAN\), but Linear has no module "
                                          r"'layers.\*.mlp.down_proj'"):
        module_plan(torch.nn.Linear(2, 2))


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    strategy = TPStrategy(load_config("grpo", TP_KEYS, plugins=PluginManager(autoload=False)))
    out = {}
    for name in NOT_IN_THE_OLD_PLAN:
        out[name] = _forward_backward(strategy.setup_model(_tiny(name)), strategy)
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _forward_backward(model: torch.nn.Module, strategy: TPStrategy | None = None) -> dict:
    """Logits of fixed ids, then the gradients (full tensors) of a loss on them, and their total norm."""
    from torch.distributed.tensor import DTensor

    ids = torch.arange(3, 3 + 14).reshape(2, 7) % 60 + 3
    logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).mean().neg().backward()
    grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
             for n, p in model.named_parameters()}
    norm = strategy.clip_grad_norm(model, 0.0) if strategy else float(torch.nn.utils.get_total_norm(grads.values()))
    return {"logits": logits.detach(), "grads": grads, "norm": norm,
            "split": {n: p.to_local().shape for n, p in model.named_parameters() if isinstance(p, DTensor)}}


def test_two_ranks_give_the_logits_and_gradients_of_one_process_for_qwen3_gemma3_and_phi3(tmp_path):
    mp.spawn(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name in NOT_IN_THE_OLD_PLAN:
        single = _forward_backward(_tiny(name))
        for r in ranks:
            got = r[name]
            torch.testing.assert_close(got["logits"], single["logits"], rtol=1e-5, atol=1e-6, msg=name)
            assert got["grads"].keys() == single["grads"].keys()
            for param, grad in single["grads"].items():
                torch.testing.assert_close(got["grads"][param], grad, rtol=1e-5, atol=1e-6, msg=f"{name} {param}")
            assert got["norm"] == pytest.approx(single["norm"], rel=1e-5)
    # the plan was applied: each rank holds half of the split projections' weights
    split = ranks[0]["phi3"]["split"]
    assert split["model.layers.0.self_attn.qkv_proj.weight"] == (32, 32)  # (4 + 2 + 2 heads) x 8 / 2 ranks
    assert split["model.layers.0.mlp.down_proj.weight"] == (32, 32)  # 64 inputs / 2 ranks
    assert ranks[0]["qwen3"]["split"]["model.layers.1.self_attn.k_proj.weight"] == (8, 32)
