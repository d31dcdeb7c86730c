"""The loggers beyond the defaults, each run for real: jsonl and csv files, SwanLab offline, trackio's local store,
mlflow's tracking store chosen by config or MLFLOW_TRACKING_URI; and the profiler plugin (traces, per-stage metrics)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlforge.errors import RLForgeError


def _config(**sections):
    return OmegaConf.create({"trainer": {"project": "proj", "experiment": "exp"}, **sections})


# --- jsonl / csv -----------------------------------------------------------------------------------------------


def test_jsonl_appends_one_record_per_call_and_nan_becomes_null(pm, tmp_path):
    lg = pm.registry.logger.get("jsonl")(_config(), str(tmp_path))
    lg.log_params({"actor": {"lr": 1.0}})
    lg.log_metrics({"critic/score/mean": 0.5, "actor/pg_loss": float("nan")}, step=1)
    lg.log_metrics({"val/accuracy": 0.25}, step=1)
    lg.close()
    lg = pm.registry.logger.get("jsonl")(_config(), str(tmp_path))  # a resumed run appends
    lg.log_metrics({"critic/score/mean": 0.75}, step=2)
    lg.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], {k: v for k, v in r.items() if k not in ("step", "time")}) for r in records] == [
        (1, {"critic/score/mean": 0.5, "actor/pg_loss": None}), (1, {"val/accuracy": 0.25}),
        (2, {"critic/score/mean": 0.75})]


def test_console_prints_a_line_only_for_metrics_it_shows(pm, capsys):
    lg = pm.registry.logger.get("console")(_config(trainer={"total_steps": 3, "progress": False}), "")
    lg.log_metrics({"critic/score/mean": 0.5}, step=1)
    lg.log_metrics({"timing_s/save_checkpoint": 0.1, "timing_s/checkpoint_write": 0.2}, step=1)  # logged apart
    lg.close()
    assert capsys.readouterr().out.splitlines() == ["step    1/3 | reward 0.5"]


def test_csv_widens_its_header_for_new_metrics_and_keeps_it_on_resume(pm, tmp_path):
    lg = pm.registry.logger.get("csv")(_config(), str(tmp_path))
    lg.log_metrics({"critic/score/mean": 0.5}, step=0)
    lg.log_metrics({"critic/score/mean": 0.6, "val/accuracy": 0.25}, step=1)  # a new column: the file is rewritten
    lg.close()
    lg = pm.registry.logger.get("csv")(_config(), str(tmp_path))
    lg.log_metrics({"val/accuracy": 0.5}, step=2)
    lg.close()
    with (tmp_path / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["step", "time", "critic/score/mean", "val/accuracy"]
    assert [(r["step"], r["critic/score/mean"], r["val/accuracy"]) for r in rows] == [
        ("0", "0.5", ""), ("1", "0.6", "0.25"), ("2", "", "0.5")]
    assert all(float(r["time"]) > 0 for r in rows)


# --- swanlab / trackio ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["swanlab", "trackio"])
def test_a_missing_package_is_one_error_with_the_install_command(monkeypatch, pm, tmp_path, name):
    monkeypatch.setitem(sys.modules, name, None)  # import -> ImportError
    with pytest.raises(RLForgeError, match=rf"logger.backends includes '{name}' but the {name} package is not "
                                           rf"installed: pip install 'rlforge\[{name}\]'"):
        pm.registry.logger.get(name)(_config(), str(tmp_path))


def _failing_swanlab(monkeypatch, error: Exception) -> None:
    """A swanlab whose ``init`` raises ``error`` (real swanlab: no login and no TTY raises a RuntimeError)."""
    def init(**kwargs):
        raise error

    monkeypatch.setitem(sys.modules, "swanlab", types.SimpleNamespace(init=init))


def test_swanlab_that_cannot_start_is_one_error_naming_the_mode_and_the_fix(monkeypatch, pm, tmp_path):
    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    _failing_swanlab(monkeypatch, RuntimeError("Failed to initialize SwanLab in online mode: no TTY is available for "
                                               "interactive login."))
    with pytest.raises(RLForgeError) as err:
        pm.registry.logger.get("swanlab")(_config(), str(tmp_path))
    assert str(err.value) == (
        "logger.backends includes 'swanlab' (logger.swanlab.mode unset: SwanLab's default, online), but SwanLab could "
        "not start a run: Failed to initialize SwanLab in online mode: no TTY is available for interactive login. Log "
        "in (`swanlab login`, or SWANLAB_API_KEY), set logger.swanlab.mode=offline to log without an account (`swanlab "
        "sync` uploads later), or leave swanlab out of logger.backends.")


def test_a_swanlab_mode_that_is_no_mode_is_refused(monkeypatch, pm, tmp_path):
    from rlforge.config import compose
    from rlforge.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'logger.swanlab.mode' must be one of online, offline, local, disabled, "
                                          r"got 'foo'"):
        compose(pm.registry, overrides=["logger.swanlab.mode=foo"])
    monkeypatch.setenv("SWANLAB_MODE", "foo")
    _failing_swanlab(monkeypatch, AssertionError("swanlab.init is not reached"))
    with pytest.raises(RLForgeError, match=r"SWANLAB_MODE=foo is not a SwanLab mode: set it to one of online, offline, "
                                           r"local, disabled, or set logger.swanlab.mode"):
        pm.registry.logger.get("swanlab")(_config(), str(tmp_path))


def _swanlab_scalars(run_folder: Path) -> list[tuple[str, int, float]]:
    """The (key, step, value) scalars of a SwanLab run file, read with SwanLab's own reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    [file] = run_folder.glob("run-*.swanlab")
    reader, out = DataStoreReader(), []
    reader.open(str(file))
    while (data := reader.scan()) is not None:
        record = Record()
        record.ParseFromString(data)
        if record.HasField("scalar"):
            out.append((record.scalar.key, record.scalar.step, record.scalar.value.number))
    reader.close()
    return out


