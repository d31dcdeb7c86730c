"""A trajectory (what an agent loop returns) and :class:`Conversation`, the helper that builds one turn by turn.

The response of a trajectory is everything after the prompt: model turns (``response_mask`` 1, with the engine's
log-probs) and inserted turns (tool replies, user messages, chat-template glue; mask 0, log-prob 0)::

    prompt ids           | response ids                                                              |
    <|user|>2+3?<|end|>  | <tool_call>..</tool_call><|end|> | <|tool|>5<|end|><|assistant|> | 5<|end|> |
    <|assistant|>        |   model turn 1: mask 1           |  inserted: mask 0             | turn 2: 1|
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlforge.agent.base import AgentContext, Sample
    from rlforge.agent.engine import TrajectoryEngine
    from rlforge.agent.toolbox import ToolSession
    from rlforge.protocols import Generation

DONE, TURN_LIMIT, TOKEN_LIMIT = "done", "max_turns", "max_tokens"  # why a trajectory ended


@dataclass
class ToolStats:
    """What the tools did in one trajectory (filled by ``ToolSession``)."""

    calls: int = 0
    errors: int = 0
    parse_errors: int = 0
    seconds: list[float] = field(default_factory=list)  # wall-clock time of each call


@dataclass(frozen=True)
class Span:
    """A run of response tokens ``[start, end)``: a model turn (``role`` ``"assistant"``, loss mask 1) or what was
    inserted between two model turns (mask 0): ``messages`` (tool replies, a user turn) with the chat template's
    glue around them; ``role`` is their role (``"tool"``, ``"user"``; roles joined with ``+`` when they differ)."""

    role: str
    start: int
    end: int
    messages: tuple[dict[str, Any], ...] = ()


MODEL = "assistant"  # the role of a model turn's span


def inserted_role(messages: list[dict[str, Any]]) -> str:
    """The role of an inserted span: its messages' role, or their roles joined with ``+``."""
    return "+".join(dict.fromkeys(str(m.get("role", "?")) for m in messages)) or "?"


