"""What the swanlab and trackio loggers share: both libraries hand back a run object with ``log(dict, step)`` and
``finish()`` and an ``Image`` type, so metrics, plots and the end of the run go through them the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class RunApiLogger:
    """A logger over a library's run object: subclasses set ``self.lib`` (the imported library, for ``Image``) and
    ``self.run`` (its run) in ``__init__``."""

    lib: Any
    run: Any
    step: int = 0  # the last step logged: plots go to it

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.step = step
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def log_artifact(self, path: str) -> None:
        file = Path(path)
        if file.suffix == ".png":
            self.run.log({f"plots/{file.stem}": self.lib.Image(str(file))}, step=self.step)

    def close(self) -> None:
        self.run.finish()
