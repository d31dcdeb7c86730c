"""JSON files read through Hugging Face ``datasets`` (``data.name=hf``) keep every value as written, or are refused.

datasets' json builder gives each column one Arrow type: a column of several types is kept as JSON text (a string
that parses as JSON reads back parsed: ``"007"`` as 7), integers in a float column read back as floats, date-like
strings as datetimes. :func:`check_json` finds the columns where that can happen and, only for those, reads the file
again in Python and refuses it at the first value read back changed, naming the row, the column and its types.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import DataError
from rlforge.plugins.data.builtin import check_ground_truth, json_rows


KEPT_DTYPES = frozenset({"string", "large_string", "int64", "bool", "null"})  # columns that read JSON back as written
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _changeable(feature: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The columns (key paths, 0 for a list's items) whose values datasets' json builder may read back changed: a
    column of several types, kept as JSON text (a string that parses as JSON reads back parsed: '007' as 7), a float
    column (an integer reads back as a float) or a timestamp column (a string reads back as a datetime)."""
    import datasets

    if isinstance(feature, dict):
        return [p for key, inner in feature.items() for p in _changeable(inner, (*path, key))]
    if isinstance(feature, (list, datasets.List, datasets.LargeList)):
        return _changeable(feature[0] if isinstance(feature, list) else feature.feature, (*path, 0))
    return [] if isinstance(feature, datasets.Value) and feature.dtype in KEPT_DTYPES else [path]


def _at(value: Any, path: tuple[Any, ...]) -> list[Any]:
    """The values at ``path`` in ``value``: a key of an object (None where it is missing), 0 each item of a list."""
    if not path:
        return [value]
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        return [v for item in value for v in _at(item, rest)] if isinstance(value, list) else []
    return _at(value.get(key) if isinstance(value, dict) else None, rest)


def _same(written: Any, read: Any) -> bool:
    """Whether ``read`` is ``written``: equal, and of its type, in every item and value (NaN reads back as NaN)."""
    if type(written) is not type(read):
        return False
    if isinstance(written, dict):
        return written.keys() == read.keys() and all(_same(v, read[k]) for k, v in written.items())
    if isinstance(written, list):
        return len(written) == len(read) and all(map(_same, written, read))
    return bool(written == read or (written != written and read != read))


def check_json(path: str, rows: Any) -> None:
    """Refuse a JSON file of which datasets reads a value back other than as written (:func:`_changeable`), naming the
    row, the column and a row of each of its types. Where a column can change, the file is read again in Python, row
    by row, which also refuses what ``data.name=files`` refuses (a NaN ground truth; a key written twice in an object,
    which datasets drops where it re-encodes a row of mixed columns)."""
    columns = _changeable(rows.features)
    if not columns:
        return
    types: dict[tuple[Any, ...], dict[str, int]] = {c: {} for c in columns}  # column -> JSON type -> its first row
    changed = _first_changed(path, rows, columns, types)
    if changed:
        raise _changed_error(path, *changed, types[changed[1]])


def _first_changed(path: str, rows: Any, columns: list[tuple[Any, ...]], types: dict[tuple[Any, ...], dict[str, int]]
                   ) -> tuple[int, tuple[Any, ...], Any, Any] | None:
    """The first value of ``columns`` read back changed, as (row, column, written, read), or None; ``types`` gets each
    column's JSON types, with the row where each is first."""
    from rlforge.plugins.data.hf_datasets import READ_BATCH

    table = rows.select_columns(sorted({c[0] for c in columns}))
    read = (dict(zip(b, values)) for b in table.iter(batch_size=READ_BATCH) for values in zip(*b.values()))
    changed = None
    for n, (back, written) in enumerate(zip(read, json_rows(path)), 1):  # as many rows as were read (max_*_rows)
        check_ground_truth(written, f"{path}, row {n}")
        for column in columns:
            for value, got in zip(_at(written, column), _at(back, column)):
                if value is not None:
                    types[column].setdefault(JSON_TYPES.get(type(value), type(value).__name__), n)
                if changed is None and not _same(value, got):
                    changed = (n, column, value, got)
    return changed


def _changed_error(path: str, row: int, column: tuple[Any, ...], written: Any, read: Any, types: dict[str, int]
                   ) -> DataError:
    """The error for a value read back changed: the row, the column, its types and what to do."""
    name = "".join("[]" if isinstance(k, int) else f".{k}" for k in column).lstrip(".")
    fix = (f"Write every value of '{name}' as one JSON type (a ground truth as a string: \"5\", not 5), or read the "
           f"file with data.name=files" if len(types) > 1 else "Read the file with data.name=files")
    held = ", ".join(f"{kind} (row {n})" for kind, n in types.items())
    return DataError(f"{path}, row {row}: datasets would read {written!r} (column '{name}') back as {read!r}: its JSON "
                     f"reader gives a column one type, and this one holds {held}. {fix}, which keeps each value as "
                     f"written.")
