"""Built-in datasets: ``arith`` (generated offline, seeded) and ``files`` (verl-style jsonl/parquet)."""

from __future__ import annotations

import io
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.capabilities import DatasetCapabilities
from rlforge.config.schema import option
from rlforge.data import SAVED_DATASET_FILE, data_file_problem
from rlforge.errors import DataError
from rlforge.hookspecs import hookimpl

ARITH_SOURCE = "arith"
UTF8_CHUNK = 1 << 22  # bytes (then to the end of the line) checked at a time for UTF-8


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
        return _parquet_rows(path)
    if file.suffix not in (".jsonl", ".json"):
        raise DataError(f"Data file {path}: unsupported extension '{file.suffix}' (use .jsonl, .json or .parquet).")
    rows = list(json_rows(path))
    if not rows:
        raise DataError(f"Data file {path} has no rows.")
    return rows


def _parquet_rows(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise DataError(f"Cannot read parquet file {path}: {exc}") from None
    if table.num_rows == 0:
        raise DataError(f"Data file {path} has no rows: the parquet table is empty (columns: "
                        f"{', '.join(table.column_names) or 'none'}).")
    return table.to_pylist()


def json_rows(path: str) -> Iterator[dict[str, Any]]:
    """The rows of a ``.jsonl``/``.json`` file, one at a time: JSON lines (blank lines skipped) or, in a ``.json``
    file, one JSON array of objects; a leading UTF-8 BOM is skipped. Errors name the file and line, and a key written
    twice in one object is one."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            yield from _json_file_rows(path, fh.read()) if path.endswith(".json") else _line_rows(path, fh)
    except UnicodeDecodeError as exc:
        problem = utf8_problem(path) or f"{path} is not UTF-8 text ({exc.reason})"
        raise DataError(f"{problem}.") from None


def _json_file_rows(path: str, text: str) -> Iterable[dict[str, Any]]:
    """A ``.json`` file's rows: a JSON array of objects, or JSON lines."""
    if not text.lstrip().startswith("["):
        return _line_rows(path, io.StringIO(text))
    try:
        rows = DECODER.decode(text)
    except ValueError as exc:
        raise _unread(exc, path, text) from None
    bad = next((i for i, r in enumerate(rows, 1) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{path}, item {bad}: a row must be a JSON object.")
    if not rows:
        raise DataError(f"Data file {path} has no rows: the JSON array is empty.")
    return rows


def _line_rows(path: str, lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The rows of JSON lines, one object a line (blank lines skipped)."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = DECODER.decode(line)
        except ValueError as exc:
            raise _unread(exc, f"{path}, line {lineno}", line) from None
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {lineno}: a row must be a JSON object, got {type(row).__name__}.")
        yield row


class DuplicateKey(ValueError):
    """A JSON object that writes ``key`` twice (``json`` would keep the last value, silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) < len(pairs):
        raise DuplicateKey(next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1))
    return obj


DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)  # json.loads, refusing a key written twice in an object


def _unread(exc: ValueError, where: str, text: str) -> DataError:
    """Why ``text`` (JSON at ``where``: the file, and the line of a JSON lines file) was not read, in words."""
    if isinstance(exc, DuplicateKey):
        return DataError(f"{where}: the key '{exc.key}' is written twice in one object; a JSON reader keeps only one "
                         f"of its values, so the row is not read as written. Keep one.")
    if isinstance(exc, json.JSONDecodeError):
        at = f" at line {exc.lineno}" if "\n" in text.rstrip() else ""  # a whole file: where in it
        return DataError(f"{where}: not valid JSON ({exc.msg}{at}).")
    return DataError(f"{where}: not valid JSON ({exc}).")  # such as an integer of more digits than Python reads


def utf8_problem(path: str) -> str | None:
    """Where ``path`` stops being UTF-8 text, in words (its first bad byte and line), or None."""
    offset = lines = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(UTF8_CHUNK) + fh.readline():  # whole lines: no character is cut in two
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = lines + chunk.count(b"\n", 0, exc.start) + 1
                return f"{path} is not UTF-8 text ({exc.reason} at byte {offset + exc.start}, line {line})"
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
    return None


def check_ground_truth(row: dict[str, Any], where: str) -> None:
    """Refuse a NaN ``reward_model.ground_truth`` (JSON's ``NaN``, a float column's gap): no answer can match it."""
    reward = row.get("reward_model")
    truth = reward.get("ground_truth") if isinstance(reward, dict) else None
    if isinstance(truth, float) and math.isnan(truth):
        raise DataError(f"{where}: reward_model.ground_truth is NaN, which no answer matches. Write the row's ground "
                        f"truth (as a string: \"5\"), or leave the row out.")


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
            check_ground_truth(row, row["_origin"])
            rows.append(row)
    return rows


@hookimpl
def rlforge_register(registry):
    registry.dataset.register("arith", arith_dataset, config=ArithConfig,
                              description="built-in 'What is a+b?' task, generated offline")
    registry.dataset.register("files", files_dataset, description="verl-style rows from data.train_files/val_files",
                              capabilities=DatasetCapabilities(reads_data_files=True))
