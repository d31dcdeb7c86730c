"""``mlflow`` logger: the tracking store of ``logger.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a
sqlite store inside the run folder; asynchronous metric logging.

mlflow's asynchronous logging writes in a background thread, and a write that fails there (a full disk, a
file-size limit) is only logged by mlflow: the run would go on, and end pointing at a store that lacks its
metrics. So each step waits for the previous step's write (done by then: it costs nothing) and the end of the
run (``rlforge_fit_end``, before the summary) waits for the last one; a failed write stops the run with one
message naming the store, what failed and the space there (``rlforge.diskio``). A ``mlflow.db`` that is a link
is refused: sqlite would write into the link's target.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rlforge import diskio, reach
from rlforge.capabilities import LoggerCapabilities
from rlforge.errors import RLForgeError, first_line
from rlforge.hookspecs import hookimpl
from rlforge.tools.plots import MLFLOW_STORE_FILE, local_store, recorded_store
from rlforge.tracking import environment_kept

log = logging.getLogger("rlforge.logger")
# mlflow logs each failed asynchronous write with its traceback from its background thread; rlforge reports it
# as one error instead (every failed write stops the run)
MLFLOW_FAULT_LOGGERS = ("mlflow.utils.async_logging.async_logging_queue", "mlflow.store.db.utils")
STORE = "mlflow.db"
RUN_ID_FILE = "mlflow_run_id"
RESUME_HINT = ("samples.jsonl and the checkpoints are complete; free space, then continue with trainer.resume=auto, "
               "or drop mlflow from logger.backends.")


@dataclass
class MlflowConfig:
    """The ``mlflow`` logger (``logger.backends`` contains ``mlflow``)."""

    tracking_uri: Optional[str] = None  # the tracking store (http://host:5000, sqlite:///path/mlflow.db, databricks, ...); None = $MLFLOW_TRACKING_URI, else <run>/mlflow.db
    experiment: Optional[str] = None  # the mlflow experiment; None = $MLFLOW_EXPERIMENT_NAME, else trainer.project


def run_store(config: Any, run_dir: str) -> str:
    """The tracking URI a run logs into: ``logger.mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the
    run-local sqlite store."""
    section = config.get("logger", {}).get("mlflow", {}) or {}
    return section.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or local_store(run_dir)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    file = Path(uri.removeprefix("sqlite:///"))
    return file.parent.resolve() / file.name  # the file itself unresolved: a link there is refused, not followed


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MlflowLogger:
    """Logs params, metrics (async) and artifacts to the run's tracking store (:func:`run_store`).

    A sqlite store keeps the artifacts of the experiments it creates beside it (the run-local one in
    ``<run_dir>/mlartifacts``); a tracking server keeps them where it says. Resuming a run continues the same mlflow run (its id is kept in
    ``<run_dir>/mlflow_run_id``, its store in ``<run_dir>/mlflow_tracking_uri``): a resumed run pointed at another
    store starts a new mlflow run there.
    """

    capabilities = LoggerCapabilities(marks_outcome=True)  # close_as

    def __init__(self, config: Any, run_dir: str) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "true")
        import mlflow

        self.mlflow = mlflow
        for name in MLFLOW_FAULT_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        folder = Path(run_dir).resolve()
        self.uri = run_store(config, run_dir)
        self.store = sqlite_file(self.uri)
        if self.store is not None:
            diskio.refuse_links(self.store)  # sqlite would follow a link and write into its target
        self.pending: tuple[str, Any] | None = None  # (what, mlflow's RunOperations) of the last async write
        self.names: dict[str, str] = {}  # key -> its mlflow name in this run (_name)
        self.owners: dict[str, str] = {}  # mlflow name -> the key that has it
        section = config.get("logger", {}).get("mlflow", {}) or {}
        name = section.get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or config.trainer.project
        id_file, uri_file = folder / RUN_ID_FILE, folder / MLFLOW_STORE_FILE
        same_store = recorded_store(folder) == self.uri
        run_id = id_file.read_text().strip() if id_file.is_file() and same_store else None
        if id_file.is_file() and not same_store:
            log.warning("mlflow: this run logged into %s before; it now logs into %s, as a new mlflow run",
                        recorded_store(folder), self.uri)
        with _unusable_store(config, self.uri, mlflow.MlflowException), self._store_errors("open the mlflow store"), environment_kept():
            mlflow.set_tracking_uri(self.uri)
            if mlflow.get_experiment_by_name(name) is None:
                beside = {"artifact_location": (self.store.parent / "mlartifacts").as_uri()} if self.store else {}
                mlflow.create_experiment(name, **beside)  # a sqlite store keeps the artifacts beside it
            mlflow.set_experiment(name)
            self.run = mlflow.start_run(run_id=run_id, run_name=f"{config.trainer.experiment}/{folder.name}")
            diskio.write_atomic(id_file, self.run.info.run_id)
            diskio.write_atomic(uri_file, self.uri)

    def _name(self, key: str) -> str:
        """``mlflow_name(key)``, made distinct from the names other keys got in this run (two data sources may
        differ only in characters mlflow does not allow): a later key that would collide gets a hash of itself."""
        name = self.names.get(key)
        if name is None:
            name = mlflow_name(key)
            if self.owners.setdefault(name, key) != key:
                name = f"{name[:MLFLOW_NAME_LIMIT - 9]}_{_digest(key)}"
                self.owners[name] = key
            self.names[key] = name
        return name

    def log_params(self, params: dict[str, Any]) -> None:
        # names as mlflow allows them (a mapping's keys may be any text: algorithm.teacher.routes' data sources)
        flat = {self._name(k): str(v)[:6000] for k, v in flatten(params).items()}
        with self._store_errors("read the run's parameters"):
            existing = self.mlflow.get_run(self.run.info.run_id).data.params
        ops = self.mlflow.log_params({k: v for k, v in flat.items() if k not in existing}, synchronous=False)
        self._settle()
        self.pending = ("write the run's parameters", ops)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        ops = self.mlflow.log_metrics({self._name(k): float(v) for k, v in metrics.items()}, step=step,
                                      synchronous=False)
        self._settle()  # the previous write, finished by now; this one is checked at the next call or the end
        self.pending = (f"write the metrics of step {step}", ops)

    def flush(self) -> None:
        """Wait for the last asynchronous write. :raises diskio.WriteFailure: it failed."""
        self._settle()

    def _settle(self) -> None:
        if self.pending is None:
            return
        (what, ops), self.pending = self.pending, None
        if ops is not None:
            with self._store_errors(what, every=True):
                ops.wait()

    def _store_errors(self, what: str, every: bool = False) -> Any:
        return store_errors(what, self.store, every, self.uri)

    def log_artifact(self, path: str) -> None:
        self.mlflow.log_artifact(path)

    def close(self) -> None:
        self.close_as("finished")

    def close_as(self, outcome: str) -> None:
        """Ends the mlflow run as FINISHED, FAILED or KILLED (Ctrl-C, SIGTERM), as Lightning's mlflow logger does."""
        try:
            self._settle()
        except diskio.WriteFailure as exc:  # the run already stopped, or the end of the run reported it
            log.warning("%s", exc)
        finally:
            self.mlflow.end_run(status=outcome.upper())


