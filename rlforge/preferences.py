"""Preference data: rows -> tokenized pairs or labelled completions, and their batches (``rlforge.data`` holds the
prompts they share the tokenization of).

Preference rows follow TRL's formats. Paired: ``prompt``, ``chosen``, ``rejected`` (optional ``margin``, a
number). Unpaired (KTO): ``prompt``, ``completion``, ``label`` (true = desirable). The prompt is a string or
a list of chat messages; each completion is a string (one assistant message) or a list of messages. A paired
row without ``prompt`` whose ``chosen`` and ``rejected`` are conversations takes their common leading messages
as the prompt (TRL's implicit prompt); so does one whose ``prompt`` is a string beside conversations that open with
the prompt's turn (UltraFeedback binarized; TRL's ``maybe_extract_prompt`` ignores such a prompt). The completion's
tokens are what the chat template adds after the prompt rendered with the generation prompt: the tokens the model
would generate, end-of-turn included (where only the text continues the prompt's, the completion's text is
tokenized on its own: ``_completion_ids``).
"""

from __future__ import annotations

import logging
import math
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.data import (
    Prompt, _ids, _messages, _prompt, _tokenize_prompt, _vision_rows, apply_template, collate, columns, report_overlong,
    row_origin,
)
from rlforge.errors import DataError
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

log = logging.getLogger("rlforge.data")


@dataclass
class PreferenceExample:
    """A prompt and its labelled completions: chosen then rejected (a pair), or one completion (unpaired)."""

    prompt: Prompt
    completions: list[list[int]]  # token ids of each completion (end-of-turn included)
    labels: list[float]  # 1.0 = chosen / desirable, 0.0 = rejected / undesirable
    margin: float = 0.0  # a pair's ``margin`` column (reward-model training)


def is_preference_row(row: dict[str, Any]) -> bool:
    """Whether a row is in a preference format (paired ``chosen``/``rejected`` or unpaired ``completion``)."""
    return "chosen" in row or "rejected" in row or "completion" in row


def _prompt_in_conversations(row: dict[str, Any]) -> bool:
    """Whether ``chosen`` and ``rejected`` carry the prompt (TRL's ``maybe_extract_prompt``): a row without ``prompt``,
    or one whose ``prompt`` is a string beside conversations that open with a prompt turn (a message that is not the
    assistant's), as UltraFeedback binarized's rows are: the string column is then ignored."""
    if "prompt" not in row:
        return True
    chosen, rejected = row.get("chosen"), row.get("rejected")
    return (isinstance(row["prompt"], str) and isinstance(chosen, list) and isinstance(rejected, list)
            and bool(chosen) and isinstance(chosen[0], dict) and chosen[0].get("role") != "assistant")


