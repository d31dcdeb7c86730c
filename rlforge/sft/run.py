"""``rlforge sft``: the config -> data, model, Lightning Trainer -> fit -> Hugging Face folder + accuracy."""

from __future__ import annotations

import logging
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import FSDPStrategy, Strategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, read_write

from rlforge import lr_schedule
from rlforge.errors import ConfigError
from rlforge.models import quiet_transformers, resolve_model_path
from rlforge.sft import record
from rlforge.sft.accuracy import GreedyAccuracy
from rlforge.sft.data import BatchPlan, SFTData, train_examples, val_examples
from rlforge.sft.formats import FORMATS, TRUNCATIONS, Example
from rlforge.sft.module import FRESH_TINY, INITS, SFTModule, build_model, build_tokenizer
from rlforge.sft.order import ORDERS
from rlforge.sft.outputs import CHECKPOINTS, LAST, LOGGERS, ExportHF, RunRecord, StopUnderway, checkpointing

QUIET = (  # Lightning warnings that do not apply here
    "Checkpoint directory .* exists and is not empty",  # a resumed run writes into its own folder again
    "You're resuming from a checkpoint that ended before the epoch ended",  # our batches resume by step
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # inside Lightning (torch 2.13)
    "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",  # another sft.save_every
)


class HFBlocks:
    """FSDP auto-wrap policy: each block that a Hugging Face model names in its ``_no_split_modules`` (e.g.
    ``LlamaDecoderLayer``) is one FSDP unit. FSDP visits a parent (``recurse=True``) before its children, so the
    names are known by the time the blocks are asked about."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __call__(self, module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        if recurse:
            self.names.update(getattr(module, "_no_split_modules", None) or [])
            return True
        return type(module).__name__ in self.names


STRATEGIES: dict[str, Callable[[], Strategy]] = {  # other names go to Lightning as they are
    "fsdp": lambda: FSDPStrategy(auto_wrap_policy=HFBlocks()),
}


def hide_lightning_tips() -> None:
    """Drop Lightning's advertising line ("Tip: ... litlogger") from its rank-zero log; keep its other lines."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoTips) for f in logger.filters):
        logger.addFilter(_NoTips())


class _NoTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in str(record.msg)


IN_PROCESS = ("ddp_spawn", "ddp_fork", "ddp_notebook")  # Lightning strategies whose ranks start from this process


def check_config(s: DictConfig) -> None:
    """Fail before any model is loaded: every ``sft`` choice and size is checked here."""
    choices = {"format": ("auto", *FORMATS), "truncation": ("error", *TRUNCATIONS),
               "sampling": tuple(ORDERS),
               "strategy": ("auto", *sorted(StrategyRegistry.available_strategies()))}
    for key, allowed in choices.items():
        if s[key] not in allowed:
            raise ConfigError(f"Unknown sft.{key} '{s[key]}'. Choose one of: {', '.join(allowed)}.")
    if s.strategy.startswith(IN_PROCESS):  # Lightning's multiprocessing launcher: the run pickled into spawned
        # processes (its config holds a class per plugin set, its loggers modules) or forked ones (the reward
        # function's worker processes then belong to another parent)
        raise ConfigError(f"sft.strategy={s.strategy} is not supported: it starts the ranks from this process (spawned "
                          f"or forked), which rlforge's SFT run does not survive. Use sft.strategy=ddp: Lightning runs "
                          f"the command again for the other ranks.")
    for name in s.loggers:
        if name not in LOGGERS:
            raise ConfigError(f"Unknown logger '{name}' in sft.loggers. Available: {', '.join(LOGGERS)}.")
    for key in ("steps", "batch_size", "max_length", "log_every"):
        if not s[key] > 0:
            raise ConfigError(f"sft.{key} must be > 0, got {s[key]}.")
    for key in ("lr", "warmup_steps", "save_every", "val_every", "grad_clip", "weight_decay"):  # lr 0: no change
        if s[key] < 0:
            raise ConfigError(f"sft.{key} must be >= 0, got {s[key]}.")
    if len(s.betas) != 2 or not all(0 <= b < 1 for b in s.betas):
        raise ConfigError(f"sft.betas must be two numbers in [0, 1) (AdamW's beta1, beta2), got {list(s.betas)}.")


