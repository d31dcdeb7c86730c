"""``plots`` plugin: at the end of a run, PNG curves of reward, accuracy, response length, KL and entropy.

They are written to ``<run_dir>/plots/`` and handed to every logger's ``log_artifact`` (mlflow stores them with
the run; tensorboard shows them as images). Validation metrics are collected as they come. Switch it off
with ``'plugins.disable=[rlforge.plugins.logger.plots]'``; ``rlforge report RUN_DIR`` redraws the plots from
the run's mlflow store.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from rlforge.hookspecs import hookimpl
from rlforge.tools.plots import PLOT_DIR, series_from_history, write_plots

_validations: WeakKeyDictionary[Any, list[tuple[int, dict[str, float]]]] = WeakKeyDictionary()


@hookimpl
def rlforge_validation_end(trainer, step, metrics):
    _validations.setdefault(trainer, []).append((step, dict(metrics)))


@hookimpl
def rlforge_fit_end(trainer):
    series = series_from_history(trainer.history, _validations.pop(trainer, []))
    for path in write_plots(series, trainer.run_dir / PLOT_DIR):
        for logger in trainer.loggers:
            logger.log_artifact(str(path))
