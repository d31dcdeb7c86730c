"""SFT data: rows (files, or the built-in dataset) -> examples -> step-indexed micro-batches for Lightning.

Batch ``j`` of a rank is a function of ``j`` alone (seed, step, rank), so a resumed run restarts its loader at
``j = global_step * accumulation`` and sees exactly the batches an uninterrupted run would have seen, without
any sampler state in the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset, Sampler

from rlforge.data import template_kwargs
from rlforge.errors import ConfigError, DataError
from rlforge.sft.formats import FORMATS, MISSING, Example, Keys, columns, dig, row_format, truncate
from rlforge.sft.order import ORDERS, BatchOrder


def file_rows(config: DictConfig, registry: Any, path: str) -> list[dict[str, Any]]:
    """Rows of one ``.jsonl``/``.json``/``.parquet`` file (through the ``files`` dataset: rows name file and row)."""
    cfg: Any = OmegaConf.to_container(config, resolve=True)
    cfg["data"]["train_files"] = [path]
    return registry.dataset.get("files")(OmegaConf.create(cfg), "train")


def builtin_rows(config: DictConfig, registry: Any) -> list[dict[str, Any]]:
    """The training split of ``data.name`` as prompt/response rows (response = the ground truth)."""
    name = config.data.name
    rows = []
    for i, row in enumerate(registry.dataset.get(name)(config, "train")):
        where = str(row.get("_origin") or f"{name} (train), row {i + 1}")
        truth = dig(row, "reward_model.ground_truth")
        if truth is MISSING:
            raise DataError(f"{where}: missing 'reward_model.ground_truth', the SFT target when sft.train_file "
                            f"is unset. Columns present: {columns(row)}.")
        rows.append({"prompt": row.get("prompt"), "response": str(truth), "_origin": where})
    return rows


def build_examples(rows: list[dict[str, Any]], tokenizer: Any, s: DictConfig, keys: Keys, name: str
                   ) -> tuple[list[Example], int]:
    """(examples, number of examples dropped): a row gives one example, or several for a conversation whose chat
    template rewrites earlier turns (``rlforge.sft.formats``); examples over ``sft.max_length``
    (``sft.truncation=drop``) and examples left with no trained token by truncation are dropped; any other bad row
    is an error naming its file and row."""
    examples: list[Example] = []
    dropped = 0
    fmt, max_length, how = s.format, s.max_length, s.truncation  # read once: OmegaConf access is slow
    for i, row in enumerate(rows):
        where = str(row.get("_origin") or f"{name}, row {i + 1}")
        if row.get("images") is not None or row.get("videos") is not None:  # verl's and TRL's image/video columns
            raise DataError(f"{where}: the row has images or videos; rlforge sft trains on text only (SFT with images "
                            f"is not built yet, docs/multimodal.md). Drop the column to train on the text alone.")
        for example in FORMATS[row_format(row, fmt, keys)](row, tokenizer, keys, where):
            kept = truncate(example, max_length, how, where)
            if kept is not None and kept.trained:
                examples.append(kept)
            else:
                dropped += 1
    if rows and not examples:
        raise DataError(f"{name}: no row is left to train on (all {len(rows)} are over sft.max_length="
                        f"{s.max_length} tokens or lose every trained token to sft.truncation={s.truncation}).")
    return examples, dropped


def pad(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask``."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(examples):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        attn[i, : len(e.ids)] = 1
        mask[i, : len(e.ids)] = torch.tensor(e.mask)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}


@dataclass(frozen=True)
class BatchPlan:
    """``batch_size`` examples per optimizer step over ``world`` data-parallel ranks, ``micro`` per forward pass on
    one; with sequence parallelism the ``sp`` devices of a data-parallel group share each micro-batch (device
    ``r`` is in group ``r // sp``)."""

    batch_size: int
    world: int
    micro: int
    sp: int = 1

    @classmethod
    def from_config(cls, s: DictConfig, devices: int) -> BatchPlan:
        sp = int(s.sequence_parallel_size)
        if devices % sp:
            given = s.get("devices", devices)
            raise ConfigError(f"sft.sequence_parallel_size={sp} must divide the number of devices ({devices}"
                              f"{'' if str(given) == str(devices) else f': sft.devices={given}'}).")
        world = devices // sp
        ranks = f"{world} devices" if sp == 1 else f"{world} data-parallel groups of {sp} devices"
        if s.batch_size % world:
            groups = "devices" if sp == 1 else "data-parallel groups (devices / sft.sequence_parallel_size)"
            raise ConfigError(f"sft.batch_size={s.batch_size} must be a multiple of the number of {groups} ({world}).")
        per_rank = s.batch_size // world
        micro = s.micro_batch_size or per_rank
        if micro <= 0 or per_rank % micro:
            raise ConfigError(f"sft.micro_batch_size={s.micro_batch_size} must divide the examples per device and "
                              f"step (sft.batch_size={s.batch_size} / {ranks} = {per_rank}).")
        return cls(s.batch_size, world, micro, sp)

    def rank(self, device_rank: int) -> int:
        """The data-parallel rank of device ``device_rank``."""
        return device_rank // self.sp

    @property
    def per_rank(self) -> int:
        return self.batch_size // self.world

    @property
    def accumulation(self) -> int:
        return self.per_rank // self.micro


class StepBatches(Dataset):
    """Item ``j``: micro-batch ``j % accumulation`` of this rank's share of step ``j // accumulation``.

    ``order`` picks each step's global batch (``rlforge.sft.order``). Each item carries ``num_tokens``, the
    trained tokens of the whole global batch, so that the loss is the token mean over the global batch however
    it is split.
    """

    def __init__(self, examples: list[Example], plan: BatchPlan, steps: int, rank: int, order: BatchOrder,
                 pad_id: int) -> None:
        self.examples, self.plan, self.steps, self.rank, self.order, self.pad_id = (
            examples, plan, steps, rank, order, pad_id)

    def __len__(self) -> int:
        return self.steps * self.plan.accumulation

    def __getitem__(self, j: int) -> dict[str, torch.Tensor]:
        step, part = divmod(j, self.plan.accumulation)
        batch = self.order.batch(step)
        share = batch[self.rank * self.plan.per_rank : (self.rank + 1) * self.plan.per_rank]
        mine = share[part * self.plan.micro : (part + 1) * self.plan.micro]
        out = pad([self.examples[i] for i in mine], self.pad_id)
        out["num_tokens"] = torch.tensor(sum(self.examples[i].trained for i in batch))
        return out


class FromIndex(Sampler[int]):
    """``start(), ..., size - 1``, with ``start`` read when iteration begins (after a checkpoint has loaded)."""

    def __init__(self, size: int, start: Callable[[], int]) -> None:
        self.size, self.start = size, start

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start(), self.size))