@contextlib.contextmanager
def _unusable_store(config: Any, uri: str, refused: type[Exception]) -> Iterator[None]:
    """mlflow's refusal of the tracking store (``refused``, mlflow's error: not a URI it takes, a server it cannot
    reach) as one error naming where the store was given and what to give instead."""
    given = (config.get("logger", {}).get("mlflow", {}) or {}).get("tracking_uri")
    source = (f"logger.mlflow.tracking_uri={given}" if given else f"MLFLOW_TRACKING_URI={uri}"
              if os.environ.get("MLFLOW_TRACKING_URI") else f"the run's own store {uri}")
    advice = ("Give a tracking server (http://host:5000) or a database (sqlite:///path/mlflow.db) in "
              "logger.mlflow.tracking_uri, unset it and MLFLOW_TRACKING_URI for a store in the run folder, or leave "
              "mlflow out of logger.backends.")
    # a server that does not answer: mlflow's client retries it for minutes before it says so
    why = reach.silent(uri, 443 if uri.startswith("https://") else 80) if uri.startswith(("http://", "https://")) \
        else ""
    if why:
        raise RLForgeError(f"logger.backends includes 'mlflow', but its tracking server ({source}) does not answer: "
                           f"{why}. {advice}")
    try:
        yield
    except refused as exc:
        raise RLForgeError(
            f"logger.backends includes 'mlflow', but mlflow cannot use the tracking store ({source}): "
            f"{first_line(exc).split('. ')[0].rstrip('.')}. {advice}"
        ) from exc


NEARLY_FULL = 1 << 20  # bytes: a store this close to the file-size limit, or a disk with less free, is full


