"""The base classes of an agent run's components: subclass :class:`Tool`, :class:`Interaction` or :class:`ToolParser`
(docs/agentic.md; agent loops subclass :class:`rlforge.agent.loop.AgentLoop`). Their contracts are the Protocols of the
same names in ``rlforge.protocols``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from functools import cached_property
from typing import Any, ClassVar

from rlforge.agent.types import ParsedTurn, Sample, ToolResult


async def maybe_await(value: Any) -> Any:
    """``value``, awaited if it is awaitable (user methods may be sync or async)."""
    return await value if inspect.isawaitable(value) else value


class Tool:
    """A function the model may call. Set ``name`` (the registered name), ``description`` and ``parameters`` (JSON
    schema of the arguments); implement ``execute``, sync or ``async``. Options: a ``config=`` dataclass at
    registration, read as ``self.options`` (``rollout.agent.<name>``).

    Per-trajectory state: ``create(sample)`` runs before the tool's first call in a trajectory and its result is
    passed to every ``execute`` of that trajectory; ``release(state)`` runs when the trajectory ends."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def __init__(self, config: Any) -> None:
        self.config = config

    @cached_property
    def options(self) -> Any:
        """This tool's config section ``rollout.agent.<name>`` (None when it has no options)."""
        return self.config.rollout.agent.get(self.name) if self.config is not None else None

    def schema(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def create(self, sample: Sample) -> Any:
        return None

    def execute(self, arguments: dict[str, Any], state: Any) -> str | ToolResult | Awaitable[str | ToolResult]:
        raise NotImplementedError(f"tool {self.name!r} must implement execute")  # abstract

    def release(self, state: Any) -> None:
        return None


class Interaction:
    """A simulated user or environment; one instance per trajectory (keep its state on ``self``). Options: a
    ``config=`` dataclass at registration, read as ``self.options`` (``rollout.agent.<name>``)."""

    name: ClassVar[str] = ""

    def __init__(self, config: Any) -> None:
        self.config = config

    @cached_property
    def options(self) -> Any:
        return self.config.rollout.agent.get(self.name) if self.config is not None else None

    def reset(self, sample: Sample) -> str | dict[str, Any] | None:
        """The user's first message, appended to the prompt (None: the prompt alone). A message may be a dict
        ``{"content": "<image>...", "images": [...]}`` that shows images to a vision-language model."""
        return None

    def step(self, message: str) -> tuple[str | dict[str, Any], float, bool]:
        """``(reply, reward, done)`` for the model's ``message``; the reward is added to that model turn. The reply
        is text, or a message dict with ``images`` as in :meth:`reset` (an environment's rendered observation)."""
        raise NotImplementedError(f"interaction {self.name!r} must implement step")  # abstract

    def close(self) -> None:
        """Release what the interaction holds; runs when its trajectory ends (sync or ``async``)."""


class ToolParser:
    """Reads tool calls from a model turn's text; implement ``parse``. A parser that needs the run's tokenizer or
    chat template also implements ``bind(context)``, called once with the run's :class:`AgentContext` before any
    turn."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def parse(self, text: str) -> ParsedTurn:
        raise NotImplementedError(f"{type(self).__name__} must implement parse")  # abstract
