"""The full RLHF path on the built-in task, on CPU: preference pairs -> reward model -> GRPO on the learned reward,
and DPO on the same pairs.

    python scripts/rlhf_demo.py --out rlhf_demo            # the figures in docs/algorithms/preference.md
    python scripts/rlhf_demo.py --out /tmp/x --quick       # a few steps of each (the slow test)

1. Pairs: the shipped SFT model (builtin:tiny-arith) samples ``--samples`` answers at temperature 1 to each of
   ``--prompts`` training questions of the arith task; the rule reward (exact match) marks them right or wrong; a
   question with both gives pairs (a right answer against each distinct wrong one, up to
   ``--pairs-per-question``). The pairs of a tenth of the questions are held out.
2. Reward model: ``rlforge fit --algo rm`` on the pairs; held-out pairwise accuracy before and after; exported.
3. GRPO with ``reward.manager=model``: on the learned reward only (``rule_weight=0``), then on the learned reward
   plus the rule reward (``rule_weight=1``); validation reports the exact-match accuracy on the held-out questions
   (the rule's ``acc``), greedy, before and after.
4. DPO on the same pairs, validated the same way.

Writes ``pairs_train.jsonl``, ``pairs_heldout.jsonl``, ``val_prompts.jsonl``, the runs (a folder per algorithm),
``reward_model/`` (the exported reward model) and ``results.json`` into ``--out``, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlforge import Trainer, batch as B, load_config
from rlforge.build import Builder
from rlforge.plugin_manager import PluginManager


@dataclass
class Sizes:
    prompts: int = 1024  # training questions sampled for pairs
    samples: int = 8  # answers sampled per question
    pairs_per_question: int = 4  # a right answer against up to this many distinct wrong ones
    rm_steps: int = 60  # reward-model steps (32 pairs each)
    grpo_steps: int = 40  # GRPO steps on the learned reward
    dpo_steps: int = 60  # DPO steps (32 pairs each)
    val_size: int = 200  # held-out questions for exact-match accuracy
    batch: int = 32  # pairs (reward model, DPO) or prompts (GRPO) per step


QUICK = Sizes(prompts=64, samples=4, rm_steps=3, grpo_steps=2, dpo_steps=2, val_size=16, batch=4)
PAIR_ACC = "val/rewards/accuracies"
COMMON = ["trainer.progress=false", "logger.backends=[console]", "trainer.save_every=0", "trainer.val_every=0"]


def sample_pairs(sizes: Sizes, seed: int = 1) -> tuple[list[dict[str, Any]], int]:
    """Pairs (right vs wrong sampled answer) from the SFT model on the first training questions; and the number of
    samples drawn."""
    import torch

    from rlforge.data import collate, tokenize_rows
    from rlforge.sampling import SamplingParams

    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [f"trainer.seed={seed}", f"data.arith.val_size={sizes.val_size}"], plugins=pm)
    builder = Builder(cfg, pm)
    module = builder.module()
    module.configure_model()
    rows = builder.dataset("train")[: sizes.prompts]
    prompts = tokenize_rows(rows, module.tokenizer, cfg.data.max_prompt_length, True, "arith (train)")
    engine, reward = builder.rollout(module.actor, module.tokenizer), builder.reward(module.tokenizer)
    params = SamplingParams(sizes.samples, 1.0, 1.0, 0, cfg.rollout.max_new_tokens)
    torch.manual_seed(seed)  # the same pairs on every run
    try:
        batch = engine.generate(collate(prompts, module.tokenizer.pad_token_id, list(range(len(prompts)))), params)
        batch = reward.score(batch)
    finally:
        reward.close()
    answers: dict[int, tuple[list[str], list[str]]] = {}  # question -> (distinct right, distinct wrong answers)
    for uid, text, acc in zip(batch[B.UID], batch[B.RESPONSE_TEXT], batch[B.ACC].tolist()):
        side = answers.setdefault(uid, ([], []))[0 if acc == 1.0 else 1]
        if text not in side:
            side.append(text)
    pairs = []
    for uid, (right, wrong) in sorted(answers.items()):
        for j, bad in enumerate(wrong[: sizes.pairs_per_question] if right else []):
            # no ground truth in the pairs: validation's exact match is on the held-out questions only
            pairs.append({"prompt": rows[uid]["prompt"], "data_source": rows[uid]["data_source"], "question": uid,
                          "chosen": right[j % len(right)], "rejected": bad})
    return pairs, len(batch)


def log(message: str, start: float) -> None:
    print(f"[rlhf_demo {time.perf_counter() - start:5.0f} s] {message}", flush=True)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def fit(algo: str, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One run; its summary plus the first and last validation metrics."""
    validations: list[dict[str, float]] = []

    class Record:
        @staticmethod
        def rlforge_validation_end(metrics: dict[str, float]) -> None:
            validations.append(metrics)

    config = load_config(algo, [*COMMON, f"trainer.runs_root={out}", f"trainer.experiment={algo}", *overrides])
    trainer = Trainer(config, callbacks=[Record()])
    summary = trainer.fit()
    return {**summary, "val_before": validations[0], "val_after": validations[-1]}


