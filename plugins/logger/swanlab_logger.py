"""``swanlab`` logger (optional): SwanLab, online, offline or local.

``pip install 'rlforge[swanlab]'``. ``logger.swanlab.mode`` (or ``SWANLAB_MODE``) picks where the run goes:
``online`` (SwanLab's cloud, after ``swanlab login``), ``offline`` (files in ``<run>/swanlog``, uploaded later with
``swanlab sync <run>/swanlog/run-*``), ``local`` (the same files, viewed with ``swanlab watch <run>/swanlog``; needs
``pip install 'swanlab[dashboard]'``) or ``disabled``. The SwanLab run id is kept in ``<run>/swanlab_run_id``, so
a resumed run continues the same SwanLab run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rlforge.config.schema import option
from rlforge.errors import RLForgeError, first_line
from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import
from rlforge.plugins.logger.run_api import RunApiLogger

RUN_ID_FILE = "swanlab_run_id"
MODES = ("online", "offline", "local", "disabled")  # swanlab's ModeType


@dataclass
class SwanlabConfig:
    """The ``swanlab`` logger (``logger.backends`` contains ``swanlab``)."""

    mode: Optional[str] = option(None, choices=MODES)  # where the run goes (docs/tracking.md); None = $SWANLAB_MODE, else SwanLab's default (online)
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
        env = os.environ.get("SWANLAB_MODE")
        if not s.get("mode") and env and env not in MODES:  # swanlab's own error is a pydantic dump
            raise RLForgeError(f"SWANLAB_MODE={env} is not a SwanLab mode: set it to one of {', '.join(MODES)}, or set "
                               f"logger.swanlab.mode (e.g. logger.swanlab.mode=offline), which wins over it.")
        try:
            self.run = swanlab.init(
                project=s.get("project") or config.trainer.project, workspace=s.get("workspace"),
                name=f"{config.trainer.experiment}/{folder.name}", mode=s.get("mode"),
                log_dir=str(s.get("log_dir") or folder / "swanlog"), id=run_id, resume="allow" if run_id else None,
                reinit=True,
            )
        except Exception as exc:  # no login and no TTY, no network, ...: swanlab has no error class of its own
            raise RLForgeError(
                f"logger.backends includes 'swanlab' ({_mode_words(s.get('mode'), env)}), but SwanLab could not start "
                f"a run: {first_line(exc) or type(exc).__name__} Log in (`swanlab login`, or SWANLAB_API_KEY), set "
                f"logger.swanlab.mode=offline to log without an account (`swanlab sync` uploads later), or leave "
                f"swanlab out of logger.backends."
            ) from exc
        id_file.write_text(self.run.id)

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params)


def _mode_words(mode: str | None, env: str | None) -> str:
    """Where the mode SwanLab ran in came from (``logger.swanlab.mode``, else ``SWANLAB_MODE``), for a message."""
    if mode:
        return f"logger.swanlab.mode={mode}"
    return f"SWANLAB_MODE={env}" if env else "logger.swanlab.mode unset: SwanLab's default, online"


@hookimpl
def rlforge_register(registry):
    registry.logger.register("swanlab", SwanlabLogger, config=SwanlabConfig,
                             description="SwanLab (pip install 'rlforge[swanlab]'; logger.swanlab.mode=offline)")
