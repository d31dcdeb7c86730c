"""The full RLHF path on the built-in task, on CPU: preference pairs -> reward model -> GRPO on the learned reward,
and DPO on the same pairs.

    python scripts/rlhf_demo.py --out rlhf_demo            # the figures in docs/algorithms/preference.md
    python scripts/rlhf_demo.py --out /tmp/x --quick       # a few steps of each (the slow test)

1. Pairs: the shipped SFT model (builtin:tiny-arith) samples ``--samples`` answers at temperature 1 to each of
   ``--prompts`` training questions of the arith task; the rule reward (exact match) marks them right or wrong; a
   question with both gives a pair (chosen = a right answer, rejected = a wrong one). A tenth of the questions'
   pairs are held out.
2. Reward model: ``rlforge fit --algo rm`` on the pairs; held-out pairwise accuracy before and after; exported.
3. GRPO with ``reward.manager=model`` (the learned reward only: ``rule_weight=0``); validation still reports the
   exact-match accuracy on the held-out questions (the rule's ``acc``), greedy, before and after.
4. DPO on the same pairs, validated the same way.

Writes ``pairs_train.jsonl``, ``pairs_heldout.jsonl``, ``val_prompts.jsonl``, the runs, ``rm/`` (the exported
reward model) and ``results.json`` into ``--out``, and prints a table.
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
    rm_steps: int = 60  # reward-model steps (32 pairs each)
    grpo_steps: int = 60  # GRPO steps on the learned reward
    dpo_steps: int = 60  # DPO steps (32 pairs each)
    val_size: int = 200  # held-out questions for exact-match accuracy


QUICK = Sizes(prompts=64, samples=4, rm_steps=3, grpo_steps=2, dpo_steps=2, val_size=16)
COMMON = ["trainer.progress=false", "logger.backends=[console]", "trainer.save_every=0", "trainer.val_every=0"]


def sample_pairs(sizes: Sizes, seed: int = 1) -> tuple[list[dict[str, Any]], int]:
    """Pairs (right vs wrong sampled answer) from the SFT model on the first training questions; and the number of
    samples drawn."""
    from rlforge.data import collate, tokenize_rows
    from rlforge.protocols import SamplingParams

    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [f"trainer.seed={seed}", f"data.arith.val_size={sizes.val_size}"], plugins=pm)
    builder = Builder(cfg, pm)
    module = builder.module()
    module.configure_model()
    rows = builder.dataset("train")[: sizes.prompts]
    prompts = tokenize_rows(rows, module.tokenizer, cfg.data.max_prompt_length, True, "arith (train)")
    engine, reward = builder.rollout(module.actor, module.tokenizer), builder.reward(module.tokenizer)
    params = SamplingParams(sizes.samples, 1.0, 1.0, 0, cfg.rollout.max_new_tokens)
    try:
        batch = engine.generate(collate(prompts, module.tokenizer.pad_token_id, list(range(len(prompts)))), params)
        batch = reward.score(batch)
    finally:
        reward.close()
    by_prompt: dict[int, dict[bool, str]] = {}
    for uid, text, acc in zip(batch[B.UID], batch[B.RESPONSE_TEXT], batch[B.ACC].tolist()):
        by_prompt.setdefault(uid, {}).setdefault(acc == 1.0, text)
    pairs = [{**rows[uid], "chosen": answers[True], "rejected": answers[False]}
             for uid, answers in sorted(by_prompt.items()) if len(answers) == 2]
    return pairs, len(batch)


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

    trainer = Trainer(load_config(algo, [*COMMON, f"trainer.runs_root={out}", f"trainer.experiment={algo}",
                                         *overrides]), callbacks=[Record()])
    summary = trainer.fit()
    return {**summary, "val_before": validations[0], "val_after": validations[-1]}


def run(out: Path, sizes: Sizes) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    pairs, drawn = sample_pairs(sizes)
    rng = random.Random(0)
    rng.shuffle(pairs)
    held = max(1, len(pairs) // 10)
    train = write_jsonl(out / "pairs_train.jsonl", pairs[held:])
    heldout = write_jsonl(out / "pairs_heldout.jsonl", pairs[:held])
    pm = PluginManager(autoload=False)
    val_rows = Builder(load_config("grpo", [f"data.arith.val_size={sizes.val_size}"], plugins=pm), pm).dataset("val")
    val = write_jsonl(out / "val_prompts.jsonl", val_rows)
    files = ["data.name=files", f"data.train_files=[{train}]"]
    results: dict[str, Any] = {"sizes": asdict(sizes), "samples_drawn": drawn, "pairs_train": len(pairs) - held,
                               "pairs_heldout": held}

    rm = fit("rm", out, [*files, f"data.val_files=[{heldout}]", f"trainer.total_steps={sizes.rm_steps}",
                         "actor.lr=3e-4", "actor.ppo_mini_batch_size=32"])
    from rlforge.tools.export import export_checkpoint

    export_checkpoint(rm["run_dir"], out / "rm", pm.registry)
    results["rm"] = rm
    results["grpo_model_reward"] = fit("grpo", out, [
        "reward.manager=model", f"reward.model.path={out / 'rm'}", f"trainer.total_steps={sizes.grpo_steps}",
        f"data.arith.val_size={sizes.val_size}"])
    results["dpo"] = fit("dpo", out, [*files, f"data.val_files=[{val},{heldout}]",
                                      f"trainer.total_steps={sizes.dpo_steps}", "actor.lr=5e-5"])
    results["seconds"] = time.perf_counter() - start
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return results


def report(results: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    rm, grpo, dpo = results["rm"], results["grpo_model_reward"], results["dpo"]
    lines = [
        f"pairs: {results['pairs_train']} for training, {results['pairs_heldout']} held out "
        f"(from {results['samples_drawn']} sampled answers)",
        "| run | metric | before | after |", "|---|---|---|---|",
        f"| reward model ({results['sizes']['rm_steps']} steps) | held-out pairwise accuracy | "
        f"{pct(rm['accuracy_before'])} | {pct(rm['accuracy_after'])} |",
        f"| GRPO on the learned reward ({results['sizes']['grpo_steps']} steps) | greedy exact match | "
        f"{pct(grpo['accuracy_before'])} | {pct(grpo['accuracy_after'])} |",
        f"| DPO on the pairs ({results['sizes']['dpo_steps']} steps) | greedy exact match | "
        f"{pct(dpo['accuracy_before'])} | {pct(dpo['accuracy_after'])} |",
        f"| DPO on the pairs | held-out pair accuracy (implicit reward) | "
        f"{pct(dpo['val_before'].get('val/rewards/accuracies'))} | {pct(dpo['val_after'].get('val/rewards/accuracies'))} |",
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
