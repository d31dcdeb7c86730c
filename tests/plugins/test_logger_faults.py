"""The mlflow logger when its store cannot be written: a full disk or a file-size limit mid-run stops the run
with one message naming the store (never metrics lost silently), and a store that is a link is refused."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlforge.diskio import WriteFailure
from rlforge.errors import RLForgeError

CONFIG = OmegaConf.create({"trainer": {"project": "p", "experiment": "e"}})


class _Ops:
    """mlflow's RunOperations: wait() raises what the background write raised."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def wait(self) -> None:
        if self.error is not None:
            raise self.error


def _fake_mlflow(fail_from_step: int, error: Exception) -> types.ModuleType:
    """An mlflow whose asynchronous metric writes fail from ``fail_from_step`` on (as its store would)."""
    m = types.ModuleType("mlflow")
    m.MlflowException = type("MlflowException", (Exception,), {})
    run = types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"), data=types.SimpleNamespace(params={}))
    m.logged = []
    m.set_tracking_uri = m.set_experiment = m.end_run = lambda *a, **k: None
    m.get_experiment_by_name = lambda name: object()
    m.start_run = lambda **k: run
    m.get_run = lambda run_id: run
    m.log_params = lambda params, synchronous: _Ops(None)

    def log_metrics(metrics, step, synchronous):
        m.logged.append(step)
        return _Ops(error if step >= fail_from_step else None)

    m.log_metrics = log_metrics
    return m


@pytest.fixture
def logger_with(monkeypatch, tmp_path):
    def make(fail_from_step: int, error: Exception):
        from rlforge.plugins.logger.mlflow_logger import MlflowLogger

        monkeypatch.setitem(sys.modules, "mlflow", _fake_mlflow(fail_from_step, error))
        return MlflowLogger(CONFIG, str(tmp_path))
    return make


def test_a_failed_async_write_stops_at_the_next_step_naming_the_store(logger_with, tmp_path):
    lg = logger_with(2, Exception("(sqlite3.OperationalError) database or disk is full"))
    lg.log_params({"a": 1})
    lg.log_metrics({"x": 1.0}, 1)
    lg.log_metrics({"x": 2.0}, 2)  # fails in the background
    with pytest.raises(WriteFailure) as err:
        lg.log_metrics({"x": 3.0}, 3)
    msg = str(err.value)
    assert msg.startswith(f"Cannot write the metrics of step 2 into {tmp_path.resolve() / 'mlflow.db'}: No space left "
                          f"on device (mlflow: sqlite3.OperationalError: database or disk is full).")
    assert "free there" in msg and "trainer.resume=auto" in msg


def test_the_last_write_is_checked_before_the_summary(logger_with, tmp_path):
    from rlforge.plugins.logger.mlflow_logger import rlforge_fit_end

    lg = logger_with(1, Exception("(sqlite3.OperationalError) some other sqlite failure"))
    lg.log_metrics({"x": 1.0}, 1)
    with pytest.raises(WriteFailure, match=r"Cannot write the metrics of step 1 into .*mlflow.db: mlflow: "
                                           r"sqlite3.OperationalError: some other sqlite failure\. The store lacks"):
        rlforge_fit_end(trainer=types.SimpleNamespace(loggers=[lg]), module=None, summary={})
    lg.close()  # nothing pending any more: closes quietly


def test_a_store_that_is_a_symlink_is_refused(logger_with, tmp_path):
    target = tmp_path / "elsewhere.db"
    target.write_text("precious")
    (tmp_path / "mlflow.db").symlink_to(target)
    with pytest.raises(RLForgeError, match=r"Refusing to write .*mlflow.db: it is a symbolic link \(to .*elsewhere"):
        logger_with(1, Exception("unused"))
    assert target.read_text() == "precious"


REAL_STORE = """
import resource, sys
from omegaconf import OmegaConf
from rlforge.diskio import WriteFailure
from rlforge.plugins.logger.mlflow_logger import MlflowLogger
from pathlib import Path
run = Path(sys.argv[1])
lg = MlflowLogger(OmegaConf.create({"trainer": {"project": "p", "experiment": "e"}}), str(run))
lg.log_params({"a": 1})
lg.log_metrics({"x": 0.0}, 0)
lg.flush()
size = (run / "mlflow.db").stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 4096, resource.RLIM_INFINITY))  # ulimit -f just above the store
try:
    for step in range(1, 200):
        lg.log_metrics({f"m{i}": float(step) for i in range(100)}, step)
    lg.flush()
except WriteFailure as exc:
    print("ERROR", exc)
"""


@pytest.mark.slow  # a real sqlite store: mlflow's migrations take ~5 s
def test_a_real_store_over_the_file_size_limit(tmp_path):
    done = subprocess.run([sys.executable, "-c", REAL_STORE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "true"})
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("ERROR Cannot write the metrics of step "), done.stdout + done.stderr
    assert f"into {tmp_path.resolve() / 'mlflow.db'}: {os.strerror(errno.EFBIG)}" in line
    assert "(mlflow: sqlite3.OperationalError: disk I/O error). The file-size limit of this process (ulimit -f) is" \
           in line and "and the store has grown to" in line
    assert "Traceback" not in done.stderr  # mlflow's own logging of the failure is replaced by the one error
