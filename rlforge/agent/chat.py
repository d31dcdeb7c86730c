"""Chat-template rendering for trajectories built token by token.

A trajectory is one token stream: the prompt, then model turns (their tokens as generated, never re-tokenized)
and inserted turns (tool replies, user messages). The tokens of an inserted turn are what the chat template puts
after a finished assistant message, found by rendering a fixed two-message conversation with and without the new
messages and taking the difference. The text that the template writes after an assistant message's content (its
end marker, e.g. ``<|im_end|>\\n``) is added in front, minus the stop token the model generated itself.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import RLForgeError

TRUNCATION_MARKER = "...(truncated)"
# the side of a long tool reply that is cut away -> the marker in its place (verl's tool_response_truncate_side)
TRUNCATION_MARKERS = {"right": TRUNCATION_MARKER, "left": "(truncated)...", "middle": "...(truncated)..."}
CHARS_PER_TOKEN = 64  # text is cut to this many characters per token allowed before it is tokenized (bounded cost)
_USER, _ASSISTANT = "RLFORGE_USER_SENTINEL", "RLFORGE_ASSISTANT_SENTINEL"
_BASE = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]


class ChatFormat:
    """Renders prompts (with tool schemas) and inserted turns for one tokenizer's chat template, or a vision-language
    model's processor's (``processor``: it renders every conversation and encodes prompts with images)."""

    def __init__(self, tokenizer: Any, template: dict[str, Any] | None = None, processor: Any = None,
                 image_key: str = "images", continue_final: bool = False) -> None:
        self.tokenizer = tokenizer
        self.processor = processor
        self.image_key = image_key  # data.image_key, named in errors
        self.template = dict(template or {})  # data.apply_chat_template_kwargs, passed to every render
        self.continue_final = continue_final  # data.continue_final_message: an opening prefill is continued
        # the processor's image and video pad tokens: each stands for an image's features, never for text
        self.reserved = [t for t in (getattr(processor, "image_token", None), getattr(processor, "video_token", None))
                         if isinstance(t, str) and t]
        self._base = self.render(_BASE, add_generation_prompt=False)
        at = self._base.rfind(_ASSISTANT)
        if at < 0:
            raise RLForgeError("The tokenizer's chat template drops the content of assistant messages, so agent loops "
                               "cannot build multi-turn trajectories with it (rollout.agent.loop).")
        self.end_of_message = self._base[at + len(_ASSISTANT):]  # e.g. "<|end|>" or "<|im_end|>\n"

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
        try:
            return (self.processor or self.tokenizer).apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt,
                **({"continue_final_message": True} if continue_final_message else {}), **self.template)
        except Exception as exc:  # jinja errors: a role or field the template does not handle
            roles = [m.get("role") for m in messages]
            raise RLForgeError(f"The chat template cannot render messages with roles {roles}"
                               f"{' and tools' if tools else ''}: {type(exc).__name__}: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(valid_text(text), add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                   images: list[Any] | None = None) -> list[int]:
        """The opening prompt, ending with the template's generation prompt, or in the assistant's last message
        (``data.continue_final_message``), as the data loader renders it (``rlforge.data.render_ending``).
        ``images``: the row's images, one per ``<image>`` placeholder of ``messages``; the processor expands each
        into its image-pad tokens, as the data loader does."""
        if not images:
            return self.encode(self._opening(messages, tools))
        return self.prompt_with_images(messages, tools, images)[0]

    def _opening(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        from rlforge.data import render_ending

        return self.render(messages, tools, **render_ending(messages, self.continue_final))

    def prompt_with_images(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                           images: list[Any]) -> tuple[list[int], dict[str, Any]]:
        """:meth:`prompt_ids` of messages with images, and the images' vision inputs."""
        from rlforge import multimodal as mm

        where = "the trajectory's opening messages"
        typed = mm.typed_messages(messages, len(images), where, self.image_key)
        return mm.encode_text(self._processor(), valid_text(self._opening(typed, tools)), images, where)

    def inserted_ids(self, messages: list[dict[str, Any]], stop_text: str = "") -> list[int]:
        """The tokens that follow a model turn when ``messages`` (tool replies, a user message) come next, up to the
        generation prompt of the next model turn. ``stop_text``: the text of the stop token that ended the model
        turn ("" when it was cut by the length limit: the template's end marker is inserted whole)."""
        return self.encode(self._inserted_text(messages, stop_text))

    def inserted_with_images(self, messages: list[dict[str, Any]], images: list[Any], stop_text: str = ""
                             ) -> tuple[list[int], dict[str, Any]]:
        """:meth:`inserted_ids` of messages that show ``images`` (their typed image parts, in order), each expanded
        into its image-pad tokens by the processor; and the images' vision inputs."""
        from rlforge import multimodal as mm

        return mm.encode_text(self._processor(), valid_text(self._inserted_text(messages, stop_text)), images,
                              "the inserted messages", "them")

    def _processor(self) -> Any:
        """The processor that encodes images (an error for a text model)."""
        if self.processor is None:
            raise RLForgeError("Images need a vision-language model's processor (model.path is a text model).")
        return self.processor

    def escape(self, text: str) -> str:
        """``text`` with each spelling of the model's image or video pad token broken by a space after its first
        character (``< |image_pad|>``): inserted text (a tool's reply, a web page) must not take an image's place."""
        for token in self.reserved:
            text = text.replace(token, f"{token[0]} {token[1:]}")
        return text

    def _inserted_text(self, messages: list[dict[str, Any]], stop_text: str) -> str:
        full = self.render([*_BASE, *messages])
        if not full.startswith(self._base):
            raise RLForgeError(
                f"The chat template renders a conversation differently once messages with roles "
                f"{[m.get('role') for m in messages]} follow it, so inserted turns cannot be appended token by token. "
                "Override Conversation.add_messages for this template (docs/agentic.md).")
        added = full[len(self._base):]
        if not added:
            raise RLForgeError(f"The chat template renders messages with roles {[m.get('role') for m in messages]} "
                               "as nothing, so the model would never see them.")
        end = self.end_of_message
        closing = end[len(stop_text):] if stop_text and end.startswith(stop_text) else end
        return closing + added

    def truncate(self, text: str, max_tokens: int, side: str = "right") -> tuple[str, bool]:
        """``text`` cut to at most ``max_tokens`` tokens, a truncation marker among them; (text, whether cut).
        ``side`` is the side cut away, as verl's ``tool_response_truncate_side``: ``right`` keeps the head (then
        ``...(truncated)``), ``left`` the tail (after ``(truncated)...``), ``middle`` both halves around
        ``...(truncated)...``. Only ``CHARS_PER_TOKEN * max_tokens`` characters of each kept end are tokenized, so a
        reply of any size costs the same."""
        span = CHARS_PER_TOKEN * max_tokens
        if len(text) <= span and len(self.encode(text)) <= max_tokens:
            return text, False
        marker = TRUNCATION_MARKERS[side]
        head, tail = self.encode(text[:span]), self.encode(text[-span:])
        keep = max(0, max_tokens - len(self.encode(marker)))
        while True:  # the kept ends re-encoded may take more tokens (a merge across the cut): keep fewer
            cut = self._cut(head, tail, keep, side, marker)
            if keep == 0 or len(self.encode(cut)) <= max_tokens:
                return cut, True
            keep -= 1

    def _cut(self, head: list[int], tail: list[int], keep: int, side: str, marker: str) -> str:
        """``keep`` tokens of the head and/or the tail around ``marker``; a character whose bytes the cut split
        (a byte-level token in the middle of a multibyte character) is left out rather than shown as U+FFFD."""
        first = (keep + 1) // 2 if side == "middle" else keep if side == "right" else 0
        last = keep - first
        start = self.decode(head[:first]).rstrip("\ufffd")
        end = self.decode(tail[len(tail) - last:] if last else []).lstrip("\ufffd")
        return {"right": start + marker, "left": marker + end, "middle": start + marker + end}[side]


def valid_text(text: str) -> str:
    """``text`` with each lone surrogate (from a JSON escape such as ``"\\ud800"``, or bytes decoded with
    ``surrogateescape``) replaced by ``?``: tokenizers refuse such strings, and a model may write one."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text