def preflight(config: DictConfig) -> None:
    """What is checked before any data or model is read: the ``sft`` choices and sizes, the files, ``sft.init``."""
    from rlforge.data import data_file_problem

    s = config.sft
    check_config(s)
    for key in ("train_file", "val_file"):
        if s[key] and (problem := data_file_problem(s[key])):
            raise ConfigError(f"{problem} (sft.{key}).")
    if s.init not in INITS:
        resolve_model_path(s.init, "sft.init")


def apply_epochs(s: DictConfig, examples: int) -> int:
    """With ``sft.epochs`` set, ``sft.steps`` becomes epochs x (examples // sft.batch_size): whole batches per epoch
    (``sft.sampling=epoch`` leaves the tail out), verl's count. Called once the training examples are known. Returns
    the steps the run trains: ``sft.steps``, or fewer where ``sft.epoch_limit`` passes over the data end it first
    (the schedule still spans ``sft.steps``, as verl's SFT loop ends after total_epochs beside total_training_steps)."""
    per_epoch = examples // s.batch_size
    if s.epochs is not None:
        with read_write(s):
            s.steps = max(1, int(s.epochs) * per_epoch)
    return s.steps if s.epoch_limit is None else max(1, min(s.steps, int(s.epoch_limit) * per_epoch))


def warmup_note(s: DictConfig) -> str:
    """A warning where the warm-up spans the whole run (``sft.warmup_steps``, default 20, or ``sft.warmup_ratio``, at
    least ``sft.steps``): the rate never reaches ``sft.lr``; "" otherwise."""
    warm = lr_schedule.warmup_steps(s.warmup_steps, s.warmup_ratio, s.steps)
    if warm < s.steps or not s.lr:
        return ""
    return (f"The warm-up ({warm} steps: sft.warmup_steps={s.warmup_steps}, sft.warmup_ratio={s.warmup_ratio}) is not "
            f"shorter than the run (sft.steps={s.steps}): the learning rate rises for the whole run and never reaches "
            f"sft.lr={s.lr:g}. Lower sft.warmup_steps (20 by default) or set sft.warmup_ratio.")


def _latest(s: DictConfig) -> str | None:
    """``checkpoints/last.ckpt``; where its link is broken (Lightning removes the older ``step_N.ckpt`` before it
    links the newer one: a run stopped in between), the newest ``step_N.ckpt`` there, said in a warning."""
    folder = Path(s.output_dir) / CHECKPOINTS
    if (folder / LAST).exists():
        return str(folder / LAST)
    steps = sorted(folder.glob("step_*.ckpt"), key=lambda p: int(p.stem.split("_")[1]) if p.stem[5:].isdigit() else -1)
    if not steps:
        return None
    logging.getLogger("rlforge.sft").warning("sft.resume=auto: %s links to a checkpoint that is gone (the run stopped while it saved); resuming "
                "from %s, the newest there.", folder / LAST, steps[-1].name)
    return str(steps[-1])


def _given(s: DictConfig) -> str:
    """A checkpoint file of rlforge's SFT (Lightning's ``.ckpt``); a folder gives its ``checkpoints/last.ckpt`` (an
    SFT output folder) or its ``last.ckpt``."""
    given = Path(s.resume)
    found = next((c for c in (given / CHECKPOINTS / LAST, given / LAST) if c.is_file()), None) if given.is_dir() else (
        given if given.is_file() and given.suffix == ".ckpt" and zipfile.is_zipfile(given) else None)
    if found is None:
        what = ("a folder without checkpoints/last.ckpt or last.ckpt" if given.is_dir() else
                "not a checkpoint (a .ckpt file that torch.save wrote)" if given.exists() else "no such checkpoint")
        raise ConfigError(f"sft.resume={s.resume}: {what}. Use never, auto (<sft.output_dir>/{CHECKPOINTS}/{LAST} if "
                          f"there is one), the path of a .ckpt, or an SFT output folder.")
    return str(found)


