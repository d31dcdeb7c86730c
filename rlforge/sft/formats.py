"""SFT row formats -> token ids and a loss mask (1 on the tokens the model is trained to produce).

The formats, chosen per row by ``sft.format`` (``auto``: by the columns the row has, in this order: the
``sft.messages_key`` column, the ``sft.completion_key`` column, the ``sft.text_key`` column without a response,
else a prompt/response pair):

- ``prompt_response`` (verl's ``SFTDataset``): the prompt (chat messages, or a string = one user message) rendered
  with the chat template and its generation prompt, then the response tokens and EOS. Loss on the response and EOS.
- ``messages`` (verl's multi-turn and TRL's conversational format): a conversation (system/user/assistant/tool
  messages; assistant messages may carry ``tool_calls``). Each assistant turn is rendered against its own history:
  the conversation before it, rendered with the generation prompt, then the turn as the template renders it when
  the conversation ends there. Loss on the turn's content (tool calls included) and its end-of-turn token, never
  on the template's glue. Turns whose histories render alike share one sequence (one per row for a
  prefix-preserving template); a template that rewrites earlier turns (Qwen3 drops the reasoning of past turns)
  starts a new sequence where the history changes. Works with any template, without ``{% generation %}`` markers.
- ``prompt_completion`` (TRL's prompt-completion formats, with TRL's masks): a string prompt and completion are
  plain text, no template: the tokens of ``prompt + completion`` and EOS, loss on what follows the prompt's tokens;
  a conversational prompt and completion (message lists) are rendered with the chat template, loss on everything
  the completion adds after the prompt's rendering with its generation prompt.
- ``text`` (TRL's language modelling): the tokens of the text and EOS, loss on every token.
"""

from __future__ import annotations

import json

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlforge.errors import DataError

ROLES = ("system", "user", "assistant", "tool")
TEMPLATE_CODE_ERRORS = (ArithmeticError, TypeError, ValueError, KeyError, IndexError, AttributeError)
MISSING = object()


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is a training target

    @property
    def trained(self) -> int:
        """Tokens in the loss; the first position never is one (no token precedes it)."""
        return sum(self.mask[1:])


@dataclass(frozen=True)
class Keys:
    """Where a row keeps its fields (``sft.*_key``); dots reach into nested dicts (``extra_info.question``). With them,
    how its messages are rendered: the chat template's keyword arguments (``data.apply_chat_template_kwargs``)."""

    prompt: str = "prompt"
    response: str = "response"
    messages: str = "messages"
    tools: str = "tools"
    completion: str = "completion"
    text: str = "text"
    template: dict[str, Any] = field(default_factory=dict)
    thinking: str = ""  # the column of a row's enable_thinking (sft.enable_thinking_key; "" = not read)
    thinking_default: bool | None = None  # for rows without that column (sft.enable_thinking_default)

    def row_template(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """The chat template's keyword arguments for ``row``: its enable_thinking column (a null value sets nothing)
        or, where it lacks the column, the default, over ``template`` (verl's multi-turn SFT dataset does the same)."""
        value = dig(row, self.thinking) if self.thinking else MISSING
        value = self.thinking_default if value is MISSING else value
        if value is None:
            return self.template
        if isinstance(value, str) or str(value) not in ("True", "False", "0", "1"):  # numpy's bool_ too
            raise DataError(f"{where}: '{self.thinking}' (sft.enable_thinking_key) must be true, false or null, got "
                            f"{value!r:.40}.")
        return {**self.template, "enable_thinking": bool(value)}


def dig(row: dict[str, Any], key: str) -> Any:
    """``row['a']['b']`` for ``key='a.b'``; ``MISSING`` when any level is absent."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def columns(row: dict[str, Any]) -> list[str]:
    """The row's columns, for error messages (not the file-and-row tag rlforge adds)."""
    return sorted(k for k in row if k != "_origin")


def need(row: dict[str, Any], key: str, config_key: str, where: str) -> Any:
    value = dig(row, key)
    if value is MISSING:
        raise DataError(f"{where}: missing '{key}' ({config_key}). Columns present: {columns(row)}.")
    return value


def apply(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any,
          template: dict[str, Any]) -> list[int]:
    enc = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation_prompt,
                                        tokenize=True, **template)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, where: str,
           template: dict[str, Any], tools: Any = None) -> list[int]:
    """Token ids of ``messages`` through the chat template (``template``: its keyword arguments,
    ``Keys.row_template``); a template's own error names the row and its cause."""
    from jinja2 import TemplateError

    try:
        return apply(tokenizer, messages, generation_prompt, tools, template)
    except TemplateError as exc:
        raise DataError(f"{where}: the chat template rejects this row: {exc} "
                        f"({rejection_cause(tokenizer, messages, generation_prompt, tools, template)})") from None
    except TEMPLATE_CODE_ERRORS as exc:  # the template's own code failed
        raise DataError(f"{where}: the chat template fails on this row: {type(exc).__name__}: {exc}") from None


