"""Validation metrics under rlforge's names and verl's (``val-core/<source>/<var>/mean@N``), hand-computed."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge.module import generation_metrics


def _batch(sources: list[str], uids: list[int], scores: list[float], acc: list[float] | None) -> B.Batch:
    tensors = {B.SCORES: torch.tensor(scores), **({B.ACC: torch.tensor(acc)} if acc is not None else {})}
    return B.Batch(tensors, {B.DATA_SOURCE: sources, B.UID: uids})


def test_two_sources_two_samples_per_prompt():
    # gsm8k: prompt 0 scores (1, 0), prompt 1 (1, 1); math: prompt 2 (0, 0), prompt 3 (1, 0)
    batch = _batch(["gsm8k"] * 4 + ["math"] * 4, [0, 0, 1, 1, 2, 2, 3, 3],
                   [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    m = generation_metrics(batch)
    assert m["val/accuracy"] == pytest.approx(4 / 8)
    assert m["val/gsm8k/accuracy"] == pytest.approx(0.75) and m["val/math/accuracy"] == pytest.approx(0.25)
    # per-prompt means (0.5, 1.0) -> 0.75; population stds (0.5, 0.0) -> 0.25
    assert m["val-core/gsm8k/acc/mean@2"] == pytest.approx(0.75)
    assert m["val-aux/gsm8k/acc/std@2"] == pytest.approx(0.25)
    assert m["val-aux/gsm8k/reward/mean@2"] == pytest.approx(0.75)  # acc is the core variable: reward is aux
    # math: means (0.0, 0.5) -> 0.25; stds (0.0, 0.5) -> 0.25
    assert m["val-core/math/acc/mean@2"] == pytest.approx(0.25)
    assert m["val-aux/math/reward/std@2"] == pytest.approx(0.25)
    assert not any(k.startswith("val-core/") and "/reward/" in k for k in m)


def test_without_acc_the_reward_is_core_and_one_sample_has_no_std():
    m = generation_metrics(_batch(["arith"] * 3, [0, 1, 2], [0.5, 1.0, 0.0], None))
    assert m == {"val/reward": pytest.approx(0.5), "val-core/arith/reward/mean@1": pytest.approx(0.5)}
