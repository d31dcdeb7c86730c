"""The end-of-run summary table."""

from __future__ import annotations

import importlib.util
from typing import Any

from rich.console import Console
from rich.table import Table


ERROR_SHARE = "reward/error_share"  # logged by the rule reward manager each step


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def reward_error_share(history: list[dict[str, float]]) -> float | None:
    """The mean over the training steps of the share of reward calls that failed (errors and timeouts), or
    None when no step logged it (a reward manager that does not count failures, an offline algorithm)."""
    shares = [h[ERROR_SHARE] for h in history if ERROR_SHARE in h]
    return sum(shares) / len(shares) if shares else None


def print_summary(summary: dict[str, Any], with_mlflow: bool) -> None:
    table = Table(title="rlforge: run summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    table.add_row("validation accuracy before", _pct(before))
    table.add_row("validation accuracy after", _pct(after))
    if before is not None and after is not None:
        table.add_row("change", f"{100 * (after - before):+.1f} points")
    table.add_row("steps", str(summary["steps"]))
    if summary.get("reward_error_share") is not None:
        table.add_row("failed reward calls", _pct(summary["reward_error_share"]) + " (reward/error_share)")
    table.add_row("tokens/s", f"{summary['tokens_per_s']:.0f}")
    table.add_row("wall time", f"{summary['seconds']:.1f} s")
    table.add_row("run folder", summary["run_dir"])
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    if with_mlflow:
        ui = "" if importlib.util.find_spec("flask") else " (the web UI needs the full mlflow: pip install 'rlforge[mlflow]')"
        console.print(f"Open the metrics: mlflow ui --backend-store-uri {summary['mlflow_uri']}{ui}", markup=False)
