"""The hf engine's decoding loop (``plugins/rollout/hf_decode.py``) against transformers ``generate``: greedy tokens
are identical for left-padded prompts, in fp32 and bf16, with one or several new tokens; models whose every layer is
plain attention decode on the filled-length cache, others (sliding-window layers) on transformers' StaticCache."""

from __future__ import annotations

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_tokens_equal_generate(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    factory, filled = MODELS[name]
    model = factory().to(dtype).eval()
    caches = []
    model.register_forward_pre_hook(lambda m, a, kw: caches.append(kw.get("past_key_values")), with_kwargs=True)
    prompts = torch.randint(3, 50, (5, 7))
    mask = torch.ones_like(prompts)
    mask[0, :3] = mask[1, :1] = 0  # left padding of different widths
    prompts[mask == 0] = 0
    decoder = Decoder(model, [2], 0)
    for new in (1, 6):
        with torch.no_grad():
            tokens, _ = decoder.decode(prompts, mask, SamplingParams(n=1, temperature=0.0, max_new_tokens=new))
            caches.clear()
            reference = model.generate(input_ids=prompts, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                       pad_token_id=0, eos_token_id=[2])[:, prompts.shape[1]:]
        n = min(reference.shape[1], tokens.shape[1])
        assert n >= 1 and torch.equal(reference[:, :n], tokens[:, :n])
        assert tokens.shape[1] == n or (tokens[:, n:] == 0).all()
    caches.clear()
    with torch.no_grad():
        decoder.decode(prompts, mask, SamplingParams(n=1, temperature=0.0, max_new_tokens=3))
    assert all(type(layer) is _filled_layer() for layer in caches[0].layers) == filled


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


def test_packed_linears_give_the_plain_tokens_and_are_restored(monkeypatch) -> None:
    """On CPU in fp32 without gradients the decoding steps' linear layers run on MKL-packed weights, repacked when
    finished rows leave the batch: the same greedy tokens and log-probs (to float rounding) as the plain products, and
    every layer's own forward back after the call. With gradients on, in bf16 or above PACK_MAX_BYTES: not packed."""
    import rlforge.plugins.rollout.hf_decode as hf_decode

    if not torch.backends.mkl.is_available():
        pytest.skip("this torch build has no MKL")
    torch.manual_seed(0)
    model = MODELS["llama_gqa"][0]().eval()
    packed_rows: list[int] = []
    pack = hf_decode.PackedLinears.pack
    monkeypatch.setattr(hf_decode.PackedLinears, "pack", lambda self, rows: (packed_rows.append(rows), pack(self, rows)))
    prompts = torch.randint(3, 50, (8, 5))
    mask = torch.ones_like(prompts)
    mask[0, :2] = 0
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    with torch.no_grad():
        free, _ = Decoder(model, [], 0).decode(prompts, mask, greedy)
        stops = sorted({int(free[i, 2]) for i in range(4)})
        tokens, log_probs = Decoder(model, stops, 0).decode(prompts, mask, greedy)
        assert len(set(packed_rows)) >= 2, packed_rows  # repacked after the batch shrank
        assert not any("forward" in vars(m) for m in model.modules())
        assert hf_decode.PackedLinears.for_model(model, torch.device("meta")) is None
        monkeypatch.setattr(hf_decode, "PACK_MAX_BYTES", 0)
        packed_rows.clear()
        plain_tokens, plain_log_probs = Decoder(model, stops, 0).decode(prompts, mask, greedy)
        assert packed_rows == []
        monkeypatch.undo()
        assert hf_decode.PackedLinears.for_model(model, torch.device("cpu")) is not None
        assert hf_decode.PackedLinears.for_model(model.to(torch.bfloat16), torch.device("cpu")) is None
    assert hf_decode.PackedLinears.for_model(model.float(), torch.device("cpu")) is None  # gradients on
    assert torch.equal(tokens, plain_tokens)
    torch.testing.assert_close(log_probs, plain_log_probs, rtol=1e-5, atol=1e-5)
