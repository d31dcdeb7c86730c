"""What the agent loops of a run share: :class:`AgentContext` (the config, the tokenizer and its chat format, the
tools, the tool parser, the interactions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlforge.agent.chat import ChatFormat

if TYPE_CHECKING:
    from rlforge.agent.base import Interaction, ToolParser
    from rlforge.agent.toolbox import Toolbox


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
        from rlforge.data import template_kwargs

        self.chat = ChatFormat(self.tokenizer, template_kwargs(self.config))
        bind = getattr(self.parser, "bind", None)  # optional: parsers that read the tokenizer (``tokenizer``)
        if bind is not None:
            bind(self)

    @property
    def limits(self) -> Any:
        """The ``rollout.agent`` section."""
        return self.config.rollout.agent