RESUME: dict[str, Callable[[DictConfig], str | None]] = {"never": lambda s: None, "auto": _latest}


def resume_from(s: DictConfig) -> str | None:
    """The checkpoint to resume from (``sft.resume``), or None for a fresh start."""
    return RESUME.get(s.resume, _given)(s)


def lightning_precision(config: DictConfig) -> str:
    """``model.precision`` (the names are Lightning's), ``auto`` resolved by the accelerator SFT runs on."""
    from rlforge import precision

    accelerator = config.sft.accelerator
    if accelerator == "auto":
        import torch

        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    return precision.resolve(config.model.precision, "cuda" if accelerator in ("gpu", "cuda") else "cpu").name


def make_trainer(s: DictConfig, callbacks: list[Callback], loggers: list[Logger], validate: bool,
                 precision: str = "32-true", stop: int | None = None, resumed: bool = False) -> L.Trainer:
    """Lightning's Trainer for ``stop`` steps (default ``sft.steps``; :func:`apply_epochs`). ``resumed``: it continues a
    checkpoint; a checkpoint of a run that reached its steps (saved at the last batch) ended Lightning's one epoch, and
    with ``max_epochs=1`` a larger ``sft.steps`` trained nothing."""
    stop = stop or s.steps
    strategy = STRATEGIES[s.strategy]() if s.strategy in STRATEGIES else s.strategy
    try:
        return L.Trainer(
            accelerator=s.accelerator, devices=s.devices, num_nodes=s.num_nodes, strategy=strategy,
            # one Lightning epoch holds every step (StepBatches): the progress bar reads "Epoch 0/0", not "0/-2"; a
            # resumed run is ended by max_steps alone (its checkpoint's epoch may have ended: FromIndex starts the next
            # one at the batch of the next step)
            precision=precision, max_steps=stop, max_epochs=-1 if resumed else 1,
            gradient_clip_val=s.grad_clip or None,
            default_root_dir=s.output_dir, logger=loggers or False, callbacks=callbacks,
            enable_checkpointing=bool(s.save_every), enable_progress_bar=s.progress,
            log_every_n_steps=min(s.log_every, stop),
            num_sanity_val_steps=0, use_distributed_sampler=False, limit_val_batches=1.0 if validate else 0,
        )
    except (MisconfigurationException, ValueError, TypeError, RuntimeError) as exc:
        raise ConfigError(f"Lightning cannot run sft.accelerator={s.accelerator} sft.devices={s.devices} "
                          f"sft.num_nodes={s.num_nodes} sft.strategy={s.strategy} model.precision={precision}: "
                          f"{exc}") from None


def _schedule(trainer: L.Trainer, plan: BatchPlan, s: DictConfig) -> None:
    """Settings that depend on the number of ranks, known once the Trainer exists (it counts micro-batches)."""
    trainer.accumulate_grad_batches = plan.accumulation
    if s.val_every:
        trainer.val_check_interval = min(s.val_every, s.steps) * plan.accumulation
        trainer.check_val_every_n_epoch = None


def load_data(config: DictConfig, plugins: Any, tokenizer: Any, say: Callable[[str], Any]
              ) -> tuple[list[Example], list[Example]]:
    train, dropped = train_examples(config, plugins.registry, tokenizer)
    val, val_dropped = val_examples(config, plugins.registry, tokenizer)
    say(f"sft data: {len(train)} training examples, {len(val)} validation examples"
        + (f" ({dropped} + {val_dropped} examples dropped by sft.truncation)" if dropped + val_dropped else ""))
    return train, val