@contextlib.contextmanager
def store_errors(what: str, store: Path | None, every: bool = False, uri: str = "") -> Iterator[None]:
    """A failed write into the store as one ``WriteFailure`` naming the store and the cause; other errors pass,
    unless ``every`` (an asynchronous write, whose data is lost whatever the cause). ``store``: the sqlite file
    (None: a store elsewhere, named by ``uri``).

    sqlite reports a write that the file-size limit stopped as ``disk I/O error``: when the error does not say
    what failed, a store at the file-size limit or a disk with (almost) no space left is named as the cause."""
    try:
        yield
    except RLForgeError:
        raise
    except Exception as exc:
        code = _cause(exc, store) if store is not None else None
        if code is None and not every:
            raise
        said = _reason(str(exc)) or type(exc).__name__
        reason = f"{os.strerror(code)} (mlflow: {said})" if code is not None else f"mlflow: {said}"
        if store is None:
            space = ""
        elif code == errno.EFBIG and (limit := diskio.file_size_limit()) is not None and store.exists():
            space = (f"The file-size limit of this process (ulimit -f) is {diskio.size_words(limit)} and the store has "
                     f"grown to {diskio.size_words(store.stat().st_size)}: raise it (ulimit -f unlimited).")
        else:
            space = diskio.space_words(code, store.parent)
        raise diskio.WriteFailure(f"Cannot {what} into {store or uri}: {reason}.{' ' + space if space else ''} The "
                                  f"store lacks them from here on: {RESUME_HINT}") from None


def _reason(text: str) -> str:
    """The database's own words from mlflow's message (which wraps each failed async write in a list repr)."""
    found = re.search(r"\((sqlite3\.\w+)\) (.+?)(?:\\n|\n|'\)|$)", text)
    if found:
        return f"{found[1]}: {found[2]}"
    return (text.strip().splitlines() or [""])[0][:300]


def _cause(exc: BaseException, store: Path) -> int | None:
    """The errno of a failed write into the store, from the error or (for sqlite's 'disk I/O error') the disk."""
    found = diskio.failed_write(exc)
    if found is not None and found[0] is not None:
        return found[0]
    if "disk I/O error" not in str(exc):
        return None
    limit = diskio.file_size_limit()
    files = [p for p in (store, store.with_name(STORE + "-journal"), store.with_name(STORE + "-wal")) if p.exists()]
    if limit is not None and any(p.stat().st_size + NEARLY_FULL >= limit for p in files):
        return errno.EFBIG
    free = diskio.free_bytes(store.parent)
    return errno.ENOSPC if free is not None and free < NEARLY_FULL else None


MLFLOW_NAME_LIMIT = 250  # mlflow's longest metric or parameter name


def mlflow_name(name: str) -> str:
    """The metric (or parameter) name as mlflow stores it: mlflow allows letters, digits and ``_-. :/`` only, so ``@``
    becomes ``_at_`` (``val-core/gsm8k/acc/mean@4`` -> ``val-core/gsm8k/acc/mean_at_4``, as verl's mlflow logger
    writes it) and any other character ``_``; a name must also be a normalized path (no empty, ``.`` or ``..``
    segment: each becomes ``_``, so a data source ``gsm8k/`` or ``a//b`` is kept apart) and at most 250 characters
    (a longer one keeps its start and a hash of the whole)."""
    name = re.sub(r"[^\w\-. :/]", "_", name.replace("@", "_at_"))
    name = "/".join(part if part not in ("", ".", "..") else "_" for part in name.split("/"))
    name = f"_{name}" if name.startswith("..") else name  # mlflow refuses a name that starts with ..
    if len(name) > MLFLOW_NAME_LIMIT:
        name = f"{name[:MLFLOW_NAME_LIMIT - 9]}_{_digest(name)}"
    return name


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


@hookimpl
def rlforge_fit_end(trainer: Any, module: Any, summary: dict[str, Any]) -> None:
    """Before the summary points at the store: the last metrics are in it, or the run ends with the error. The
    summary (and ``summary.json``) names the store the run logged into."""
    for lg in getattr(trainer, "loggers", ()):
        if isinstance(lg, MlflowLogger):
            lg.flush()
            if summary.get("mlflow_uri") != lg.uri:  # the trainer names no store: a run without mlflow writes none
                summary["mlflow_uri"] = lg.uri
                diskio.write_atomic(Path(trainer.run_dir) / "summary.json", json.dumps(summary, indent=2))


@hookimpl
def rlforge_register(registry):
    registry.logger.register("mlflow", MlflowLogger, config=MlflowConfig,
                             description="mlflow: logger.mlflow.tracking_uri / $MLFLOW_TRACKING_URI, else a sqlite "
                                         "store inside the run folder")
