"""What the agent loops of a run share: :class:`AgentContext` (the config, the tokenizer and its chat format, the
tools, the tool parser, the interactions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlforge.agent.chat import ChatFormat
from rlforge.agent.engine import RowImages

if TYPE_CHECKING:
    from rlforge.agent.base import Interaction, ToolParser
    from rlforge.agent.toolbox import Toolbox
    from rlforge.agent.types import Sample


@dataclass
class AgentContext:
    """What agent loops share for a run: the config, the tokenizer and its chat format, the tools, the tool parser,
    a factory of interactions (None when ``rollout.agent.interaction`` is unset) and a vision-language model's
    processor (None for a text model)."""

    config: Any
    tokenizer: Any
    tools: Toolbox
    parser: ToolParser
    new_interaction: Callable[[], Interaction] | None = None
    processor: Any = None
    chat: ChatFormat = field(init=False)

    def __post_init__(self) -> None:
        from rlforge.data import template_kwargs

        self.chat = ChatFormat(self.tokenizer, template_kwargs(self.config), self.processor,
                               self.config.data.image_key, self.config.data.continue_final_message)
        bind = getattr(self.parser, "bind", None)  # optional: parsers that read the tokenizer (``tokenizer``)
        if bind is not None:
            bind(self)

    def row_images(self, sample: Sample) -> RowImages | None:
        """The images a trajectory's requests carry: its row's vision inputs (None for a text row) and the image-pad
        tokens of its prompt; None for a text model."""
        if self.processor is None:
            return None
        token = self.image_token_id
        return RowImages(sample.multi_modal, token, sample.prompt_ids.count(token))

    @property
    def image_token_id(self) -> int:
        """The image-pad token of the vision-language model's processor."""
        token = getattr(self.processor, "image_token_id", None)
        if token is None:
            token = self.tokenizer.convert_tokens_to_ids(self.processor.image_token)
        return int(token)

    @property
    def limits(self) -> Any:
        """The ``rollout.agent`` section."""
        return self.config.rollout.agent
