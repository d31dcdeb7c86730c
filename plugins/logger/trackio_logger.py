"""``trackio`` logger (optional): Hugging Face's trackio, a local sqlite store with a dashboard.

``pip install 'rlforge[trackio]'``. Runs go into trackio's local store (``TRACKIO_DIR``, by default
``~/.cache/huggingface/trackio``), one database per project, so every run of a project is compared in
``trackio show --project NAME``; ``logger.trackio.space_id`` (or ``TRACKIO_SPACE_ID``) logs to a Hugging Face
Space instead. The trackio run is named ``<trainer.experiment>/<run folder>``, so a resumed run continues it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import
from rlforge.plugins.logger.run_api import RunApiLogger


@dataclass
class TrackioConfig:
    """The ``trackio`` logger (``logger.backends`` contains ``trackio``)."""

    project: Optional[str] = None  # the trackio project (one database in TRACKIO_DIR); None = trainer.project
    space_id: Optional[str] = None  # a Hugging Face Space (user/name) to log to; None = $TRACKIO_SPACE_ID, else local only
    group: Optional[str] = None  # a group of runs in the dashboard; None = none


class TrackioLogger(RunApiLogger):
    """Logs params (the run config), metrics (same names as every other logger) and PNG artifacts to trackio."""

    def __init__(self, config: Any, run_dir: str) -> None:
        self.lib = trackio = optional_import("trackio", "logger.backends includes 'trackio'",
                                                 "pip install 'rlforge[trackio]'")
        from omegaconf import OmegaConf

        s = config.get("logger", {}).get("trackio", {}) or {}
        self.run = trackio.init(
            project=s.get("project") or config.trainer.project, name=f"{config.trainer.experiment}/{Path(run_dir).name}",
            space_id=s.get("space_id"), group=s.get("group"), config=OmegaConf.to_container(config, resolve=True),
            resume="allow", auto_log_gpu=False, auto_log_cpu=False,
        )

    def log_params(self, params: dict[str, Any]) -> None:
        pass  # trackio takes the run's config when the run starts (above)


@hookimpl
def rlforge_register(registry):
    registry.logger.register("trackio", TrackioLogger, config=TrackioConfig,
                             description="trackio's local store (pip install 'rlforge[trackio]'; TRACKIO_DIR)")
