"""rlforge.evaluation: the one evaluator of validation, ``rlforge eval`` and the SFT check (single turn or an agent
loop, agent rewards added to the scores), and a standalone engine behind the generation contract (``token_io``)."""

from __future__ import annotations

from types import SimpleNamespace
import torch

from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS
from rlforge.capabilities import RolloutCapabilities
from rlforge.evaluation import EngineBackend, Evaluator
from rlforge.sampling import Generation, SamplingParams

PARAMS = SamplingParams(n=1, temperature=0.0, max_new_tokens=4)


def scored(batch: B.Batch) -> B.Batch:
    """A reward manager's score: 1 per row, on the last token, with a training-step counter in meta."""
    batch[B.SCORES] = torch.ones(len(batch))
    batch[B.TOKEN_LEVEL_SCORES] = torch.tensor([[0.0, 1.0]] * len(batch))
    batch.meta["metrics"] = {"reward/calls": 1.0}
    return batch


def test_single_turn_generates_with_the_backends_generate_and_scores() -> None:
    calls: list[SamplingParams] = []
    backend = SimpleNamespace(generate=lambda batch, params: calls.append(params) or batch)
    evaluate = Evaluator(backend, scored)  # type: ignore[arg-type]
    out = evaluate(B.Batch({B.PROMPTS: torch.zeros(2, 3, dtype=torch.long)}), PARAMS)
    assert calls == [PARAMS] and out[B.SCORES].tolist() == [1.0, 1.0]
    assert "metrics" not in out.meta and evaluate.metrics() == {}  # the manager's counters are for training steps

    def failing(batch: B.Batch) -> B.Batch:  # 2 of its calls failed, one by its timeout: fallback scores
        batch = scored(batch)
        batch.meta["metrics"] = {"reward/errors": 1.0, "reward/timeouts": 1.0, "reward/error_share": 2 / 3}
        return batch

    evaluate = Evaluator(backend, failing)  # type: ignore[arg-type]
    for rows in (3, 2):  # helper-52: a validation whose reward failed looked like a model that scores 0
        evaluate(B.Batch({B.PROMPTS: torch.zeros(rows, 3, dtype=torch.long)}), PARAMS)
    assert evaluate.metrics() == {"reward/errors": 2.0, "reward/timeouts": 2.0}  # summed: val/reward/errors, ...


class Loop:
    """An agent loop's rollout whose trajectories carry a reward of 0.5 on their first token."""

    def __init__(self) -> None:
        self.calls: list[SamplingParams] = []
        self.turns = iter([2.0, 5.0])

    def __call__(self, batch: B.Batch, params: SamplingParams) -> tuple[B.Batch, dict[str, float]]:
        self.calls.append(params)
        rows = batch.repeat_interleave(params.n)
        rows[AGENT_REWARDS] = torch.tensor([[0.5, 0.0]] * len(rows))
        return rows, {"num_turns/mean": next(self.turns), "agent/other": 1.0}


def test_an_agent_loop_generates_and_its_rewards_are_added() -> None:
    loop, closed = Loop(), []
    evaluate = Evaluator(SimpleNamespace(), scored, loop, lambda: closed.append(True))  # type: ignore[arg-type]
    first = evaluate(B.Batch({B.PROMPTS: torch.zeros(1, 3, dtype=torch.long)}), PARAMS)
    evaluate(B.Batch({B.PROMPTS: torch.zeros(3, 3, dtype=torch.long)}), PARAMS)
    assert loop.calls == [PARAMS] * 2
    assert first[B.SCORES].tolist() == [1.5] and first[B.TOKEN_LEVEL_SCORES].tolist() == [[0.5, 1.0]]
    assert evaluate.metrics() == {"num_turns/mean": (2.0 * 1 + 5.0 * 3) / 4}  # per trajectory; only the agent keys
    evaluate.close()
    assert closed == [True]


class BatchOnly:
    """An engine with a batch ``generate`` only: one token, 7, then the end of sequence (2)."""

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        out = batch.repeat_interleave(params.n)
        out[B.RESPONSES] = torch.tensor([[7, 2]] * len(out))
        out[B.RESPONSE_MASK] = torch.ones(len(out), 2, dtype=torch.long)
        out[B.ROLLOUT_LOG_PROBS] = torch.zeros(len(out), 2)
        return out


def test_a_standalone_engine_generates_tokens_as_it_declares() -> None:
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=2)
    via_generate = EngineBackend(BatchOnly(), tokenizer, RolloutCapabilities())  # type: ignore[arg-type]
    assert via_generate.generate_tokens([[5, 6]], [PARAMS]) == [Generation([7, 2], [0.0, 0.0], "stop")]

    class Native(BatchOnly):
        def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
            return [Generation([9], [-1.0], "length")] * len(prompts)

    native = EngineBackend(Native(), tokenizer, RolloutCapabilities(token_io=True, continuous_batching=True))
    assert native.generate_tokens([[5]], [PARAMS]) == [Generation([9], [-1.0], "length")]
    assert native.continuous_batching and not via_generate.continuous_batching
    undeclared = EngineBackend(Native(), tokenizer, RolloutCapabilities())  # has the method, declares nothing
    assert undeclared.generate_tokens([[5, 6]], [PARAMS]) == [Generation([7, 2], [0.0, 0.0], "stop")]
