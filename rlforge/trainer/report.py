"""The end-of-run summary table, and the trajectory records that ``rlforge report RUN --trajectory N`` shows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlforge.errors import RLForgeError


ERROR_SHARE = "reward/error_share"  # logged by the rule reward manager each step
ROLE_STYLES = {"assistant": "green", "tool": "yellow", "user": "cyan"}  # spans of other roles: the default style


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
    console = _console()
    console.print(table)
    if with_mlflow:
        ui = "" if importlib.util.find_spec("flask") else " (the web UI needs the full mlflow: pip install 'rlforge[mlflow]')"
        console.print(f"Open the metrics: mlflow ui --backend-store-uri {summary['mlflow_uri']}{ui}", markup=False)


def _console() -> Console:
    """rich's console; written to a file or a pipe (a log), 200 columns wide, where rich would assume 80 and cut the
    run folder's path and the table."""
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def select_trajectory(records: list[dict[str, Any]], which: str) -> dict[str, Any]:
    """The record ``which`` names: ``N`` (the N-th line, from 0; negative counts from the end) or ``STEP:INDEX``
    (row INDEX of step STEP)."""
    step, colon, index = which.partition(":")
    try:
        if colon:
            found = [r for r in records if r.get("step") == int(step) and r.get("index") == int(index)]
            if not found:
                raise IndexError
            return found[-1]  # a step replayed after a resume is recorded again: the last one trained
        return records[int(which)]
    except ValueError:
        raise RLForgeError(f"--trajectory {which!r}: give N (a line of trajectories.jsonl), STEP:INDEX or "
                           "all") from None
    except IndexError:
        steps = sorted({r.get("step") for r in records})
        raise RLForgeError(f"--trajectory {which!r}: the record has {len(records)} trajectories (lines 0-"
                           f"{len(records) - 1}), of steps {steps[0]}-{steps[-1]}") from None


def _mask_words(mask: list[int]) -> str:
    if not mask:
        return "-"
    trained = sum(mask)
    return "1" if trained == len(mask) else "0" if trained == 0 else f"1 on {trained} of {len(mask)}"


def _span_text(span: dict[str, Any]) -> Text:
    text = Text(span.get("text", ""))
    for call in span.get("tool_calls", []):
        text.append(f"\n-> tool call {call['name']}({json.dumps(call.get('arguments'), ensure_ascii=False)})",
                    style="bold")
    for error in span.get("parse_errors", []):
        text.append(f"\n-> unreadable call: {error}", style="red")
    return text


def print_trajectory(record: dict[str, Any], console: Console | None = None) -> None:
    """One trajectory record: what generated it, its reward, and each span of its response with its loss mask."""
    console = console or _console()
    mask = record.get("loss_mask", [])
    console.print(Text(f"step {record.get('step')}, sample {record.get('index')} (uid {record.get('uid')}, "
                       f"data_source {record.get('data_source')}), policy version {record.get('policy_version')}: "
                       f"reward {record.get('reward')}, stop {record.get('stop_reason', '-')}, "
                       f"{sum(mask)} of {len(mask)} response tokens trained", style="bold"))
    console.print(Text(f"prompt ({len(record.get('prompt_ids', []))} tokens): {record.get('prompt', '')}"))
    table = Table(show_lines=True)
    for column in ("#", "role", "tokens", "loss mask", "text"):
        table.add_column(column)
    for k, span in enumerate(record["spans"]):
        start, end = span["start"], span["end"]
        table.add_row(str(k), span["role"], f"{start}-{end}", _mask_words(mask[start:end]), _span_text(span),
                      style=ROLE_STYLES.get(span["role"], ""))
    console.print(table)
    console.print(Text(f"answer: {record.get('answer')!r}   ground truth: {record.get('ground_truth')!r}"))


def print_trajectories(records: list[dict[str, Any]], console: Console | None = None) -> None:
    """One line per record: its step, row, reward, turns and tool calls."""
    console = console or _console()
    table = Table(title=f"{len(records)} trajectories")
    for column in ("line", "step", "index", "policy version", "reward", "model turns", "tool calls", "stop"):
        table.add_column(column)
    for n, r in enumerate(records):
        spans = r["spans"]
        table.add_row(str(n), str(r.get("step")), str(r.get("index")), str(r.get("policy_version")),
                      str(r.get("reward")), str(sum(s["role"] == "assistant" for s in spans)),
                      str(sum(len(s.get("tool_calls", [])) for s in spans)), str(r.get("stop_reason", "-")))
    console.print(table)


def show_trajectories(run_dir: str | Path, which: str) -> None:
    """``rlforge report RUN --trajectory WHICH``: a trajectory of ``<run>/trajectories.jsonl``, or ``all``."""
    from rlforge.agent.record import RECORD_FILE, read_records

    path = Path(run_dir) / RECORD_FILE
    if not Path(run_dir).is_dir():
        raise RLForgeError(f"Run folder {run_dir} does not exist")
    if not path.is_file():
        raise RLForgeError(f"{path} does not exist: trajectories are recorded by runs with "
                           "rollout.agent.record_trajectories=true")
    records = read_records(path)
    if not records:
        raise RLForgeError(f"{path} has no trajectory yet")
    if which == "all":
        print_trajectories(records)
    else:
        print_trajectory(select_trajectory(records, which))
