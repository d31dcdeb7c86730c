"""Where every second of the GRPO step goes: rlforge (hf, vllm engines) and TRL side by side on the work of
``grpo_vs_trl.py`` (same model folder, P prompts x G samples x exactly T new tokens, one optimizer step, fp32).

    .venv/bin/python benchmarks/step_breakdown.py --size tiny --engines hf,vllm --trl-python .venv-bench/bin/python

Per step (median over the steps after the 2 warm-up steps of every round, rounds alternating in fresh processes):

- rlforge: its own ``timing_s/*`` (``trainer.history``): gen, reward, log_prob (old_log_prob + ref), update
  (update_actor), sync (update_weights), other = step - those (advantage, dataflow, the framework).
- TRL: its ``GRPOTrainer`` methods timed in place: gen = ``_generate`` (tokenize, ``generate``, decode), reward =
  ``_calculate_rewards``, log_prob = ``_get_per_token_logps_and_entropies`` called while preparing the batch (old and
  reference log-probs; none here: beta=0, one iteration), update = step - ``_prepare_inputs`` (loss forward,
  backward, clipping, optimizer step), other = ``_prepare_inputs`` - gen - reward - log_prob (advantages, padding,
  metrics). TRL shares the model with its generator: no sync.
- update GFLOP/s = 6 x parameters x tokens / update seconds (tokens: prompt + response tokens of the batch; 6 =
  2 for the forward, 4 for the backward multiply-adds; attention's own FLOPs, small at these lengths, left out).
- peak: the best fp32 GFLOP/s of a 1024 x 1024 matmul with all of this process's threads (and with one), measured
  first in the same run.
- decode bound: the tokens/s that the matrix products of one decoding step allow (every linear layer and the output
  head on P x G one-token rows, each timed alone), the ceiling of generation with this model and batch.
- CPU seconds (user + system, from /proc via psutil) of the trainer process and of the vLLM engine's processes per
  stage, for rlforge: a count that other jobs on the machine cannot raise, unlike wall times. The engine's CPU
  seconds during the update say whether it competes with the trainer for the cores.

Writes a JSON file (``--out``) and prints markdown tables (docs/performance.md keeps the figures).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from grpo_vs_trl import (
    alternate,
    build_model,
    contenders,
    parse_work_args,
    precision,
    prefixed_data,
    rlforge_history,
    served_round,
    step_timer,
    trl_trainer,
    work,
)

from rlforge import hookimpl

PHASES = ("gen", "reward", "log_prob", "update", "sync", "other")
RLFORGE_TIMINGS = {  # phase: rlforge's timing_s/* keys
    "gen": ("gen",), "reward": ("reward",), "log_prob": ("old_log_prob", "ref"), "update": ("update_actor",),
    "sync": ("update_weights",),
}
WARMUP = 2  # steps of each round left out (the first step starts the vLLM engine)


def matmul_peak(threads: int, n: int = 1024, repeats: int = 10) -> float:
    """Best fp32 GFLOP/s of an n x n matmul with ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best = min(timed(lambda: a @ b) for _ in range(repeats))
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / best / 1e9


