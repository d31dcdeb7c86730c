"""``profiler`` plugin: torch.profiler traces of chosen steps, and memory / throughput metrics per stage.

Options at ``plugins.profiler.*`` (all off by default):

- ``steps=[3,4]``: trace these training steps with ``torch.profiler`` (CPU, and CUDA where there is a GPU). Each run of
  consecutive steps is one window: ``warmup`` steps before it are profiled and thrown away (torch.profiler's
  warm-up), the window's steps are recorded, and the trace is written to ``<run>/profiler/steps_<a>-<b>.json``
  (Chrome trace format: open it in https://ui.perfetto.dev or chrome://tracing) with the table of the most expensive
  operators beside it (``steps_<a>-<b>.txt``).
- ``stage_metrics=true``: per stage of the dataflow, ``perf/<stage>/peak_rss_gb`` (this process's peak resident
  memory during the stage: Linux resets the high-water mark at each stage start; elsewhere it is the peak so far),
  ``perf/<stage>/max_memory_allocated_gb`` and ``perf/<stage>/max_memory_reserved_gb`` (CUDA, where a GPU is in use)
  and ``perf/<stage>/tokens_per_s`` (the batch's prompt and response tokens over the stage's seconds); per step,
  verl's ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb`` and ``perf/cpu_memory_used_gb``.

Both measure the driver process: with the local controller that is every role; Ray or torchrun workers are
other processes.
"""

from __future__ import annotations

import re
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from rlforge import batch as B
from rlforge.config.schema import option
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl

GB = 1024**3
TRACE_DIR = "profiler"
SECTION = "profiler"  # plugins.profiler.*


@dataclass
class ProfilerConfig:
    """torch.profiler traces of chosen steps and memory / throughput metrics per stage (docs/tracking.md)."""

    steps: list[int] = field(default_factory=list)  # training steps traced with torch.profiler (consecutive steps share one trace); [] = none
    warmup: int = option(1, ge=0)  # steps profiled and discarded before each traced window (fewer where the run starts later)
    record_shapes: bool = False  # record the input shapes of each operator
    profile_memory: bool = False  # record tensor memory allocations
    with_stack: bool = False  # record the Python stack of each operator (larger traces)
    stage_metrics: bool = False  # log memory and throughput per stage: perf/<stage>/peak_rss_gb, ...


def windows(steps: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive steps as (first, last): ``[5, 3, 4, 9]`` -> ``[(3, 5), (9, 9)]``."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def peak_rss_bytes() -> int:
    """This process's peak resident memory: Linux's ``VmHWM`` (resettable), else ``getrusage``'s lifetime peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            found = re.search(r"VmHWM:\s+(\d+) kB", fh.read())
        if found:
            return int(found[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def reset_peak_rss() -> None:
    """Reset Linux's high-water mark of this process's resident memory (a no-op where it cannot be)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def _cuda() -> Any:
    """torch.cuda when this process has initialised a GPU (else None: nothing to measure)."""
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


class StepWatch:
    """One run's profiler windows and per-stage measurements."""

    def __init__(self, options: Any, run_dir: Path) -> None:
        self.options = options
        self.out = run_dir / TRACE_DIR
        self.windows = windows(list(options.steps))
        self.prof: Any = None
        self.window: tuple[int, int] | None = None
        self.stages: dict[str, dict[str, float]] = {}

    # --- torch.profiler windows -------------------------------------------------------------------
    def step_start(self, step: int) -> None:
        if self.prof is not None:
            return
        for first, last in self.windows:
            if first - self.options.warmup <= step <= last:
                self._start(step, first, last)
                return

    def _start(self, step: int, first: int, last: int) -> None:
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if _cuda() is not None else [])
        start = max(step, first)  # a run resumed inside the window records its remaining steps
        self.window = (start, last)
        self.prof = tp.profile(
            activities=activities, record_shapes=self.options.record_shapes,
            profile_memory=self.options.profile_memory, with_stack=self.options.with_stack,
            schedule=tp.schedule(wait=0, warmup=start - step, active=last - start + 1, repeat=1),
            on_trace_ready=self._write,
        )
        self.prof.start()

    def _write(self, prof: Any) -> None:
        assert self.window is not None
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.out / "steps_{}-{}".format(*self.window)
        prof.export_chrome_trace(str(stem.with_suffix(".json")))
        sort = "self_cuda_time_total" if _cuda() is not None else "self_cpu_time_total"
        stem.with_suffix(".txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")
        print(f"rlforge: profiler trace of steps {self.window[0]}-{self.window[1]}: {stem.with_suffix('.json')}")

    def step_end(self, step: int, metrics: dict[str, float]) -> None:
        if self.prof is not None:
            self.prof.step()
            if self.window is not None and step >= self.window[1]:
                self.stop()
        if self.options.stage_metrics:
            metrics.update(self._stage_metrics())

    def stop(self) -> None:
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.stop()

    # --- per-stage memory and throughput ----------------------------------------------------------
    def stage_start(self) -> None:
        reset_peak_rss()
        if (cuda := _cuda()) is not None:
            cuda.reset_peak_memory_stats()

    def stage_end(self, stage: str, batch: Any, seconds: float) -> None:
        seen = self.stages.setdefault(stage, {"seconds": 0.0, "tokens": 0.0, "rss": 0.0, "alloc": 0.0, "reserved": 0.0})
        seen["seconds"] += seconds
        seen["tokens"] += _tokens(batch)
        seen["rss"] = max(seen["rss"], peak_rss_bytes())
        if (cuda := _cuda()) is not None:
            seen["alloc"] = max(seen["alloc"], cuda.max_memory_allocated())
            seen["reserved"] = max(seen["reserved"], cuda.max_memory_reserved())

    def _stage_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        gpu = _cuda() is not None
        for stage, seen in self.stages.items():
            out[f"perf/{stage}/peak_rss_gb"] = seen["rss"] / GB
            if seen["seconds"] > 0 and seen["tokens"]:
                out[f"perf/{stage}/tokens_per_s"] = seen["tokens"] / seen["seconds"]
            if gpu:
                out[f"perf/{stage}/max_memory_allocated_gb"] = seen["alloc"] / GB
                out[f"perf/{stage}/max_memory_reserved_gb"] = seen["reserved"] / GB
        if self.stages:
            out["perf/cpu_memory_used_gb"] = max(s["rss"] for s in self.stages.values()) / GB
            if gpu:
                out["perf/max_memory_allocated_gb"] = max(s["alloc"] for s in self.stages.values()) / GB
                out["perf/max_memory_reserved_gb"] = max(s["reserved"] for s in self.stages.values()) / GB
        self.stages = {}
        return out


