"""A third-party tool and agent loop, pip-installed as a package with an ``rlforge`` entry point, used from config
with no change to rlforge: ``rlforge plugins list`` shows them, a training run uses the loop, the tool's options
come from ``rollout.agent.<tool>``."""

from __future__ import annotations

import sys

import pytest

import rlforge
from rlforge import Trainer
from rlforge import batch as B
from rlforge.build import Builder
from rlforge.plugin_manager import AUTOLOAD_ENV, PluginManager
from tests.agent.conftest import Scripted, prompt_batch, sampling
from tests.plugin_dist import installed_package

pytestmark = pytest.mark.slow

DIST, EP = "rlforge-testplug-agent", "agentplug"
SOURCE = '''
"""A third-party rlforge plugin: the tool ``shout`` and the agent loop ``ask_twice`` (test suite)."""
from dataclasses import dataclass

from rlforge.agent import AgentLoop, Tool
from rlforge.hookspecs import hookimpl


@dataclass
class ShoutConfig:
    suffix: str = "!"  # appended to the shouted text


class Shout(Tool):
    """Upper-cases its text."""

    name = "shout"
    description = "Shout the text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    async def execute(self, arguments, state):
        return arguments["text"].upper() + self.options.suffix


class AskTwice(AgentLoop):
    """Answers, is asked 'Are you sure?', answers again; the second answer is scored."""

    async def run(self, sample, engine):
        conv = self.conversation(sample)
        await conv.generate(engine)
        conv.add_messages([{"role": "user", "content": "Are you sure?"}])
        answer = await conv.generate(engine)
        return conv.finish(answer=answer, metrics={"asked": 1.0})


@hookimpl
def rlforge_register(registry):
    registry.tool.register("shout", Shout, config=ShoutConfig)
    registry.agent_loop.register("ask_twice", AskTwice)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    with installed_package(tmp_path_factory.mktemp("agentplug_dist"), DIST, "agentplug_pkg", {EP: ("plugin", SOURCE)}):
        yield


@pytest.fixture
def plugins(installed, monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    return PluginManager()


def test_listed(plugins):
    info = {i.name: i for i in plugins.plugins()}[EP]
    assert info.error == "" and info.components == ["agent loop:ask_twice", "tool:shout"]


def test_third_party_tool_with_its_options_in_the_builtin_tool_agent(plugins, tok):
    cfg = rlforge.load_config("grpo", ["data.max_prompt_length=64", "rollout.max_new_tokens=120",
                                       "rollout.agent.loop=tool_agent", "rollout.agent.tools=[shout]",
                                       "rollout.agent.shout.suffix=?!"], plugins=plugins)
    runner = Builder(cfg, plugins).agent(tok)
    call = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
    out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(max_new_tokens=120),
                                  Scripted(tok, lambda text: "ok" if "<|tool|>" in text else call))
    assert "<|tool|>HI?!<|end|>" in tok.decode(out[B.RESPONSES][0])
    assert tok.decode(out[B.PROMPTS][0]).startswith("<|system|>tools: shout<|end|>")
    assert metrics["tool_call_counts/mean"] == 1 and metrics["agent/tool_errors"] == 0


def test_third_party_loop_trains(plugins, tmp_path):
    cfg = rlforge.load_config("grpo", [
        "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.arith.train_size=512", "data.arith.val_size=4",
        "trainer.val_every=0", "trainer.progress=false", "trainer.val_before_train=false", "trainer.total_steps=1",
        "logger.backends=[console]", "rollout.max_new_tokens=40", f"trainer.runs_root={tmp_path}",
        "rollout.agent.loop=ask_twice"], plugins=plugins)
    trainer = Trainer(cfg, plugins=plugins)
    assert trainer.fit()["steps"] == 1
    metrics = trainer.history[-1]
    assert metrics["agent/model_turns/mean"] == 2 and metrics["agent/asked/mean"] == 1.0