def decode_bound(folder: Path, rows: int, repeats: int = 20) -> float:
    """Tokens/s that the decoding step's matrix products alone allow: every linear layer of the model (and its
    output head) applied to ``rows`` one-token rows, best time of each, summed; ``rows`` tokens per step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    seconds = 0.0
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):
                x = torch.randn(rows, layer.in_features)
                torch.nn.functional.linear(x, layer.weight)
                seconds += min(timed(lambda: torch.nn.functional.linear(x, layer.weight)) for _ in range(repeats))
    return rows / seconds


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# --- rlforge ----------------------------------------------------------------------------------------


class CpuMeter:
    """rlforge hooks: CPU seconds of this process and of the vLLM engine's processes in each stage of each step."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.engine: list[Any] = []
        self.steps: list[dict[str, dict[str, float]]] = []

    def _find_engine(self) -> bool:
        """Look for the engine's processes (vLLM titles them VLLM::EngineCore, VLLM::Worker); whether new ones were
        found."""
        if self.engine:
            return False
        self.engine = [p for p in self.me.children(recursive=True) if p.name().startswith("VLLM")]
        return bool(self.engine)

    def _now(self) -> tuple[float, float]:
        return sum(self.me.cpu_times()[:2]), sum(sum(p.cpu_times()[:2]) for p in self.engine)

    def _add(self, key: str, since: tuple[float, float]) -> None:
        now = self._now()
        self.current[key] = {"trainer": now[0] - since[0], "engine": now[1] - since[1]}

    @hookimpl
    def rlforge_step_start(self) -> None:
        self._find_engine()
        self.current: dict[str, dict[str, float]] = {}
        self.step_mark = self.mark = self._now()

    @hookimpl
    def rlforge_stage_start(self) -> None:
        self.mark = self._now()

    @hookimpl
    def rlforge_stage_end(self, stage: str) -> None:
        if self._find_engine():  # the engine started in this stage: its CPU seconds count from the next one
            self.mark = (self.mark[0], self._now()[1])
            self.step_mark = (self.step_mark[0], self.mark[1])
        self._add(stage, self.mark)

    @hookimpl
    def rlforge_step_end(self) -> None:
        self._add("step", self.step_mark)
        self.steps.append(self.current)


def rlforge_round(spec: dict) -> list[dict]:
    meter = CpuMeter()
    with prefixed_data(spec) as (_, overrides):
        history = rlforge_history(*work(spec), spec["who"].split("-", 1)[1], callbacks=(meter,),
                                  overrides=(*overrides, *precision(spec)[0]))
    out = []
    for h, cpu in zip(history, meter.steps):
        row = {phase: sum(h.get(f"timing_s/{k}", 0.0) for k in keys) for phase, keys in RLFORGE_TIMINGS.items()}
        row["step"] = h["timing_s/step"]
        row["other"] = row["step"] - sum(row[p] for p in RLFORGE_TIMINGS)
        row["tokens"] = h["perf/total_num_tokens"]
        row["cpu"] = cpu
        out.append(row)
    return out


# --- TRL --------------------------------------------------------------------------------------------


def trl_round(spec: dict) -> list[dict]:
    """TRL's step with its pieces timed by wrapping the trainer's methods on the instance."""
    timer = step_timer()
    steps: list[dict[str, float]] = []
    inside_prepare = [False]

    def current() -> dict[str, float]:
        while len(steps) <= len(timer.times):  # the step in progress is number len(timer.times)
            steps.append(dict.fromkeys(("prepare", "gen", "reward", "log_prob", "tokens"), 0.0))
        return steps[len(timer.times)]

    def wrap(trainer: Any, method: str, phase: str, only_in_prepare: bool = False) -> None:
        original = getattr(trainer, method)

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            if only_in_prepare and not inside_prepare[0]:  # the loss forward: part of the update
                return original(*args, **kwargs)
            inside_prepare[0] |= phase == "prepare"
            start = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                current()[phase] += time.perf_counter() - start
                inside_prepare[0] &= phase != "prepare"
            if phase == "prepare":
                current()["tokens"] += float(result["prompt_mask"].sum() + result["completion_mask"].sum())
            return result

        setattr(trainer, method, timed_call)

    with tempfile.TemporaryDirectory() as out, prefixed_data(spec) as (rows, _):
        trainer = trl_trainer(*work(spec), out, timer, rows=rows, **precision(spec)[1])
        wrap(trainer, "_prepare_inputs", "prepare")
        wrap(trainer, "_generate", "gen")
        wrap(trainer, "_calculate_rewards", "reward")
        wrap(trainer, "_get_per_token_logps_and_entropies", "log_prob", only_in_prepare=True)
        trainer.train()
    rows = []
    for step, s in zip(timer.times, steps):
        rows.append({"step": step, "gen": s["gen"], "reward": s["reward"], "log_prob": s["log_prob"],
                     "update": step - s["prepare"], "sync": 0.0,
                     "other": s["prepare"] - s["gen"] - s["reward"] - s["log_prob"], "tokens": s["tokens"]})
    return rows


