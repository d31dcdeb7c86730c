""":class:`Conversation`, the helper that builds a trajectory (what an agent loop returns,
:class:`rlforge.agent.types.Trajectory`) turn by turn.

The response of a trajectory is everything after the prompt: model turns (``response_mask`` 1, with the engine's
log-probs) and inserted turns (tool replies, user messages, chat-template glue; mask 0, log-prob 0)::

    prompt ids           | response ids                                                              |
    <|user|>2+3?<|end|>  | <tool_call>..</tool_call><|end|> | <|tool|>5<|end|><|assistant|> | 5<|end|> |
    <|assistant|>        |   model turn 1: mask 1           |  inserted: mask 0             | turn 2: 1|
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlforge.agent.engine import RowImages
from rlforge.agent.types import DONE, MODEL, TOKEN_LIMIT, TURN_LIMIT, Sample, Span, ToolStats, Trajectory
from rlforge.multimodal import IMAGE_PLACEHOLDER, IMAGES, flatten_parts, open_images, split_placeholders

if TYPE_CHECKING:
    from rlforge.agent.context import AgentContext
    from rlforge.agent.engine import TrajectoryEngine
    from rlforge.agent.toolbox import ToolSession
    from rlforge.sampling import Generation


def _placeholders(content: Any) -> int:
    """The ``<image>`` placeholders of a message's content (none in a content that is not text)."""
    return content.count(IMAGE_PLACEHOLDER) if isinstance(content, str) else 0


def _placed(images: list[Any], content: Any, where: str) -> list[Any]:
    """``images``, checked to be one per ``<image>`` placeholder of the message's ``content``."""
    found = _placeholders(content)
    if found != len(images):
        raise ValueError(f"{where} has {len(images)} image(s) in 'images' and {found} {IMAGE_PLACEHOLDER} "
                         f"placeholder(s) in its content: put one placeholder where each image goes")
    return images


def inserted_role(messages: list[dict[str, Any]]) -> str:
    """The role of an inserted span: its messages' role, or their roles joined with ``+``."""
    return "+".join(dict.fromkeys(str(m.get("role", "?")) for m in messages)) or "?"


