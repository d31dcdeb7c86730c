"""The ``rollout.agent`` config section: which agent loop, tools, tool parser and interaction a rollout uses, and
the limits every trajectory obeys (docs/agentic.md). Components put their own options under
``rollout.agent.<component name>`` (e.g. ``rollout.agent.calculator.max_exponent``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rlforge.errors import ConfigError, DataError

SINGLE_TURN = "single_turn"
ANSWER_FROM = ("last_turn", "response")  # rollout.agent.answer_from


@dataclass
class AgentConfig:
    """Multi-turn rollouts (docs/agentic.md). A trajectory's response (model tokens and inserted tokens together)
    is at most ``rollout.max_new_tokens`` tokens; ``loop=single_turn`` is the one-prompt, one-completion rollout."""

    loop: str = SINGLE_TURN  # agent loop registry name: single_turn | tool_agent | interaction | openai_agent | verl_agent (verl's own loops, per row)
    tools: list[str] = field(default_factory=list)  # tool registry names offered to the model
    tool_config_path: Optional[str] = None  # verl's tool config YAML: its BaseTool classes are offered too (needs verl)
    function_tool_path: Optional[str] = None  # a Python file of verl @function_tool functions, offered too (needs verl)
    tool_parser: str = "hermes"  # reads tool calls from the model's text (tool parser registry name)
    interaction: Optional[str] = None  # interaction registry name: the simulated user of loop=interaction
    max_turns: int = 4  # model turns (generate calls) per trajectory
    max_tokens_per_turn: int = 0  # new tokens per model turn; 0 = what is left of rollout.max_new_tokens
    max_tool_calls_per_turn: int = 4  # tool calls run per model turn; further calls get an error reply
    max_tool_output_tokens: int = 256  # a tool's reply is cut to this many tokens, with a marker
    tool_output_truncate_side: str = "right"  # the side of a long reply cut away: right (its head kept), left (its tail kept) or middle (head and tail kept), as verl's tool_response_truncate_side
    tool_timeout_s: float = 10.0  # wall-clock limit of one tool call; then the model gets an error reply
    answer_from: str = "last_turn"  # what the reward function scores when a loop returns no answer: last_turn (the last model turn's text) | response (the whole response decoded without special tokens, tool replies and user turns included, as verl's reward managers read it)
    record_trajectories: bool = False  # write <run>/trajectories.jsonl: per trained sample its token ids, loss mask, spans (model turns, tool and user turns), tool calls, policy version and reward (rlforge report RUN --trajectory N shows one)
    wave_wait_s: float = 0.05  # longest wait for trajectories in a tool call before a wave starts without them; above tool_timeout_s, waves never depend on timing (reproducible sampling)


def validate_agent_config(config: Any) -> None:
    """Limits are positive and the tool list has no repeats (component names are checked by the registries)."""
    a = config.rollout.agent
    if config.rollout.ignore_eos and a.loop != SINGLE_TURN:
        raise ConfigError(f"rollout.ignore_eos=true with rollout.agent.loop={a.loop}: a model turn ends at its stop "
                          f"token, so an agent loop needs them (ignore_eos is for single-turn rollouts).")
    for key in ("max_turns", "max_tool_calls_per_turn", "max_tool_output_tokens"):
        if a[key] <= 0:
            raise ConfigError(f"'rollout.agent.{key}' must be a positive integer, got {a[key]}.")
    if a.max_tokens_per_turn < 0:
        raise ConfigError(f"'rollout.agent.max_tokens_per_turn' must be >= 0 (0 = no per-turn limit), "
                          f"got {a.max_tokens_per_turn}.")
    if a.answer_from not in ANSWER_FROM:
        raise ConfigError(f"'rollout.agent.answer_from' must be {' or '.join(ANSWER_FROM)} (what the reward function "
                          f"scores when a loop gives no answer), got {a.answer_from!r}.")
    if a.tool_output_truncate_side not in ("right", "left", "middle"):
        raise ConfigError(f"'rollout.agent.tool_output_truncate_side' must be right, left or middle (the side of a long "
                          f"tool reply that is cut away), got {a.tool_output_truncate_side!r}.")
    for key in ("tool_timeout_s", "wave_wait_s"):
        if not a[key] > 0:
            raise ConfigError(f"'rollout.agent.{key}' must be > 0 seconds, got {a[key]}.")
    for key in ("tool_config_path", "function_tool_path"):
        if a[key] is not None and not Path(a[key]).is_file():
            raise ConfigError(f"'rollout.agent.{key}' names {a[key]!r}, which is not a file "
                              f"({'missing' if not Path(a[key]).exists() else 'a folder'}; relative paths are read "
                              f"from the working directory {os.getcwd()}).")
    repeated = sorted({t for t in a.tools if list(a.tools).count(t) > 1})
    if repeated:
        raise ConfigError(f"'rollout.agent.tools' names '{repeated[0]}' twice: {list(a.tools)}.")


VERL_LOOPS = {"single_turn_agent": SINGLE_TURN, "tool_agent": "tool_agent"}  # verl's agent_name -> rlforge's loop
VERL_AGENT = "verl_agent"  # the loop that runs verl's own agent loops, row by row (plugins/agent/verl_loops.py)


def check_image_rows(prompts: Any, registry: Any, loop: str, name: str) -> None:
    """Prompts with images need an agent loop that takes them: one whose class says why it cannot
    (``AgentLoop.refuses_images``) makes the first such row a DataError naming it."""
    refused = getattr(registry.agent_loop.get(loop), "refuses_images", "")
    first = next((p for p in prompts if p.multi_modal is not None), None) if refused else None
    if first is not None:
        raise DataError(f"{name}, row {first.index + 1}: the row has images, but rollout.agent.loop={loop} does not "
                        f"take them: {refused}")


def check_row_loops(rows: Any, loop: str, name: str) -> None:
    """Rows that name their agent loop as verl's data does (``agent_name``) name this run's: rlforge's own loops run
    one per run (verl picks one per row), so rows that ask for another, or for several, are a DataError naming them;
    ``loop=verl_agent`` runs verl's loops row by row (and names a row whose loop it lacks when it runs). Rows held in
    memory and Arrow-backed rows with an ``agent_name`` column are checked here; streamed rows when they run
    (``rlforge.agent.runner.check_agent_name``)."""
    from collections.abc import Sequence

    from rlforge.data import row_origin

    if loop == VERL_AGENT or not isinstance(rows, Sequence) or not rows or not isinstance(rows[0], dict):
        return
    if not isinstance(rows, list) and "agent_name" not in rows[0]:  # Arrow rows share their columns
        return
    first: dict[str, str] = {}  # agent_name -> where it first appears
    for i, row in enumerate(rows):
        asked = row.get("agent_name") if isinstance(row, dict) else None
        if asked is not None and asked not in first:
            first[asked] = row_origin(row, i, name)
    if len(first) > 1:
        seen = ", ".join(f"'{a}' ({where})" for a, where in first.items())
        raise DataError(f"The rows of {name} name several agent loops in agent_name: {seen}. rlforge's own agent "
                        f"loops run one per run: set rollout.agent.loop={VERL_AGENT} to run verl's loops row by row as "
                        f"verl does, or give the rows one agent_name, or none (then rollout.agent.loop={loop} runs "
                        f"them) (docs/agentic.md).")
    for asked, where in first.items():
        want = VERL_LOOPS.get(asked)
        if want == loop:
            continue
        if want is None:
            raise DataError(f"{where}: agent_name '{asked}' is not one of verl's built-in agent loops "
                            f"({', '.join(VERL_LOOPS)}): a loop of your own runs with rollout.agent.loop={VERL_AGENT} "
                            f"and its class in rollout.agent.verl_agent.agent_loop_config_path (verl's "
                            f"agent_loop_config_path; docs/agentic.md#verls-agent-loops).")
        raise DataError(f"{where}: agent_name '{asked}' asks for the agent loop '{want}', but this run's is "
                        f"rollout.agent.loop={loop}: rlforge's own loops run one per run, where verl picks one per row. "
                        f"Set rollout.agent.loop={want} (in a verl launch: "
                        f"actor_rollout_ref.rollout.agent.default_agent_loop={asked}), or rollout.agent.loop="
                        f"{VERL_AGENT} to run verl's own loops row by row.")
