"""Tracking after a real run: mlflow read-back (metrics and plot artifacts), tensorboard events, plots,
``rlforge report``, and the optional wandb logger."""

from __future__ import annotations

import sys

import pytest

from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.tools.plots import PLOTS, series_from_history, write_plots

PNGS = {f"{stem}.png" for stem in PLOTS} - {"tool_calls.png", "turns.png"}  # those two: agentic runs only
TRAIN_METRICS = ["critic/score/mean", "critic/acc/mean", "response_length/mean", "actor/pg_loss", "actor/entropy",
                 "actor/ppo_kl", "actor/grad_norm", "timing_s/step", "perf/throughput"]


def test_mlflow_run_reads_back_with_metrics_and_plot_artifacts(fitted_run):
    from mlflow.tracking import MlflowClient

    trainer, summary = fitted_run
    client = MlflowClient(tracking_uri=summary["mlflow_uri"])
    run_id = (trainer.run_dir / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    assert run.data.params["algorithm.name"] == "grpo"
    for name in TRAIN_METRICS:  # every per-step metric, once per step
        assert [m.step for m in client.get_metric_history(run_id, name)] == [1, 2], name
    assert set(trainer.history[0]) - {"step"} <= set(run.data.metrics)
    # validation before training, after step 1 and at the end
    assert [m.step for m in client.get_metric_history(run_id, "val/accuracy")] == [0, 1, 2]
    # verl's validation names, with mlflow's spelling of '@'
    assert [m.step for m in client.get_metric_history(run_id, "val-core/arith/acc/mean_at_1")] == [0, 1, 2]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert PNGS <= artifacts
    local = client.download_artifacts(run_id, "reward.png", str(trainer.run_dir / "dl"))
    assert open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots_are_written_into_the_run_folder(fitted_run):
    trainer, _ = fitted_run
    assert {p.name for p in (trainer.run_dir / "plots").iterdir()} == PNGS


def test_tensorboard_has_the_same_metric_names(fitted_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, _ = fitted_run
    acc = EventAccumulator(str(trainer.run_dir / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    for name in [*TRAIN_METRICS, "val/accuracy"]:
        assert name in tags["scalars"], name
    assert [e.step for e in acc.Scalars("critic/score/mean")] == [1, 2]
    assert {f"plots/{p.removesuffix('.png')}" for p in PNGS} <= set(tags["images"])
    assert "config/text_summary" in tags["tensors"]


def test_jsonl_and_csv_hold_every_logged_metric(fitted_run):
    import csv
    import json

    trainer, _ = fitted_run
    records = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "critic/score/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert set(trainer.history[0]) <= set(train[0])
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 1, 2]
    with (trainer.run_dir / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["step"], r["critic/score/mean"]) for r in rows] == [
        (str(r["step"]), "" if r.get("critic/score/mean") is None else str(r["critic/score/mean"])) for r in records]


def test_profiler_stage_metrics_in_every_step(fitted_run):
    trainer, _ = fitted_run
    for row in trainer.history:
        assert row["perf/rollout/peak_rss_gb"] > 0 and row["perf/rollout/tokens_per_s"] > 0
        assert row["perf/cpu_memory_used_gb"] >= row["perf/update_actor/peak_rss_gb"]


def test_report_redraws_plots_from_mlflow(fitted_run, capsys):
    trainer, _ = fitted_run
    plots = trainer.run_dir / "plots"
    for png in plots.iterdir():
        png.unlink()
    assert main(["report", str(trainer.run_dir)]) == 0
    assert {p.name for p in plots.iterdir()} == PNGS
    assert f"wrote {plots / 'kl.png'}" in capsys.readouterr().out


def test_report_needs_an_mlflow_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlforge: error: {tmp_path} has no mlflow.db") and len(err.splitlines()) == 1


def test_write_plots_skips_missing_metrics(tmp_path):
    history = [{"step": 1, "critic/score/mean": 0.1}, {"step": 2, "critic/score/mean": 0.3}]
    series = series_from_history(history, [(0, {"val/reward": 0.0}), (2, {"val/reward": 0.5})])
    assert series == {"critic/score/mean": [(1, 0.1), (2, 0.3)], "val/reward": [(0, 0.0), (2, 0.5)]}
    assert [p.name for p in write_plots(series, tmp_path)] == ["reward.png"]


def test_wandb_logger_without_wandb_is_one_clear_error(monkeypatch, pm, default_config, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(RLForgeError, match="the wandb package is not installed: pip install wandb"):
        pm.registry.logger.get("wandb")(default_config, str(tmp_path))


def test_wandb_logger_offline(monkeypatch, pm, default_config, tmp_path):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    png = write_plots({"critic/score/mean": [(1, 0.1), (2, 0.2)]}, tmp_path / "plots")[0]
    logger = pm.registry.logger.get("wandb")(default_config, str(tmp_path))
    logger.log_params({"actor": {"lr": 1e-5}})
    logger.log_metrics({"critic/score/mean": 0.5, "actor/pg_loss": 0.1}, step=1)
    logger.log_artifact(str(png))
    logger.close()
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    [run_folder] = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    assert (run_folder / f"run-{run_id}.wandb").is_file()
