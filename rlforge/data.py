"""Training data: verl-style rows -> tokenized prompts (chat template applied), and a resumable sampler.
Preference rows (pairs, labelled completions): ``rlforge.preferences``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

from rlforge import batch as B
from rlforge.errors import DataError
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

log = logging.getLogger("rlforge.data")


@dataclass
class Prompt:
    ids: list[int]
    messages: list[dict[str, str]]
    data_source: str
    ground_truth: Any
    extra_info: Any
    index: int  # position of the source row
    multi_modal: dict[str, Any] | None = None  # the row's vision inputs (rlforge.multimodal), None without images
    agent_name: str | None = None  # the row's agent_name column (verl's per-row agent loop), None without


# the files ``datasets`` writes into a folder: Dataset.save_to_disk (one split), DatasetDict.save_to_disk (splits)
SAVED_DATASET_FILE, SAVED_DATASET_DICT_FILE = "state.json", "dataset_dict.json"


def data_file_problem(path: str) -> str | None:
    """What keeps ``path`` from being read as a data file, in words, or None: missing, or a folder. A folder saved by
    ``Dataset.save_to_disk`` passes (the ``hf`` dataset reads it; ``files`` says so)."""
    file = Path(path)
    if (file / SAVED_DATASET_FILE).is_file():
        return None
    if (file / SAVED_DATASET_DICT_FILE).is_file():
        return (f"Data file {path} is a folder saved by DatasetDict.save_to_disk (several splits): read it with "
                f"data.name=hf data.hf.path={path} (data.hf.train_split, data.hf.val_split pick the splits; "
                f"docs/data.md)")
    if file.is_dir():
        return (f"Data file {path} is a directory, not a file: give the .jsonl or .parquet files themselves (a "
                f"folder of parquet shards: list each shard)")
    if not file.is_file():
        glob = any(c in str(path) for c in "*?[")
        return f"Data file not found: {path}{' (data files are named one by one: a glob is not expanded)' * glob}"
    return None


def columns(row: dict[str, Any]) -> list[str]:
    """A row's columns as an error message lists them: without the loaders' own (``_origin``)."""
    return sorted(k for k in row if not k.startswith("_"))


def row_origin(row: dict[str, Any], index: int, name: str) -> str:
    """Where a row comes from, for error messages: its ``_origin`` (file and line) or ``<name>, row <n>``."""
    return str(row.get("_origin") or f"{name}, row {index + 1}")


def first_rows(rows: Iterable[Any], column: str, name: str) -> dict[Any, str]:
    """Each value of ``column`` in ``rows`` -> where its first row is (:func:`row_origin`: ``train.jsonl, row 3``), in
    the order the values first appear; rows that are not dicts or lack the column are left out. What a check of one
    column names rows by, e.g. the reward manager's ``check_data_sources`` (``name``: the dataset, as in
    ``tokenize_rows``)."""
    found: dict[Any, str] = {}
    for i, row in enumerate(rows):
        if isinstance(row, dict) and column in row and row[column] not in found:
            found[row[column]] = row_origin(row, i, name)
    return found


def _message_problem(message: Any) -> str:
    """What is wrong with one chat message, or '' (a dict with a non-empty string role and string content)."""
    if not isinstance(message, dict):
        return f"is a {type(message).__name__}, not a {{role, content}} object"
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role.strip():
        return "has no role" if role is None else f"has a role that is not a non-empty string ({role!r})"
    if not isinstance(content, str):
        return ("has no content" if "content" not in message
                else f"has content of type {type(content).__name__}, not a string")
    try:
        content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate (JSON's "\ud800"): no tokenizer encodes it
        return f"has text that is not valid Unicode ({exc.reason} at character {exc.start}: {content[exc.start]!r})"
    return ""


def _tool_call_text(message: Any) -> Any:
    """An assistant message that only calls tools has ``content: null`` in OpenAI's format: its content is "" (what
    chat templates render for no text)."""
    if isinstance(message, dict) and message.get("content", "") is None and message.get("tool_calls"):
        return {**message, "content": ""}
    return message


_JSON_WARNED: set[str] = set()  # the columns warned about holding JSON chat messages as text (_messages)
# the roles chat templates are written for (OpenAI's, Llama 3's ipython); another is rendered as it is, or refused
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function", "ipython"})
ROLE_MEANT = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant", "ai": "assistant"}
_ROLES_WARNED: set[str] = set()  # the unusual roles warned about (_messages)


def _is_chat(text: str) -> bool:
    """Whether ``text`` is JSON for a list of chat messages (``[{"role": ..., "content": ...}]``)."""
    import json

    try:
        found = json.loads(text)
    except ValueError:
        return False
    return isinstance(found, list) and bool(found) and all(isinstance(m, dict) and "role" in m for m in found)


def _messages(value: Any, where: str, column: str) -> list[dict[str, Any]]:
    """A string or a list of chat messages, as a list of messages (a string is one ``role`` message). A prompt must
    have some text; a completion may be empty (the model answered nothing but the end of its turn)."""
    from rlforge import multimodal as mm

    role = "user" if column == "prompt" else "assistant"
    if isinstance(value, str) and value.lstrip().startswith("[{") and column not in _JSON_WARNED and _is_chat(value):
        _JSON_WARNED.add(column)
        log.warning("%s: '%s' is a string holding JSON chat messages, which rlforge (as a string) trains on as the "
                    "text of one %s message. If they are meant as messages, store a list (json.loads the column: a "
                    "CSV or a pandas pipeline may have turned it into text). Warned once.", where, column, role)
    messages = [{"role": role, "content": value}] if isinstance(value, str) else value
    if isinstance(messages, list):  # typed parts (TRL's vision rows) become verl's '<image>' placeholders
        messages = [{**m, "content": mm.flatten_parts(m["content"], f"{where}: {column} message {j}")}
                    if isinstance(m, dict) and isinstance(m.get("content"), list) else _tool_call_text(m)
                    for j, m in enumerate(messages, 1)]
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: '{column}' must be a string or a list of chat messages {{role, content}}, got "
                        f"{type(messages).__name__}{' (empty)' if isinstance(messages, list) else ''}.")
    for j, m in enumerate(messages, 1):
        problem = _message_problem(m)
        if problem:
            raise DataError(f"{where}: {column} message {j} {problem}: '{column}' must be a list of chat messages "
                            f"{{\"role\": str, \"content\": str}}.")
    for m in messages:
        if m["role"] not in CHAT_ROLES and m["role"] not in _ROLES_WARNED:
            _ROLES_WARNED.add(m["role"])
            meant = ROLE_MEANT.get(m["role"].casefold())
            log.warning("%s: a %s message has the role %r, which chat templates are not written for (they know %s): "
                        "the tokenizer's template renders it as it is or refuses it.%s Warned once per role.", where,
                        column, m["role"], ", ".join(sorted(CHAT_ROLES)),
                        f" ShareGPT's '{m['role']}' is '{meant}'." if meant else "")
    if column == "prompt" and not any(m["content"].strip() for m in messages):
        raise DataError(f"{where}: the prompt is empty.")
    return messages


def apply_template(tokenizer: Any, messages: list[dict[str, Any]], where: str, **kwargs: Any) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template; a template that refuses them (a role or an
    order of messages it does not accept) is a DataError naming the row."""
    try:
        return _ids(tokenizer.apply_chat_template(messages, tokenize=True, **kwargs))
    except Exception as exc:  # jinja's raise_exception, or a template that breaks on the input
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DataError(f"{where}: the tokenizer's chat template cannot render this row "
                        f"({type(exc).__name__}: {detail}).") from None


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


