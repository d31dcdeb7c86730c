"""``jsonl`` and ``csv`` loggers: the metrics as plain files in the run folder, no dependency.

``<run>/metrics.jsonl``: one JSON object per logged metrics dict (``{"step": 3, "time": ..., "critic/score/mean":
0.41, ...}``), appended as it comes. ``<run>/metrics.csv``: one row per logged metrics dict under a header of every
metric name seen so far (a new name, e.g. the first validation's, rewrites the file with the wider header; a row
without a metric leaves its cell empty). A resumed run appends to both, so a step logged before the interruption
and again after it has two records: the later one counts. The run's config is ``<run>/config.yaml`` already.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path
from typing import Any

from rlforge import diskio
from rlforge.hookspecs import hookimpl

JSONL = "metrics.jsonl"
CSV = "metrics.csv"
FIRST = ("step", "time")  # the columns every record starts with


def _number(value: float) -> float | None:
    """A metric as JSON can hold it: NaN and infinities (a diverged loss) become null."""
    value = float(value)
    return value if math.isfinite(value) else None


class JsonlLogger:
    """Appends each metrics dict to ``<run_dir>/metrics.jsonl`` (flushed per record)."""

    def __init__(self, config: Any, run_dir: str) -> None:
        self.path = Path(run_dir) / JSONL
        self.file = diskio.open_text(self.path, append=True)

    def log_params(self, params: dict[str, Any]) -> None:
        pass  # the run's config.yaml holds them

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, "time": time.time(), **{k: _number(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def log_artifact(self, path: str) -> None:
        pass

    def close(self) -> None:
        self.file.close()


class CsvLogger:
    """Writes each metrics dict as a row of ``<run_dir>/metrics.csv`` (columns: step, time, then every metric name
    in the order first seen)."""

    def __init__(self, config: Any, run_dir: str) -> None:
        self.path = Path(run_dir) / CSV
        diskio.refuse_links(self.path)
        self.columns: list[str] = []
        if self.path.is_file():  # a resumed run: keep its columns
            with self.path.open(newline="", encoding="utf-8") as fh:
                self.columns = next(csv.reader(fh), [])

    def log_params(self, params: dict[str, Any]) -> None:
        pass  # the run's config.yaml holds them

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        new = [k for k in row if k not in self.columns]
        if new:
            self._widen(new)
        with diskio.open_text(self.path, append=True) as fh:
            csv.DictWriter(fh, self.columns, restval="", lineterminator="\n").writerow(row)

    def _widen(self, new: list[str]) -> None:
        """Rewrite the file with ``new`` columns added to the header (atomically: a crash keeps the old file)."""
        rows: list[dict[str, str]] = []
        if self.path.is_file():
            with self.path.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
        self.columns = [*FIRST, *(c for c in self.columns if c not in FIRST), *(c for c in new if c not in FIRST)]
        text = io.StringIO()
        writer = csv.DictWriter(text, self.columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        diskio.write_atomic(self.path, text.getvalue())

    def log_artifact(self, path: str) -> None:
        pass

    def close(self) -> None:
        pass


@hookimpl
def rlforge_register(registry):
    registry.logger.register("jsonl", JsonlLogger, description="every metrics dict appended to <run>/metrics.jsonl")
    registry.logger.register("csv", CsvLogger, description="the metrics as rows of <run>/metrics.csv")