def rejection_cause(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any,
                    template: dict[str, Any]) -> str:
    """Why a template refused ``messages``: the system message when the rest renders, else the roles it got."""
    from jinja2 import TemplateError

    roles = [m["role"] for m in messages]
    if roles[0] == "system" and len(roles) > 1:
        try:
            apply(tokenizer, messages[1:], generation_prompt, tools, template)
            return ("the template has no system role: it renders the conversation without message 0 (system); "
                    "fold the system message into the first user message or drop it")
        except (TemplateError, *TEMPLATE_CODE_ERRORS):
            pass
    return f"the roles it was given: {', '.join(roles)}"


def check_messages(messages: Any, key: str, where: str) -> list[dict[str, Any]]:
    """Chat messages with known roles; string content (or none, for an assistant message with tool calls)."""
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: '{key}' must be a non-empty list of chat messages {{role, content}}.")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise DataError(f"{where}: '{key}' message {i} needs a role in {list(ROLES)}, got {m!r:.80}.")
        content_ok = isinstance(m.get("content"), str) or (m.get("content") is None and m.get("tool_calls"))
        if not content_ok:
            raise DataError(f"{where}: '{key}' message {i} ({m['role']}) needs a string 'content'.")
    return messages


def prompt_response(row: dict[str, Any], tokenizer: Any, keys: Keys, where: str) -> Example:
    messages = check_messages(need(row, keys.prompt, "sft.prompt_key", where), keys.prompt, where)
    response = need(row, keys.response, "sft.response_key", where)
    if not isinstance(response, str):
        raise DataError(f"{where}: '{keys.response}' (sft.response_key) must be a string, "
                        f"got {type(response).__name__}.")
    prompt = render(tokenizer, messages, True, where, keys.row_template(row, where))
    answer = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return Example(prompt + answer, [0] * len(prompt) + [1] * len(answer))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def turn_end(tokenizer: Any, span: list[int]) -> int:
    """Length of an assistant turn's span without the template's glue after it: the span ends at the first special
    token of its trailing run of special tokens and whitespace (``<|im_end|>\\n`` -> ``<|im_end|>``; Phi-3's
    ``<|end|>\\n<|endoftext|>`` at the end of a conversation -> ``<|end|>``)."""
    added = tokenizer.added_tokens_decoder
    end = len(span)
    for i in range(len(span) - 1, -1, -1):
        special = span[i] in added and added[span[i]].special
        if not special and tokenizer.decode(span[i:i + 1]).strip():
            break
        if special:
            end = i + 1
    return end


def with_eos(ids: list[int], tokenizer: Any) -> list[int]:
    """``ids`` ending in EOS (TRL appends it where the text does not already end with it)."""
    return ids if ids and ids[-1] == tokenizer.eos_token_id else [*ids, tokenizer.eos_token_id]


def text(row: dict[str, Any], tokenizer: Any, keys: Keys, where: str) -> Example:
    value = need(row, keys.text, "sft.text_key", where)
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: '{keys.text}' (sft.text_key) must be a non-empty string, got {value!r:.60}.")
    ids = with_eos(list(tokenizer(value)["input_ids"]), tokenizer)
    return Example(ids, [1] * len(ids))


def prompt_completion(row: dict[str, Any], tokenizer: Any, keys: Keys, where: str) -> Example:
    """TRL's prompt-completion rows: both strings (plain text) or both message lists (the chat template)."""
    prompt = need(row, keys.prompt, "sft.prompt_key", where)
    completion = need(row, keys.completion, "sft.completion_key", where)
    if isinstance(prompt, str) and isinstance(completion, str):
        head = list(tokenizer(prompt)["input_ids"])
        ids = with_eos(list(tokenizer(prompt + completion)["input_ids"]), tokenizer)
        how = "the tokenizer joins the prompt's last characters with the completion's first into one token"
    elif isinstance(prompt, list) and isinstance(completion, list):
        tools = row_tools(row, keys, where)
        messages = check_messages(prompt, keys.prompt, where)
        template = keys.row_template(row, where)
        head = render(tokenizer, messages, True, where, template, tools)
        ids = render(tokenizer, messages + check_messages(completion, keys.completion, where), False, where,
                     template, tools)
        how = "the chat template renders the prompt differently once the completion follows"
    else:
        raise DataError(f"{where}: '{keys.prompt}' (sft.prompt_key) and '{keys.completion}' (sft.completion_key) must "
                        f"both be strings or both be lists of chat messages, got {type(prompt).__name__} and "
                        f"{type(completion).__name__}.")
    if ids[: len(head)] != head:
        raise DataError(f"{where}: the prompt's tokens are not the start of the prompt and completion's tokens ({how}), "
                        f"so the completion cannot be masked.")
    return Example(ids, [0] * len(head) + [1] * (len(ids) - len(head)))


