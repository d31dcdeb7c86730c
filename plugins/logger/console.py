"""``console`` logger: a live rich progress bar and one metrics line per step."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from rlforge.hookspecs import hookimpl

# metric -> short label, in the order printed on the per-step line
LINE_KEYS = {
    "critic/score/mean": "reward",
    "critic/acc/mean": "acc",
    "response_length/mean": "resp_len",
    "actor/pg_loss": "pg_loss",
    "actor/loss": "loss",  # preference algorithms and the reward model (TRL's names below)
    "rewards/accuracies": "pair_acc",
    "rewards/margins": "margin",
    "actor/entropy": "entropy",
    "actor/kl_loss": "kl",
    "actor/grad_norm": "grad_norm",
    "perf/throughput": "tok/s",
    "timing_s/step": "s/step",
}


def format_metrics(metrics: dict[str, float], keys: dict[str, str]) -> str:
    return " | ".join(f"{label} {metrics[k]:.4g}" for k, label in keys.items() if k in metrics)


class ConsoleLogger:
    """Progress bar (step, reward, response length, s/step) plus a metrics line per step."""

    def __init__(self, config: Any, run_dir: str) -> None:
        self.total = config.trainer.total_steps
        self.console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.progress: Progress | None = None
        if config.trainer.progress:
            self.progress = Progress(
                TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), console=self.console, transient=True,
            )
            self.task = self.progress.add_task("fit", total=self.total, info="")
            self.progress.start()

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        # validation's line shows rlforge's names; verl's duplicates (val-core/, val-aux/) go to the trackers only
        val = {k: v for k, v in metrics.items() if k.startswith("val/")}
        train = {k: v for k, v in metrics.items() if not k.startswith(("val/", "val-core/", "val-aux/"))}
        line = format_metrics(train, LINE_KEYS)
        if line:  # metrics logged apart from the step's (a checkpoint's timing_s/*) get no line of their own
            self.console.print(f"step {step:>4}/{self.total} | {line}")
            if self.progress is not None:
                info = format_metrics(train, {"critic/score/mean": "reward", "response_length/mean": "len",
                                              "timing_s/step": "s/step"})
                self.progress.update(self.task, completed=step, info=info)
        if val:
            shown = " | ".join(f"{k} {v:.4g}" for k, v in sorted(val.items()))
            self.console.print(f"[cyan]validation @ step {step}[/cyan] | {shown}")

    def log_artifact(self, path: str) -> None:
        pass

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


@hookimpl
def rlforge_register(registry):
    registry.logger.register("console", ConsoleLogger)