@pytest.mark.slow  # SwanLab starts its run in ~3 s
def test_swanlab_offline_run_and_resume(monkeypatch, pm, tmp_path):
    pytest.importorskip("swanlab")
    from rlforge.tools.plots import write_plots

    png = write_plots({"critic/score/mean": [(1, 0.1), (2, 0.2)]}, tmp_path / "plots")[0]
    cfg = _config(logger={"swanlab": {"mode": "offline"}})
    lg = pm.registry.logger.get("swanlab")(cfg, str(tmp_path))
    lg.log_params({"actor": {"lr": 1e-5}})
    lg.log_metrics({"critic/score/mean": 0.5, "val-core/arith/acc/mean@4": 0.25}, step=1)
    lg.log_artifact(str(png))
    lg.close()
    run_id = (tmp_path / "swanlab_run_id").read_text().strip()
    lg = pm.registry.logger.get("swanlab")(cfg, str(tmp_path))  # resumed: the same SwanLab run
    assert lg.run.id == run_id
    lg.log_metrics({"critic/score/mean": 0.75}, step=2)
    lg.close()
    first, second = sorted((tmp_path / "swanlog").glob(f"run-*-{run_id}"))
    assert _swanlab_scalars(first) == [("critic/score/mean", 1, 0.5), ("val-core/arith/acc/mean@4", 1, 0.25)]
    assert _swanlab_scalars(second) == [("critic/score/mean", 2, 0.75)]
    assert "lr: 1.0e-05" in (first / "files" / "config.yaml").read_text()
    assert list((first / "media").rglob("*.png"))  # the plot


