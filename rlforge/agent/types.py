"""The agent's plain types: what an agent loop receives (:class:`Sample`), what a tool parser reads
(:class:`ParsedTurn`, :class:`ToolCall`), what a tool returns (:class:`ToolResult`), what a loop returns
(:class:`Trajectory`) and the errors of agent runs. A leaf of the agent package (it imports no other agent module),
so that the contracts in ``rlforge.protocols`` can name these types without importing the agent machinery."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlforge.errors import RLForgeError


class AgentLoopError(RLForgeError):
    """An agent loop (or the interaction it drives) failed: the message names the loop, the sample and the turn."""


class ToolError(Exception):
    """Raise it from ``Tool.execute`` to send the model an error reply with this message (counted in tool errors)."""


@dataclass(frozen=True)
class Sample:
    """One prompt row as an agent loop sees it (one of the ``rollout.n`` loops of its prompt)."""

    messages: list[dict[str, Any]]  # the prompt's chat messages (a copy: loops may extend it)
    prompt_ids: list[int]  # the prompt as the data loader tokenized it (chat template, no tool schemas)
    data_source: str
    ground_truth: Any
    extra_info: Any
    uid: Any  # group id: the rollout.n samples of a prompt share it
    index: int  # row of the rollout batch (prompt index x rollout.n + sample number)
    agent_name: str | None = None  # the row's agent_name column (verl's per-row agent loop; rollout.agent.loop=verl_agent)
    multi_modal: dict[str, Any] | None = None  # the row's vision inputs (B.MULTI_MODAL_INPUTS: pixel_values,
    # image_grid_thw, images); None for a text row. Its requests carry them (docs/agentic.md, images)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn read by a tool parser: its content without the calls (and without its reasoning), the calls,
    one message per call that could not be read (the model gets each as an error reply), and the reasoning the
    parser found (Qwen3's ``<think>...</think>``; "" when none)."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str = ""


@dataclass(frozen=True)
class ToolResult:
    """A tool's reply with a reward (added to the reward of the turn that called it) and the images it shows
    (PIL images, ``{"bytes": ...}`` or paths; a vision-language model sees them before the text, as verl inserts a
    ``ToolResponse``'s images)."""

    text: str
    reward: float = 0.0
    images: tuple[Any, ...] | list[Any] = ()


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
    extra_info: dict[str, Any] | None = None  # added to the row's extra_info that the reward function receives
    score: float | None = None  # set: the trajectory's score in place of the reward function's (which is not called)
    multi_modal: dict[str, Any] | None = None  # the vision inputs of every image of the sequence when inserted turns
    # showed images (the row's first, then theirs; Conversation sets it); None: the row's

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
        scored = [("score", self.score)] if self.score is not None else []
        for what, value in [("reward", self.reward), *scored, *((f"turn_rewards[{k}]", r) for k, r in
                                                       enumerate(self.turn_rewards)),
                            *((f"metrics[{k!r}]", v) for k, v in self.metrics.items())]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{what} is {value!r}; it must be a finite number")
        if self.multi_modal is not None and not (isinstance(self.multi_modal, dict) and
                                                 {"pixel_values", "image_grid_thw"} <= set(self.multi_modal)):
            raise ValueError("multi_modal must be a dict with pixel_values and image_grid_thw (or None: the row's)")
        if self.extra_info is not None and not isinstance(self.extra_info, dict):
            raise ValueError(f"extra_info is {type(self.extra_info).__name__}, not a dict (or None)")
        if self.answer is not None and not isinstance(self.answer, str):
            raise ValueError(f"answer is {type(self.answer).__name__} ({self.answer!r:.40}), not a str (or None: the "
                             f"text of the last model turn)")
