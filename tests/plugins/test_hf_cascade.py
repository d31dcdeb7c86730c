"""Cascade attention for repeated prompts (``plugins/rollout/hf_cascade.py``): the hf engine's decoding loop keeps each
distinct prompt's keys and values once and decodes the tokens of the per-row cache; it applies only where it can be
checked, and leaves the model's attention as it was."""

from __future__ import annotations

import pytest
import torch
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, DogeConfig, DogeForCausalLM, GPT2Config,
                          GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

import rlforge.plugins.rollout.hf_cascade as hf_cascade
import rlforge.plugins.rollout.hf_decode as hf_decode
from rlforge.plugins.rollout.hf_decode import Decoder
from rlforge.sampling import SamplingParams

SMALL = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}


def llama(**kwargs) -> torch.nn.Module:
    return LlamaForCausalLM(LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=1, **kwargs)).eval()


MODELS = {
    "llama_gqa": llama,
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, bos_token_id=1,
                                               eos_token_id=2)).eval(),
}


def shares(forward_kwargs: dict) -> bool:
    """Whether a forward call decodes with the cascade's shared-prompt cache (not the probe's)."""
    return isinstance(forward_kwargs.get(hf_cascade.KEYWORD), hf_cascade._types()[1])


def repeated_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of different padding, 11 rows: repeated and interleaved as no GRPO batch is."""
    torch.manual_seed(1)
    distinct = torch.randint(3, 50, (3, 7))
    mask = torch.ones_like(distinct)
    mask[1, :3] = mask[2, :1] = 0
    distinct[mask == 0] = 0
    order = torch.tensor([0, 1, 0, 2, 2, 1, 0, 2, 1, 1, 0])
    return distinct[order], mask[order]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cascade_decodes_the_tokens_of_the_per_row_cache(monkeypatch, name: str) -> None:
    """Greedy tokens equal, log-probs to float rounding, also as finished rows leave the batch (then the prompts
    without a running row leave the cache); seeded samples reproducible; the model's attention is sdpa again after."""
    torch.manual_seed(0)
    model = MODELS[name]()
    prompts, mask = repeated_prompts()
    caches: list = []
    model.register_forward_pre_hook(lambda m, a, kw: caches.append(kw.get(hf_cascade.KEYWORD)), with_kwargs=True)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=9)
    with torch.no_grad():
        free, _ = Decoder(model, [], 0).decode(prompts, mask, greedy)
    stop = int(free[1, 2])  # the rows of prompt 1 (greedy: alike) stop by their third token
    decode = {}
    for cascade in (True, False):
        monkeypatch.setattr(hf_cascade, "MIN_SAVED_BYTES", 0 if cascade else 2**62)
        caches.clear()
        with torch.no_grad():
            decode[cascade] = Decoder(model, [stop], 0).decode(prompts, mask, greedy)
        used = [c for c in caches if isinstance(c, hf_cascade._types()[1])]
        probed = [c for c in caches if isinstance(c, hf_cascade._types()[2])]
        assert bool(used) == bool(probed) == cascade  # the probe's forward, the prefill's, then every step's
        assert not used or len(used) == len(caches) - 2
        if cascade:
            assert len(used[-1].inverse) < len(prompts) and used[-1].bias.shape[0] < 3, "no compaction happened"
        assert model.config._attn_implementation == "sdpa"
    (tokens, log_probs), (row_tokens, row_log_probs) = decode[True], decode[False]
    assert (tokens == stop).any() and torch.equal(tokens, row_tokens)
    torch.testing.assert_close(log_probs, row_log_probs, rtol=0, atol=1e-5)
    monkeypatch.setattr(hf_cascade, "MIN_SAVED_BYTES", 0)
    sampled = SamplingParams(n=1, temperature=1.0, max_new_tokens=9, seed=5)
    with torch.no_grad():
        first = Decoder(model, [stop], 0).decode(prompts, mask, sampled)
        again = Decoder(model, [stop], 0).decode(prompts, mask, sampled)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_cascade_applies_only_where_it_can_be_checked(monkeypatch) -> None:
    """Not for sliding-window layers (the probe sees the window), keys expanded from a cached latent (DeepSeek's
    multi-head latent attention: the attention does not receive what the cache returned), a mask of the model's own
    making (Doge adds a learned bias to it, which the cascade would drop: helper-49's finding), eager attention, bf16
    weights, distinct prompts or fewer bytes saved than its threshold; for a mixture of experts (its attention gets
    output_router_logits=False); a forward pass without the cache while the cascade is switched on (another thread's)
    gets sdpa and its mask; an error in a decoding call leaves the attention as it was."""
    sliding = Qwen2ForCausalLM(Qwen2Config(**SMALL, num_hidden_layers=2, num_key_value_heads=2,
                                           use_sliding_window=True, sliding_window=4, max_window_layers=0)).eval()
    latent = DeepseekV3ForCausalLM(DeepseekV3Config(
        **SMALL, num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, head_dim=8)).eval()
    experts = MixtralForCausalLM(MixtralConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2,
                                               num_local_experts=4)).eval()
    own_mask = DogeForCausalLM(DogeConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=2)).eval()
    model = llama()
    cases = {"sliding window": sliding, "latent attention": latent, "own mask": own_mask,
             "eager": llama(attn_implementation="eager"),
             "bf16": llama().to(torch.bfloat16), "llama": model, "experts": experts}
    for what, m in cases.items():
        config = m.config.get_text_config(decoder=True)
        assert hf_cascade.supported(m, config) == (what in ("llama", "experts")), what
    prompts, mask = repeated_prompts()
    assert not hf_cascade.worth_it(len(prompts), 3, prompts.shape[1], model.config)  # 8 rows x 7 positions x 64 bytes
    monkeypatch.setattr(hf_cascade, "MIN_SAVED_BYTES", 0)
    used: list = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: used.append(shares(kw)), with_kwargs=True)
    with torch.no_grad():  # no prompt repeats: nothing to share, whatever the threshold
        for rows in ([0, 1, 3], [0]):
            Decoder(model, [], 0).decode(prompts[rows], mask[rows], SamplingParams(n=1, temperature=0.0, max_new_tokens=3))
    hook.remove()
    assert used and not any(used)
    monkeypatch.undo()
    with torch.no_grad():
        plain = model(input_ids=prompts, attention_mask=mask).logits
        with hf_cascade.switched(model.config):
            assert model.config._attn_implementation == hf_cascade.NAME
            other = model(input_ids=prompts, attention_mask=mask).logits
    assert torch.equal(plain, other) and model.config._attn_implementation == "sdpa"

    monkeypatch.setattr(hf_cascade, "MIN_SAVED_BYTES", 0)
    monkeypatch.setattr(hf_decode, "Sampler", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError), torch.no_grad():
        Decoder(model, [2], 0).decode(prompts, mask, SamplingParams(n=1, temperature=0.0, max_new_tokens=3))
    assert model.config._attn_implementation == "sdpa"


