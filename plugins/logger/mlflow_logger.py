"""``mlflow`` logger: a sqlite tracking store inside the run folder, asynchronous metric logging."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rlforge.hookspecs import hookimpl


def tracking_uri(run_dir: str) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MlflowLogger:
    """Logs params, metrics (async) and artifacts to ``<run_dir>/mlflow.db`` + ``<run_dir>/mlartifacts``.

    Resuming a run continues the same mlflow run (its id is kept in ``<run_dir>/mlflow_run_id``).
    """

    def __init__(self, config: Any, run_dir: str) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "true")
        import mlflow

        self.mlflow = mlflow
        self.uri = tracking_uri(run_dir)
        mlflow.set_tracking_uri(self.uri)
        artifacts = (Path(run_dir).resolve() / "mlartifacts").as_uri()
        name = config.trainer.project
        if mlflow.get_experiment_by_name(name) is None:
            mlflow.create_experiment(name, artifact_location=artifacts)
        mlflow.set_experiment(name)
        id_file = Path(run_dir) / "mlflow_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        self.run = mlflow.start_run(run_id=run_id, run_name=f"{config.trainer.experiment}/{Path(run_dir).name}")
        id_file.write_text(self.run.info.run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        flat = {k: str(v)[:6000] for k, v in flatten(params).items()}
        existing = self.mlflow.get_run(self.run.info.run_id).data.params
        self.mlflow.log_params({k: v for k, v in flat.items() if k not in existing}, synchronous=False)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({mlflow_name(k): float(v) for k, v in metrics.items()}, step=step, synchronous=False)

    def log_artifact(self, path: str) -> None:
        self.mlflow.log_artifact(path)

    def close(self) -> None:
        self.mlflow.end_run()


def mlflow_name(name: str) -> str:
    """The metric name as mlflow stores it: mlflow allows letters, digits and ``_-. :/`` only, so ``@`` becomes
    ``_at_`` (``val-core/gsm8k/acc/mean@4`` -> ``val-core/gsm8k/acc/mean_at_4``, as verl's mlflow logger writes it)
    and any other character ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", name.replace("@", "_at_"))


@hookimpl
def rlforge_register(registry):
    registry.logger.register("mlflow", MlflowLogger, description="mlflow, sqlite store inside the run folder")
