"""The base classes of agentic rollouts: subclass :class:`AgentLoop`, :class:`Tool` or :class:`Interaction`
(docs/agentic.md). Their contracts are the Protocols of the same names in ``rlforge.protocols``."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from rlforge.agent.config import validate_agent_config
from rlforge.errors import RLForgeError

if TYPE_CHECKING:
    from rlforge.agent.chat import ChatFormat
    from rlforge.agent.engine import TrajectoryEngine
    from rlforge.agent.toolbox import Toolbox
    from rlforge.agent.trajectory import Conversation, Trajectory


class AgentLoopError(RLForgeError):
    """An agent loop (or the interaction it drives) failed: the message names the loop, the sample and the turn."""


class ToolError(Exception):
    """Raise it from ``Tool.execute`` to send the model an error reply with this message (counted in tool errors)."""


async def maybe_await(value: Any) -> Any:
    """``value``, awaited if it is awaitable (user methods may be sync or async)."""
    return await value if inspect.isawaitable(value) else value


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
    """A tool's reply with a reward (added to the reward of the turn that called it)."""

    text: str
    reward: float = 0.0


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

    def execute(self, arguments: dict[str, Any], state: Any) -> str | ToolResult:
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

    def reset(self, sample: Sample) -> str | None:
        """The user's first message, appended to the prompt (None: the prompt alone)."""
        return None

    def step(self, message: str) -> tuple[str, float, bool]:
        """``(reply, reward, done)`` for the model's ``message``; the reward is added to that model turn."""
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


@dataclass
class AgentContext:
    """What agent loops share for a run: the config, the tokenizer and its chat format, the tools, the tool parser,
    and a factory of interactions (None when ``rollout.agent.interaction`` is unset)."""

    config: Any
    tokenizer: Any
    tools: Toolbox
    parser: ToolParser
    new_interaction: Callable[[], Interaction] | None = None
    chat: ChatFormat = field(init=False)

    def __post_init__(self) -> None:
        from rlforge.agent.chat import ChatFormat
        from rlforge.data import template_kwargs

        self.chat = ChatFormat(self.tokenizer, template_kwargs(self.config))
        bind = getattr(self.parser, "bind", None)  # optional: parsers that read the tokenizer (``tokenizer``)
        if bind is not None:
            bind(self)

    @property
    def limits(self) -> Any:
        """The ``rollout.agent`` section."""
        return self.config.rollout.agent


class AgentLoop:
    """Owns one trajectory per ``run`` call; many calls run concurrently on one instance, so keep per-trajectory
    state in local variables (or a :class:`Conversation`). Registered under ``agent_loop``; built once per run.

    ``run(sample, engine)`` receives the prompt and a handle to the rollout engine and returns a
    :class:`Trajectory`. :meth:`conversation` starts one that keeps the token ids, the response mask, the log-probs,
    the chat messages and the limits (``rollout.agent.*``) for you."""

    def __init__(self, config: Any, context: AgentContext) -> None:
        self.config = config
        self.context = context

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        validate_agent_config(config)

    def conversation(self, sample: Sample, *, tools: bool = False, messages: list[dict[str, Any]] | None = None
                     ) -> Conversation:
        """A new trajectory for ``sample``. ``tools``: render the prompt with the tools' schemas (the chat template's
        ``tools=``); ``messages``: added to the prompt's messages (e.g. an interaction's opening message)."""
        from rlforge.agent.trajectory import Conversation

        return Conversation(self.context, sample, tools=tools,
                            opening=[*sample.messages, *messages] if messages else None)

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        raise NotImplementedError(f"{type(self).__name__} must implement run")  # abstract

    def rollout_scope(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """An async context entered in the rollout's event loop before its trajectories start, and left there once
        they are done: where a loop starts what must live in that loop (a server). Default: nothing."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Release what the loop holds (servers, processes); called when training ends."""
