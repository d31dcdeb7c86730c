"""The one evaluator: generate from held-out prompts and score the samples as a training step's rollout and reward
stages do. Validation (``RLModule.validate``), ``rlforge eval`` and the SFT accuracy check all go through it, so the
choice of agent loop and the agent rewards are handled in one place.

It generates through one contract: the batch ``generate`` for single-turn prompts (a :class:`GenerationBackend`), the
token-in/token-out ``generate_tokens`` (taking overlapping calls when ``continuous_batching``) for an agent loop. The
run's rollout workers offer both (``controller.workers.rollout``); a rollout engine outside a run (``rlforge eval``,
the SFT check) is wrapped into it by :class:`EngineBackend`. With an agent loop (``rollout.agent.loop`` other than ``single_turn``: in a run, the flow's own
agentic rollout stage, ``rlforge.agent.stage.evaluator``; outside one, a runner on the engine's ``generate_tokens``,
``Builder.evaluator``) each prompt's samples are the loop's trajectories; their own rewards (``agent_rewards``: an
env's return, tool and turn rewards) are then added to the reward function's scores, as the training step's
``agent_reward`` stage adds them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS, add_agent_rewards
from rlforge.agent.engine import call_backend, token_generator
from rlforge.sampling import Generation, SamplingParams

if TYPE_CHECKING:
    from rlforge.capabilities import RolloutCapabilities
    from rlforge.protocols import RolloutEngine

AGENT_METRICS = ("num_turns/mean", "tool_call_counts/mean", "agent/tool_call_format_ok",
                 "agent/turn_limit_ratio")  # an agent loop's metrics the evaluator reports (validation: val/<name>)
# an agent loop's rollout of prompts at the given sampling: (the trajectories as a batch, the agent metrics)
AgentRollout = Callable[[B.Batch, SamplingParams], "tuple[B.Batch, dict[str, float]]"]


class GenerationBackend(Protocol):
    """What the evaluator generates single-turn samples through: the run's rollout workers
    (``controller.workers.rollout``), or a standalone engine (:class:`EngineBackend`)."""

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch: ...


class EngineBackend:
    """A rollout engine outside a run (``rlforge eval``, the SFT check) as a :class:`GenerationBackend`; its
    ``capabilities`` are those its registry entry declares (``token_io``, ``continuous_batching``)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, capabilities: RolloutCapabilities) -> None:
        self.engine = engine
        self.tokens = token_generator(engine, tokenizer, capabilities.token_io)
        self.continuous_batching = capabilities.continuous_batching
        # the engine's non-blocking agent request (agent.engine.Submit), used under continuous batching
        self.submit_tokens = getattr(engine, "submit_tokens", None)

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        return self.engine.generate(batch, params)

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams],
                        multi_modal: list[dict[str, Any] | None] | None = None) -> list[Generation]:
        return call_backend(self.tokens, prompts, params, multi_modal)

    def hold_engine(self, held: bool) -> None:
        """The engine awake across an agent rollout's calls (its ``hold``, where it has one), as a run's workers."""
        hold = getattr(self.engine, "hold", None)
        if hold is not None:
            hold(held)


FAULT_METRICS = ("reward/errors", "reward/timeouts")  # the reward manager's failed calls (reliability.md)
# what a batch is scored for, in batch.meta[SCORED_FOR] while the evaluator's reward manager scores it (absent: a
# training step); a reward manager words its errors by it (scored_for)
SCORED_FOR = "scored_for"
TRAINING, VALIDATION = "training", "validation"  # validation: a run's, rlforge eval's and the SFT check's


# the updates the trainer has made when ``batch`` is scored, in batch.meta[SCORED_AT] (a training step's reward stage:
# its step - 1; validation: the trainer's step; absent elsewhere: 0); a reward manager may shape by it (TRL's
# trainer_state.global_step)
SCORED_AT = "scored_at"


def scored_at(batch: B.Batch) -> int:
    """The optimizer updates made before ``batch`` is scored (:data:`SCORED_AT`)."""
    return int(batch.meta.get(SCORED_AT, 0))


def score_with(score: Callable[[B.Batch], B.Batch], batch: B.Batch, meta: dict[str, Any]) -> B.Batch:
    """``score(batch)`` with ``meta`` (:data:`SCORED_FOR`, :data:`SCORED_AT`) in the batch's meta while it is scored,
    and in neither the batch nor the scored one after (a scorer may return another batch, with a copy of the meta)."""
    batch.meta.update(meta)
    try:
        scored = score(batch)
    finally:
        for key in meta:
            batch.meta.pop(key, None)
    for key in meta:
        scored.meta.pop(key, None)
    return scored


def scored_for(batch: B.Batch) -> str:
    """What ``batch`` is being scored for: :data:`VALIDATION` while an :class:`Evaluator` scores it, else
    :data:`TRAINING` (a training step's reward stage)."""
    return str(batch.meta.get(SCORED_FOR, TRAINING))


class Evaluator:
    """Generates ``params.n`` samples per prompt through ``backend``, or through ``agent`` (the agent loop's rollout
    on that backend) when given, and scores them with ``score`` (the controller's or the reward manager's);
    :meth:`metrics` averages the agent loop's metrics (:data:`AGENT_METRICS`) over every trajectory generated so far,
    and sums the reward calls that failed (``reward/errors``, ``reward/timeouts``, where any did: their samples count
    as ``reward.fallback_score`` in the scores). ``close``: what :meth:`close` stops (the agent loop's tools and servers, for an evaluator that built its own)."""

    def __init__(self, backend: GenerationBackend, score: Callable[[B.Batch], B.Batch],
                 agent: AgentRollout | None = None, close: Callable[[], None] | None = None, step: int = 0) -> None:
        self.backend, self.scorer, self.agent, self._close, self.step = backend, score, agent, close, step
        self._parts: dict[str, list[tuple[float, int]]] = defaultdict(list)  # (value, trajectories) per call
        self._faults: dict[str, float] = defaultdict(float)  # the reward manager's failed calls, summed

    def __call__(self, prompts: B.Batch, params: SamplingParams) -> B.Batch:
        """The scored samples of ``prompts``."""
        return self.score(self.generate(prompts, params))

    def generate(self, prompts: B.Batch, params: SamplingParams) -> B.Batch:
        if self.agent is None:
            return self.backend.generate(prompts, params)
        out, metrics = self.agent(prompts, params)
        for key in AGENT_METRICS:
            if key in metrics:
                self._parts[key].append((metrics[key], len(out)))
        return out

    def score(self, batch: B.Batch) -> B.Batch:
        """The reward function's scores, plus the trajectories' rewards when an agent loop generated ``batch``."""
        # the reward manager's errors say validation, not a training step
        batch = score_with(self.scorer, batch, {SCORED_FOR: VALIDATION, SCORED_AT: self.step})
        counted = batch.meta.pop("metrics", {})  # the reward manager's counters: only its failures are kept
        for key in FAULT_METRICS:
            self._faults[key] += counted.get(key, 0.0)
        if AGENT_REWARDS in batch:
            add_agent_rewards(batch)
        return batch

    def metrics(self) -> dict[str, float]:
        """The agent metrics, each averaged over the trajectories (one call's as the loop gave them; empty without an
        agent loop)."""
        faults = {key: n for key, n in self._faults.items() if n}
        return {**{key: parts[0][0] if len(parts) == 1 else sum(v * n for v, n in parts) / sum(n for _, n in parts)
                   for key, parts in self._parts.items()}, **faults}

    def close(self) -> None:
        if self._close is not None:
            self._close()
