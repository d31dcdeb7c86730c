"""The complete agent loop of docs/agentic.md ("A complete agent loop"), run from the page's own text: saved as the
file the page names, loaded as a plugin module (``-p``), it builds the tool_agent trajectory with its rewards, and
trains with the command the page gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge import batch as B
from rlforge.cli import main
from rlforge.plugin_manager import PluginManager
from tests.agent.conftest import Scripted, calculator_then_answer, prompt_batch, runner_for, sampling

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agentic.md"
HEADING = "## A complete agent loop"


def page_code(heading: str = HEADING) -> str:
    """The first ``python`` block after ``heading`` on the page."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    block = text.index("```python\n", start) + len("```python\n")
    return text[block:text.index("\n```\n", block)]


@pytest.fixture(scope="module")
def loops_file(tmp_path_factory):
    """One file for the module: a plugin file is imported under its name once per process."""
    path = tmp_path_factory.mktemp("docs_loop") / "my_loops.py"
    path.write_text(page_code(), encoding="utf-8")
    return path


def test_the_page_names_the_loop_and_the_command(loops_file):
    section = PAGE.read_text(encoding="utf-8").split(HEADING, 1)[1]
    assert "rlforge fit -p my_loops.py rollout.agent.loop=checked_tools" in section.split("```python", 1)[0]


def test_the_documented_loop_builds_the_tool_trajectory_with_its_rewards(loops_file, tok):
    pm = PluginManager(autoload=False, modules=[str(loops_file)])
    runner = runner_for(pm, tok, "rollout.agent.loop=checked_tools", "rollout.agent.tools=[calculator]")
    try:
        out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(),
                                      Scripted(tok, calculator_then_answer))
        bad, bad_metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(),
                                          Scripted(tok, lambda text: "<tool_call>{oops</tool_call>"
                                                   if "<|tool|>" not in text else "5"))
    finally:
        runner.close()
    assert out[B.RESPONSE_MASK][0].tolist() == [1] * 82 + [0] * 11 + [1] * 2  # as tool_agent builds it
    assert out[B.SOLUTION_TEXT] == ["5"] and metrics["agent/used_tool/mean"] == 1.0
    assert out["agent_rewards"][0].tolist()[94] == pytest.approx(0.2)  # the answer after a tool, last token
    turn_end = len(tok.encode("<tool_call>{oops</tool_call><|end|>", add_special_tokens=False)) - 1
    assert bad["agent_rewards"][0].tolist()[turn_end] == pytest.approx(-0.1)  # the unreadable call's turn
    assert bad_metrics["agent/parse_errors"] == 1 and bad_metrics["agent/used_tool/mean"] == 0.0


@pytest.mark.slow
def test_the_documented_command_trains_with_the_loop(loops_file, tmp_path, capsys):
    code = main(["fit", "-p", str(loops_file), "rollout.agent.loop=checked_tools", "rollout.agent.tools=[calculator]",
                 "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.arith.train_size=64",
                 "data.arith.val_size=2", "trainer.val_every=0", "trainer.progress=false",
                 "trainer.val_before_train=false", "trainer.total_steps=1", "logger.backends=[console]",
                 "rollout.max_new_tokens=40", f"trainer.runs_root={tmp_path}"])
    assert code == 0, capsys.readouterr().err
    assert "step    1/1" in capsys.readouterr().out
