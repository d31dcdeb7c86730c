"""What the mlflow clients of RL runs (``rlforge.plugins.logger.mlflow_logger``) and SFT runs (Lightning's
``MLFlowLogger``, ``rlforge.sft.outputs``) share: mlflow's ``set_tracking_uri`` and ``set_experiment`` export the store
and the experiment to the environment (for child processes), and the next run in the process, or any child, would
then log into this run's store. They run inside :func:`environment_kept`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

MLFLOW_ENVIRONMENT = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")


@contextlib.contextmanager
def environment_kept(names: tuple[str, ...] = MLFLOW_ENVIRONMENT) -> Iterator[None]:
    """Restore these environment variables (set, changed or removed inside) on exit."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