def _tokens(batch: Any) -> float:
    """Prompt and response tokens of a batch (0 for a batch without prompt masks, e.g. an offline algorithm's)."""
    try:
        if B.PROMPT_MASK not in batch:
            return 0.0
        responses = batch[B.RESPONSE_MASK].sum() if B.RESPONSE_MASK in batch else 0
        return float(responses + batch[B.PROMPT_MASK].sum())
    except (TypeError, KeyError):
        return 0.0


_watches: WeakKeyDictionary[Any, StepWatch] = WeakKeyDictionary()


def _watch(trainer: Any) -> StepWatch | None:
    try:
        return _watches.get(trainer)
    except TypeError:  # not weak-referenceable: no trainer whose fit started
        return None


def _options(config: Any) -> Any:
    return config.get("plugins", {}).get(SECTION) if config is not None else None


@hookimpl
def rlforge_register(registry):
    registry.plugin_options(ProfilerConfig, name=SECTION)


@hookimpl
def rlforge_fit_start(trainer: Any, module: Any) -> None:
    options = _options(getattr(trainer, "config", None))
    if options is None or not (options.steps or options.stage_metrics):
        return
    if any(s < 1 for s in options.steps):
        raise ConfigError(f"'plugins.profiler.steps' must list training steps (>= 1), got {list(options.steps)}.")
    _watches[trainer] = StepWatch(options, Path(trainer.run_dir))


@hookimpl
def rlforge_step_start(trainer: Any, step: int) -> None:
    if (watch := _watch(trainer)) is not None:
        watch.step_start(step)


@hookimpl
def rlforge_stage_start(trainer: Any, stage: str, batch: Any) -> None:
    if (watch := _watch(trainer)) is not None and watch.options.stage_metrics:
        watch.stage_start()


@hookimpl
def rlforge_stage_end(trainer: Any, stage: str, batch: Any, seconds: float) -> None:
    if (watch := _watch(trainer)) is not None and watch.options.stage_metrics:
        watch.stage_end(stage, batch, seconds)


@hookimpl
def rlforge_step_end(trainer: Any, step: int, metrics: dict[str, float]) -> None:
    if (watch := _watch(trainer)) is not None:
        watch.step_end(step, metrics)


@hookimpl
def rlforge_fit_end(trainer: Any) -> None:
    if (watch := _watch(trainer)) is not None:
        del _watches[trainer]
        watch.stop()


@hookimpl
def rlforge_exception(trainer: Any, exception: BaseException) -> None:
    if (watch := _watch(trainer)) is not None:
        del _watches[trainer]
        watch.stop()