def test_the_engines_samples_of_a_prompt_report_the_actors_log_probs(monkeypatch, pm) -> None:
    """The hf engine with n samples per prompt and the cascade on: the rollout's log-probs are the actor's forward
    (what the sync pipeline reuses as the old log-probs)."""
    from rlforge import batch as B
    from rlforge import load_config
    from rlforge.data import collate, tokenize_rows
    from rlforge.models import load_model, load_tokenizer
    from rlforge.ops import response_logprobs

    monkeypatch.setattr(hf_cascade, "MIN_SAVED_BYTES", 0)
    cfg = load_config("grpo", ["rollout.max_new_tokens=6", "data.max_prompt_length=24"], plugins=pm)
    tok, actor = load_tokenizer(cfg.model.path), load_model(cfg.model.path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:4]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "val"), tok.pad_token_id,
                    list(range(len(rows))))
    used: list = []
    actor.register_forward_pre_hook(lambda m, a, kw: used.append(shares(kw)), with_kwargs=True)
    torch.manual_seed(0)
    out = pm.registry.rollout.get("hf")(cfg, actor, tok).generate(batch, SamplingParams(n=4, temperature=1.0,
                                                                                         max_new_tokens=6))
    assert any(used)
    recomputed, _ = response_logprobs(actor, out[B.INPUT_IDS], out[B.ATTENTION_MASK], out[B.RESPONSES].shape[1])
    gap = ((recomputed - out[B.ROLLOUT_LOG_PROBS]).abs() * out[B.RESPONSE_MASK]).max().item()
    assert gap < 1e-4, gap