def _split_implicit_prompt(row: dict[str, Any], where: str) -> dict[str, Any]:
    """TRL's implicit prompt: the leading messages ``chosen`` and ``rejected`` share become the prompt, leaving each
    at least its last message as its completion."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise DataError(f"{where}: missing column 'prompt' (only conversations in 'chosen' and 'rejected' may "
                        f"carry the prompt as their common first messages, or Anthropic HH transcripts in both: "
                        f"'\\n\\nHuman: ...\\n\\nAssistant: ...'). Columns present: {columns(row)}.")
    common = 0
    while common < min(len(chosen), len(rejected)) and chosen[common] == rejected[common]:
        common += 1
    shared = min(common, len(chosen) - 1, len(rejected) - 1)
    if shared > 0:
        return {**row, "prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}
    why = ("no 'prompt' column" if "prompt" not in row else
           "'prompt' is a string beside conversations in 'chosen' and 'rejected', which carry the prompt")
    if not common:
        raise DataError(f"{where}: {why}, and 'chosen' and 'rejected' share no first message to take as the prompt.")
    if len(chosen) == len(rejected):  # both are that one message
        raise DataError(f"{where}: {why}, and 'chosen' and 'rejected' are the same single message: no completion "
                        f"follows it in either.")
    short, other = ("chosen", "rejected") if len(chosen) == 1 else ("rejected", "chosen")
    raise DataError(f"{where}: {why}, and '{short}' has no completion after the prompt it shares with '{other}': its "
                    f"only message (role {row[short][0].get('role')!r}) is the first message of '{other}' too, which "
                    f"leaves '{short}' empty once that message is the prompt. End '{short}' with its own assistant "
                    f"message, or give the row a 'prompt' column.")


# a turn of an Anthropic HH transcript ("\n\nHuman: ...\n\nAssistant: ..."): its speaker and the text up to the next
HH_TURN = re.compile(r"\n\n(Human|Assistant): ?")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def hh_messages(text: Any) -> list[dict[str, str]] | None:
    """An Anthropic HH transcript as chat messages (``Human`` -> user, ``Assistant`` -> assistant), or None where
    ``text`` is not one: a string that opens with a ``\n\nHuman:`` turn and holds an ``Assistant`` turn."""
    if not isinstance(text, str):
        return None
    parts = HH_TURN.split(text)
    if parts[0] or len(parts) < 5 or parts[1] != "Human" or "Assistant" not in parts[1::2]:
        return None
    return [{"role": HH_ROLES[who], "content": said} for who, said in zip(parts[1::2], parts[2::2])]


def _hh_conversations(row: dict[str, Any]) -> dict[str, Any]:
    """A row without ``prompt`` whose ``chosen`` and ``rejected`` are both Anthropic HH transcripts (the
    ``Anthropic/hh-rlhf`` dataset as published) with them as conversations; other rows as they are."""
    if "prompt" in row:
        return row
    chosen, rejected = hh_messages(row.get("chosen")), hh_messages(row.get("rejected"))
    return row if chosen is None or rejected is None else {**row, "chosen": chosen, "rejected": rejected}


def _take_prompt(row: dict[str, Any], where: str, ignored: list[str]) -> dict[str, Any]:
    """The row with its prompt in ``prompt``: taken from the conversations where they carry it
    (:func:`_prompt_in_conversations`; Anthropic HH transcripts read as conversations first). A string ``prompt`` so
    ignored that is not the last user message of the conversations' prompt adds the row to ``ignored``."""
    row = _hh_conversations(row)
    if not _prompt_in_conversations(row):
        return row
    split = _split_implicit_prompt(row, where)
    if "prompt" in row:
        users = [m.get("content") for m in split["prompt"] if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1], str) or users[-1].strip() != row["prompt"].strip():
            ignored.append(where)
    return split


def _completion_ids(tokenizer: Any, prompt: Prompt, value: Any, where: str, column: str, max_len: int) -> list[int]:
    """The tokens the chat template adds after the prompt (rendered with the generation prompt), cut to ``max_len``.
    Where the text of prompt + completion continues the prompt's text but its tokens do not continue the prompt's
    (a generation prompt ending in a space, which byte-level BPE merges into the answer's first token: Anthropic
    HH's ``Assistant: ``), the completion's text is tokenized on its own (no special tokens) and follows the prompt's
    ids as generation sees them, as TRL does."""
    turns = _messages(value, where, column)
    full = apply_template(tokenizer, prompt.messages + turns, where)
    if full[: len(prompt.ids)] == prompt.ids:
        ids = full[len(prompt.ids):]
    else:
        ids = _ids(tokenizer(_completion_text(tokenizer, prompt, turns, where, column), add_special_tokens=False))
    if not ids:
        raise DataError(f"{where}: '{column}' renders as no tokens after the prompt (an empty completion needs a chat "
                        f"template that closes the turn).")
    return ids[:max_len]


def _completion_text(tokenizer: Any, prompt: Prompt, turns: list[dict[str, Any]], where: str, column: str) -> str:
    """The text the chat template adds after the prompt rendered with the generation prompt; a template whose text of
    prompt + completion does not start with that prompt is a DataError showing where the two part."""
    head = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(prompt.messages + turns, tokenize=False)
    if text.startswith(head):
        return text[len(head):]
    at = next((i for i, (a, b) in enumerate(zip(head, text)) if a != b), min(len(head), len(text)))
    raise DataError(f"{where}: the chat template does not render '{column}' as a continuation of the prompt: the "
                    f"prompt with the generation prompt is not a prefix of prompt + {column}, as text (they part at "
                    f"character {at + 1}: the prompt has {head[at:at + 40]!r}, prompt + {column} has "
                    f"{text[at:at + 40]!r}).")


