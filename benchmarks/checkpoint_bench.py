"""The seconds a checkpoint blocks the training loop, ``strategy.checkpoint=full`` (gathered, written before the next
step) against ``async`` (the shards written in the background, docs/reliability.md), on the 20.6M-parameter model of
``grpo_vs_trl.py`` (float32: 82 MB of weights, 165 MB of AdamW state) under the local controller.

    python benchmarks/checkpoint_bench.py [--steps 6] [--rounds 2] [--out checkpoint_bench.json]

Each round runs both modes (alternating, fresh trainers) for ``--steps`` GRPO steps of small work (4 prompts x 2
samples x 16 tokens) with a checkpoint after every step, and reads the trainer's own metrics of the checkpoints before
the last one (the last is always written whole, with ``actor/``): ``timing_s/save_checkpoint`` (the loop blocked)
and, for ``async``, ``timing_s/checkpoint_write`` (the background write), plus ``timing_s/step`` (a step that runs
beside a write). Prints medians and the machine's matmul speed (scripts/machine_speed.py); writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from grpo_vs_trl import build_model, rlforge_history  # noqa: E402
from machine_speed import matmul_gflops  # noqa: E402

MODES = ("full", "async")


def run(folder: Path, mode: str, steps: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as run_dir:
        history = rlforge_history(folder, 4, 2, 16, steps, overrides=(
            "trainer.save_every=1", "trainer.keep_last_n=2", f"strategy.checkpoint={mode}",
            f"trainer.run_dir={run_dir}", "logger.backends=[jsonl]"))
        logged = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]

    def before_last(name: str) -> list[float]:  # the last checkpoint is written whole in both modes
        return [r[name] for r in logged if name in r and r["step"] < steps]

    return {"blocked_s": before_last("timing_s/save_checkpoint"), "write_s": before_last("timing_s/checkpoint_write"),
            "step_s": [h["timing_s/step"] for h in history[:-1]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="checkpoint_bench.json")
    args = parser.parse_args()
    result: dict = {"gflops_2_threads": matmul_gflops(2), "torch": torch.__version__}
    torch.set_num_threads(2)
    runs: dict[str, dict[str, list[float]]] = {m: {"blocked_s": [], "write_s": [], "step_s": []} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        result["parameters"] = build_model(Path(tmp), "20m")
        for _ in range(args.rounds):
            for mode in MODES:
                for key, values in run(Path(tmp), mode, args.steps).items():
                    runs[mode][key] += values
    for mode in MODES:
        result[mode] = r = {**runs[mode], **{f"median_{k}": statistics.median(v) for k, v in runs[mode].items() if v}}
        write = f", background write {r['median_write_s']:.3f} s" if "median_write_s" in r else ""
        print(f"{mode}: blocked {r['median_blocked_s']:.3f} s per checkpoint{write}, step {r['median_step_s']:.2f} s "
              f"(medians of {len(r['blocked_s'])} checkpoints)", flush=True)
    print(f"machine: fp32 matmul {result['gflops_2_threads']:.0f} GFLOP/s on 2 threads; "
          f"{result['parameters'] / 1e6:.1f}M parameters")
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