class Conversation:
    """Builds one trajectory: the token stream, its mask and log-probs, the chat messages so far, and the limits
    (``rollout.agent.max_turns``, ``max_tokens_per_turn``; the response budget ``rollout.max_new_tokens``).

    ``await generate(engine)`` runs one model turn and returns its text (None once a limit stops the trajectory);
    ``add_messages([...])`` inserts tool replies or user messages (False when they do not fit); ``finish()``
    returns the :class:`Trajectory`."""

    def __init__(self, context: AgentContext, sample: Sample, *, tools: bool | list[dict[str, Any]] = False,
                 opening: list[dict[str, Any]] | None = None) -> None:
        """``tools``: render the prompt with the run's tool schemas (True) or with these schemas (a list);
        ``opening``: the conversation's first messages (default: the sample's, tokenized as the loader did; a
        message of its own may show images, as in :meth:`add_messages`)."""
        self.context = context
        self.chat = context.chat
        self.sample = sample
        self.messages = [self._escaped(m) for m in opening] if opening is not None else list(sample.messages)
        self.images = context.row_images(sample)  # the images so far (the row's, then inserted turns'); None: none
        schemas = (context.tools.schemas() if tools is True else tools) or None
        if any(m.get("images") for m in self.messages):
            rendered, images = self._opening(self._row_images())
            self.prompt_ids, inputs = self.chat.prompt_with_images(rendered, schemas, images)
            self.images = RowImages(inputs, context.image_token_id, self.prompt_ids.count(context.image_token_id))
        elif schemas or opening is not None:  # a row with images: rendered with its images by the processor
            self.prompt_ids = self.chat.prompt_ids(self.messages, schemas, self._row_images() or None)
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
        if self.images is not None:  # a vision-language model: the images so far (engines without images: no keyword)
            overrides["images"] = self.images
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
        False (and the trajectory stops at the token limit) when they would leave no room for another model turn.
        A message may show images (a vision-language model): its ``images`` (PIL images, ``{"bytes": ...}`` or
        paths), one per ``<image>`` placeholder of its content, in order (tool replies with images have them). In a
        message without ``images``, ``<image>`` is text; text that spells the model's image or video pad token is
        escaped (``ChatFormat.escape``), so that only real images take image tokens."""
        messages, rendered, images = self._inserted(messages)
        if images:
            ids, inputs = self.chat.inserted_with_images(rendered, images, self._stop_text)
            token = self.context.image_token_id
            extended = (self.images.extended(inputs, ids.count(token)) if self.images is not None else
                        RowImages(inputs, token, ids.count(token)))
        else:
            ids = self.chat.inserted_ids(rendered, self._stop_text)
        if len(ids) >= self.remaining:
            self.stop(TOKEN_LIMIT)
            return False
        if images:
            self.images = extended
        self.spans.append(Span(inserted_role(messages), len(self.response_ids), len(self.response_ids) + len(ids),
                               tuple(messages)))
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.messages += messages
        self.inserted_turns += 1
        return True

    def _row_images(self) -> list[Any]:
        """The row's images, for a prompt rendered again (none for a text row)."""
        if self.sample.multi_modal is None:
            return []
        if IMAGES not in self.sample.multi_modal:
            raise ValueError(f"the row's vision inputs have no '{IMAGES}' (the images themselves, which the data "
                             f"loader keeps beside pixel_values), so its prompt cannot be rendered again")
        return list(self.sample.multi_modal[IMAGES])

    def _escaped(self, message: dict[str, Any]) -> dict[str, Any]:
        """``message`` with its text escaped (``ChatFormat.escape``)."""
        content = message.get("content")
        return {**message, "content": self.chat.escape(content)} if isinstance(content, str) else message

    def _opening(self, row_images: list[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
        """The opening messages without their ``images`` and every image they show, in order: a message's own, or
        for the placeholders of a message without ``images`` the row's next ones (all of them must be used)."""
        rendered, images, used = [], [], 0
        for n, m in enumerate(self.messages):
            content = m.get("content")
            if m.get("images"):
                where = f"opening message {n} ({m.get('role')})"
                images += _placed(open_images(m["images"], where, "images"), content, where)
            else:
                found = _placeholders(content)
                images += row_images[used:used + found]
                used += found
            rendered.append({k: v for k, v in m.items() if k != "images"})
        if used != len(row_images):
            raise ValueError(f"the opening messages have {used} {IMAGE_PLACEHOLDER} placeholder(s) for the row's "
                             f"{len(row_images)} image(s) ({self.chat.image_key}, data.image_key)")
        return rendered, images

    def _inserted(self, messages: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
        """(``messages`` as kept: text contents escaped, images opened; as rendered: without ``images``, a message
        with images split into typed parts on its placeholders; the images they show, in order)."""
        kept, out, images = [], [], []
        for n, m in enumerate(messages):
            where = f"message {n} ({m.get('role')})"
            shown = open_images(m.get("images"), where, "images")
            content = m.get("content")
            if isinstance(content, list):  # typed parts (the OpenAI format): an image part needs its image
                content = flatten_parts(content, where)
                if _placeholders(content) and not shown:
                    raise ValueError(f"{where} has an image part but no 'images': give the image in its 'images'")
            message = self._escaped({**{k: v for k, v in m.items() if k != "images"}, "content": content})
            kept.append({**message, "images": shown} if shown else message)
            if shown:
                _placed(shown, message["content"], where)
                message["content"] = split_placeholders(message["content"])
            out.append(message)
            images += shown
        return kept, out, images

    def tool_session(self, names: list[str] | None = None) -> ToolSession:
        """The tools of this trajectory: ``async with conv.tool_session() as tools: await tools.run(parsed)``;
        ``names``: only these of the run's tools (a call of another gets the "no such tool" reply)."""
        return self.context.tools.session(self.sample, self.chat, self.stats, names)

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
            # the trajectory showed images of its own (opening, inserted turns): its vision inputs are not the row's
            multi_modal=(self.images.inputs if self.images is not None and self.images.inputs is not
                         self.sample.multi_modal else None),
        )
