"""Step time of ``trainer.pipeline=sync`` against ``one_step_off`` and ``async`` on the benchmark model
(docs/pipelines.md).

    python benchmarks/pipeline_bench.py [--size 20m] [--prompts 16] [--samples 8] [--tokens 64] [--steps 8]
                                        [--rounds 1] [--engine hf] [--modes sync one_step_off async]
                                        [--max-staleness 2] [--controller local] [--out pipeline_bench.json]

GRPO on a random char-level Llama (``grpo_vs_trl.build_model``), P prompts x G samples, exactly T new tokens
per sample (min = max new tokens), fp32, one optimizer step per batch; the old log-probs are recomputed in both
modes (``actor.reuse_rollout_log_probs=false``), so the work per step is the same. The modes alternate, each
round in a fresh process; the median seconds per step of the steady state (the first 2 steps of a round skipped:
warm-up, and the first step of one_step_off has nothing to overlap; so are the last steps that launch no generation,
1 with one_step_off and max_staleness with async) are reported with the median ``timing_s/gen`` (sync: the
generation; one_step_off and async: serving the batch generated ahead and launching the next ones) and
``timing_s/wait_prev_gen`` (one_step_off and async: the wait for this step's batch from the rollout thread).
``async`` runs with ``trainer.max_staleness=--max-staleness``; a speed-up is reported for each mode against sync.

``--controller ray`` runs every mode under the Ray controller with one actor rank and one rollout worker
(``ray.rollout_workers=1``), each on a placement bundle of ``--cpus-per-worker`` CPUs (Ray gives each worker that many
torch threads): generation and training on cores of their own, so the pipelines can overlap without competing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_vs_trl import SIZES, build_model

MODES = ("sync", "one_step_off", "async")
WARMUP = 2  # steps of each round left out: the first ones (engine start; one_step_off has nothing to overlap yet)
KEYS = ("timing_s/step", "timing_s/gen", "timing_s/wait_prev_gen", "timing_s/old_log_prob", "timing_s/update_actor")


def mode_overrides(mode: str, max_staleness: int) -> list[str]:
    """The config of one mode (``trainer.max_staleness`` belongs to async only)."""
    return [f"trainer.pipeline={mode}", *([f"trainer.max_staleness={max_staleness}"] if mode == "async" else [])]


def ending_steps(mode: str, max_staleness: int) -> int:
    """The last steps of a run that launch no generation (the batches ahead stop at trainer.total_steps), so they
    train without anything beside them: left out with the warm-up, to time the steady state only."""
    return {"sync": 0, "one_step_off": 1, "async": max_staleness}[mode]


def controller_overrides(controller: str, cpus: float) -> list[str]:
    """``--controller``: the local controller as configured, or Ray with a rollout worker beside one actor rank."""
    if controller == "local":
        return []
    return ["trainer.controller=ray", "ray.rollout_workers=1", f"ray.num_cpus={int(2 * cpus)}",
            f"ray.cpus_per_worker={cpus}", f"ray.rollout_cpus_per_worker={cpus}"]


def run_steps(spec: dict) -> list[dict[str, float]]:
    from rlforge import Trainer, load_config

    p, g, t = spec["p"], spec["g"], spec["t"]
    with tempfile.TemporaryDirectory() as runs:
        cfg = load_config("grpo", [
            f"model.path={spec['folder']}", f"trainer.runs_root={runs}", f"trainer.total_steps={spec['steps']}",
            f"data.train_batch_size={p}", f"rollout.n={g}", f"rollout.max_new_tokens={t}", f"rollout.min_new_tokens={t}",
            f"rollout.micro_batch_size={p * g}", f"actor.ppo_mini_batch_size={p}", "actor.lr=1e-6",
            "actor.reuse_rollout_log_probs=false", f"rollout.name={spec['engine']}",
            *mode_overrides(spec["mode"], spec["max_staleness"]), *controller_overrides(spec["controller"], spec["cpus"]),
            "trainer.val_before_train=false", "trainer.val_every=0", "trainer.save_every=0", "data.arith.val_size=1",
            "trainer.progress=false", "logger.backends=[]", "trainer.samples_to_save=0",
        ])
        trainer = Trainer(cfg)
        trainer.fit()
        return [{k: h.get(k, 0.0) for k in KEYS} for h in trainer.history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="20m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="steps per round; the first 2 are warm-up")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--engine", default="hf", help="rollout.name")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="sync first: the reference")
    parser.add_argument("--max-staleness", type=int, default=2, help="trainer.max_staleness of the async mode")
    parser.add_argument("--controller", choices=("local", "ray"), default="local")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="--controller ray: CPUs of each worker")
    parser.add_argument("--out", default="pipeline_bench.json")
    parser.add_argument("--round", help=argparse.SUPPRESS)  # internal: one round, prints its per-step timings
    args = parser.parse_args()
    if args.round:
        print(json.dumps(run_steps(json.loads(args.round))))
        return
    modes = args.modes
    steps: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, args.size)
        for _ in range(args.rounds):
            for mode in modes:
                spec = {"folder": str(folder), "p": args.prompts, "g": args.samples, "t": args.tokens,
                        "steps": args.steps, "engine": args.engine, "mode": mode, "max_staleness": args.max_staleness,
                        "controller": args.controller, "cpus": args.cpus_per_worker}
                out = subprocess.run([sys.executable, __file__, "--round", json.dumps(spec)], check=True,
                                     capture_output=True, text=True)
                history = json.loads(out.stdout.strip().splitlines()[-1])
                kept = history[WARMUP : len(history) - ending_steps(mode, args.max_staleness)]
                seconds = " ".join(f"{s['timing_s/step']:.2f}" for s in kept)
                print(f"{mode}: {seconds} s/step", flush=True)
                steps[mode] += kept
    med = {m: {k: statistics.median(s[k] for s in steps[m]) if steps[m] else 0.0 for k in KEYS} for m in modes}
    speedup = {m: med["sync"]["timing_s/step"] / med[m]["timing_s/step"] for m in modes
               if m != "sync" and "sync" in med and med[m]["timing_s/step"]}
    result = {"size": args.size, "params": params, "P": args.prompts, "G": args.samples, "T": args.tokens,
              "engine": args.engine, "max_staleness": args.max_staleness, "controller": args.controller,
              "median": med, "steps": steps,
              "speedup": speedup}
    print("| mode | s/step | gen | wait_prev_gen | old_log_prob | update_actor |\n|---|---|---|---|---|---|")
    for m in modes:
        print(f"| {m} | " + " | ".join(f"{med[m][k]:.2f}" for k in KEYS) + " |")
    for m, x in speedup.items():
        print(f"{args.size} ({params / 1e6:.1f}M), {args.prompts}x{args.samples}x{args.tokens}, {args.engine}, "
              f"{args.controller}: "
              f"{m} {x:.2f}x the speed of sync")
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