def _pair_columns(row: dict[str, Any], where: str, paired: bool) -> list[tuple[str, Any, float]]:
    """(column, completion, label) of a row; paired algorithms need ``chosen`` and ``rejected``."""
    if "completion" in row and "chosen" not in row:
        if paired:
            raise DataError(f"{where}: a 'completion' with a 'label' is unpaired data (KTO); this algorithm trains "
                            f"on pairs: columns 'prompt', 'chosen', 'rejected'.")
        if not isinstance(row.get("label"), bool):
            raise DataError(f"{where}: unpaired rows need a boolean 'label' (true = desirable), got "
                            f"{row.get('label')!r}.")
        return [("completion", row["completion"], float(row["label"]))]
    missing = [c for c in ("chosen", "rejected") if c not in row]
    if missing:
        raise DataError(f"{where}: missing column '{missing[0]}'. Preference rows have 'prompt', 'chosen' and "
                        f"'rejected' (or 'prompt', 'completion', 'label' for KTO). Columns present: {columns(row)}.")
    return [("chosen", row["chosen"], 1.0), ("rejected", row["rejected"], 0.0)]


def _margin(row: dict[str, Any], where: str) -> float:
    value = row.get("margin", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataError(f"{where}: 'margin' must be a finite number, got {value!r}.")
    return float(value)


def tokenize_preferences(
    rows: list[dict[str, Any]], tokenizer: Any, max_prompt_len: int, max_completion_len: int,
    filter_overlong: bool, name: str, paired: bool = True, processor: Any = None, image_key: str = "images",
) -> list[PreferenceExample]:
    """Validate preference rows (see the module doc) and tokenize them. ``paired=False`` (KTO) takes unpaired rows
    and splits each pair into a desirable and an undesirable example. Completions longer than
    ``max_completion_len`` tokens are cut (as TRL truncates); overlong prompts are dropped or an error, as for
    ``tokenize_rows``. A pair whose chosen and rejected completions are the same tokens (the same text, both empty,
    or the same within ``max_completion_len``) carries no preference: it is dropped with a warning, and a dataset
    of nothing but such pairs is an error. A row with images (``image_key``) has its prompt encoded by
    ``processor`` (as in ``tokenize_rows``; the completions are text)."""
    examples: list[PreferenceExample] = []
    identical: list[str] = []
    overlong: list[tuple[int, dict[str, Any], str]] = []  # (position, row, where) of the rows dropped for length
    ignored: list[str] = []  # rows whose string 'prompt' is not the user message their conversations open with
    for i, row in enumerate(rows):
        where = row_origin(row, i, name)
        row = _take_prompt(row, where, ignored)
        text = _tokenize_prompt(row, i, tokenizer, max_prompt_len, filter_overlong, where, need_reward=False)
        prompt = _vision_prompt(row, i, text, processor, image_key, max_prompt_len, filter_overlong, where)
        if prompt is None:
            overlong.append((i, row, where))
            continue
        parts = _pair_columns(row, where, paired)
        if processor is not None:  # a vision model's completions are text: an image there would train as '<image>'
            _refuse_completion_images(parts, where)
        # a completion is the tokens its turn adds after the prompt: rendered as text (the images are the prompt's)
        ids = [_completion_ids(tokenizer, text, value, where, col, max_completion_len) for col, value, _ in parts]
        labels = [label for _, _, label in parts]
        if paired and ids[0] == ids[1]:
            identical.append(where)
        elif paired:
            examples.append(PreferenceExample(prompt, ids, labels, _margin(row, where)))
        else:
            examples += [PreferenceExample(prompt, [c], [label]) for c, label in zip(ids, labels)]
    if ignored:
        log.warning("%s: %d of %d rows have a string 'prompt' besides 'chosen' and 'rejected' conversations that "
                    "carry the prompt, and it is not the last user message of that prompt, first %s: the "
                    "conversations' prompt is the one trained on, 'prompt' is ignored (TRL's maybe_extract_prompt).",
                    name, len(ignored), len(rows), ignored[0])
    report_overlong(name, len(rows), len(rows) - len(overlong),
                    lambda: _prompt_length(overlong[0], tokenizer, processor, image_key), max_prompt_len)
    _report_identical(identical, len(examples) + len(identical), name, max_completion_len)
    return examples


def _prompt_length(dropped: tuple[int, dict[str, Any], str], tokenizer: Any, processor: Any,
                   image_key: str) -> tuple[str, int]:
    """Where a row dropped for its prompt's length is, and that length in tokens (its prompt encoded again, without
    a limit)."""
    index, row, where = dropped
    text = _tokenize_prompt(row, index, tokenizer, sys.maxsize, False, where, need_reward=False)
    prompt = _vision_prompt(row, index, text, processor, image_key, sys.maxsize, False, where)
    assert prompt is not None  # no limit: nothing is dropped
    return where, len(prompt.ids)


def _refuse_completion_images(parts: list[tuple[str, Any, float]], where: str) -> None:
    from rlforge import multimodal as mm

    for column, value, _ in parts:
        if mm.placeholder_count(_messages(value, where, column)):
            raise DataError(f"{where}: '{column}' has an image ({mm.IMAGE_PLACEHOLDER} or an image part): completions "
                            f"are text; the images go with the prompt (docs/multimodal.md).")


def _vision_prompt(row: dict[str, Any], index: int, text: Prompt | None, processor: Any, image_key: str,
                   max_len: int, filter_overlong: bool, where: str) -> Prompt | None:
    """A preference row's prompt: ``text`` (its chat-template rendering), or for a row with images its encoding by
    the processor, with the vision inputs; None when overlong and filtered out."""
    if text is None:
        return None
    vision = _vision_rows([row], [text.messages], [where], processor, image_key)
    if not vision:
        return text
    ids, inputs = vision[0]
    return _prompt(row, index, text.messages, ids, max_len, filter_overlong, where, inputs)


def _report_identical(identical: list[str], pairs: int, name: str, max_completion_len: int) -> None:
    """Warn about the dropped pairs whose completions are the same tokens; refuse a dataset of only such pairs."""
    if not identical:
        return
    same = (f"'chosen' and 'rejected' are the same tokens (the same text, both empty, or the same within "
            f"algorithm.max_completion_length={max_completion_len} tokens)")
    if len(identical) == pairs:
        raise DataError(f"{name}: in every one of its {pairs} pairs {same}, first {identical[0]}: there is no "
                        f"preference to learn from.")
    log.warning("%s: dropped %d of %d pairs whose %s, first %s: they carry no preference.", name, len(identical),
                pairs, same, identical[0])


def collate_preferences(examples: list[PreferenceExample], pad_id: int, uids: list[Any]) -> B.Batch:
    """One row per completion, an example's rows adjacent and sharing its uid (a pair: chosen, then rejected), in
    the rollout layout: left-padded ``prompts``, right-padded ``responses``, ``input_ids`` = prompt ++ response;
    plus ``label`` (1.0 chosen/desirable) and ``margin``."""
    rows = [(ex, ids, label, uid) for ex, uid in zip(examples, uids) for ids, label in zip(ex.completions, ex.labels)]
    batch = collate([ex.prompt for ex, _, _, _ in rows], pad_id, [uid for _, _, _, uid in rows])
    width = max(len(ids) for _, ids, _, _ in rows)
    responses = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (_, ids, _, _) in enumerate(rows):
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    batch[B.RESPONSES], batch[B.RESPONSE_MASK] = responses, mask
    batch[B.INPUT_IDS] = torch.cat([batch[B.PROMPTS], responses], dim=1)
    batch[B.ATTENTION_MASK] = torch.cat([batch[B.PROMPT_MASK], mask], dim=1)
    batch[B.LABEL] = torch.tensor([label for _, _, label, _ in rows])
    batch[B.MARGIN] = torch.tensor([ex.margin for ex, _, _, _ in rows])
    return batch
