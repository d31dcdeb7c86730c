"""Prompt data: verl-style rows -> tokenized prompts (chat template applied), and a resumable sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlforge import batch as B
from rlforge.errors import DataError


@dataclass
class Prompt:
    ids: list[int]
    messages: list[dict[str, str]]
    data_source: str
    ground_truth: Any
    extra_info: Any
    index: int  # position of the source row


def _origin(row: dict[str, Any], index: int, name: str) -> str:
    return str(row.get("_origin") or f"{name}, row {index + 1}")


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
    return ""


def tokenize_rows(
    rows: list[dict[str, Any]], tokenizer: Any, max_len: int, filter_overlong: bool, name: str,
    need_reward: bool = True,
) -> list[Prompt]:
    """Validate verl-format rows and apply the chat template. ``name`` labels errors (dataset or file).

    With ``need_reward=False`` (SFT) only ``prompt`` is required.
    """
    prompts: list[Prompt] = []
    for i, row in enumerate(rows):
        where = _origin(row, i, name)
        for col in ("prompt", "data_source") if need_reward else ("prompt",):
            if col not in row:
                raise DataError(f"{where}: missing column '{col}'. Columns present: {sorted(row)}.")
        messages = row["prompt"]
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: 'prompt' must be a list of chat messages {{role, content}}, got "
                            f"{type(messages).__name__}{' (empty)' if isinstance(messages, list) else ''}.")
        for j, m in enumerate(messages, 1):
            problem = _message_problem(m)
            if problem:
                raise DataError(f"{where}: prompt message {j} {problem}: 'prompt' must be a list of chat messages "
                                f"{{\"role\": str, \"content\": str}}.")
        if not any(str(m.get("content", "")).strip() for m in messages):
            raise DataError(f"{where}: the prompt is empty.")
        reward = row.get("reward_model") or {}
        if need_reward and (not isinstance(reward, dict) or "ground_truth" not in reward):
            raise DataError(f"{where}: missing 'reward_model.ground_truth'.")
        try:
            enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # a template that rejects a role or an order of messages (jinja raise_exception)
            raise DataError(f"{where}: the tokenizer's chat template cannot render this prompt "
                            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})."
                            ) from None
        ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
        if len(ids) > max_len:
            if not filter_overlong:
                raise DataError(
                    f"{where}: prompt is {len(ids)} tokens, over data.max_prompt_length={max_len} "
                    f"(set data.filter_overlong_prompts=true to drop such rows)."
                )
            continue
        truth = reward.get("ground_truth") if isinstance(reward, dict) else None
        prompts.append(Prompt(ids, messages, row.get("data_source", ""), truth, row.get("extra_info"), i))
    if rows and not prompts:
        raise DataError(
            f"{name}: all {len(rows)} prompts are longer than data.max_prompt_length={max_len} tokens."
        )
    return prompts


def collate(prompts: list[Prompt], pad_id: int, uids: list[Any]) -> B.Batch:
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
        },
    )


class PromptSampler:
    """Yields batches of prompt indices epoch after epoch; its state (epoch, position) resumes exactly.

    Each epoch's order is a permutation drawn from a generator seeded with ``seed + epoch``, so it does
    not depend on any global RNG.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool, seed: int) -> None:
        if size < batch_size:
            raise DataError(f"The training set has {size} prompts, fewer than data.train_batch_size={batch_size}.")
        self.size, self.batch_size, self.shuffle, self.seed = size, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next_indices(self) -> list[int]:
        if self.position + self.batch_size > self.size:  # drop the incomplete tail, start a new epoch
            self.epoch, self.position = self.epoch + 1, 0
        idx = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return idx

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
