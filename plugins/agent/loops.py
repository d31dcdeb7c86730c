"""Built-in agent loops: ``single_turn`` (one completion; the default, which keeps the engines' batch rollout),
``tool_agent`` (model <-> tools until an answer or a limit) and ``interaction`` (model <-> a simulated user)."""

from __future__ import annotations

import numbers
from typing import Any

from rlforge.agent import TURN_LIMIT, AgentLoop, Sample, Trajectory, TrajectoryEngine
from rlforge.agent.base import maybe_await
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl


class SingleTurnLoop(AgentLoop):
    """One completion of the prompt, as the rollout engines' ``generate`` does."""

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        conv = self.conversation(sample)
        await conv.generate(engine)
        return conv.finish()


class ToolAgentLoop(AgentLoop):
    """The model answers or calls tools (``rollout.agent.tools``, verl's tool files; read by
    ``rollout.agent.tool_parser``); each turn's calls run concurrently and their replies (or error messages) come back
    as tool messages. Ends at the first turn without a tool call, after ``rollout.agent.max_turns`` model turns, or
    when the token budget is spent. A row's ``extra_info.tool_selection`` (a list of tool names, as in verl) offers
    only those of the run's tools to its trajectories."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        AgentLoop.validate_config(config, registry)
        a = config.rollout.agent
        if not (a.tools or a.tool_config_path or a.function_tool_path):
            raise ConfigError("rollout.agent.loop=tool_agent needs tools: set 'rollout.agent.tools', e.g. "
                              f"'rollout.agent.tools=[calculator]' (available: {', '.join(registry.tool.available())}"
                              "), or verl's 'rollout.agent.tool_config_path' / 'function_tool_path'.")

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        selection = sample.extra_info.get("tool_selection") if isinstance(sample.extra_info, dict) else None
        # verl's order: the row's, each name once
        names = list(dict.fromkeys(n for n in selection if n in self.context.tools.tools)) if selection else None
        conv = self.conversation(sample, tools=True if names is None else self.context.tools.schemas(names))
        async with conv.tool_session(names) as tools:
            while (text := await conv.generate(engine)) is not None:
                parsed = self.context.parser.parse(text)
                if not parsed.calls and not parsed.errors:
                    break  # an answer
                if conv.turns_left <= 0:
                    conv.stop(TURN_LIMIT)
                    break
                replies, reward = await tools.run(parsed)
                conv.add_reward(reward)
                if not conv.add_messages(replies):
                    break
        return conv.finish()


class InteractionLoop(AgentLoop):
    """The model talks with the interaction ``rollout.agent.interaction`` (a simulated user or environment): each
    model message gets ``(reply, reward, done)``; the reply is the next user message. Ends when the interaction says
    done, or at the turn or token limit."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        AgentLoop.validate_config(config, registry)
        if not config.rollout.agent.interaction:
            raise ConfigError("rollout.agent.loop=interaction needs 'rollout.agent.interaction' (a simulated user). "
                              f"Available: {', '.join(registry.interaction.available()) or '(none)'}.")

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        assert self.context.new_interaction is not None  # validate_config
        interaction = self.context.new_interaction()
        try:
            first = await maybe_await(interaction.reset(sample))
            conv = self.conversation(sample, messages=[_user(first, "reset()")] if first else None)
            while (text := await conv.generate(engine)) is not None:
                reply, reward, done = _step_result(await maybe_await(interaction.step(text)))
                conv.add_reward(reward)
                if done:
                    break
                if conv.turns_left <= 0:
                    conv.stop(TURN_LIMIT)
                    break
                if not conv.add_messages([_user(reply, "step()")]):
                    break
            return conv.finish()
        finally:
            close = getattr(interaction, "close", None)  # optional for interactions that do not subclass Interaction
            if close is not None:
                await maybe_await(close())


def _step_result(result: Any) -> tuple[Any, float, bool]:
    ok = (isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], (str, dict))
          and isinstance(result[1], numbers.Real) and not isinstance(result[2], str))
    if not ok:
        raise TypeError(f"the interaction's step() returned {result!r:.120}; it must return (reply: str or message "
                        f"dict, reward: float, done: bool)")
    return result[0], float(result[1]), bool(result[2])


def _user(reply: Any, where: str) -> dict[str, Any]:
    """An interaction's reply as the next user message: its text, or a message dict (``content``, and ``images``
    for a vision-language model: one per ``<image>`` placeholder)."""
    if isinstance(reply, str):
        return {"role": "user", "content": reply}
    if not isinstance(reply, dict) or not isinstance(reply.get("content"), str):
        raise TypeError(f"the interaction's {where} returned {reply!r:.120}; a reply is a str or a dict with a str "
                        f"'content' (and 'images')")
    return {"role": "user", **reply}


@hookimpl
def rlforge_register(registry):
    registry.agent_loop.register("single_turn", SingleTurnLoop)
    registry.agent_loop.register("tool_agent", ToolAgentLoop)
    registry.agent_loop.register("interaction", InteractionLoop)
