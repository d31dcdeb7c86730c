"""``swanlab`` logger (optional): SwanLab, online, offline or local.

``pip install 'rlforge[swanlab]'``. ``logger.swanlab.mode`` (or ``SWANLAB_MODE``) picks where the run goes:
``online`` (SwanLab's cloud, after ``swanlab login``), ``offline`` (files in ``<run>/swanlog``, uploaded later with
``swanlab sync <run>/swanlog/run-*``), ``local`` (the same files, viewed with ``swanlab watch <run>/swanlog``; needs
``pip install 'swanlab[dashboard]'``) or ``disabled``. The SwanLab run id is kept in ``<run>/swanlab_run_id``, so
a resumed run continues the same SwanLab run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import
from rlforge.plugins.logger.run_api import RunApiLogger

RUN_ID_FILE = "swanlab_run_id"


@dataclass
class SwanlabConfig:
    """The ``swanlab`` logger (``logger.backends`` contains ``swanlab``)."""

    mode: Optional[str] = None  # online | offline | local | disabled; None = $SWANLAB_MODE, else SwanLab's default (online)
    project: Optional[str] = None  # the SwanLab project; None = trainer.project
    workspace: Optional[str] = None  # an organisation's workspace; None = your own
    log_dir: Optional[str] = None  # where the run's files go; None = <run>/swanlog


class SwanlabLogger(RunApiLogger):
    """Logs params (the run config), metrics (same names as every other logger) and PNG artifacts to SwanLab."""

    def __init__(self, config: Any, run_dir: str) -> None:
        self.lib = swanlab = optional_import("swanlab", "logger.backends includes 'swanlab'",
                                                 "pip install 'rlforge[swanlab]'")
        folder = Path(run_dir)
        s = config.get("logger", {}).get("swanlab", {}) or {}
        id_file = folder / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        self.run = swanlab.init(
            project=s.get("project") or config.trainer.project, workspace=s.get("workspace"),
            name=f"{config.trainer.experiment}/{folder.name}", mode=s.get("mode"),
            log_dir=str(s.get("log_dir") or folder / "swanlog"), id=run_id, resume="allow" if run_id else None,
            reinit=True,
        )
        id_file.write_text(self.run.id)

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params)


@hookimpl
def rlforge_register(registry):
    registry.logger.register("swanlab", SwanlabLogger, config=SwanlabConfig,
                             description="SwanLab (pip install 'rlforge[swanlab]'; logger.swanlab.mode=offline)")