TEMPLATE_CHUNK = 1024  # rows rendered and tokenized in one call of the chat template (batched, the tokenizer in Rust)


def apply_templates(tokenizer: Any, conversations: list[list[dict[str, Any]]], wheres: list[str],
                    **kwargs: Any) -> list[list[int]]:
    """``apply_template`` of many conversations, in batched calls (about 2.5x faster than one call per row on the
    built-in task); a chunk that fails is rendered row by row, so the error names its row."""
    ids: list[list[int]] = []
    for start in range(0, len(conversations), TEMPLATE_CHUNK):
        chunk = conversations[start:start + TEMPLATE_CHUNK]
        try:
            encoded = tokenizer.apply_chat_template(chunk, tokenize=True, **kwargs)
            ids.extend(list(row) for row in (encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
        except Exception:
            ids.extend(apply_template(tokenizer, m, w, **kwargs) for m, w in zip(chunk, wheres[start:], strict=False))
    return ids


def render_ending(messages: list[dict[str, Any]], continue_final: bool) -> dict[str, bool]:
    """How a prompt's render ends: with the template's generation prompt (a new assistant turn), or, with
    ``continue_final`` (``data.continue_final_message``) and the assistant's message last (a prefill such as
    ``<think>``), with that message left open for the model to continue (TRL's ``continue_final_message``)."""
    if continue_final and messages and messages[-1].get("role") == "assistant":
        return {"add_generation_prompt": False, "continue_final_message": True}
    return {"add_generation_prompt": True}


def template_kwargs(config: Any) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` as plain Python values: the keyword arguments of every prompt render."""
    from omegaconf import OmegaConf

    value = config.data.apply_chat_template_kwargs
    plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return {str(k): v for k, v in plain.items()} if isinstance(plain, dict) else {}


def truncate(ids: list[int], max_len: int, mode: str) -> list[int]:
    """``ids`` cut to ``max_len`` tokens (``data.truncation``): left keeps the last tokens, right the first, middle the
    first ``max_len // 2`` and the last ``max_len - max_len // 2``. Shorter ids come back as they are."""
    if len(ids) <= max_len:
        return list(ids)
    if mode == "left":
        return list(ids[len(ids) - max_len:])
    if mode == "right":
        return list(ids[:max_len])
    if mode == "middle":
        head = max_len // 2
        return list(ids[:head]) + list(ids[len(ids) - (max_len - head):])
    raise ValueError(f"data.truncation='{mode}' does not cut prompts; cutting ones: left, right, middle")


@runtime_checkable
class PromptSource(Protocol):
    """Rows that tokenize their prompts themselves (in worker processes, into a cache): ``tokenize_rows`` calls
    ``tokenize_prompts(encode)``, where ``encode(rows, indices, wheres)`` is :func:`prompt_batch` with the run's
    settings: rows of one batch as dicts, their positions in the whole set and their names for errors."""

    def tokenize_prompts(self, encode: Callable[[list[dict[str, Any]], list[int], list[str]], list[Prompt]]
                         ) -> Sequence[Prompt]: ...


@overload
def tokenize_rows(
    rows: PromptSource, tokenizer: Any, max_len: int, filter_overlong: bool, name: str, need_reward: bool = True,
    processor: Any = None, image_key: str = "images", truncation: str = "error", template: dict[str, Any] | None = None,
    continue_final: bool = False,
) -> Sequence[Prompt]: ...


@overload
def tokenize_rows(
    rows: list[dict[str, Any]], tokenizer: Any, max_len: int, filter_overlong: bool, name: str,
    need_reward: bool = True, processor: Any = None, image_key: str = "images", truncation: str = "error",
    template: dict[str, Any] | None = None, continue_final: bool = False,
) -> list[Prompt]: ...


def tokenize_rows(
    rows: Any, tokenizer: Any, max_len: int, filter_overlong: bool, name: str,
    need_reward: bool = True, processor: Any = None, image_key: str = "images", truncation: str = "error",
    template: dict[str, Any] | None = None, continue_final: bool = False,
) -> Sequence[Prompt]:
    """Validate verl-format rows and apply the chat template. ``name`` labels errors (dataset or file).

    With ``need_reward=False`` (SFT) only ``prompt`` is required. A row with images in its ``image_key`` column goes
    through ``processor`` (a vision-language model's, ``rlforge.multimodal``): its prompt ids have the images'
    tokens and its ``Prompt.multi_modal`` the vision inputs. A prompt over ``max_len`` tokens is dropped
    (``filter_overlong``; a warning counts the dropped rows and names the first: :func:`report_overlong`), else cut by
    ``truncation`` (``data.truncation``; ``error``: a DataError naming the row).
    ``template``: keyword arguments of the chat template (``data.apply_chat_template_kwargs``); ``continue_final``
    (``data.continue_final_message``): a prompt whose last message is the assistant's is continued
    (:func:`render_ending`).

    Rows that tokenize themselves (a :class:`PromptSource`, such as the ``hf`` dataset's) are handed
    :func:`prompt_batch` with these settings and return their prompts, for a text model (no ``processor``).
    """
    encode = partial(prompt_batch, tokenizer=tokenizer, max_len=max_len, filter_overlong=filter_overlong,
                     need_reward=need_reward, image_key=image_key, truncation=truncation, template=template or {},
                     continue_final=continue_final)
    if isinstance(rows, PromptSource) and processor is None:
        prompts = rows.tokenize_prompts(encode)
    else:
        rows = list(rows)
        prompts = encode(rows, list(range(len(rows))), [row_origin(row, i, name) for i, row in enumerate(rows)],
                         processor=processor)
    report_overlong(name, len(rows), len(prompts), partial(_first_dropped, rows, prompts, encode, name, processor),
                    max_len)
    return prompts


def _first_dropped(rows: Any, prompts: Sequence[Prompt], encode: Callable[..., list[Prompt]], name: str,
                   processor: Any) -> tuple[str, int]:
    """Where the first row left out of ``prompts`` is, and its prompt's length in tokens. The prompts keep their rows'
    order (``Prompt.index``), so the first whose index is not its position follows the gap: found in log(n) reads of
    ``prompts`` (the ``hf`` dataset's are read from Arrow), then that one row is encoded again without a limit."""
    lo, hi = 0, len(prompts)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if prompts[mid].index == mid else (lo, mid)
    where = row_origin(rows[lo], lo, name)
    (prompt,) = encode([rows[lo]], [lo], [where], max_len=sys.maxsize, filter_overlong=False, processor=processor)
    return where, len(prompt.ids)


def report_overlong(name: str, total: int, kept: int, first: Callable[[], tuple[str, int]], max_len: int) -> None:
    """Warn that ``total - kept`` of a dataset's ``total`` rows were dropped for a prompt longer than ``max_len``
    tokens (``data.filter_overlong_prompts``), naming the first of them; ``first()`` gives where it is and its length
    (computed only when rows were dropped). A dataset with no row left is a DataError."""
    if kept >= total:
        return
    where, length = first()
    longer = (f"longer than data.max_prompt_length={max_len} tokens (after the chat template), first {where} "
              f"({length} tokens)")
    if not kept:
        raise DataError(f"{name}: all {total} prompts are {longer}: raise data.max_prompt_length.")
    log.warning("%s: dropped %d of %d rows whose prompt is %s: raise data.max_prompt_length to keep them.", name,
                total - kept, total, longer)


def prompt_batch(
    rows: list[dict[str, Any]], indices: list[int], wheres: list[str], *, tokenizer: Any, max_len: int,
    filter_overlong: bool, need_reward: bool = True, processor: Any = None, image_key: str = "images",
    truncation: str = "error", template: dict[str, Any] | None = None, continue_final: bool = False,
) -> list[Prompt]:
    """The prompts of ``rows`` (see ``tokenize_rows``), without the overlong ones when ``filter_overlong``:
    ``indices`` are the rows' positions (``Prompt.index``), ``wheres`` name them in errors."""
    messages = [_checked_messages(row, where, need_reward) for row, where in zip(rows, wheres)]
    endings = [render_ending(m, continue_final) for m in messages]
    vision = _vision_rows(rows, messages, wheres, processor, image_key, template, endings)
    all_ids: list[Any] = [None] * len(rows)
    for ending in {tuple(e.items()): e for e in endings}.values():  # each way a render ends, with its rows
        text = [i for i in range(len(rows)) if i not in vision and endings[i] == ending]
        for i, ids in zip(text, apply_templates(tokenizer, [messages[i] for i in text], [wheres[i] for i in text],
                                                **ending, **(template or {}))):
            all_ids[i] = ids
    for i, (ids, _) in vision.items():
        all_ids[i] = ids
    return [p for i, row in enumerate(rows)
            if (p := _prompt(row, indices[i], messages[i], all_ids[i], max_len, filter_overlong, wheres[i],
                             vision[i][1] if i in vision else None, truncation)) is not None]


def _vision_rows(rows: list[dict[str, Any]], messages: list[list[dict[str, Any]]], wheres: list[str], processor: Any,
                 image_key: str, template: dict[str, Any] | None = None,
                 endings: list[dict[str, bool]] | None = None) -> dict[int, tuple[list[int], dict[str, Any]]]:
    """The rows with images or ``<image>`` placeholders, encoded by the processor: {row: (ids, vision inputs)}. For a
    text model (no processor) a row with images is an error and ``<image>`` is plain text."""
    from rlforge import multimodal as mm

    found: dict[int, tuple[list[int], dict[str, Any]]] = {}
    for i, (row, where) in enumerate(zip(rows, wheres)):
        if processor is None:
            if row.get(image_key):
                raise DataError(f"{where}: the row has images (column '{image_key}', data.image_key), but model.path "
                                f"has no image processor: a text-only model. Use a vision-language model "
                                f"(docs/multimodal.md).")
            continue
        images = mm.row_images(row, image_key, where) if row.get(image_key) is not None else []
        if not images and not mm.placeholder_count(messages[i]):
            mm.refuse_video(messages[i], where)  # a text row, but for a vision model '<video>' is no text
            continue
        if image_key not in row:
            columns = sorted(k for k in row if not k.startswith("_"))
            raise DataError(f"{where}: the prompt has {mm.placeholder_count(messages[i])} {mm.IMAGE_PLACEHOLDER} "
                            f"placeholder(s) but the row has no column '{image_key}' (data.image_key). Columns "
                            f"present: {columns}.")
        typed = mm.typed_messages(messages[i], len(images), where, image_key)
        ending = endings[i] if endings else render_ending(messages[i], False)
        found[i] = mm.encode_prompt(processor, typed, images, where, **ending, **(template or {}))
    return found


def _tokenize_prompt(row: dict[str, Any], index: int, tokenizer: Any, max_len: int, filter_overlong: bool,
                     where: str, need_reward: bool) -> Prompt | None:
    """One row's prompt with the chat template applied (a preference row's: never cut); None when it is overlong
    and filtered out."""
    messages = _checked_messages(row, where, need_reward)
    ids = apply_template(tokenizer, messages, where, add_generation_prompt=True)
    return _prompt(row, index, messages, ids, max_len, filter_overlong, where, truncation=None)


def _prompt(row: dict[str, Any], index: int, messages: list[dict[str, Any]], ids: list[int], max_len: int,
            filter_overlong: bool, where: str, multi_modal: dict[str, Any] | None = None,
            truncation: str | None = "error") -> Prompt | None:
    """The row's :class:`Prompt`, its ids cut by ``truncation`` where over ``max_len`` (None: a prompt that is never
    cut, a preference row's); None when overlong and ``filter_overlong``."""
    if len(ids) > max_len:
        if filter_overlong:
            return None
        if truncation in ("error", None) or multi_modal is not None:
            why = ("; a prompt with images is never cut: data.truncation would separate image tokens from their "
                   "images" if multi_modal is not None else
                   "; a preference row's prompt is never cut (docs/data.md)" if truncation is None else
                   ", or data.truncation=left|right|middle to cut them")
            raise DataError(
                f"{where}: prompt is {len(ids)} tokens, over data.max_prompt_length={max_len} "
                f"(set data.filter_overlong_prompts=true to drop such rows{why})."
            )
        ids = truncate(ids, max_len, truncation)
    reward = row.get("reward_model") or {}
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    agent = row.get("agent_name")
    return Prompt(ids, messages, row.get("data_source", ""), truth, row.get("extra_info"), index, multi_modal,
                  None if agent is None else str(agent))


def _checked_messages(row: dict[str, Any], where: str, need_reward: bool) -> list[dict[str, Any]]:
    """One row's prompt messages, after the checks of its columns."""
    for col in ("prompt", "data_source") if need_reward else ("prompt",):
        if col not in row:
            raise DataError(f"{where}: missing column '{col}'. Columns present: {columns(row)}.")
    messages = _messages(row["prompt"], where, "prompt")
    reward = row.get("reward_model") or {}
    if need_reward and (not isinstance(reward, dict) or reward.get("ground_truth") is None):  # a null is absent
        raise DataError(f"{where}: missing 'reward_model.ground_truth'"
                        f"{' (null)' if isinstance(reward, dict) and 'ground_truth' in reward else ''}.")
    return messages


def collate(prompts: Sequence[Prompt], pad_id: int, uids: list[Any]) -> B.Batch:
    """Left-pad prompts into a batch with the loader columns."""
    width = max(len(p.ids) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p.ids):] = torch.tensor(p.ids)
        mask[i, width - len(p.ids):] = 1
    return B.Batch(
        {B.PROMPTS: ids, B.PROMPT_MASK: mask},
        {
            B.UID: uids,
            B.RAW_PROMPT: [p.messages for p in prompts],
            B.DATA_SOURCE: [p.data_source for p in prompts],
            B.GROUND_TRUTH: [p.ground_truth for p in prompts],
            B.EXTRA_INFO: [p.extra_info for p in prompts],
            **({B.MULTI_MODAL_INPUTS: [p.multi_modal for p in prompts]}
               if any(p.multi_modal is not None for p in prompts) else {}),
            **({B.AGENT_NAME: [p.agent_name for p in prompts]} if any(p.agent_name for p in prompts) else {}),
        },
    )


class PromptSampler:
    """Yields batches of prompt indices epoch after epoch; its state (epoch, position) resumes exactly.

    Each epoch's order is a permutation drawn from a generator seeded with ``seed + epoch``, so it does
    not depend on any global RNG. It is drawn once per epoch and kept as a tensor (8 bytes per example).
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool, seed: int) -> None:
        if size < batch_size:
            raise DataError(f"The training set has {size} examples (prompts, pairs), fewer than "
                            f"data.train_batch_size={batch_size}.")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0
        self._drawn: tuple[int, torch.Tensor] | None = None  # (epoch, its order)

    def _order(self) -> torch.Tensor:
        if self._drawn is None or self._drawn[0] != self.epoch:
            if self.shuffle:
                order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
            else:
                order = torch.arange(self.size)
            self._drawn = (self.epoch, order)
        return self._drawn[1]

    def next_indices(self) -> list[int]:
        if self.position + self.batch_size > self.size:  # drop the incomplete tail, start a new epoch
            self.epoch, self.position = self.epoch + 1, 0
        idx = self._order()[self.position : self.position + self.batch_size].tolist()
        self.position += self.batch_size
        return idx

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