TRACKIO_RUN = """
import json, sys
from omegaconf import OmegaConf
from rlforge.plugin_manager import PluginManager
run_dir, png = sys.argv[1], sys.argv[2]
make = PluginManager(autoload=False).registry.logger.get("trackio")
cfg = OmegaConf.create({"trainer": {"project": "proj", "experiment": "exp"}, "logger": {"trackio": {"group": "g"}}})
lg = make(cfg, run_dir)
lg.log_metrics({"critic/score/mean": 0.5, "val-core/arith/acc/mean@4": 0.25}, step=1)
lg.log_artifact(png)
lg.close()
lg = make(cfg, run_dir)  # resumed: the same trackio run (by name)
lg.log_metrics({"critic/score/mean": 0.75}, step=2)
lg.close()
from trackio.sqlite_storage import SQLiteStorage
runs = SQLiteStorage.get_runs("proj")
logs = [{k: v for k, v in r.items() if k != "timestamp"} for r in SQLiteStorage.get_logs("proj", runs[0])]
print("RESULT", json.dumps({"runs": runs, "logs": logs, "config": SQLiteStorage.get_run_config("proj", runs[0])}))
"""


@pytest.mark.slow  # a subprocess: trackio reads TRACKIO_DIR when it is imported (~3 s)
def test_trackio_local_store_and_resume(tmp_path):
    pytest.importorskip("trackio")
    from rlforge.tools.plots import write_plots

    png = write_plots({"critic/score/mean": [(1, 0.1), (2, 0.2)]}, tmp_path / "plots")[0]
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TRACKIO_SPACE_ID", None)
    done = subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(run_dir), str(png)], capture_output=True,
                          text=True, timeout=120, env=env)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, done.stdout + done.stderr
    got = json.loads(line[0][len("RESULT "):])
    assert got["runs"] == ["exp/run-1"]
    scalars = [{k: v for k, v in r.items() if not k.startswith("plots/")} for r in got["logs"]]
    assert {"step": 1, "critic/score/mean": 0.5, "val-core/arith/acc/mean@4": 0.25} in scalars
    assert {"step": 2, "critic/score/mean": 0.75} in scalars
    assert any("plots/reward" in r for r in got["logs"])
    assert got["config"]["trainer"] == {"project": "proj", "experiment": "exp"}
    assert (tmp_path / "store" / "proj.db").is_file()


# --- mlflow: which store ----------------------------------------------------------------------------------------


def _recording_mlflow() -> types.ModuleType:
    """An mlflow that records the store, experiment and run id it is given (real mlflow: the slow test below)."""
    m = types.ModuleType("mlflow")
    m.MlflowException = type("MlflowException", (Exception,), {})
    m.calls = {}
    m.set_tracking_uri = lambda uri: m.calls.update(uri=uri)
    m.get_experiment_by_name = lambda name: None
    m.create_experiment = lambda name, **kw: m.calls.update(created=(name, kw))
    m.set_experiment = lambda name: m.calls.update(experiment=name)

    def start_run(run_id, run_name):
        m.calls.update(run_id=run_id, run_name=run_name)
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id or f"new-{len(m.calls)}"))

    m.start_run = start_run
    m.end_run = lambda: None
    return m


@pytest.fixture
def fake_mlflow(monkeypatch):
    m = _recording_mlflow()
    monkeypatch.setitem(sys.modules, "mlflow", m)
    # the fake's servers (http://mlflow.example:5000) answer; 127.0.0.1:1 is one that does not
    monkeypatch.setattr("rlforge.reach.silent", lambda url, port=None: "nothing answers at 127.0.0.1:1 (refused)"
                        if "127.0.0.1:1" in url else "")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    from rlforge.plugins.logger.mlflow_logger import MlflowLogger
    return m, MlflowLogger


def test_mlflow_defaults_to_the_run_local_store(fake_mlflow, tmp_path):
    m, MlflowLogger = fake_mlflow
    MlflowLogger(_config(), str(tmp_path))
    assert m.calls["uri"] == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert m.calls["created"] == ("proj", {"artifact_location": (tmp_path.resolve() / "mlartifacts").as_uri()})
    assert (tmp_path / "mlflow_tracking_uri").read_text() == m.calls["uri"]