def run(out: Path, sizes: Sizes) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    pairs, drawn = sample_pairs(sizes)
    log(f"{len(pairs)} pairs from {drawn} sampled answers", start)
    questions = sorted({p["question"] for p in pairs})
    random.Random(0).shuffle(questions)
    held_out = set(questions[: max(1, len(questions) // 10)])  # a tenth of the questions, all their pairs
    train = write_jsonl(out / "pairs_train.jsonl", [p for p in pairs if p["question"] not in held_out])
    heldout = write_jsonl(out / "pairs_heldout.jsonl", [p for p in pairs if p["question"] in held_out])
    held = sum(p["question"] in held_out for p in pairs)
    pm = PluginManager(autoload=False)
    val_rows = Builder(load_config("grpo", [f"data.arith.val_size={sizes.val_size}"], plugins=pm), pm).dataset("val")
    val = write_jsonl(out / "val_prompts.jsonl", val_rows)
    files = ["data.name=files", f"data.train_files=[{train}]", f"data.train_batch_size={sizes.batch}",
             f"actor.ppo_mini_batch_size={sizes.batch}"]
    results: dict[str, Any] = {"sizes": asdict(sizes), "samples_drawn": drawn, "pairs_train": len(pairs) - held,
                               "pairs_heldout": held}

    rm = fit("rm", out, [*files, f"data.val_files=[{heldout}]", f"trainer.total_steps={sizes.rm_steps}",
                         "actor.lr=3e-4"])
    from rlforge.tools.export import export_checkpoint

    export_checkpoint(rm["run_dir"], out / "reward_model", pm.registry)
    results["rm"] = rm
    log(f"reward model: held-out pairwise accuracy {rm['accuracy_before']:.3f} -> {rm['accuracy_after']:.3f}", start)
    grpo = ["reward.manager=model", f"reward.model.path={out / 'reward_model'}",
            f"trainer.total_steps={sizes.grpo_steps}", f"data.arith.val_size={sizes.val_size}",
            f"data.train_batch_size={sizes.batch}", f"actor.ppo_mini_batch_size={min(8, sizes.batch)}"]
    for name, weight in (("grpo_model_reward", 0.0), ("grpo_model_and_rule", 1.0)):
        results[name] = fit("grpo", out, [*grpo, f"reward.model.rule_weight={weight}", f"trainer.experiment={name}"])
        log(f"{name}: exact match {results[name]['accuracy_before']:.3f} -> {results[name]['accuracy_after']:.3f}",
            start)
    results["dpo"] = fit("dpo", out, [*files, f"data.val_files=[{val},{heldout}]",
                                      f"trainer.total_steps={sizes.dpo_steps}", "actor.lr=5e-5"])
    results["seconds"] = time.perf_counter() - start
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return results


def report(results: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    rm, dpo = results["rm"], results["dpo"]
    grpo, mixed = results["grpo_model_reward"], results["grpo_model_and_rule"]
    lines = [
        f"pairs: {results['pairs_train']} for training, {results['pairs_heldout']} held out "
        f"(from {results['samples_drawn']} sampled answers)",
        "| run | metric | before | after |", "|---|---|---|---|",
        f"| reward model ({results['sizes']['rm_steps']} steps) | held-out pairwise accuracy | "
        f"{pct(rm['accuracy_before'])} | {pct(rm['accuracy_after'])} |",
        f"| GRPO on the learned reward ({results['sizes']['grpo_steps']} steps) | greedy exact match | "
        f"{pct(grpo['accuracy_before'])} | {pct(grpo['accuracy_after'])} |",
        f"| GRPO on the learned reward + the rule reward ({results['sizes']['grpo_steps']} steps) | "
        f"greedy exact match | "
        f"{pct(mixed['accuracy_before'])} | {pct(mixed['accuracy_after'])} |",
        f"| DPO on the pairs ({results['sizes']['dpo_steps']} steps) | greedy exact match | "
        f"{pct(dpo['accuracy_before'])} | {pct(dpo['accuracy_after'])} |",
        f"| DPO on the pairs | held-out pair accuracy (implicit reward) | - (all 0) | "
        f"{pct(dpo['val_after'].get(PAIR_ACC))} |",
        f"total: {results['seconds']:.0f} s",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="rlhf_demo", help="output folder")
    parser.add_argument("--quick", action="store_true", help="a few steps of each part (smoke test)")
    for name, value in asdict(Sizes()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"default {value}")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    sizes = Sizes(**{k: getattr(args, k) if getattr(args, k) is not None else v for k, v in asdict(sizes).items()})
    print(report(run(Path(args.out), sizes)))


if __name__ == "__main__":
    main()
