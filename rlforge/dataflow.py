"""The dataflow of one training step as data: an ordered list of named stages (HybridFlow style).

Each built-in :class:`Stage` declares the batch columns it needs and produces; user stages are any
callable ``batch -> batch`` (optionally with ``requires``/``produces`` attributes). ``compile()``
checks, before any model is loaded, that every stage's inputs come from an earlier stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union

from rlforge import batch as B
from rlforge.errors import RLForgeError


class Stage(str, Enum):
    ROLLOUT = "rollout"
    REWARD = "reward"
    FILTER = "filter"
    OLD_LOGPROB = "old_logprob"
    REF_LOGPROB = "ref_logprob"
    VALUES = "values"
    ADVANTAGE = "advantage"
    UPDATE_CRITIC = "update_critic"
    UPDATE_ACTOR = "update_actor"
    SYNC_WEIGHTS = "sync_weights"


# columns each built-in stage needs / adds (the prompt columns come from the data loader)
STAGE_IO: dict[Stage, tuple[set[str], set[str]]] = {
    Stage.ROLLOUT: ({B.PROMPTS, B.PROMPT_MASK, B.UID}, {B.RESPONSES, B.INPUT_IDS, B.ATTENTION_MASK, B.RESPONSE_MASK,
                                          B.ROLLOUT_LOG_PROBS}),
    Stage.REWARD: ({B.RESPONSES, B.RESPONSE_MASK}, {B.SCORES, B.TOKEN_LEVEL_SCORES, B.TOKEN_LEVEL_REWARDS}),
    Stage.FILTER: ({B.TOKEN_LEVEL_REWARDS, B.UID}, set()),
    Stage.OLD_LOGPROB: ({B.INPUT_IDS, B.ATTENTION_MASK}, {B.OLD_LOG_PROBS}),
    Stage.REF_LOGPROB: ({B.INPUT_IDS, B.ATTENTION_MASK}, {B.REF_LOG_PROBS}),
    Stage.VALUES: ({B.INPUT_IDS, B.ATTENTION_MASK}, {B.VALUES}),
    Stage.ADVANTAGE: ({B.TOKEN_LEVEL_REWARDS, B.RESPONSE_MASK}, {B.ADVANTAGES, B.RETURNS}),
    Stage.UPDATE_CRITIC: ({B.VALUES, B.RETURNS}, set()),
    Stage.UPDATE_ACTOR: ({B.OLD_LOG_PROBS, B.ADVANTAGES, B.RESPONSE_MASK}, set()),
    Stage.SYNC_WEIGHTS: (set(), set()),
}
LOADER_COLUMNS = {B.PROMPTS, B.PROMPT_MASK, B.UID, B.RAW_PROMPT, B.DATA_SOURCE, B.GROUND_TRUTH, B.EXTRA_INFO}

StageFn = Callable[[Any], Any]
StageLike = Union[Stage, StageFn]


@dataclass(frozen=True)
class FlowStep:
    name: str
    stage: Stage | None  # None for a user callable
    fn: StageFn | None
    requires: frozenset[str]
    produces: frozenset[str]


def _step(item: StageLike) -> FlowStep:
    if isinstance(item, Stage):
        req, prod = STAGE_IO[item]
        return FlowStep(item.value, item, None, frozenset(req), frozenset(prod))
    if callable(item):
        name = getattr(item, "stage_name", None) or getattr(item, "__name__", type(item).__name__)
        req = frozenset(getattr(item, "requires", ()))
        prod = frozenset(getattr(item, "produces", ()))
        return FlowStep(name, None, item, req, prod)
    raise RLForgeError(f"A dataflow stage must be a Stage or a callable batch -> batch, got {item!r}.")


class DataFlow:
    """An ordered, editable list of stages; ``compile()`` validates it."""

    def __init__(self, name: str, stages: Iterable[StageLike]) -> None:
        self.name = name
        self.steps: list[FlowStep] = [_step(s) for s in stages]

    def _index(self, anchor: StageLike | str) -> int:
        key = anchor.value if isinstance(anchor, Stage) else anchor if isinstance(anchor, str) else None
        for i, step in enumerate(self.steps):
            if step.name == key or (key is None and step.fn is anchor):
                return i
        raise RLForgeError(f"Stage {anchor!r} is not in dataflow '{self.name}': {self.names()}")

    def insert_after(self, anchor: StageLike | str, item: StageLike) -> DataFlow:
        self.steps.insert(self._index(anchor) + 1, _step(item))
        return self

    def insert_before(self, anchor: StageLike | str, item: StageLike) -> DataFlow:
        self.steps.insert(self._index(anchor), _step(item))
        return self

    def remove(self, anchor: StageLike | str) -> DataFlow:
        del self.steps[self._index(anchor)]
        return self

    def replace(self, anchor: StageLike | str, item: StageLike) -> DataFlow:
        self.steps[self._index(anchor)] = _step(item)
        return self

    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def __contains__(self, item: StageLike | str) -> bool:
        try:
            self._index(item)
        except RLForgeError:
            return False
        return True

    def compile(self) -> DataFlow:
        """Check that every stage's inputs are produced by the loader or an earlier stage."""
        have = set(LOADER_COLUMNS)
        for step in self.steps:
            missing = step.requires - have
            if missing:
                raise RLForgeError(
                    f"Dataflow '{self.name}': stage '{step.name}' needs {sorted(missing)}, which no earlier "
                    f"stage produces. Order: {' -> '.join(self.names())}"
                )
            have |= step.produces
        return self

    def __repr__(self) -> str:
        return f"DataFlow({self.name!r}, {' -> '.join(self.names())})"
