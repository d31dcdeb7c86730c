"""GRPO on the default task in variants (fp32, bf16-mixed, LoRA; the one_step_off and async pipelines): validation
accuracy over the steps, one figure.

    python benchmarks/learning_variants.py --steps 200 --out docs/img/variants.png [--variants fp32 "lora r16"]
    python benchmarks/learning_variants.py --steps 200 --out docs/img/pipelines.png --variants fp32 one_step_off \
        "async S=2" "async S=2, TIS"

Each variant is the default run (``rlforge fit --algo grpo``, same seeds) with the overrides of ``VARIANTS``.
Prints a markdown table (docs/models.md keeps the latest figures), writes the figure and ``<out>.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rlforge import Trainer, hookimpl, load_config

VARIANTS: dict[str, list[str]] = {
    "fp32": [],
    "bf16-mixed": ["model.precision=bf16-mixed"],
    "lora r16": ["model.lora.rank=16", "model.lora.alpha=32", "actor.lr=3e-4"],
    "one_step_off": ["trainer.pipeline=one_step_off"],
    "async S=2": ["trainer.pipeline=async", "trainer.max_staleness=2"],
    "async S=2, TIS": ["trainer.pipeline=async", "trainer.max_staleness=2", "algorithm.rollout_is=token"],
}


class Validations:
    """A callback that keeps ``(step, val/accuracy)`` of every validation."""

    def __init__(self) -> None:
        self.points: list[tuple[int, float]] = []

    @hookimpl
    def rlforge_validation_end(self, step, metrics) -> None:
        self.points.append((int(step), float(metrics["val/accuracy"])))


def run(overrides: list[str], steps: int, val_every: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("grpo", [f"trainer.runs_root={tmp}", f"trainer.total_steps={steps}",
                                   f"trainer.val_every={val_every}", "trainer.save_every=0", "trainer.progress=false",
                                   "logger.backends=[]", *overrides])
        seen = Validations()
        start = time.perf_counter()
        Trainer(cfg, callbacks=[seen]).fit()
        return {"overrides": overrides, "val_accuracy": seen.points, "seconds": time.perf_counter() - start}


def plot(results: dict[str, dict], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, r in results.items():
        steps, acc = zip(*r["val_accuracy"])
        ax.plot(steps, [100 * a for a in acc], marker="o", markersize=4, label=name)
    ax.set(title="GRPO on the default task: greedy validation accuracy", xlabel="step", ylabel="accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--val-every", type=int, default=25)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", default="variants.png", help="the figure; the figures also go to <out>.json")
    args = parser.parse_args()
    results = {}
    print("| variant | overrides | val accuracy before -> after | seconds |")
    print("|---|---|---|---|")
    for name in args.variants:
        r = results[name] = run(VARIANTS[name], args.steps, args.val_every)
        first, last = r["val_accuracy"][0][1], r["val_accuracy"][-1][1]
        print(f"| {name} | `{' '.join(r['overrides']) or '(default)'}` | {100 * first:.1f}% -> {100 * last:.1f}% | "
              f"{r['seconds']:.0f} |", flush=True)
    out = Path(args.out)
    plot(results, out)
    out.with_suffix(".json").write_text(json.dumps({"steps": args.steps, "results": results}, indent=2))


if __name__ == "__main__":
    main()