def test_mlflow_honours_the_environment_then_the_config(fake_mlflow, monkeypatch, tmp_path):
    m, MlflowLogger = fake_mlflow
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-env")
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    MlflowLogger(_config(), str(tmp_path / "a"))
    assert (m.calls["uri"], m.calls["experiment"]) == ("http://mlflow.example:5000", "team-env")
    assert m.calls["created"] == ("team-env", {})  # the server keeps the artifacts
    shared = tmp_path / "shared" / "mlflow.db"
    cfg = _config(logger={"mlflow": {"tracking_uri": f"sqlite:///{shared}", "experiment": "team"}})
    MlflowLogger(cfg, str(tmp_path / "b"))
    assert (m.calls["uri"], m.calls["experiment"]) == (f"sqlite:///{shared}", "team")
    assert m.calls["created"] == ("team", {"artifact_location": (shared.parent / "mlartifacts").as_uri()})
    assert m.calls["run_name"] == "exp/b"


def test_mlflow_resume_continues_the_run_in_the_same_store_only(fake_mlflow, tmp_path):
    m, MlflowLogger = fake_mlflow
    store = {"logger": {"mlflow": {"tracking_uri": "http://a:5000"}}}
    first = MlflowLogger(_config(**store), str(tmp_path))
    MlflowLogger(_config(**store), str(tmp_path))
    assert m.calls["run_id"] == first.run.info.run_id
    MlflowLogger(_config(logger={"mlflow": {"tracking_uri": "http://b:5000"}}), str(tmp_path))
    assert m.calls["run_id"] is None  # that run is not in this store: a new one
    assert (tmp_path / "mlflow_tracking_uri").read_text() == "http://b:5000"


def test_mlflow_refusing_the_store_is_one_error_naming_the_key(fake_mlflow, monkeypatch, tmp_path):
    m, MlflowLogger = fake_mlflow

    def refuse(uri):
        raise m.MlflowException("The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. More.")

    monkeypatch.setattr(m, "set_tracking_uri", refuse)
    with pytest.raises(RLForgeError) as err:
        MlflowLogger(_config(logger={"mlflow": {"tracking_uri": "notauri"}}), str(tmp_path))
    assert str(err.value) == (
        "logger.backends includes 'mlflow', but mlflow cannot use the tracking store (logger.mlflow.tracking_uri="
        "notauri): The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. Give a tracking server "
        "(http://host:5000) or a database (sqlite:///path/mlflow.db) in logger.mlflow.tracking_uri, unset it and "
        "MLFLOW_TRACKING_URI for a store in the run folder, or leave mlflow out of logger.backends.")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")  # a server that does not answer: said at once
    with pytest.raises(RLForgeError, match=r"its tracking server \(MLFLOW_TRACKING_URI=http://127.0.0.1:1\) does not "
                                           r"answer: nothing answers at 127.0.0.1:1 \("):
        MlflowLogger(_config(), str(tmp_path))


