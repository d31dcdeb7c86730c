"""Preference data: rows -> tokenized pairs or labelled completions, and their batches (``rlforge.data`` holds the
prompts they share the tokenization of).

Preference rows follow TRL's formats. Paired: ``prompt``, ``chosen``, ``rejected`` (optional ``margin``, a
number). Unpaired (KTO): ``prompt``, ``completion``, ``label`` (true = desirable). The prompt is a string or
a list of chat messages; each completion is a string (one assistant message) or a list of messages. A paired
row without ``prompt`` whose ``chosen`` and ``rejected`` are conversations takes their common leading messages
as the prompt (TRL's implicit prompt). The completion's tokens are what the chat template adds after the
prompt rendered with the generation prompt: the tokens the model would generate, end-of-turn included.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.data import (
    Prompt, _messages, _prompt, _tokenize_prompt, _vision_rows, apply_template, collate, columns, row_origin,
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


def _split_implicit_prompt(row: dict[str, Any], where: str) -> dict[str, Any]:
    """TRL's implicit prompt: the leading messages ``chosen`` and ``rejected`` share become the prompt."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise DataError(f"{where}: missing column 'prompt' (only conversations in 'chosen' and 'rejected' may "
                        f"carry the prompt as their common first messages). Columns present: {columns(row)}.")
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    if not shared:
        raise DataError(f"{where}: no 'prompt' column, and 'chosen' and 'rejected' share no first message to "
                        f"take as the prompt.")
    return {**row, "prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def _completion_ids(tokenizer: Any, prompt: Prompt, value: Any, where: str, column: str, max_len: int) -> list[int]:
    """The tokens the chat template adds after the prompt (rendered with the generation prompt), cut to ``max_len``."""
    turns = _messages(value, where, column)
    full = apply_template(tokenizer, prompt.messages + turns, where)
    if full[: len(prompt.ids)] != prompt.ids:
        raise DataError(f"{where}: the chat template does not render '{column}' as a continuation of the prompt "
                        f"(the prompt with the generation prompt is not a prefix of prompt + {column}).")
    ids = full[len(prompt.ids):][:max_len]
    if not ids:
        raise DataError(f"{where}: '{column}' renders as no tokens after the prompt (an empty completion needs a chat "
                        f"template that closes the turn).")
    return ids


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
    for i, row in enumerate(rows):
        where = row_origin(row, i, name)
        if "prompt" not in row:
            row = _split_implicit_prompt(row, where)
        text = _tokenize_prompt(row, i, tokenizer, max_prompt_len, filter_overlong, where, need_reward=False)
        prompt = _vision_prompt(row, i, text, processor, image_key, max_prompt_len, filter_overlong, where)
        if prompt is None:
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
    _report_identical(identical, len(examples) + len(identical), name, max_completion_len)
    if rows and not examples:
        raise DataError(f"{name}: all {len(rows)} prompts are longer than data.max_prompt_length={max_prompt_len} "
                        f"tokens.")
    return examples


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