class SFTData(L.LightningDataModule):
    """Training micro-batches by step (see ``StepBatches``); validation examples split over the ranks."""

    def __init__(self, train: list[Example], val: list[Example], plan: BatchPlan, s: DictConfig, pad_id: int) -> None:
        super().__init__()
        if len(train) < plan.batch_size:
            raise DataError(f"The SFT data has {len(train)} examples, fewer than sft.batch_size={plan.batch_size}.")
        self.train, self.val, self.plan, self.steps, self.pad_id = train, val, plan, s.steps, pad_id
        self.order = ORDERS[s.sampling](len(train), plan.batch_size, s.seed)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        assert trainer is not None
        data = StepBatches(self.train, self.plan, self.steps, self.plan.rank(trainer.global_rank), self.order,
                           self.pad_id)
        start = FromIndex(len(data), lambda: trainer.global_step * self.plan.accumulation)
        return DataLoader(data, batch_size=None, sampler=start)

    def val_dataloader(self) -> DataLoader:
        assert self.trainer is not None
        mine = self.val[self.plan.rank(self.trainer.global_rank) :: self.plan.world]
        micro = [pad(mine[i : i + self.plan.micro], self.pad_id) for i in range(0, len(mine), self.plan.micro)]
        return DataLoader(micro, batch_size=None)


def sft_keys(config: DictConfig) -> Keys:
    s = config.sft
    return Keys(s.prompt_key, s.response_key, s.messages_key, s.tools_key, s.completion_key, s.text_key,
                template_kwargs(config), s.enable_thinking_key, s.enable_thinking_default)


def train_examples(config: DictConfig, registry: Any, tokenizer: Any) -> tuple[list[Example], int]:
    """``sft.train_file``'s examples, or ``data.name``'s training rows with their ground truth as the response."""
    s = config.sft
    if s.train_file:
        return build_examples(file_rows(config, registry, s.train_file), tokenizer, s, sft_keys(config), s.train_file)
    keys = Keys(template=template_kwargs(config), thinking_default=s.enable_thinking_default)
    return build_examples(builtin_rows(config, registry), tokenizer, s, keys, config.data.name)


def val_examples(config: DictConfig, registry: Any, tokenizer: Any) -> tuple[list[Example], int]:
    """``sft.val_file``'s examples (none when it is unset)."""
    s = config.sft
    if not s.val_file:
        return [], 0
    return build_examples(file_rows(config, registry, s.val_file), tokenizer, s, sft_keys(config), s.val_file)
