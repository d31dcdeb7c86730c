"""What an SFT checkpoint records of its run, and the check that a resume continues the same training (docs/sft.md).

Every checkpoint holds, under :data:`KEY`, the config the run trains with and the fingerprint of its training examples
(``rlforge.resume.data_fingerprint``: their count and a SHA-256 over their token ids and loss masks, in order).
``sft.resume`` compares them with the current run after the data is read and before the model is built, as ``rlforge
fit`` compares its checkpoints (``rlforge.resume``): a change to a key of :data:`COMPARED` other than
:data:`MAY_CHANGE`, or to the training examples, stops the resume with each difference named (``sft.lr: 0.001 ->
0.05``); ``sft.resume_force=true`` continues anyway, with a warning. A checkpoint written before rlforge recorded
this resumes unchecked, with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig, OmegaConf

from rlforge import lr_schedule, resume
from rlforge.errors import ConfigError
from rlforge.sft.formats import Example

KEY = "rlforge_sft"  # the record's entry in a Lightning checkpoint: a JSON string (loadable with weights_only=True)
# the keys that shape an SFT run's weights besides its training examples (data.* and model.chat_template act through
# the examples, which the fingerprint compares)
COMPARED = ("sft.*", "model.lora.*", "model.precision")
# keys that may differ between a checkpoint and its continuation: the length of the run (the learning-rate schedule
# then spans the new sft.steps), logging, checkpoint and validation cadence, locations
MAY_CHANGE = (
    "sft.steps", "sft.epochs", "sft.epoch_limit",
    "sft.log_every", "sft.progress", "sft.loggers", "sft.run_name",
    "sft.save_every", "sft.output_dir", "sft.output_dtype", "sft.resume", "sft.resume_force",
    "sft.val_file", "sft.val_every", "sft.val_accuracy",
    "sft.train_file",  # its location: the examples themselves are compared by their fingerprint
)
log = logging.getLogger("rlforge.sft")


@dataclass(frozen=True)
class Saved:
    """A checkpoint to resume from, read before the model is built."""

    path: str
    step: int | None  # None: not read (a sharded checkpoint folder)
    record: dict[str, Any] | None  # None: written before rlforge recorded its config and data


def read(path: str) -> Saved:
    """The step and record of the Lightning checkpoint ``path`` (memory-mapped: its tensors are not read)."""
    if not Path(path).is_file():  # a sharded checkpoint folder (deepspeed's): no record to read
        return Saved(path, None, None)
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 (any reason it cannot be read is the answer)
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"sft.resume: the checkpoint {path} cannot be read ({why}). Resume from another checkpoint "
                          f"(sft.resume=PATH) or start a new run (sft.resume=never).") from None
    text = checkpoint.get(KEY)
    return Saved(path, int(checkpoint.get("global_step", 0)), json.loads(text) if isinstance(text, str) else None)


def where(saved: Saved) -> str:
    return saved.path if saved.step is None else f"{saved.path} (step {saved.step})"


def of(config: DictConfig, train: list[Example]) -> dict[str, Any]:
    """The record of a run: its config (``sft.steps`` counted from ``sft.epochs`` already) and training data."""
    return {"config": OmegaConf.to_container(config, resolve=True), "data": resume.data_fingerprint(train)}


def defaults() -> dict[str, Any]:
    """The default values of the compared sections: a key added since a checkpoint was written passes when it holds
    its default."""
    from rlforge.config.schema import ModelConfig, SFTConfig

    tree = {"sft": OmegaConf.structured(SFTConfig), "model": OmegaConf.structured(ModelConfig)}
    return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)  # type: ignore[return-value]


def _compared(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resume.flatten(config).items() if resume.may_change(k, COMPARED)}


def compare(saved: dict[str, Any], now: dict[str, Any], base: Callable[[], dict[str, Any]] = defaults
            ) -> tuple[list[str], dict[str, list[Any]]]:
    """(blocking differences in words, allowed ones ``key -> [old, new]``) between two records: ``rlforge fit``'s
    check (``rlforge.resume.compare_configs``, ``compare_fingerprints``) over the keys :data:`COMPARED`, with
    :data:`MAY_CHANGE` the keys that may change."""
    blocking, changed = resume.compare_configs(_compared(saved.get("config") or {}), _compared(now["config"]), base,
                                               MAY_CHANGE)
    blocking += resume.compare_fingerprints({"data": saved.get("data")}, {"data": now["data"], "files": {}})
    return blocking, changed


def check(saved: Saved, now: dict[str, Any], s: DictConfig) -> dict[str, Any]:
    """Refuse (``ConfigError``) a resume of ``saved`` whose config or data changed in a way that changes the result,
    unless ``sft.resume_force`` (``s``: the ``sft`` section); returns what the new checkpoints record of this resume
    (from where, which allowed keys changed, which changes were forced)."""
    at = where(saved)
    entry: dict[str, Any] = {"checkpoint": saved.path, "step": saved.step, "changed": {}, "forced": []}
    if saved.record is None:
        log.warning("%s holds no record of the config and training data it was trained with (it was written before "
                    "rlforge recorded them, or it is a sharded checkpoint folder): resuming without checking that "
                    "sft.lr, the schedule, the batch sizes, the model or the training data are unchanged.", at)
        return entry
    blocking, entry["changed"] = compare(saved.record, now)
    if blocking:
        shown = resume.listing(blocking)
        if not s.resume_force:
            raise ConfigError(
                f"Cannot resume from {at}: it was trained with a different config or data ({shown}). Continuing "
                f"would mix two setups in one run. Start a new run (sft.resume=never, or another sft.output_dir), or "
                f"continue anyway with sft.resume_force=true.")
        log.warning("Resuming from %s although it changed (sft.resume_force=true): %s", at, shown)
        entry["forced"] = blocking
    if "sft.steps" in entry["changed"] and lr_schedule.depends_on_length(s):  # as rlforge fit warns (rlforge.resume)
        old, new = entry["changed"]["sft.steps"]
        log.warning("sft.steps %s -> %s changes the learning-rate schedule (sft.lr_scheduler=%s, a warm-up of "
                    "sft.warmup_steps=%s or sft.warmup_ratio=%s): the steps from here on run at the rates of a %s-step "
                    "run's schedule, not at the %s-step one's.", old, new, s.lr_scheduler, s.warmup_steps,
                    s.warmup_ratio, new, old)
    return entry


def history(saved: Saved | None) -> list[dict[str, Any]]:
    """The resumes the checkpoint ``saved`` records (none for a fresh run)."""
    return list((saved.record or {}).get("resumes", [])) if saved is not None else []


class KeepRecord(Callback):
    """Writes ``record`` (:func:`of`, with the run's resumes) into every checkpoint under :data:`KEY`."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.text = json.dumps(record, default=str)

    def on_save_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[KEY] = self.text
