"""The hf engine with ``rollout.hf.compile=true``: a compiled decoding step on a static KV cache generates what
the plain engine generates, follows in-place weight updates, and reports the actor's log-probs."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.data import collate, tokenize_rows
from rlforge.models import load_model, load_tokenizer
from rlforge.ops import response_logprobs
from rlforge.sampling import SamplingParams

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def engines(pm):
    cfg = load_config("grpo", ["rollout.max_new_tokens=6", "data.max_prompt_length=24"], plugins=pm)
    compiled_cfg = load_config("grpo", ["rollout.max_new_tokens=6", "data.max_prompt_length=24", "rollout.hf.compile=true"],
                               plugins=pm)
    tok = load_tokenizer(cfg.model.path)
    actor = load_model(cfg.model.path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:8]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "val"), tok.pad_token_id,
                    list(range(len(rows))))
    factory = pm.registry.rollout.get("hf")
    return factory(cfg, actor, tok), factory(compiled_cfg, actor, tok), actor, batch


def _greedy(engine, batch):
    out = engine.generate(batch.select(torch.arange(len(batch))), GREEDY)
    return out[B.RESPONSES].clone(), out[B.RESPONSE_MASK].clone()


def test_compiled_greedy_equals_plain_greedy_before_and_after_an_update(engines):
    plain, compiled, actor, batch = engines
    for _ in range(2):
        expected = _greedy(plain, batch)
        assert expected[1].sum() > len(batch)  # real answers
        got = _greedy(compiled, batch)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        with torch.no_grad():  # an in-place optimizer-like update the compiled step must see
            for p in actor.parameters():
                p.add_(torch.randn_like(p) * 0.02)


def test_compiled_sampling_reports_the_actors_log_probs(engines):
    _, compiled, actor, batch = engines
    torch.manual_seed(0)
    out = compiled.generate(batch, SamplingParams(n=2, temperature=1.0, max_new_tokens=6))
    recomputed, _ = response_logprobs(actor, out[B.INPUT_IDS], out[B.ATTENTION_MASK], out[B.RESPONSES].shape[1])
    gap = ((recomputed - out[B.ROLLOUT_LOG_PROBS]).abs() * out[B.RESPONSE_MASK]).max().item()
    assert gap < 1e-4, gap
