"""Validation metrics under rlforge's names and verl's (``val-core/<source>/<var>/mean@N``), hand-computed."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge.module import generation_metrics


def _batch(sources: list[str], uids: list[int], scores: list[float], acc: list[float] | None) -> B.Batch:
    """A scored batch; ``acc`` given, each sample's verl ``reward_extra_info`` has it, as the rule manager writes it."""
    tensors = {B.SCORES: torch.tensor(scores), **({B.ACC: torch.tensor(acc)} if acc is not None else {})}
    lists = {B.DATA_SOURCE: sources, B.UID: uids,
             **({B.REWARD_EXTRA_INFO: [{"acc": a} for a in acc]} if acc is not None else {})}
    return B.Batch(tensors, lists)


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


def test_a_number_result_is_its_own_acc_as_in_verl() -> None:
    """verl's reward managers record a number result as reward_extra_info['acc'] and its validation's core variable
    is acc: a partial credit of 0.5 is 0.5 there (rlforge's val/accuracy, B.ACC, counts a score below 1 as wrong); a
    dict without acc has no acc variable: the reward is core. A failed call is a wrong answer in both."""
    from rlforge.plugins.reward.results import OK, RAISED, evaluate

    def partial(*_):
        return 0.5

    assert evaluate(partial, ()) == (OK, (0.5, 0.0, {"acc": 0.5}))
    assert evaluate(lambda *_: {"score": 0.5, "format": 1}, ()) == (OK, (0.5, 0.0, {"format": 1.0}))
    assert evaluate(lambda *_: {"score": 1.0, "acc": False}, ()) == (OK, (1.0, 0.0, {"acc": 0.0}))
    assert evaluate(lambda *_: 1 / 0, ())[0] == RAISED
    batch = _batch(["t"] * 2, [0, 0], [0.5, 0.5], [0.0, 0.0])
    batch[B.REWARD_EXTRA_INFO] = [{"acc": 0.5}, {"acc": 0.5}]
    m = generation_metrics(batch)
    assert m["val-core/t/acc/mean@2"] == pytest.approx(0.5) and m["val/accuracy"] == 0.0
    batch[B.REWARD_EXTRA_INFO] = [{"format": 1.0}, {"acc": 0.0}]  # the second call failed
    m = generation_metrics(batch)
    assert m["val-core/t/reward/mean@2"] == pytest.approx(0.5) and not any("/acc/" in k for k in m)


def test_numeric_keys_the_reward_function_returns_are_variables_as_in_verl():
    """A key beside score and acc that every sample returns as a number: val-aux/<source>/<key>/mean@N and std@N;
    strings, keys some samples lack and a key named like a variable already there are left out."""
    batch = _batch(["gsm8k"] * 4, [0, 0, 1, 1], [1.0, 0.0, 1.0, 1.0], None)
    batch[B.REWARD_EXTRA_INFO] = [{"format": 1.0, "pred": "4", "reward": 9.0, "some": 1.0},
                                  {"format": 0.0, "pred": "5", "reward": 9.0},
                                  {"format": 1.0, "pred": "4", "reward": 9.0},
                                  {"format": 1.0, "pred": "4", "reward": 9.0}]
    m = generation_metrics(batch)
    # per-prompt means of format (0.5, 1.0) -> 0.75; population stds (0.5, 0.0) -> 0.25
    assert m["val-aux/gsm8k/format/mean@2"] == pytest.approx(0.75)
    assert m["val-aux/gsm8k/format/std@2"] == pytest.approx(0.25)
    assert m["val-core/gsm8k/reward/mean@2"] == pytest.approx(0.75)  # the score, not the extra 'reward'
    assert not any("/pred/" in k or "/some/" in k for k in m)


def test_val_generations_pick_as_verl_picks() -> None:
    """Sorted by the decoded prompt, shuffled by numpy's RandomState(42), the first n (verl's
    _maybe_log_val_generations)."""
    import numpy as np

    from rlforge import batch as B
    from rlforge.trainer.metrics import val_generations

    class Tok:  # token i decodes to the letter i; 0 is padding (special)
        def batch_decode(self, rows, skip_special_tokens):
            return ["".join(chr(96 + t) for t in r if t or not skip_special_tokens) for r in rows]

    prompts = torch.tensor([[0, 3], [0, 1], [2, 2], [0, 4], [1, 5]])
    batch = B.Batch({B.PROMPTS: prompts, B.PROMPT_MASK: (prompts > 0).long(), B.SCORES: torch.tensor([.1, .2, .3, .4, .5])},
                    {B.RESPONSE_TEXT: ["r0", "r1", "r2", "r3", "r4"]})
    expected = sorted(zip(["c", "a", "bb", "d", "ae"], ["r0", "r1", "r2", "r3", "r4"], [.1, .2, .3, .4, .5]))
    np.random.RandomState(42).shuffle(expected)
    got = val_generations(batch, Tok(), 3)
    assert [(g["input"], g["output"]) for g in got] == [(i, o) for i, o, _ in expected[:3]]
    assert got[0]["score"] == pytest.approx(expected[0][2]) and val_generations(batch, Tok(), 0) == []