# --- report -----------------------------------------------------------------------------------------


def summarize(rows: list[dict], params: int, gen_tokens: int, peak: float) -> dict:
    med = {k: statistics.median(r[k] for r in rows) for k in ("step", *PHASES, "tokens")}
    med["update_gflops"] = 6 * params * med["tokens"] / med["update"] / 1e9
    med["gen_tokens_per_s"] = gen_tokens / med["gen"]
    med["update_share_of_peak"] = med["update_gflops"] / peak
    med["other_share_of_step"] = med["other"] / med["step"]
    if "cpu" in rows[0]:
        stages = rows[0]["cpu"].keys()
        med["cpu"] = {st: {who: statistics.median(r["cpu"][st][who] for r in rows) for who in ("trainer", "engine")}
                      for st in stages}
    return med


def report(result: dict) -> None:
    print(f"\n{result['size']} ({result['params'] / 1e6:.2f}M params), {result['P']}x{result['G']}x{result['T']}, "
          f"fp32 matmul peak {result['peak_gflops']:.0f} GFLOP/s ({result['threads']} threads), "
          f"{result['peak_gflops_1t']:.0f} (1 thread), decoding-step matmul bound "
          f"{result['decode_bound_tokens_per_s']:.0f} tokens/s; median seconds per step\n")
    print("| contender | step | gen | reward | log-prob | update | sync | other | gen tok/s | gen % bound | "
          "update GFLOP/s | update % peak | other % step |")
    print("|---|" + "---|" * 12)
    for who, m in result["median"].items():
        print(f"| {who} | {m['step']:.3f} | " + " | ".join(f"{m[p]:.3f}" for p in PHASES)
              + f" | {m['gen_tokens_per_s']:.0f} | {100 * m['gen_tokens_per_s'] / result['decode_bound_tokens_per_s']:.0f}% "
              f"| {m['update_gflops']:.1f} | "
              f"{100 * m['update_share_of_peak']:.0f}% | {100 * m['other_share_of_step']:.1f}% |")
    for who, m in result["median"].items():
        if "cpu" in m:
            print(f"\n{who}: CPU seconds per stage (median step): "
                  + ", ".join(f"{st} trainer {c['trainer']:.2f} / engine {c['engine']:.2f}"
                              for st, c in m["cpu"].items()))


def main() -> None:
    args = parse_work_args(__doc__, steps=5, out="step_breakdown.json")
    if served_round(args, trl_round, rlforge_round):
        return
    load_before = os.getloadavg()
    threads = torch.get_num_threads()
    peak, peak_1t = matmul_peak(threads), matmul_peak(1)
    rows: dict[str, list[dict]] = {who: [] for who in contenders(args)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, args.size)
        bound = decode_bound(folder, args.prompts * args.samples)
        for who, got in alternate(args, __file__, folder):
            rows[who] += got[WARMUP:]
            print(f"{who}: " + " ".join(f"{r['step']:.3f}" for r in got[WARMUP:]) + " s/step", flush=True)
    gen_tokens = args.prompts * args.samples * args.tokens
    result = {"size": args.size, "precision": args.precision, "params": params, "P": args.prompts, "G": args.samples,
              "T": args.tokens,
              "threads": threads, "cpus": os.cpu_count(), "peak_gflops": peak, "peak_gflops_1t": peak_1t,
              "decode_bound_tokens_per_s": bound,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "median": {who: summarize(r, params, gen_tokens, peak) for who, r in rows.items()}, "rows": rows}
    report(result)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