def row_tools(row: dict[str, Any], keys: Keys, where: str) -> list[dict[str, Any]] | None:
    """The row's tool schemas (``sft.tools_key``): a list of JSON objects, or that list as a JSON string; None."""
    tools = dig(row, keys.tools)
    tools = None if tools is MISSING else tools
    if isinstance(tools, str):  # datasets often keep the schemas as a JSON string
        try:
            tools = json.loads(tools)
        except ValueError:
            pass
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{where}: '{keys.tools}' (sft.tools_key) must be a list of tool schemas (JSON objects such "
                        f"as {{\"type\": \"function\", \"function\": {{...}}}}), got {type(tools).__name__} "
                        f"({tools!r:.60}).")
    return tools


def turn_sequences(row: dict[str, Any], tokenizer: Any, keys: Keys, where: str) -> list[Example]:
    """The row's training sequences: each assistant turn rendered against its own history, turns that render the
    same history sharing a sequence (see the module docstring)."""
    raw = need(row, keys.messages, "sft.messages_key", where)
    if isinstance(raw, str):
        raise DataError(f"{where}: '{keys.messages}' (sft.messages_key) must be a list of chat messages, not a string.")
    messages = check_messages(raw, keys.messages, where)
    tools, template = row_tools(row, keys, where), keys.row_template(row, where)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise DataError(f"{where}: the conversation has no assistant message to train on.")
    if all(m["role"] == "system" for m in messages[:turns[0]]):
        raise DataError(f"{where}: the conversation starts with an assistant message; put a user message first.")
    sequences: list[Example] = []
    trained_to = 0  # the end of the last trained token of sequences[-1]
    for i in turns:
        opened = render(tokenizer, messages[:i], True, where, template, tools)
        closed = render(tokenizer, messages[: i + 1], False, where, template, tools)
        if closed[: len(opened)] != opened:
            raise DataError(history_changed(tokenizer, opened, closed, i, where))
        start, end = len(opened), len(opened) + turn_end(tokenizer, closed[len(opened):])
        if sequences and start >= trained_to and closed[:trained_to] == sequences[-1].ids[:trained_to]:
            sequences[-1] = Example(closed, sequences[-1].mask[:trained_to] + [0] * (len(closed) - trained_to))
        else:  # the template renders the earlier turns differently now: a new sequence
            sequences.append(Example(closed, [0] * len(closed)))
        sequences[-1].mask[start:end] = [1] * (end - start)
        trained_to = end
    return sequences


def conversation(row: dict[str, Any], tokenizer: Any, keys: Keys, where: str) -> Example:
    """The row as one sequence (a prefix-preserving template); an error naming the row where it takes several."""
    sequences = turn_sequences(row, tokenizer, keys, where)
    if len(sequences) > 1:
        raise DataError(f"{where}: the chat template renders earlier turns differently once later ones follow, so "
                        f"this conversation trains as {len(sequences)} sequences, not one.")
    return sequences[0]


def history_changed(tokenizer: Any, opened: list[int], closed: list[int], i: int, where: str) -> str:
    at = common_prefix(opened, closed)
    alone, joined = tokenizer.decode(opened[at:at + 40]), tokenizer.decode(closed[at:at + 40])
    return (f"{where}: the chat template renders the conversation before message {i} differently once message {i} "
            f"(assistant) follows: {alone!r} with the generation prompt, {joined!r} with the message, so the turn "
            f"cannot be appended to its own history. The template moves or drops an earlier message once the "
            f"conversation goes on (such as a system message it puts into the last user message only), or its "
            f"generation prompt is not how it opens an assistant message.")


def one(fmt: Callable[[dict[str, Any], Any, Keys, str], Example]) -> Callable[..., list[Example]]:
    return lambda row, tokenizer, keys, where: [fmt(row, tokenizer, keys, where)]


FORMATS: dict[str, Callable[[dict[str, Any], Any, Keys, str], list[Example]]] = {  # a row -> its sequences
    "prompt_response": one(prompt_response),
    "prompt_completion": one(prompt_completion),
    "messages": turn_sequences,
    "text": one(text),
}


def row_format(row: dict[str, Any], fmt: str, keys: Keys) -> str:
    if fmt != "auto":
        return fmt
    if dig(row, keys.messages) is not MISSING:
        return "messages"
    if dig(row, keys.completion) is not MISSING:
        return "prompt_completion"
    if dig(row, keys.text) is not MISSING and dig(row, keys.response) is MISSING:
        return "text"
    return "prompt_response"


def truncate(example: Example, max_length: int, how: str, where: str) -> Example | None:
    """Fit ``example`` into ``max_length`` tokens as ``sft.truncation`` says; None = drop it."""
    if len(example.ids) <= max_length:
        return example
    if how not in TRUNCATIONS:
        raise DataError(f"{where}: {len(example.ids)} tokens, over sft.max_length={max_length} "
                        f"(sft.truncation={how}; the other choices: {', '.join(TRUNCATIONS)}).")
    return TRUNCATIONS[how](example, max_length)


TRUNCATIONS: dict[str, Callable[[Example, int], Example | None]] = {  # besides "error"
    "left": lambda e, n: Example(e.ids[-n:], e.mask[-n:]),
    "right": lambda e, n: Example(e.ids[:n], e.mask[:n]),
    "drop": lambda e, n: None,
}
