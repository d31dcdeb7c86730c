"""Several teachers (MOPD) for on-policy distillation (``algorithms/distill.py``): each row goes to the teacher that
``algorithm.teacher.routes`` names for its ``algorithm.teacher.route_by`` value (``data_source``, or a field of the
row's ``extra_info``), compared as text (``str`` of the value: ``1`` -> ``'1'``, ``True`` -> ``'True'``).

The training prompts are checked when they load (every value has a teacher, else an error naming the file and row),
the rows of each step again in the driver (rows from elsewhere: an agent loop's), and the teacher ranks route them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlforge import batch as B
from rlforge.errors import ConfigError, DataError

EXTRA_INFO_FIELD = f"{B.EXTRA_INFO}."  # algorithm.teacher.route_by=extra_info.<name>: a field of the row's extra_info


def validate_routes(teacher: Any) -> None:
    """``algorithm.teacher``'s routes: exclusive with ``path``, keys non-empty, values model paths, ``route_by`` a
    field rows have and read only with routes."""
    routes, by = teacher.routes, teacher.route_by
    if by != B.DATA_SOURCE and not (by.startswith(EXTRA_INFO_FIELD) and len(by) > len(EXTRA_INFO_FIELD)):
        raise ConfigError(f"algorithm.teacher.route_by={by!r}: a row's teacher is picked by {B.DATA_SOURCE} or "
                          f"{EXTRA_INFO_FIELD}<name> (a field of the row's extra_info).")
    if not routes:
        if by != B.DATA_SOURCE:
            raise ConfigError(f"algorithm.teacher.route_by={by} is read only with algorithm.teacher.routes (several "
                              f"teachers); with one teacher (algorithm.teacher.path) every row goes to it.")
        return
    if teacher.path:
        raise ConfigError(f"algorithm.teacher.path ({teacher.path}) and algorithm.teacher.routes ({dict(routes)}) are "
                          f"both set: one teacher (path) or one per route (routes), not both.")
    for key, path in routes.items():
        if key == "":
            raise ConfigError("algorithm.teacher.routes has an empty key: every route names a value of "
                              f"{by} (a row whose value is empty has no teacher).")
        if not isinstance(path, str) or not path:
            raise ConfigError(f"algorithm.teacher.routes[{key!r}] is {path!r}: each route names its teacher's causal LM "
                              f"(a folder, Hub id, builtin:NAME, run or checkpoint). A key with dots must be written "
                              f"in the mapping form, e.g. \"algorithm.teacher.routes={{{key}.x: MODEL}}\", not as "
                              f"algorithm.teacher.routes.{key}.x=MODEL (which nests it).")


def route_value(data_source: Any, extra_info: Any, route_by: str) -> str | None:
    """One row's ``route_by`` value as text; None where it has none."""
    if route_by == B.DATA_SOURCE:
        value = data_source
    else:
        value = extra_info.get(route_by[len(EXTRA_INFO_FIELD):]) if isinstance(extra_info, dict) else None
    return None if value is None else str(value)


def route_problem(data_source: Any, extra_info: Any, teacher: Any) -> str:
    """'' when the row has a teacher in ``routes``, else what keeps it from one (for an error message)."""
    by, routes = teacher.route_by, teacher.routes
    value = route_value(data_source, extra_info, by)
    if value in routes:
        return ""
    if by != B.DATA_SOURCE:
        name = by[len(EXTRA_INFO_FIELD):]
        if not isinstance(extra_info, dict):
            return f"has no extra_info (route_by={by})" if extra_info is None else \
                f"has an extra_info that is a {type(extra_info).__name__}, not a mapping (route_by={by})"
        if name not in extra_info:
            return f"has no field '{name}' in its extra_info (its fields: {sorted(extra_info)}; route_by={by})"
    return f"has {by}={value!r}, for which algorithm.teacher.routes names no teacher (its keys: {sorted(routes)})"


HINT = "add a teacher for it to algorithm.teacher.routes, or route by another field (algorithm.teacher.route_by)"


def check_prompt_routes(prompts: list[Any], rows: Any, name: str, teacher: Any) -> None:
    """Every loaded prompt (``rlforge.data.Prompt``) has a teacher, else a DataError naming its file and row."""
    from rlforge.data import row_origin

    for p in prompts:
        problem = route_problem(p.data_source, p.extra_info, teacher)
        if problem:
            where = (row_origin(rows[p.index], p.index, name) if isinstance(rows, Sequence)  # hf's rows too
                     else f"{name}, row {p.index + 1}")
            raise DataError(f"{where}: the row {problem}: {HINT}.")


def check_batch_routes(batch: B.Batch, teacher: Any) -> None:
    """Every row of a step's batch has a teacher, else a DataError naming the first one without."""
    sources = batch[B.DATA_SOURCE] if B.DATA_SOURCE in batch else [None] * len(batch)
    infos = batch[B.EXTRA_INFO] if B.EXTRA_INFO in batch else [None] * len(batch)
    for i, (source, info) in enumerate(zip(sources, infos)):
        problem = route_problem(source, info, teacher)
        if problem:
            uid = batch[B.UID][i] if B.UID in batch else None
            raise DataError(f"A row of this step (uid {uid!r}, data_source {source!r}) {problem}: {HINT}.")
