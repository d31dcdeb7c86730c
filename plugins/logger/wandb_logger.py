"""``wandb`` logger (optional): Weights & Biases, online or offline.

``wandb`` is not a dependency of rlforge: ``pip install wandb`` to use it. Set ``WANDB_MODE=offline`` to log
without an account or network (``wandb sync <run_dir>/wandb/offline-run-*`` uploads later). The wandb run id is
kept in ``<run_dir>/wandb_run_id`` so a resumed run continues the same wandb run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlforge.capabilities import LoggerCapabilities
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import


class WandbLogger:
    """Logs params (the run config), metrics (same names as every other logger) and artifacts to wandb."""

    capabilities = LoggerCapabilities(shows_generations=True, marks_outcome=True)  # log_generations, close_as

    def __init__(self, config: Any, run_dir: str) -> None:
        self.wandb = wandb = optional_import("wandb", "logger.backends includes 'wandb'", "pip install wandb")
        self.run_dir = Path(run_dir)
        id_file = self.run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        try:
            self.run = wandb.init(
                project=config.trainer.project, name=f"{config.trainer.experiment}/{self.run_dir.name}",
                dir=str(self.run_dir), id=run_id, resume="allow",
            )
        except wandb.errors.Error as exc:  # no API key, no network, a bad entity: said before the first step
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise RLForgeError(
                f"logger.backends includes 'wandb' (verl: trainer.logger), but wandb could not start a run: {first} "
                f"Log in (`wandb login`, or WANDB_API_KEY), set WANDB_MODE=offline to log without an account "
                f"(`wandb sync` uploads later), or leave wandb out of logger.backends."
            ) from exc
        id_file.write_text(self.run.id)
        self.generations: Any = None  # the table of validation generations, one row per validation

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def log_artifact(self, path: str) -> None:
        file = Path(path)
        if file.suffix == ".png":
            self.run.log({f"plots/{file.stem}": self.wandb.Image(str(file))})
        self.run.save(str(file), base_path=str(file.parent), policy="now")

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """``trainer.log_val_generations`` as verl's wandb logger shows them: the table ``val/generations``, one row
        per validation (step, then input_i, output_i, score_i of each generation), re-logged whole each time."""
        columns = ["step"] + [f"{c}_{i + 1}" for i in range(len(rows)) for c in ("input", "output", "score")]
        table = self.wandb.Table(columns=columns, data=self.generations.data if self.generations is not None else [])
        table.add_data(step, *[r[c] for r in rows for c in ("input", "output", "score")])
        self.run.log({"val/generations": table}, step=step)
        self.generations = table

    def close(self) -> None:
        self.close_as("finished")

    def close_as(self, outcome: str) -> None:
        """A run that did not finish ends with exit code 1: wandb shows it as failed."""
        self.run.finish(exit_code=0 if outcome == "finished" else 1)


@hookimpl
def rlforge_register(registry):
    registry.logger.register("wandb", WandbLogger, description="Weights & Biases (pip install wandb; WANDB_MODE=offline)")
