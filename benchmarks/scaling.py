"""Scaling curves and the breakdown of rlforge's GRPO step, on CPU (random char-level Llamas, fp32).

    python benchmarks/scaling.py [--out benchmarks/results] [--steps 6] [key=value ...]

- breakdown: the tiny model (~0.26M), 16 prompts x 8 samples x exactly 64 new tokens: the median seconds of
  every stage, the framework overhead (``timing_s/other``: the step minus its stages), and the wall time from
  one step's start to the next (everything the loop does, logging included);
- step time vs batch size: 4, 8, 16, 32 prompts x 8 samples x 32 tokens (tiny model);
- step time vs response length: 8 prompts x 8 samples x 16, 32, 64, 128 tokens (tiny model);
- peak memory vs model size: peak resident memory of a process that runs 3 steps of 8 x 8 x 32 on models of
  ~0.26M, 3.5M, 10.7M and 20.6M parameters (the process's baseline after imports is reported too).

Every point runs in a process of its own (so peak memory is that point's). Medians skip the first 2 steps.
Writes ``scaling.json`` to ``--out`` and the plots to ``--plot``; the summary goes to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from grpo_vs_trl import SIZES, build_model  # noqa: E402

BATCHES = [4, 8, 16, 32]
LENGTHS = [16, 32, 64, 128]
MEMORY_SIZES = ["tiny", "3m", "10m", "20m"]


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_point(size: str, p: int, g: int, t: int, steps: int, extra: list[str]) -> dict:
    """One configuration in this process: per-stage medians, wall time per step, peak memory."""
    from rlforge import Trainer, hookimpl, load_config

    base_mb = peak_mb()

    class Wall:
        def __init__(self) -> None:
            self.starts: list[float] = []

        @hookimpl
        def rlforge_step_start(self, step: int) -> None:
            self.starts.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, size)
        cfg = load_config("grpo", [
            f"model.path={folder}", f"trainer.runs_root={tmp}", f"trainer.total_steps={steps + 1}",
            f"data.train_batch_size={p}", f"rollout.n={g}", f"rollout.max_new_tokens={t}",
            f"rollout.min_new_tokens={t}", f"rollout.micro_batch_size={p * g}", f"actor.ppo_mini_batch_size={p}",
            "actor.lr=1e-6", "trainer.val_before_train=false", "trainer.val_every=0", "trainer.save_every=0",
            "data.arith.val_size=1", "trainer.progress=false", "logger.backends=[]", "trainer.samples_to_save=0", *extra,
        ])
        wall = Wall()
        trainer = Trainer(cfg, callbacks=[wall])
        trainer.fit()
    hist = trainer.history[2:steps]  # the extra last step only closes the wall-time interval of the one before
    walls = [b - a for a, b in zip(wall.starts[2:steps], wall.starts[3:steps + 1])]
    timing = {k.removeprefix("timing_s/"): statistics.median(h[k] for h in hist)
              for k in hist[0] if k.startswith("timing_s/")}
    return {"size": size, "params": params, "P": p, "G": g, "T": t, "timing_s": timing,
            "wall_s_per_step": statistics.median(walls), "peak_mb": peak_mb(), "baseline_mb": base_mb,
            "tokens_per_s": p * g * t / timing["step"]}


def spawn(size: str, p: int, g: int, t: int, steps: int, extra: list[str]) -> dict:
    point = json.dumps({"size": size, "p": p, "g": g, "t": t, "steps": steps, "extra": extra})
    out = subprocess.run([sys.executable, __file__, "--point", point], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{size:>5} {p:>3}x{g}x{t:<4} step {result['timing_s']['step']:.3f} s, other "
          f"{result['timing_s']['other'] * 1000:.1f} ms, peak {result['peak_mb']:.0f} MB", flush=True)
    return result


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, label in ((axes[0], "batch", "prompts per step (x 8 samples, 32 tokens)"),
                           (axes[1], "length", "new tokens per sample (8 x 8 samples)")):
        pts = results[key]
        xs = [r["P"] if key == "batch" else r["T"] for r in pts]
        ys = [r["timing_s"]["step"] for r in pts]
        ax.plot(xs, ys, "o-", label="measured")
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], "--", color="gray", label="linear from the first point")
        ax.set(xlabel=label, ylabel="seconds per step", xscale="log", yscale="log")
        ax.legend()
    mem = results["memory"]
    axes[2].plot([r["params"] / 1e6 for r in mem], [r["peak_mb"] for r in mem], "o-", label="peak")
    axes[2].plot([r["params"] / 1e6 for r in mem], [r["baseline_mb"] for r in mem], "--", label="after imports")
    axes[2].set(xlabel="parameters (millions)", ylabel="resident memory (MB)")
    axes[2].legend()
    fig.suptitle("rlforge GRPO step on CPU (fp32, hf engine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--plot", default="docs/img/scaling.png")
    parser.add_argument("--steps", type=int, default=6, help="steps per point; the first 2 are warm-up")
    parser.add_argument("--point", help=argparse.SUPPRESS)  # internal: run one point, print its JSON
    parser.add_argument("overrides", nargs="*", help="config overrides for every point, key=value")
    args = parser.parse_args()
    if args.point:
        spec = json.loads(args.point)
        print(json.dumps(run_point(spec["size"], spec["p"], spec["g"], spec["t"], spec["steps"], spec["extra"])))
        return
    extra = args.overrides
    results = {
        "breakdown": spawn("tiny", 16, 8, 64, args.steps, extra),
        "batch": [spawn("tiny", p, 8, 32, args.steps, extra) for p in BATCHES],
        "length": [spawn("tiny", 8, 8, t, args.steps, extra) for t in LENGTHS],
        "memory": [spawn(size, 8, 8, 32, 4, extra) for size in MEMORY_SIZES],
        "overrides": extra,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(results, indent=2))
    plot(results, Path(args.plot))
    b = results["breakdown"]
    print("breakdown (s):", {k: round(v, 4) for k, v in b["timing_s"].items()},
          f"overhead {100 * b['timing_s']['other'] / b['timing_s']['step']:.1f}% of the step, "
          f"wall {b['wall_s_per_step']:.3f} s/step")


if __name__ == "__main__":
    main()
