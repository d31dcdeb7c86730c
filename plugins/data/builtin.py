"""Built-in datasets: ``arith`` (generated offline, seeded) and ``files`` (verl-style jsonl/parquet)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

from rlforge.capabilities import DatasetCapabilities
from rlforge.config.schema import option
from rlforge.data import SAVED_DATASET_FILE, data_file_problem
from rlforge.errors import DataError
from rlforge.hookspecs import hookimpl

ARITH_SOURCE = "arith"


@dataclass
class ArithConfig:
    """The built-in arithmetic task (``data.name=arith``)."""

    train_size: int = option(20000, ge=1)  # training prompts
    val_size: int = option(200, ge=0)  # distinct held-out prompts, never seen in training
    max_operand: int = option(99, ge=1)  # operands a, b in 0..max_operand


def arith_rows(
    size: int, max_operand: int, seed: int, exclude: frozenset[str] = frozenset(), unique: bool = False
) -> list[dict[str, Any]]:
    """``size`` addition problems ``"What is a+b?"`` (a, b in 0..max_operand), verl row format.

    Questions in ``exclude`` are skipped; with ``unique`` no question repeats.
    """
    total = (max_operand + 1) ** 2
    if len(exclude) + (size if unique else 1) > total:
        raise DataError(f"Cannot draw {size} arith questions with operands up to {max_operand} (data.arith.max_operand).")
    return draw_rows(size, (0, max_operand), (0, max_operand), seed, exclude, unique, lambda a, b: {
        "data_source": ARITH_SOURCE,
        "prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"a": a, "b": b},
    })


def draw_rows(
    size: int, a_range: tuple[int, int], b_range: tuple[int, int], seed: int, exclude: frozenset[str], unique: bool,
    make: Callable[[int, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """``size`` rows ``make(a, b)`` for operands drawn (seeded) from the inclusive ranges; a row whose question (its
    first message) is in ``exclude`` is drawn again, and with ``unique`` no question repeats."""
    rng = random.Random(seed)
    seen = set(exclude)
    rows: list[dict[str, Any]] = []
    while len(rows) < size:
        row = make(rng.randint(*a_range), rng.randint(*b_range))
        text = row["prompt"][0]["content"]
        if text in seen:
            continue
        if unique:
            seen.add(text)
        rows.append(row)
    return rows


def arith_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """Train/val splits of the arithmetic task; validation questions never appear in training."""
    d = config.data.arith
    val = arith_rows(d.val_size, d.max_operand, seed=12345, unique=True)
    if split == "val":
        return val
    held_out = frozenset(r["prompt"][0]["content"] for r in val)
    return arith_rows(d.train_size, d.max_operand, seed=config.trainer.seed, exclude=held_out)


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl``/``.json`` or ``.parquet`` file; errors name the file and line."""
    file = Path(path)
    problem = data_file_problem(path)
    if problem:
        raise DataError(f"{problem}.")
    if (file / SAVED_DATASET_FILE).is_file():
        raise DataError(f"Data file {path} is a folder saved by Dataset.save_to_disk: data.name=files reads .jsonl, "
                        f".json and .parquet files; read the folder with data.name=hf (pip install "
                        f"'rlforge[datasets]', docs/data.md).")
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(file)
        except Exception as exc:
            raise DataError(f"Cannot read parquet file {path}: {exc}") from None
        if table.num_rows == 0:
            raise DataError(f"Data file {path} has no rows: the parquet table is empty (columns: "
                            f"{', '.join(table.column_names) or 'none'}).")
        return table.to_pylist()
    if file.suffix not in (".jsonl", ".json"):
        raise DataError(f"Data file {path}: unsupported extension '{file.suffix}' (use .jsonl, .json or .parquet).")
    rows = []
    try:
        if file.suffix == ".json" and file.read_text(encoding="utf-8").lstrip().startswith("["):
            rows = json.loads(file.read_text(encoding="utf-8"))
            bad = next((i for i, r in enumerate(rows, 1) if not isinstance(r, dict)), None)
            if bad is not None:
                raise DataError(f"{path}, item {bad}: a row must be a JSON object.")
            if not rows:
                raise DataError(f"Data file {path} has no rows: the JSON array is empty.")
            return rows
        with file.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}, line {lineno}: not valid JSON ({exc.msg}).") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}, line {lineno}: a row must be a JSON object, got {type(row).__name__}.")
                rows.append(row)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}).") from None
    if not rows:
        raise DataError(f"Data file {path} has no rows.")
    return rows


def files_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """Rows from ``data.train_files`` / ``data.val_files``, each row tagged with its file and line."""
    key = "data.train_files" if split == "train" else "data.val_files"
    files = config.data.train_files if split == "train" else config.data.val_files
    if not files:
        if split == "val":
            return []
        raise DataError(f"'{key}' is empty: give one or more .jsonl/.parquet files (data.name=files).")
    rows = []
    for path in files:
        for i, row in enumerate(read_rows(path), 1):
            row.setdefault("_origin", f"{path}, row {i}")
            rows.append(row)
    return rows


@hookimpl
def rlforge_register(registry):
    registry.dataset.register("arith", arith_dataset, config=ArithConfig,
                              description="built-in 'What is a+b?' task, generated offline")
    registry.dataset.register("files", files_dataset, description="verl-style rows from data.train_files/val_files",
                              capabilities=DatasetCapabilities(reads_data_files=True))