def run_sft(config: DictConfig, plugins: Any, log: Callable[[str], Any] = print,
            callbacks: Sequence[Callback] = ()) -> dict[str, float]:
    """Fine-tune ``sft.init`` on the SFT data; returns the last logged metrics (``train/loss``, ``val/loss``,
    ``val/accuracy``). ``callbacks`` are extra Lightning callbacks. Everything that can be checked is checked
    before the model is created."""
    s, say = config.sft, rank_zero_only(log)
    preflight(config)
    ckpt = resume_from(s)
    saved = record.read(ckpt) if ckpt else None
    quiet_transformers()
    hide_lightning_tips()
    Path(s.output_dir).mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(config)
    train, val = load_data(config, plugins, tokenizer, say)
    stop = apply_epochs(s, len(train))
    if note := warmup_note(s):
        logging.getLogger("rlforge.sft").warning(note)
    mine = resume_check(config, train, saved, say)
    accuracy = GreedyAccuracy(config, plugins, tokenizer) if s.val_accuracy else None
    try:
        metrics, step = fit(config, tokenizer, train, val, accuracy, saved, [*callbacks, record.KeepRecord(mine)],
                            say, stop)
    finally:
        if accuracy is not None:
            accuracy.close()
    acc = metrics.get("val/accuracy")
    say(f"saved {s.output_dir} | step {step} | loss {metrics.get('train/loss', float('nan')):.4f}"
        + (f" | greedy validation accuracy {100 * acc:.1f}%" if acc is not None else ""))
    return metrics


def resume_check(config: DictConfig, train: list[Example], saved: record.Saved | None,
                 say: Callable[[str], Any]) -> dict[str, Any]:
    """This run's record (:mod:`rlforge.sft.record`), once a resume of ``saved`` is found to continue the same
    training (else ``ConfigError``, unless ``sft.resume_force``); the allowed changes are printed."""
    mine = record.of(config, train)
    if saved is None:
        return mine
    entry = record.check(saved, mine, config.sft)
    say(f"resuming from {record.where(saved)}"
        + "".join(f"; {key}: {old} -> {new}" for key, (old, new) in entry["changed"].items()))
    return {**mine, "resumes": [*record.history(saved), entry]}


def fit(config: DictConfig, tokenizer: Any, train: list[Example], val: list[Example],
        accuracy: GreedyAccuracy | None, saved: record.Saved | None, callbacks: list[Callback],
        say: Callable[[str], Any], stop: int) -> tuple[dict[str, float], int]:
    """Build the Trainer, check the batch arithmetic, create the model and fit ``stop`` steps (from ``saved``, the
    checkpoint resumed): (last metrics, last step)."""
    s, out, resuming = config.sft, Path(config.sft.output_dir), saved is not None
    source = None if s.init == FRESH_TINY else resolve_model_path(s.init, "sft.init")
    export = ExportHF(out, tokenizer, accuracy, config.model, source, "" if s.output_dtype == "auto" else s.output_dtype)
    loggers = [LOGGERS[name](config, out, resuming) for name in s.loggers]
    trainer = make_trainer(s, [*checkpointing(s), RunRecord(config, out, resuming), export, StopUnderway(), *callbacks], loggers,
                           bool(val), lightning_precision(config), stop, resuming)
    plan = BatchPlan.from_config(s, trainer.world_size)
    _schedule(trainer, plan, s)
    data = SFTData(train, val, plan, s, tokenizer.pad_token_id)
    L.seed_everything(s.seed, verbose=False)
    module = SFTModule(build_model(config, tokenizer), s, trainer.world_size)
    with warnings.catch_warnings():
        for message in QUIET:
            warnings.filterwarnings("ignore", message=message)
        trainer.fit(module, data, ckpt_path=saved.path if saved else None)
    return {k: float(v) for k, v in trainer.callback_metrics.items()} | export.metrics, trainer.global_step
