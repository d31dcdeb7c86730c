"""reasoning-gym tasks as a dataset and a reward (``data.name=reasoning_gym``): the rows, the task's own
``score_answer`` through the registered reward, the config errors, and (slow) ``rlforge fit --algo grpo`` on a
task with the shipped tiny model."""

from __future__ import annotations

import json

import pytest

import rlforge
from rlforge.build import Builder
from rlforge.errors import DataError, RLForgeError
from rlforge.plugins.env.reasoning_gym import SOURCE, reasoning_gym_score
from rlforge.plugins.reward.rule import function_for

rg = pytest.importorskip("reasoning_gym")

TWO_TERMS = "data.reasoning_gym.config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}"


@pytest.fixture
def rows(pm):
    def make(*overrides: str, split: str = "train"):
        cfg = rlforge.load_config("grpo", ["data.name=reasoning_gym", "data.reasoning_gym.train_size=40",
                                           "data.reasoning_gym.val_size=10", *overrides], plugins=pm)
        return Builder(cfg, pm).dataset(split)
    return make


def test_rows_are_the_tasks_problems_with_its_system_prompt(rows):
    train = rows(TWO_TERMS)
    assert len(train) == 40
    system = rg.utils.SYSTEM_PROMPTS["default"]
    task = rg.create_dataset("basic_arithmetic", seed=1, size=80, min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    for row in train:
        info = row["extra_info"]
        entry = task[info["index"]]
        assert row["data_source"] == SOURCE
        assert row["prompt"] == [{"role": "system", "content": system}, {"role": "user", "content": entry["question"]}]
        assert row["reward_model"]["ground_truth"] == entry["answer"]
        assert info == {"task": "basic_arithmetic", "config": json.loads(json.dumps(info["config"])), "seed": 1,
                        "size": info["size"], "index": info["index"]}
    assert rows(TWO_TERMS) == train  # seeded
    assert rows(TWO_TERMS, "trainer.seed=2") != train


def test_validation_problems_are_distinct_fixed_and_never_trained_on(rows):
    val = rows(TWO_TERMS, split="val")
    questions = [r["prompt"][-1]["content"] for r in val]
    assert len(val) == 10 and len(set(questions)) == 10
    assert rows(TWO_TERMS, "trainer.seed=7", split="val") == val
    train = rows(TWO_TERMS, "data.reasoning_gym.train_size=400")
    assert not set(questions) & {r["prompt"][-1]["content"] for r in train}


def test_the_reward_is_the_tasks_own_score_of_the_answer_tag(rows, pm):
    row = rows(TWO_TERMS)[0]
    truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
    assert function_for(SOURCE, pm.registry) == SOURCE
    assert reasoning_gym_score(SOURCE, f"I think... <answer>{truth}</answer>", truth, info) == 1.0
    assert reasoning_gym_score(SOURCE, f"<answer>{truth}</answer> no, <answer>{int(truth) + 1}</answer>", truth,
                               info) == 0.0  # the last tag counts
    assert reasoning_gym_score(SOURCE, truth, truth, info) == 0.0  # no tag: no answer
    assert reasoning_gym_score(SOURCE, f" {truth}\n", truth, info, answer_tag=None) == 1.0
    task = rg.create_dataset("basic_arithmetic", seed=1, size=info["size"], **info["config"])
    entry = task[info["index"]]
    assert reasoning_gym_score(SOURCE, "<answer>-0.5</answer>", truth, info) == task.score_answer("-0.5", entry)


def test_the_reward_refuses_rows_it_cannot_regenerate(rows):
    row = rows(TWO_TERMS)[0]
    with pytest.raises(RLForgeError, match="no extra_info size, index"):
        reasoning_gym_score(SOURCE, "<answer>1</answer>", "1", {"task": "basic_arithmetic", "config": {}, "seed": 1})
    with pytest.raises(RLForgeError, match="not the row's 'not the answer'"):
        reasoning_gym_score(SOURCE, "<answer>1</answer>", "not the answer", row["extra_info"])


def test_composite_mixes_tasks_and_scores_each_by_its_own_rule(rows):
    train = rows("data.reasoning_gym.task=composite", "data.reasoning_gym.system_prompt=",
                 "data.reasoning_gym.config={datasets: [{name: basic_arithmetic, weight: 1}, "
                 "{name: chain_sum, weight: 1, config: {min_terms: 2, max_terms: 2}}]}")
    assert [m["role"] for m in train[0]["prompt"]] == ["user"]
    for row in train[:10]:
        truth = row["reward_model"]["ground_truth"]
        assert reasoning_gym_score(SOURCE, f"<answer>{truth}</answer>", truth, row["extra_info"]) == 1.0


@pytest.mark.parametrize(("override", "message"), [
    ("data.reasoning_gym.task=basic_arithmetc", "Unknown reasoning-gym task 'basic_arithmetc'.*Did you mean "
                                                "'basic_arithmetic'"),
    ("data.reasoning_gym.config={min_term: 2}", "the task 'basic_arithmetic' has no option 'min_term'.*Did you mean "
                                                "'min_terms'"),
    ("data.reasoning_gym.config={size: 5}", "config sets size: rlforge sets them"),
    ("data.reasoning_gym.config={min_terms: 9, max_terms: 2}", "task 'basic_arithmetic' refuses"),
    ("data.reasoning_gym.system_prompt=defualt", "Unknown system prompt 'defualt'.*Did you mean 'default'"),
    ("data.reasoning_gym.task=gcd|data.reasoning_gym.config={min_value: 1, max_value: 3}",  # 3 x 3 questions
     r"gave [1-9] distinct problems out of 10 \(data.reasoning_gym.val_size\): lower val_size or widen"),
])
def test_bad_task_settings_are_clear_errors(rows, override, message):
    with pytest.raises(DataError, match=message):
        rows(*override.split("|"), split="val")


@pytest.mark.slow
def test_grpo_fit_on_a_reasoning_gym_task(tmp_path, capsys, rows):
    """Two GRPO steps on basic_arithmetic with the shipped tiny model, through ``rlforge fit``: every trained
    sample's score is the task's score of its response (the whole response: the tiny model writes no tags)."""
    from rlforge.cli import main

    task = [TWO_TERMS, "data.reasoning_gym.train_size=64", "data.reasoning_gym.val_size=8",
            "data.reasoning_gym.system_prompt="]
    code = main(["fit", "--algo", "grpo", f"trainer.runs_root={tmp_path}", "data.name=reasoning_gym", *task,
                 "reward.reasoning_gym.answer_tag=", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
                 "rollout.n=2", "trainer.total_steps=2", "trainer.val_every=2", "trainer.progress=false",
                 "logger.backends=[console]", "rollout.max_new_tokens=8"])
    assert code == 0, capsys.readouterr().err
    run = next(tmp_path.glob("default/*/"))
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    by_question = {r["prompt"][-1]["content"]: r for split in ("train", "val") for r in rows(*task, split=split)}
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    validation = [json.loads(line) for line in (run / "val_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 * 2 and len(validation) == 2 * 8  # before training and after step 2
    for sample in samples + validation:
        row = by_question[sample["prompt"]]
        assert sample["ground_truth"] == row["reward_model"]["ground_truth"]
        assert sample["score"] == pytest.approx(reasoning_gym_score(SOURCE, sample["response"], sample["ground_truth"],
                                                                    row["extra_info"], answer_tag=None))
