"""The trajectory record (``rollout.agent.record_trajectories``): one line per trained sample in
``<run>/trajectories.jsonl`` with its token ids, loss mask, spans (model turns, tool replies, user turns), tool
calls, policy version and reward; ``rlforge report RUN --trajectory`` shows it."""

from __future__ import annotations

import json

import pytest
import torch

import rlforge
from rlforge import batch as B
from rlforge.agent import Trajectory
from rlforge.agent.record import AGENT_RECORD, RECORD_FILE, read_records, sample_records
from rlforge.agent.types import Span
from rlforge.cli import main
from rlforge.errors import ConfigError, RLForgeError
from tests.agent.conftest import Scripted, calculator_then_answer, prompt_batch, runner_for, sampling

FAST = ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.arith.train_size=64",
        "data.arith.val_size=2", "trainer.val_every=0", "trainer.progress=false", "trainer.val_before_train=false",
        "logger.backends=[console]", "rollout.max_new_tokens=24", "rollout.agent.record_trajectories=true"]
TOOL_TURN = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call><|end|>'


def _scored(out):
    """The rollout batch as the record stage sees it after scoring (1.0 for the first row, 0 else)."""
    out[B.SCORES] = torch.tensor([1.0] + [0.0] * (len(out) - 1))
    return out


def test_a_tool_agent_record_has_the_model_turns_tool_replies_and_calls(pm, tok):
    runner = runner_for(pm, tok, "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                        "rollout.agent.record_trajectories=true")
    try:
        out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, calculator_then_answer))
    finally:
        runner.close()
    (record,) = sample_records(_scored(out), tok, step=3)
    assert [(s["role"], s["start"], s["end"]) for s in record["spans"]] == [("assistant", 0, 82), ("tool", 82, 93),
                                                                            ("assistant", 93, 95)]
    model, tool, answer = record["spans"]
    assert model["text"] == TOOL_TURN and model["tool_calls"] == [{"name": "calculator",
                                                                   "arguments": {"expression": "2+3"}}]
    assert tool["text"] == "<|tool|>5<|end|><|assistant|>" and tool["messages"][0]["content"] == "5"
    assert tool["messages"][0]["name"] == "calculator" and "tool_calls" not in answer
    assert record["loss_mask"] == [1] * 82 + [0] * 11 + [1] * 2 and len(record["response_ids"]) == 95
    assert tok.decode(record["response_ids"]) == model["text"] + tool["text"] + answer["text"]
    assert record["prompt"] == "<|system|>tools: calculator<|end|><|user|>2+3?<|end|><|assistant|>"
    assert tok.decode(record["prompt_ids"]) == record["prompt"]
    assert (record["step"], record["policy_version"], record["reward"], record["answer"]) == (3, 2, 1.0, "5")
    assert record["tools"] == {"calls": 1, "errors": 0, "parse_errors": 0} and record["stop_reason"] == "done"
    assert json.loads(json.dumps(record)) == record  # one JSON line


def test_without_the_key_the_batch_has_no_record_column(pm, tok):
    runner = runner_for(pm, tok, "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    try:
        out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, calculator_then_answer))
    finally:
        runner.close()
    assert AGENT_RECORD not in out


def test_a_trajectory_built_without_a_conversation_gets_its_spans_from_the_mask():
    traj = Trajectory([5], [1, 2, 3, 4, 5], [1, 1, 0, 0, 1], [0.0] * 5)
    assert [(s.role, s.start, s.end) for s in traj.all_spans()] == [("assistant", 0, 2), ("inserted", 2, 4),
                                                                    ("assistant", 4, 5)]
    traj.spans = [Span("assistant", 0, 3)]  # spans that disagree with the mask (a loop that edited the tokens)
    assert [s.role for s in traj.all_spans()] == ["assistant", "inserted", "assistant"]


@pytest.mark.slow
def test_a_single_turn_run_records_every_trained_sample_and_report_shows_one(tmp_path, capsys):
    cfg = rlforge.load_config("grpo", [*FAST, f"trainer.runs_root={tmp_path}", "trainer.total_steps=2"])
    trainer = rlforge.Trainer(cfg)
    trainer.fit()
    records = read_records(trainer.run_dir / RECORD_FILE)
    assert [(r["step"], r["index"], r["policy_version"]) for r in records] == [
        (1, 0, 0), (1, 1, 0), (1, 2, 0), (1, 3, 0), (2, 0, 1), (2, 1, 1), (2, 2, 1), (2, 3, 1)]
    for r in records:
        assert [s["role"] for s in r["spans"]] == ["assistant"] and r["spans"][0]["end"] == len(r["response_ids"])
        assert set(r["loss_mask"]) == {1} and r["reward"] in (0.0, 1.0) and r["data_source"] == "arith"
    assert sum(r["reward"] for r in records[4:]) == pytest.approx(trainer.history[-1]["critic/score/mean"] * 4)
    capsys.readouterr()
    assert main(["report", str(trainer.run_dir), "--trajectory", "2:1"]) == 0
    shown = capsys.readouterr().out
    assert "step 2, sample 1" in shown and "policy version 1" in shown and records[5]["spans"][0]["text"] in shown
    assert main(["report", str(trainer.run_dir), "--trajectory", "all"]) == 0
    assert "8 trajectories" in capsys.readouterr().out
    assert main(["report", str(trainer.run_dir), "--trajectory", "8"]) == 2
    assert "the record has 8 trajectories (lines 0-7), of steps 1-2" in capsys.readouterr().err
    assert main(["report", str(trainer.run_dir), "--trajectory", "-1"]) == 0  # the last line
    assert "step 2, sample 3" in capsys.readouterr().out


def test_report_of_a_missing_run_folder_says_so(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--trajectory", "0"]) == 2
    assert f"Run folder {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_an_interaction_run_records_user_turns_and_off_policy_versions(tmp_path):
    cfg = rlforge.load_config("grpo", [*FAST, f"trainer.runs_root={tmp_path}", "trainer.total_steps=2",
                                       "rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor",
                                       "rollout.agent.max_turns=2", "rollout.max_new_tokens=40",
                                       "trainer.pipeline=one_step_off"])
    trainer = rlforge.Trainer(cfg)
    trainer.fit()
    records = read_records(trainer.run_dir / RECORD_FILE)
    assert [r["policy_version"] for r in records] == [0] * 8  # one_step_off: step 2 trains on version 0
    retried = [r for r in records if len(r["spans"]) == 3]
    assert retried, "no trajectory where the tutor answered"
    user = retried[0]["spans"][1]
    assert user["role"] == "user" and user["messages"] == [{"role": "user", "content": "Wrong, try again."}]
    assert set(retried[0]["loss_mask"][user["start"]:user["end"]]) == {0}


def test_an_offline_algorithm_with_the_record_is_a_config_error(tmp_path):
    cfg = rlforge.load_config("dpo", [f"trainer.runs_root={tmp_path}", "rollout.agent.record_trajectories=true",
                                      "trainer.total_steps=1", "logger.backends=[console]"])
    with pytest.raises(ConfigError, match="rollout.agent.record_trajectories=true records generated samples, and "
                                          "dataflow '.*' has no rollout stage"):
        rlforge.Trainer(cfg).fit()


def test_report_without_a_record_says_how_to_get_one(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--trajectory", "0"]) == 2
    assert "rollout.agent.record_trajectories=true" in capsys.readouterr().err
    (tmp_path / RECORD_FILE).write_text('{"spans": []}\nnot json\n')
    with pytest.raises(RLForgeError, match=f"{RECORD_FILE}:2 is not a JSON line"):
        read_records(tmp_path / RECORD_FILE)