@pytest.mark.slow  # a real sqlite store: mlflow's migrations take ~5-10 s
def test_mlflow_runs_share_one_store_from_the_environment(monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    from rlforge.plugins.logger.mlflow_logger import MlflowLogger
    from rlforge.tools.plots import report

    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    (tmp_path / "shared").mkdir()
    cfg = _config(logger={"mlflow": {"experiment": "team"}})
    ids = []
    for name, value in (("r1", 0.25), ("r2", 0.5), ("r1", 0.75)):  # r1 is resumed last
        (tmp_path / name).mkdir(exist_ok=True)
        lg = MlflowLogger(cfg, str(tmp_path / name))
        lg.log_metrics({"critic/score/mean": value}, step=len(ids) + 1)
        lg.close()
        ids.append(lg.run.info.run_id)
    client = MlflowClient(uri)
    assert len(client.search_runs([client.get_experiment_by_name("team").experiment_id])) == 2
    assert ids[0] == ids[2] != ids[1]
    assert [(m.step, m.value) for m in client.get_metric_history(ids[0], "critic/score/mean")] == [(1, 0.25), (3, 0.75)]
    # a mapping's keys in the config, and data sources in metric names, are any text: names mlflow accepts
    # (characters, path rules, length), and distinct where two keys differ only in characters it does not allow
    lg = MlflowLogger(cfg, str(tmp_path / "r2"))
    sources = ["math (hard)", "it's", "gsm8k/", "a//b", "../up", "x(1)", "x[1]", "s" * 300]
    lg.log_params({"routes": {source: i for i, source in enumerate(sources)}})
    lg.log_metrics({f"val/{source}/accuracy": 1.0 for source in sources}, step=1)
    lg.close_as("killed")  # (marks_outcome: how the trainer closes it)
    assert [client.get_run(i).info.status for i in ids[:2]] == ["FINISHED", "KILLED"]
    params = {k: v for k, v in client.get_run(ids[1]).data.params.items() if k.startswith("routes.")}
    assert sorted(params.values(), key=int) == [str(i) for i in range(len(sources))]  # none lost
    assert params["routes.math _hard_"] == "0" and params["routes.gsm8k/_"] == "2" and params["routes.a/_/b"] == "3"
    assert len([k for k in client.get_run(ids[1]).data.metrics if k.startswith("val/")]) == len(sources)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert [p.name for p in report(tmp_path / "r1")] == ["reward.png"]  # `rlforge report` finds the shared store
    assert [a.path for a in client.list_artifacts(ids[0])] == ["reward.png"]
    assert not (tmp_path / "r1" / "mlflow.db").exists()
    (tmp_path / "r3").mkdir()
    MlflowLogger(_config(), str(tmp_path / "r3")).close()  # mlflow exports its store and experiment: not kept
    assert not {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID"} & set(os.environ)


# --- the profiler plugin ----------------------------------------------------------------------------------------


def test_profiler_windows_group_consecutive_steps():
    from rlforge.plugins.logger.profiler import windows

    assert windows([5, 3, 4, 9, 9]) == [(3, 5), (9, 9)]
    assert windows([]) == []


class _Trainer:  # what the profiler reads of a trainer (weak-referenceable, as the real one)
    def __init__(self, config, run_dir) -> None:
        self.config, self.run_dir = config, run_dir


def _trainer(tmp_path, **options):
    cfg = OmegaConf.create({"plugins": {"profiler": {"steps": [], "warmup": 1, "record_shapes": False,
                                                     "profile_memory": False, "with_stack": False,
                                                     "stage_metrics": False, **options}}})
    return _Trainer(cfg, tmp_path)


def test_profiler_traces_the_chosen_steps_after_its_warmup(tmp_path):
    import torch

    from rlforge.plugins.logger import profiler as p

    trainer = _trainer(tmp_path, steps=[3, 4])
    p.rlforge_fit_start(trainer=trainer, module=None)
    x = torch.ones(8, 8)
    recorded = {}
    for step in range(1, 6):
        p.rlforge_step_start(trainer=trainer, step=step)
        recorded[step] = p._watches[trainer].prof is not None
        with torch.profiler.record_function(f"rlforge_test_step_{step}"):
            x = x @ x / 8
        p.rlforge_step_end(trainer=trainer, step=step, metrics={})
    p.rlforge_fit_end(trainer=trainer)
    assert recorded == {1: False, 2: True, 3: True, 4: True, 5: False}  # step 2: the warm-up
    [trace] = (tmp_path / "profiler").glob("*.json")
    assert trace.name == "steps_3-4.json"
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"rlforge_test_step_3", "rlforge_test_step_4"} <= names and "rlforge_test_step_2" not in names
    assert "aten::mm" in (tmp_path / "profiler" / "steps_3-4.txt").read_text()


def test_profiler_stage_metrics(tmp_path):
    import torch

    from rlforge import batch as B
    from rlforge.plugins.logger import profiler as p

    trainer = _trainer(tmp_path, stage_metrics=True)
    p.rlforge_fit_start(trainer=trainer, module=None)
    batch = B.Batch({B.PROMPT_MASK: torch.ones(2, 3), B.RESPONSE_MASK: torch.tensor([[1, 1, 0], [1, 0, 0]])})
    p.rlforge_step_start(trainer=trainer, step=1)
    for stage, seconds in (("rollout", 0.5), ("update_actor", 2.0)):
        p.rlforge_stage_start(trainer=trainer, stage=stage, batch=batch)
        p.rlforge_stage_end(trainer=trainer, stage=stage, batch=batch, seconds=seconds)
    metrics: dict[str, float] = {}
    p.rlforge_step_end(trainer=trainer, step=1, metrics=metrics)
    assert metrics["perf/rollout/tokens_per_s"] == 9 / 0.5  # 6 prompt + 3 response tokens
    assert metrics["perf/update_actor/tokens_per_s"] == 9 / 2.0
    assert 0 < metrics["perf/rollout/peak_rss_gb"] <= metrics["perf/cpu_memory_used_gb"]
    assert math.isfinite(metrics["perf/cpu_memory_used_gb"])
    p.rlforge_fit_end(trainer=trainer)


def test_profiler_is_off_by_default(tmp_path):
    from rlforge.plugins.logger import profiler as p

    trainer = _trainer(tmp_path)
    p.rlforge_fit_start(trainer=trainer, module=None)
    assert trainer not in p._watches
    metrics: dict[str, float] = {}
    p.rlforge_step_end(trainer=trainer, step=1, metrics=metrics)
    assert metrics == {}


def test_profiler_refuses_a_step_below_one(tmp_path):
    from rlforge.plugins.logger import profiler as p

    with pytest.raises(RLForgeError, match=r"'plugins.profiler.steps' must list training steps \(>= 1\), got \[0, 2\]"):
        p.rlforge_fit_start(trainer=_trainer(tmp_path, steps=[0, 2]), module=None)


def test_the_new_backends_are_registered_with_their_sections(pm, default_config):
    assert {"jsonl", "csv", "swanlab", "trackio", "mlflow"} <= set(pm.registry.logger.available())
    assert default_config.logger.mlflow.tracking_uri is None and default_config.logger.swanlab.mode is None
    assert list(default_config.plugins.profiler.steps) == [] and default_config.plugins.profiler.warmup == 1



def test_val_generations_show_as_verl_shows_them_in_wandb_and_tensorboard(monkeypatch, tmp_path, default_config):
    """trainer.log_val_generations: wandb gets verl's table val/generations (one row per validation, re-logged
    whole), tensorboard verl's markdown text."""
    import types

    from rlforge.plugins.logger.tensorboard import TensorBoardLogger
    from rlforge.plugins.logger.wandb_logger import WandbLogger

    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, [list(r) for r in data]

        def add_data(self, *row):
            self.data.append(list(row))

    run = types.SimpleNamespace(id="r1", log=lambda d, step: logged.append((step, d)), config=None)
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **k: run, Table=Table))
    rows = [{"input": "q1", "output": "a1", "score": 1.0}, {"input": "q2", "output": "a2", "score": 0.0}]
    w = WandbLogger(default_config, str(tmp_path))
    w.log_generations(rows, 5)
    w.log_generations(rows, 10)
    step, table = logged[-1][0], logged[-1][1]["val/generations"]
    assert step == 10 and table.columns == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert table.data == [[5, "q1", "a1", 1.0, "q2", "a2", 0.0], [10, "q1", "a1", 1.0, "q2", "a2", 0.0]]
    tb = TensorBoardLogger(default_config, str(tmp_path))
    tb.log_generations(rows, 5)
    tb.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    text = events.Tensors("val/generations/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text.startswith("**Generation Results - Step 5**") and "### Sample 2\n**Input:** q2" in text


def test_wandb_without_an_account_is_one_error_with_the_ways_out(monkeypatch, tmp_path, default_config):
    """No API key (no `wandb login`, no WANDB_API_KEY, not offline): wandb's own error becomes one that says what to
    do, before the first step (a verl launch's trainer.logger=[console,wandb] on a machine without an account)."""
    from rlforge.plugins.logger.wandb_logger import WandbLogger

    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    import wandb

    try:
        with pytest.raises(RLForgeError, match=r"logger.backends includes 'wandb' \(verl: trainer.logger\), but wandb "
                                               r"could not start a run: No API key configured.* WANDB_MODE=offline"):
            WandbLogger(default_config, str(tmp_path))
    finally:
        wandb.teardown()  # wandb keeps its settings (this test's environment) in the process until torn down
