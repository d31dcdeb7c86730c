"""The base class of agent loops: subclass :class:`AgentLoop` (docs/agentic.md). Its contract is the Protocol of the
same name in ``rlforge.protocols``."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from rlforge.agent.config import validate_agent_config
from rlforge.agent.conversation import Conversation

if TYPE_CHECKING:
    from rlforge.agent.context import AgentContext
    from rlforge.agent.engine import TrajectoryEngine
    from rlforge.agent.types import Sample, Trajectory


class AgentLoop:
    """Owns one trajectory per ``run`` call; many calls run concurrently on one instance, so keep per-trajectory
    state in local variables (or a :class:`Conversation`). Registered under ``agent_loop``; built once per run.

    ``run(sample, engine)`` receives the prompt and a handle to the rollout engine and returns a
    :class:`Trajectory`. :meth:`conversation` starts one that keeps the token ids, the response mask, the log-probs,
    the chat messages and the limits (``rollout.agent.*``) for you."""

    # why this loop cannot run rows with images ("": it can); the data is refused with it when it loads
    refuses_images: str = ""

    def __init__(self, config: Any, context: AgentContext) -> None:
        self.config = config
        self.context = context

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        validate_agent_config(config)

    def conversation(self, sample: Sample, *, tools: bool | list[dict[str, Any]] = False,
                     messages: list[dict[str, Any]] | None = None) -> Conversation:
        """A new trajectory for ``sample``. ``tools``: render the prompt with the tools' schemas (the chat template's
        ``tools=``; a list: these schemas); ``messages``: added to the prompt's messages (e.g. an interaction's
        opening message)."""
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
