"""Training curves as PNG files: reward, accuracy, response length, KL and entropy over steps (and the tool calls
and turns of agentic runs).

The ``plots`` plugin (``rlforge.plugins.logger.plots``) draws them at the end of every run from the trainer's
history; ``rlforge report RUN_DIR`` redraws them from the run's mlflow store (the run-local ``mlflow.db``, or the store
named in ``mlflow_tracking_uri``: the whole history, resumed parts included) and logs them to that mlflow run as
artifacts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlforge.errors import RLForgeError

Series = dict[str, list[tuple[int, float]]]  # metric name -> (step, value) points

# file stem -> (title, metrics drawn in it); a plot whose metrics are all missing is skipped
PLOTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("Reward", ("critic/score/mean", "val/reward")),
    "accuracy": ("Accuracy", ("critic/acc/mean", "val/accuracy")),
    "response_length": ("Response length (tokens)", ("response_length/mean",)),
    "kl": ("KL", ("actor/ppo_kl", "actor/ref_kl", "actor/kl_loss")),
    "entropy": ("Entropy", ("actor/entropy",)),
    # agentic runs only (rollout.agent.loop, docs/agentic.md)
    "tool_calls": ("Well-formed tool calls (share)", ("agent/tool_call_format_ok", "val/agent/tool_call_format_ok")),
    "turns": ("Turns per trajectory", ("num_turns/mean", "val/num_turns/mean")),
}
PLOT_DIR = "plots"
MLFLOW_STORE_FILE = "mlflow_tracking_uri"  # written by the mlflow logger: the tracking store the run logs into
METRICS = tuple(m for _, names in PLOTS.values() for m in names)


def series_from_history(history: Iterable[dict[str, float]], validations: Iterable[tuple[int, dict[str, float]]]) -> Series:
    """Points from ``Trainer.history`` (one metrics dict per step) and (step, val metrics) pairs."""
    series: Series = {}
    points = [(int(h["step"]), h) for h in history] + [(int(s), m) for s, m in validations]
    for step, metrics in points:
        for name in METRICS:
            if name in metrics:
                series.setdefault(name, []).append((step, float(metrics[name])))
    return series


def write_plots(series: Series, out_dir: Path) -> list[Path]:
    """One PNG per entry of ``PLOTS`` that has data; returns the files written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (title, names) in PLOTS.items():
        present = [n for n in names if series.get(n)]
        if not present:
            continue
        fig = Figure(figsize=(6, 3.6), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for name in present:
            steps, values = zip(*sorted(series[name]))
            sparse = name.startswith("val/")
            ax.plot(steps, values, marker="o" if sparse else None, markersize=4, label=name)
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        written.append(path)
    return written


def local_store(run_dir: str | Path) -> str:
    """The run-local mlflow store (the mlflow logger's default)."""
    return f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def recorded_store(run_dir: str | Path) -> str:
    """The tracking URI a run logged into: its ``mlflow_tracking_uri`` (runs before it was written: the run-local
    store)."""
    file = Path(run_dir) / MLFLOW_STORE_FILE
    return file.read_text().strip() if file.is_file() else local_store(run_dir)


def _mlflow_run(run_dir: Path) -> tuple[Any, str]:
    from mlflow.tracking import MlflowClient

    uri, id_file = recorded_store(run_dir), run_dir / "mlflow_run_id"
    if not id_file.is_file() or (uri == local_store(run_dir) and not (run_dir / "mlflow.db").is_file()):
        raise RLForgeError(
            f"{run_dir} has no mlflow.db and mlflow_run_id: give a run folder of a run logged with the mlflow "
            f"logger (logger.backends)."
        )
    return MlflowClient(tracking_uri=uri), id_file.read_text().strip()


def report(run_dir: str | Path) -> list[Path]:
    """Redraw ``<run_dir>/plots/*.png`` from the run's mlflow store and log them to its mlflow run."""
    folder = Path(run_dir)
    client, run_id = _mlflow_run(folder)
    series: Series = {}
    for name in METRICS:
        history = client.get_metric_history(run_id, name)
        if history:
            series[name] = [(m.step, m.value) for m in history]
    if not series:
        raise RLForgeError(f"The mlflow run in {run_dir} has none of the plotted metrics ({', '.join(METRICS)}).")
    paths = write_plots(series, folder / PLOT_DIR)
    for path in paths:
        client.log_artifact(run_id, str(path))
    return paths