@dataclass
class Trajectory:
    """One finished trajectory. ``response_mask`` is 1 on model-generated tokens only; ``log_probs`` holds the
    engine's log-prob of each generated token and 0 elsewhere.

    Rewards: ``turn_rewards[k]`` (per-turn and tool rewards of model turn k) goes on the last token of model turn k,
    ``reward`` on the last model token; both are added to the reward function's score of ``answer`` (None: the text
    of the last model turn)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    log_probs: list[float]
    turn_rewards: list[float] = field(default_factory=list)
    reward: float = 0.0
    answer: str | None = None
    inserted_turns: int = 0  # tool replies and user messages
    stop_reason: str = DONE  # done | max_turns | max_tokens
    tools: ToolStats = field(default_factory=ToolStats)
    metrics: dict[str, float] = field(default_factory=dict)  # free-form; logged as agent/<key>/mean
    spans: list[Span] = field(default_factory=list)  # model turns and inserted turns in order (Conversation fills
    # it; empty: read from the mask by ``all_spans``)

    def turn_spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` response positions of each model turn (runs of 1s in the mask; end exclusive)."""
        spans, start = [], None
        for i, m in enumerate([*self.response_mask, 0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                spans.append((start, i))
                start = None
        return spans

    def all_spans(self) -> list[Span]:
        """The spans of the response: the recorded ``spans`` when they tile it and agree with the mask, else (a
        trajectory built without a :class:`Conversation`) the runs of the mask: model turns, and ``"inserted"``
        between them."""
        if self.spans and self._spans_agree():
            return list(self.spans)
        out, pos = [], 0
        for start, end in self.turn_spans():
            if start > pos:
                out.append(Span("inserted", pos, start))
            out.append(Span(MODEL, start, end))
            pos = end
        if pos < len(self.response_ids):
            out.append(Span("inserted", pos, len(self.response_ids)))
        return out

    def _spans_agree(self) -> bool:
        pos = 0
        for span in self.spans:
            mask = 1 if span.role == MODEL else 0
            if span.start != pos or any(m != mask for m in self.response_mask[span.start:span.end]):
                return False
            pos = span.end
        return pos == len(self.response_ids)

    def check(self, budget: int) -> None:
        """``ValueError`` naming what is inconsistent (lengths, mask values, budget, rewards)."""
        n = len(self.response_ids)
        if not self.prompt_ids:
            raise ValueError("the trajectory has no prompt tokens")
        if len(self.response_mask) != n or len(self.log_probs) != n:
            raise ValueError(f"response_ids, response_mask and log_probs have lengths {n}, {len(self.response_mask)}, "
                             f"{len(self.log_probs)}; they must be equal")
        if any(m not in (0, 1) for m in self.response_mask):
            raise ValueError("response_mask must hold only 0 and 1")
        if n > budget:
            raise ValueError(f"the response has {n} tokens, over rollout.max_new_tokens={budget}")
        if len(self.turn_rewards) > len(self.turn_spans()):
            raise ValueError(f"{len(self.turn_rewards)} turn rewards for {len(self.turn_spans())} model turns")
        for what, value in [("reward", self.reward), *((f"turn_rewards[{k}]", r) for k, r in
                                                       enumerate(self.turn_rewards)),
                            *((f"metrics[{k!r}]", v) for k, v in self.metrics.items())]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{what} is {value!r}; it must be a finite number")
        if self.answer is not None and not isinstance(self.answer, str):
            raise ValueError(f"answer is {type(self.answer).__name__} ({self.answer!r:.40}), not a str (or None: the "
                             f"text of the last model turn)")


class Conversation:
    """Builds one trajectory: the token stream, its mask and log-probs, the chat messages so far, and the limits
    (``rollout.agent.max_turns``, ``max_tokens_per_turn``; the response budget ``rollout.max_new_tokens``).

    ``await generate(engine)`` runs one model turn and returns its text (None once a limit stops the trajectory);
    ``add_messages([...])`` inserts tool replies or user messages (False when they do not fit); ``finish()``
    returns the :class:`Trajectory`."""

    def __init__(self, context: AgentContext, sample: Sample, *, tools: bool | list[dict[str, Any]] = False,
                 opening: list[dict[str, Any]] | None = None) -> None:
        """``tools``: render the prompt with the run's tool schemas (True) or with these schemas (a list);
        ``opening``: the conversation's first messages (default: the sample's, tokenized as the loader did)."""
        self.context = context
        self.chat = context.chat
        self.sample = sample
        self.messages = list(opening if opening is not None else sample.messages)
        schemas = (context.tools.schemas() if tools is True else tools) or None
        if schemas or opening is not None:
            self.prompt_ids = self.chat.prompt_ids(self.messages, schemas)
        else:
            self.prompt_ids = list(sample.prompt_ids)
        limit = context.config.data.max_prompt_length
        if len(self.prompt_ids) > limit:
            raise ValueError(f"the prompt{' with the tool schemas' if schemas else ''} is {len(self.prompt_ids)} "
                             f"tokens, over data.max_prompt_length={limit}; raise data.max_prompt_length")
        self.budget = int(context.config.rollout.max_new_tokens)
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.log_probs: list[float] = []
        self.turn_rewards: list[float] = []
        self.inserted_turns = 0
        self.stop_reason: str | None = None
        self.stats = ToolStats()
        self.spans: list[Span] = []  # the response's model and inserted turns, in order
        self._stop_text = ""  # text of the stop token that ended the last model turn ("" if cut by length)
        self.last: Generation | None = None  # the last model turn's generation

    @property
    def turns(self) -> int:
        """Model turns so far."""
        return len(self.turn_rewards)

    @property
    def remaining(self) -> int:
        """Response tokens left in the budget."""
        return self.budget - len(self.response_ids)

    @property
    def turns_left(self) -> int:
        return self.context.limits.max_turns - self.turns

    def stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    async def generate(self, engine: TrajectoryEngine, max_new_tokens: int | None = None, **overrides: Any
                       ) -> str | None:
        """One model turn (at most ``max_new_tokens``, ``rollout.agent.max_tokens_per_turn`` and what is left of the
        budget); returns its text, or None (and records why) when the turn or token limit is reached. ``overrides``
        are sampling parameters (``temperature=0``)."""
        if self.stop_reason is not None:
            return None
        if self.turns_left <= 0:
            self.stop(TURN_LIMIT)
            return None
        per_turn = min(self.context.limits.max_tokens_per_turn or self.remaining, max_new_tokens or self.remaining)
        if self.remaining <= 0:
            self.stop(TOKEN_LIMIT)
            return None
        self.last = await engine.generate([*self.prompt_ids, *self.response_ids],
                                          max_new_tokens=min(per_turn, self.remaining), **overrides)
        return self.add_generation(self.last)

    def add_generation(self, gen: Generation) -> str:
        """Append a model turn (mask 1) and its assistant message; returns its text."""
        self.spans.append(Span(MODEL, len(self.response_ids), len(self.response_ids) + len(gen.ids)))
        self.response_ids += gen.ids
        self.response_mask += [1] * len(gen.ids)
        self.log_probs += list(gen.log_probs)
        self.turn_rewards.append(0.0)
        stopped = gen.finish == "stop" and bool(gen.ids)
        self._stop_text = self.context.tokenizer.decode(gen.ids[-1:]) if stopped else ""
        text = self.chat.decode(gen.ids)
        self.messages.append({"role": "assistant", "content": text})
        if gen.finish == "length" and self.remaining <= 0:
            self.stop(TOKEN_LIMIT)
        return text

    def add_messages(self, messages: list[dict[str, Any]]) -> bool:
        """Insert ``messages`` after the last model turn (mask 0), with the generation prompt of the next turn.
        False (and the trajectory stops at the token limit) when they would leave no room for another model turn."""
        ids = self.chat.inserted_ids(messages, self._stop_text)
        if len(ids) >= self.remaining:
            self.stop(TOKEN_LIMIT)
            return False
        self.spans.append(Span(inserted_role(messages), len(self.response_ids), len(self.response_ids) + len(ids),
                               tuple(messages)))
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.messages += messages
        self.inserted_turns += 1
        return True

    def tool_session(self) -> ToolSession:
        """The tools of this trajectory: ``async with conv.tool_session() as tools: await tools.run(parsed)``."""
        return self.context.tools.session(self.sample, self.chat, self.stats)

    def add_reward(self, reward: float) -> None:
        """Add ``reward`` to the last model turn."""
        self.turn_rewards[-1] += float(reward)

    def finish(self, answer: str | None = None, reward: float = 0.0, metrics: dict[str, float] | None = None
               ) -> Trajectory:
        return Trajectory(
            prompt_ids=list(self.prompt_ids), response_ids=self.response_ids, response_mask=self.response_mask,
            log_probs=self.log_probs, turn_rewards=self.turn_rewards, reward=reward, answer=answer,
            inserted_turns=self.inserted_turns, stop_reason=self.stop_reason or DONE, tools=self.stats,
            metrics=dict(metrics or {}), spans=list(self.spans),
        )
