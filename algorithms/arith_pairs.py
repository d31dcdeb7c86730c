"""``arith_pairs``: the built-in arithmetic task as preference pairs (the default data of the preference presets).

Each row of the ``arith`` dataset (same questions, same train/val split, same ``data.arith.*`` options) gains
``chosen`` (the right answer) and ``rejected`` (a wrong one: the sum moved by 1 to 10, never below 0, drawn
with a seeded generator: ``trainer.seed`` for training, a fixed seed for validation). The rows keep
``reward_model.ground_truth``, so a policy trained on them is also validated by generating answers (exact
match), and a reward model by its held-out pairwise accuracy.
"""

from __future__ import annotations

import random
from typing import Any

from rlforge.plugins.data.builtin import arith_dataset

from rlforge.hookspecs import hookimpl

WRONG_BY = 10  # a rejected answer is off by 1..WRONG_BY
VAL_SEED = 12346  # the held-out pairs are the same whatever trainer.seed (as the held-out questions are)


def wrong_answer(truth: int, rng: random.Random) -> int:
    """A wrong non-negative answer within ``WRONG_BY`` of ``truth``."""
    delta = rng.randint(1, WRONG_BY)
    return truth + delta if truth - delta < 0 or rng.random() < 0.5 else truth - delta


def with_pairs(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """``rows`` (arith rows) with ``chosen`` = the right answer and ``rejected`` = a wrong one."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        truth = int(row["reward_model"]["ground_truth"])
        out.append({**row, "chosen": str(truth), "rejected": str(wrong_answer(truth, rng))})
    return out


def arith_pairs_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """The ``arith`` split with a right (chosen) and a wrong (rejected) answer per question."""
    return with_pairs(arith_dataset(config, split), seed=config.trainer.seed if split == "train" else VAL_SEED)


@hookimpl
def rlforge_register(registry):
    registry.dataset.register("arith_pairs", arith_pairs_dataset,
                              description="the 'What is a+b?' task as preference pairs (right vs wrong answer)")
