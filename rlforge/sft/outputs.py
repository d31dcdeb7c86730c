"""What an SFT run writes into ``sft.output_dir``: loggers, checkpoints, and the final Hugging Face folder.

```
<output_dir>/config.json, model.safetensors, tokenizer files   the fine-tuned model (at the end)
<output_dir>/checkpoints/step_N.ckpt, last.ckpt                Lightning checkpoints (sft.save_every)
<output_dir>/mlflow.db, mlartifacts/, mlflow_run_id            mlflow (sft.loggers contains mlflow)
<output_dir>/tensorboard/                                      TensorBoard (sft.loggers contains tensorboard)
<output_dir>/wandb/, wandb_run_id                              Weights & Biases (sft.loggers contains wandb)
```
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from rlforge import lora
from rlforge.as_loaded import as_loaded
from rlforge.errors import STOP_UNDERWAY
from rlforge.lazy import optional_import
from rlforge.models import load_model
from rlforge.sft.accuracy import GreedyAccuracy
from rlforge.tracking import environment_kept

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
RUN_ID_FILE = "mlflow_run_id"
WANDB_ID_FILE = "wandb_run_id"


class _MLFlowLogger(MLFlowLogger):
    """Lightning's mlflow logger, without leaving this run's store in the environment (``rlforge.tracking``)."""

    @property
    def experiment(self) -> Any:
        with environment_kept():
            return super().experiment


def run_name(config: DictConfig, out: Path) -> str:
    """The run's name in mlflow and wandb: ``sft.run_name``, by default ``sft/<output folder name>``."""
    return config.sft.run_name or f"sft/{out.name}"


def mlflow_logger(config: DictConfig, out: Path, resuming: bool) -> Logger:
    """mlflow with a sqlite store in the output folder; a resumed run continues its mlflow run."""
    id_file = out / RUN_ID_FILE
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None
    return _MLFlowLogger(experiment_name=config.trainer.project, run_name=run_name(config, out),
                        tracking_uri=f"sqlite:///{out.resolve() / 'mlflow.db'}",
                        artifact_location=(out.resolve() / "mlartifacts").as_uri(), run_id=run_id)


def tensorboard_logger(config: DictConfig, out: Path, resuming: bool) -> Logger:
    return TensorBoardLogger(save_dir=str(out), name="", version="tensorboard", default_hp_metric=False)


def wandb_logger(config: DictConfig, out: Path, resuming: bool) -> Logger:
    """Weights & Biases (``pip install wandb``; ``WANDB_MODE=offline`` logs without an account), project
    ``trainer.project``, run ``sft.run_name``; a resumed run continues its wandb run."""
    optional_import("wandb", "sft.loggers includes 'wandb'", "pip install wandb")
    id_file = out / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if resuming and id_file.is_file() else None
    return WandbLogger(project=config.trainer.project, name=run_name(config, out), save_dir=str(out), id=run_id,
                       resume="allow")


LOGGERS: dict[str, Callable[[DictConfig, Path, bool], Logger]] = {
    "mlflow": mlflow_logger,
    "tensorboard": tensorboard_logger,
    "wandb": wandb_logger,
}


def checkpointing(s: DictConfig) -> list[Callback]:
    """Every ``sft.save_every`` steps: ``checkpoints/step_N.ckpt`` (the newest kept) and ``last.ckpt`` linking to it.
    Files are replaced, never versioned: a run resumed with another ``sft.save_every`` gets a new ``ModelCheckpoint``
    (Lightning keys its state by the interval) that would otherwise write ``last-v1.ckpt`` beside the old link, and
    ``sft.resume=auto`` would go back to the old checkpoint the next time."""
    if not s.save_every:
        return []
    return [ModelCheckpoint(dirpath=Path(s.output_dir) / CHECKPOINTS, filename="step_{step}", save_last="link",
                            auto_insert_metric_name=False, every_n_train_steps=s.save_every, save_top_k=1,
                            enable_version_counter=False)]


class StopUnderway(Callback):
    """An interrupt (Ctrl-C, SIGTERM) reached Lightning's clean-up: a repeated SIGTERM lets it finish (rlforge.cli)."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        STOP_UNDERWAY.set()


class RunRecord(Callback):
    """At the start of a fresh run: log the ``sft`` and ``data`` config as hyperparameters and keep the mlflow and
    wandb run ids (``mlflow_run_id``, ``wandb_run_id``) so that a resumed run logs into the same runs."""

    def __init__(self, config: DictConfig, out: Path, resuming: bool) -> None:
        self.config, self.out, self.resuming = config, out, resuming

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.resuming:
            return
        params = OmegaConf.to_container(OmegaConf.masked_copy(self.config, ["sft", "data"]), resolve=True)
        for lg in trainer.loggers:
            lg.log_hyperparams(params)  # type: ignore[arg-type]
            if isinstance(lg, MLFlowLogger) and trainer.is_global_zero:
                (self.out / RUN_ID_FILE).write_text(str(lg.run_id))
            if isinstance(lg, WandbLogger) and trainer.is_global_zero:
                (self.out / WANDB_ID_FILE).write_text(str(lg.version))


class ExportHF(Callback):
    """When training ends: save the model as a Hugging Face folder in ``out`` (gathered from every rank under
    sharded strategies) with the weight dtypes and tokenizer of ``source``, the model folder it started from (if
    any: ``rlforge.as_loaded``), then measure the greedy validation accuracy of the saved model on rank 0."""

    def __init__(self, out: Path, tokenizer: Any, accuracy: GreedyAccuracy | None, model: DictConfig,
                 source: Path | None = None, dtype: str = "") -> None:
        self.out, self.tokenizer, self.accuracy, self.model, self.source = out, tokenizer, accuracy, model, source
        self.dtype = dtype  # every floating weight in this dtype ("": each in the source's)
        self.metrics: dict[str, float] = {}

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        state = trainer.strategy.lightning_module_state_dict()  # a collective call under sharded strategies
        if not trainer.is_global_zero:
            return
        weights = {k.removeprefix("model."): v for k, v in state.items()}
        if lora.is_lora(module.model):  # a LoRA run's output is the merged model: a plain folder for model.path
            module.model.load_state_dict(weights)
            lora.merged_model(module.model).save_pretrained(self.out, safe_serialization=True)
        else:
            module.model.save_pretrained(self.out, state_dict=weights)  # type: ignore[union-attr]
        self.tokenizer.save_pretrained(self.out)
        if self.source is not None or self.dtype:
            rounding = as_loaded(self.out, self.source or self.out, dtype=self.dtype)
            if note := rounding.warning(remedy="Set sft.output_dtype=float32"):
                logging.getLogger("rlforge.sft").warning(note)
        if self.accuracy is None:
            return
        saved = load_model(str(self.out), "float32", self.model.trust_remote_code).to(trainer.strategy.root_device).eval()
        acc = self.accuracy.measure(saved)
        if acc is not None:
            self.metrics["val/accuracy"] = acc
            for lg in trainer.loggers:
                lg.log_metrics(self.metrics, step=trainer.global_step)
