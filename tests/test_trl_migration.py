"""docs/migration-from-trl.md as a TRL user follows it: its conversion turns TRL's GRPO rows into rows a run trains on,
its wrapper scores them with TRL-style reward functions (weights, None for "does not apply"), and its command's keys
compose; the string-prompt template writes the prompt as raw text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlforge import Trainer, load_config
from tests.migration_pages import DOCS, doc_command_keys, run_page

PAGE = "migration-from-trl.md"
DOC = DOCS / PAGE

TRL_REWARDS = '''
def accuracy_reward(completions, solution, **kwargs):
    return [1.0 if c[0]["content"].strip() == s else 0.0 for c, s in zip(completions, solution)]


def format_reward(completions, level, **kwargs):
    return [None if lv == 2 else float(c[0]["content"].strip().isdigit()) for c, lv in zip(completions, level)]
'''


@pytest.fixture
def converted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The doc's conversion and wrapper, run in ``tmp_path`` on TRL rows with a string-typed solution column."""
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}+{a}?"}], "solution": str(2 * a), "level": a % 3}
            for a in range(8)]
    run_page(PAGE, tmp_path, "trl_rows.jsonl", rows, "my_trl_project.rewards", TRL_REWARDS, "trl_rewards.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_converted_rows_keep_trl_columns_as_written(converted: Path) -> None:
    import pandas as pd

    row = pd.read_parquet(converted / "train.parquet").iloc[1].to_dict()
    assert row["reward_model"] == {"ground_truth": "2"}
    assert row["extra_info"] == {"solution": "2", "level": 1}  # "2" stays a string, as TRL's functions read it
    assert row["data_source"] == "my_task"


def test_wrapper_weights_the_functions_and_declines_as_trl(converted: Path) -> None:
    from rlforge.plugins.reward.user_file import load_user_function

    score = load_user_function(str(converted / "trl_rewards.py"))
    assert score("my_task", "4", "4", {"solution": "4", "level": 1}) == {
        "score": 1.2, "accuracy_reward": 1.0, "format_reward": 1.0}
    # level 2: format_reward declines (None) and drops out of the sum, as TRL's nansum drops it
    assert score("my_task", "x", "4", {"solution": "4", "level": 2}) == {"score": 0.0, "accuracy_reward": 0.0}


def test_the_trl_reward_manager_scores_the_converted_rows_with_the_functions_as_they_are(converted: Path) -> None:
    """The page's reward.manager=trl command: TRL's functions, batched, over the columns the conversion kept."""
    keys = [k.replace("train.parquet", str(converted / "train.parquet")) for k in doc_command_keys(PAGE, 0)]
    assert "reward.manager=trl" in keys
    cfg = load_config("grpo", [
        *keys, "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "rollout.max_new_tokens=4",
        "trainer.total_steps=1", f"trainer.runs_root={converted}/runs", "trainer.val_before_train=false",
        "trainer.val_every=0", "trainer.progress=false", "logger.backends=[]",
    ])
    trainer = Trainer(cfg)
    trainer.fit()
    (step,) = trainer.history
    assert step["reward/error_share"] == 0 and "reward/extra/accuracy_reward/mean" in step


def test_a_run_trains_on_the_converted_rows_with_the_doc_command(converted: Path) -> None:
    keys = doc_command_keys(PAGE)
    assert "actor.clip_ratio_c=1e9" in keys and "algorithm.epsilon=1e-4" in keys
    keys = [k for k in keys if not k.startswith("rollout.max_new_tokens=")]  # 512 tokens: a long test
    cfg = load_config("grpo", [
        *keys, "rollout.max_new_tokens=4", "data.name=files", f"data.train_files=[{converted / 'train.parquet'}]",
        f"reward.file={converted / 'trl_rewards.py'}", "trainer.total_steps=2", f"trainer.runs_root={converted}/runs",
        "trainer.val_before_train=false", "trainer.val_every=0", "trainer.progress=false", "logger.backends=[]",
    ])
    assert (cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size, cfg.rollout.n) == (1, 1, 8)
    assert cfg.actor.lr_scheduler == "linear" and cfg.actor.clip_ratio_c == 1e9 and cfg.algorithm.epsilon == 1e-4
    trainer = Trainer(cfg)
    trainer.fit()
    assert len(trainer.history) == 2
    assert all(h["reward/error_share"] == 0 for h in trainer.history)  # every sample scored by the wrapper
    assert any("reward/extra/accuracy_reward/mean" in h for h in trainer.history)


def test_raw_text_template_writes_a_string_prompt_as_it_is(tiny_chat_model: Path) -> None:
    from transformers import AutoTokenizer

    from rlforge.data import apply_template

    template = re.search(r'chat_template: "(.*)"', DOC.read_text()).group(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model)
    tokenizer.chat_template = template
    ids = apply_template(tokenizer, [{"role": "user", "content": "What is 2+2?"}], "row 1", add_generation_prompt=True)
    assert tokenizer.decode(ids) == "What is 2+2?"
