"""The hf engine's decoding loop (``plugins/rollout/hf_decode.py``) against transformers ``generate``: greedy tokens
are identical for left-padded prompts, in fp32 and bf16, with one or several new tokens; models whose every layer is
plain attention decode on the filled-length cache, others (sliding-window layers) on transformers' StaticCache."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlforge.plugins.rollout.hf_decode import Decoder, _filled_layer
from rlforge.sampling import SamplingParams

SMALL = {"vocab_size": 50, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
MODELS = {  # name: (model factory, whether the filled-length cache applies)
    "llama_gqa": (lambda: LlamaForCausalLM(LlamaConfig(**SMALL, num_hidden_layers=2, num_key_value_heads=1)), True),
    "qwen2_sliding_window": (lambda: Qwen2ForCausalLM(Qwen2Config(
        **SMALL, num_hidden_layers=3, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
        max_window_layers=1)), False),
    "gpt2": (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, bos_token_id=1,
                                                eos_token_id=2)), True),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bf16_autocast"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_tokens_equal_generate(name: str, dtype: str) -> None:
    """Also under autocast (fp32 weights, bf16 compute: a mixed model.precision), where the filled-length cache holds
    the keys and values in bf16 and transformers' growing cache the rotary embedding's fp32 keys: the same tokens."""
    torch.manual_seed(0)
    factory, filled = MODELS[name]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16_autocast")
    model = factory().to(torch.bfloat16 if dtype == "bfloat16" else torch.float32).eval()
    caches = []
    model.register_forward_pre_hook(lambda m, a, kw: caches.append(kw.get("past_key_values")), with_kwargs=True)
    prompts = torch.randint(3, 50, (5, 7))
    mask = torch.ones_like(prompts)
    mask[0, :3] = mask[1, :1] = 0  # left padding of different widths
    prompts[mask == 0] = 0
    decoder = Decoder(model, [2], 0)
    for new in (1, 6):
        with torch.no_grad(), autocast:
            tokens, _ = decoder.decode(prompts, mask, SamplingParams(n=1, temperature=0.0, max_new_tokens=new))
            caches.clear()
            reference = model.generate(input_ids=prompts, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                       pad_token_id=0, eos_token_id=[2])[:, prompts.shape[1]:]
        n = min(reference.shape[1], tokens.shape[1])
        assert n >= 1 and torch.equal(reference[:, :n], tokens[:, :n])
        assert tokens.shape[1] == n or (tokens[:, n:] == 0).all()
    caches.clear()
    with torch.no_grad(), autocast:
        decoder.decode(prompts, mask, SamplingParams(n=1, temperature=0.0, max_new_tokens=3))
    assert all(type(layer) is _filled_layer() for layer in caches[0].layers) == filled
    if filled:  # the storage: the weights' dtype, or the compute dtype under autocast
        assert {layer.keys.dtype for layer in caches[0].layers} == {layer.values.dtype for layer in caches[0].layers} \
            == {torch.float32 if dtype == "float32" else torch.bfloat16}


def test_finished_rows_leave_the_batch_with_the_same_tokens(monkeypatch) -> None:
    """Once at most COMPACT_BELOW of the rows still run, the finished ones are dropped from the computed batch: the
    remaining rows get the tokens (greedy) and log-probs of a loop that keeps every row."""
    import rlforge.plugins.rollout.hf_decode as hf_decode

    torch.manual_seed(0)
    model = MODELS["llama_gqa"][0]().eval()
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True)
    prompts = torch.randint(3, 50, (8, 5))
    mask = torch.ones_like(prompts)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    with torch.no_grad():
        free, _ = Decoder(model, [], 0).decode(prompts, mask, greedy)
        stops = sorted({int(free[i, 2]) for i in range(4)})  # rows 0-3 stop by their third token
        sizes.clear()
        tokens, log_probs = Decoder(model, stops, 0).decode(prompts, mask, greedy)
        compacted = list(sizes)
        monkeypatch.setattr(hf_decode, "COMPACT_BELOW", -1.0)  # never compact
        kept_tokens, kept_log_probs = Decoder(model, stops, 0).decode(prompts, mask, greedy)
    assert min(compacted) < 8, compacted
    assert torch.equal(tokens, kept_tokens)
    torch.testing.assert_close(log_probs, kept_log_probs, rtol=1e-5, atol=1e-5)
    monkeypatch.undo()
    sampled = SamplingParams(n=1, temperature=1.0, max_new_tokens=10, seed=7)
    with torch.no_grad():
        first = Decoder(model, stops, 0).decode(prompts, mask, sampled)
        again = Decoder(model, stops, 0).decode(prompts, mask, sampled)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # seeded: reproducible with compaction too


@pytest.mark.parametrize("precision", ["fp32", "bf16_autocast"])
def test_the_filled_length_cache_grows_as_responses_do_with_the_same_tokens(monkeypatch, precision: str) -> None:
    """The cache starts at the prompt + CACHE_GROWS_FROM positions and doubles when full (also after finished rows
    left the batch): the same greedy tokens and log-probs as one allocation of the call's whole length, and where
    every response stops early the storage stays far below prompt + max_new_tokens (helper-67: under autocast the
    whole length was allocated, 4.8x the memory of the growing cache it replaced)."""
    import rlforge.plugins.rollout.hf_decode as hf_decode

    torch.manual_seed(0)
    model = MODELS["llama_gqa"][0]().eval()
    caches: list = []
    model.register_forward_pre_hook(lambda m, a, kw: caches.append(kw.get("past_key_values")), with_kwargs=True)
    prompts = torch.randint(3, 50, (8, 5))
    mask = torch.ones_like(prompts)
    mask[0, :2] = 0
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=40)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16_autocast")
    with torch.no_grad(), autocast:
        free, _ = Decoder(model, [], 0).decode(prompts, mask, greedy)
        stops = sorted({int(free[i, 3]) for i in range(4)})  # rows 0-3 stop by their fourth token
        whole = Decoder(model, stops, 0).decode(prompts, mask, greedy)
        monkeypatch.setattr(hf_decode, "CACHE_GROWS_FROM", 2)  # grows at 7, 14, 28, 45 positions
        caches.clear()
        grown = Decoder(model, stops, 0).decode(prompts, mask, greedy)
    assert torch.equal(whole[0], grown[0]) and torch.equal(whole[1], grown[1])
    assert {layer.keys.shape[-2] for layer in caches[-1].layers} == {45}  # doubled to the call's length, at most
    with torch.no_grad(), autocast:
        Decoder(model, list(range(50)), 0).decode(prompts, mask, greedy)  # every row stops at its first token
    assert {layer.keys.shape[-2] for layer in caches[-1].layers} == {7}


def test_caches_the_loop_cannot_shrink_or_build_and_models_that_ignore_the_cache() -> None:
    """helper-49's findings: an indexed-attention cache (Qwen4-Exp), whose reorder leaves its indexer state at the old
    batch, keeps every row (the tokens of generate, no crash); a layer type with no static layer (DeepSeek-V4's
    compressed attention) decodes on the model's own cache; a model that ignores past_key_values (GPT-1) is refused
    with the engine's message, with distinct or repeated prompts."""
    from transformers import AutoConfig, AutoModelForCausalLM, OpenAIGPTConfig, OpenAIGPTLMHeadModel

    from rlforge.errors import RLForgeError

    small = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
             "num_hidden_layers": 2, "pad_token_id": 0}
    configs = {  # model type: (attention implementation, config)
        "qwen4_exp_text": ("sdpa", {**small, "num_key_value_heads": 2, "head_dim": 8, "indexer_n_heads": 2,
                           "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 4, "indexer_compress_ratio": 2,
                           "layer_types": ["indexed_attention", "indexed_attention"]}),
        "deepseek_v4": ("eager", {**small, "num_key_value_heads": 4, "head_dim": 8}),  # no sdpa in transformers 5.19
    }
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    prompts = torch.randint(3, 64, (4, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(prompts)
    for kind, (attention, kwargs) in configs.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **kwargs), attn_implementation=attention)
        model.eval()
        with torch.no_grad():
            free, _ = Decoder(model, [], 0).decode(prompts, mask, greedy)
            stop = int(free[0, 1])  # row 0 stops at its second token: the others would leave it behind
            tokens, _ = Decoder(model, [stop], 0).decode(prompts, mask, greedy)
            expected = model.generate(prompts, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                      eos_token_id=stop, pad_token_id=0)[:, 7:]
        assert torch.equal(tokens, expected[:, :tokens.shape[1]]), kind
    gpt1 = OpenAIGPTLMHeadModel(OpenAIGPTConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    for rows in ([0, 1, 2], [0, 0, 1]):
        with pytest.raises(RLForgeError, match="OpenAIGPTLMHeadModel does not support .*left the cache empty.*vllm"):
            Decoder(gpt1, [], 0).decode(prompts[rows], mask[rows], greedy)


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_prompts_of_very_different_lengths_prefill_in_groups_with_the_same_tokens(monkeypatch, name) -> None:
    """Short prompts beside long ones (mostly left padding in one pass) are prefilled in passes of their own length
    (``lengths.length_groups``): the same greedy tokens and log-probs as one padded pass, and sampled ones
    reproducible."""
    import rlforge.plugins.rollout.hf_decode as hf_decode

    torch.manual_seed(0)
    model = MODELS[name][0]().eval()
    widths: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    prompts = torch.randint(3, 50, (8, 300))
    mask = torch.ones_like(prompts)
    mask[:6, :290] = 0  # six prompts of 10 tokens, two of 300
    prompts[mask == 0] = 0
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    with torch.no_grad():
        tokens, log_probs = Decoder(model, [2], 0).decode(prompts, mask, greedy)
        assert sorted(widths[:2]) == [10, 300], widths  # two prefills, each as wide as its longest prompt
        monkeypatch.setattr(hf_decode, "length_groups", lambda lengths: [list(range(len(lengths)))])
        widths.clear()
        one_tokens, one_log_probs = Decoder(model, [2], 0).decode(prompts, mask, greedy)
        assert widths[0] == 300
    assert torch.equal(tokens, one_tokens)
    torch.testing.assert_close(log_probs, one_log_probs, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    sampled = SamplingParams(n=1, temperature=1.0, max_new_tokens=6, seed=3)
    with torch.no_grad():
        first = Decoder(model, [2], 0).decode(prompts, mask, sampled)
        again = Decoder(model, [2], 0).decode(prompts, mask, sampled)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("precision", ["fp32", "bf16_autocast"])
def test_repeated_prompts_prefill_once_each_with_the_same_tokens(precision: str) -> None:
    """The samples of a group repeat their prompt: each distinct prompt (its tokens and padding) runs through the
    prefill once and its rows get its keys and values: greedy tokens and log-probs are those of decoding the distinct
    prompts alone, on the filled-length cache, in fp32 and under autocast (a mixed precision)."""
    torch.manual_seed(0)
    model = MODELS["llama_gqa"][0]().eval()
    rows: list[int] = []
    model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    distinct = torch.randint(3, 50, (3, 6))
    distinct_mask = torch.ones_like(distinct)
    distinct_mask[1, :2] = 0
    distinct[distinct_mask == 0] = 0
    order = torch.tensor([0, 0, 1, 2, 1, 0, 2, 2, 1])  # repeated, interleaved
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=5)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16_autocast")
    with torch.no_grad(), autocast:
        alone, alone_log_probs = Decoder(model, [2], 0).decode(distinct, distinct_mask, greedy)
        rows.clear()
        tokens, log_probs = Decoder(model, [2], 0).decode(distinct[order], distinct_mask[order], greedy)
    assert rows[0] == 3 and rows[1] == 9, rows  # one prefill row per distinct prompt, then every row decodes
    assert torch.equal(tokens, alone[order])
    torch.testing.assert_close(log_probs, alone_log_probs[order], rtol=1e-4, atol=1e-4)


def test_cpu_fp32_linears_multiply_an_input_major_copy_while_decoding(monkeypatch) -> None:
    """On CPU in fp32 a decoding call's linear layers multiply by an ``[in, out]`` copy of their weights
    (``TransposedLinears``): the same greedy tokens and seeded samples as the plain product, log-probs to float
    rounding; the layers are plain again after the call (also after an error); a forward pass with gradients while
    switched (another thread's) computes with the parameters, so its gradients are theirs."""
    import rlforge.plugins.rollout.hf_decode as hf_decode

    torch.manual_seed(0)
    model = MODELS["llama_gqa"][0]().eval()
    prompts = torch.randint(3, 50, (hf_decode.TRANSPOSE_MIN_ROWS + 1, 6))  # the copy's product from the first step
    mask = torch.ones_like(prompts)
    mask[0, :2] = 0
    seen: list[bool] = []
    probe = model.model.layers[0].mlp.up_proj
    model.register_forward_pre_hook(lambda m, a: seen.append("forward" in probe.__dict__))
    decoder = Decoder(model, [2], 0)

    def run(params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return decoder.decode(prompts, mask, params)

    for params in (SamplingParams(n=1, temperature=0.0, max_new_tokens=5),
                   SamplingParams(n=1, temperature=1.0, max_new_tokens=5, seed=3)):
        seen.clear()
        tokens, log_probs = run(params)
        assert seen and all(seen)
        monkeypatch.setattr(hf_decode, "TRANSPOSE_MAX_BYTES", 0)
        seen.clear()
        plain_tokens, plain_log_probs = run(params)
        assert seen and not any(seen)
        monkeypatch.undo()
        assert torch.equal(tokens, plain_tokens)
        torch.testing.assert_close(log_probs, plain_log_probs, atol=1e-5, rtol=0)
    assert not any("forward" in m.__dict__ for m in model.modules())
    monkeypatch.setattr(decoder, "_decode", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError), torch.no_grad():
        decoder.decode(prompts, mask, SamplingParams(n=1, temperature=0.0, max_new_tokens=2))
    monkeypatch.undo()
    assert not any("forward" in m.__dict__ for m in model.modules())

    own = model.lm_head.forward = lambda x: torch.nn.functional.linear(x, model.lm_head.weight)  # e.g. a hook library's
    seen.clear()
    run(SamplingParams(n=1, temperature=0.0, max_new_tokens=2))
    assert seen and all(seen) and model.lm_head.forward is own  # the others switched; it is left as it was
    del model.lm_head.forward

    failing = types.SimpleNamespace(weight=None)  # its copy fails (as out of memory would): no layer stays switched
    with pytest.raises(AttributeError):
        hf_decode.TransposedLinears([model.lm_head, failing])  # type: ignore[list-item]
    assert not any("forward" in m.__dict__ for m in model.modules())

    with torch.no_grad():
        switched = hf_decode.TransposedLinears.for_model(model, torch.device("cpu"))
    assert switched is not None
    model(input_ids=prompts).logits.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    switched.restore()
    model.zero_grad()
    model(input_ids=prompts).logits.sum().backward()
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad)
