"""verl's agent-loop keys (the ``multi_turn`` rule of ``verl_derived``): ``rollout.multi_turn.*`` and
``rollout.agent.default_agent_loop`` / ``agent_loop_config_path``.

A launch without ``agent_loop_config_path`` runs rlforge's own loop of the behaviour verl's default loop has
(``single_turn`` or ``tool_agent``); one with it runs verl's own loops row by row (``rollout.agent.loop=verl_agent``,
plugins/agent/verl_loops.py), which read the multi_turn keys from verl's config as verl's loops do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlforge.agent.config import VERL_AGENT, VERL_LOOPS

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

R = "actor_rollout_ref.rollout"
NO_LIMIT = "verl: no limit; every model turn takes a token at least, so rollout.max_new_tokens turns is none"
# the multi_turn keys rlforge's own settings decide, for verl's loops too (plugins/agent/verl_loops.py:_owned)
OWNED = {"max_parallel_calls": "rollout.agent.max_tool_calls_per_turn",
         "max_tool_response_length": "rollout.agent.max_tool_output_tokens"}


def multi_turn(c: Context) -> None:
    """verl 0.9.1 runs each row's ``agent_name`` loop, else ``agent.default_agent_loop`` (single_turn_agent); it loads
    the tool files whatever the loop, and records ``multi_turn.enable`` in the batch's meta_info without reading it.
    Without ``agent.agent_loop_config_path`` rlforge runs its own loop of the same behaviour, one per run: the default
    loop's (a row that names another is refused when the data loads); with it, verl's loops (:func:`verl_loops`)."""

    m, loop = f"{R}.multi_turn", c.get(f"{R}.agent.default_agent_loop") or "single_turn_agent"
    keys = [k for k in c.owned if k.startswith(f"{m}.") and k != f"{m}.enable"]
    c.unread(f"{m}.enable", "verl 0.9.1 does not choose the agent loop by it (it is recorded in the batch's meta_info "
                            "only): the loop is agent.default_agent_loop, or a row's agent_name")
    if c.get(f"{R}.agent.agent_loop_config_path"):
        verl_loops(c, loop, keys)
        return
    c.same(f"{R}.agent.agent_loop_config_path", "verl's built-in loops only")
    if loop in VERL_LOOPS:
        scored = ("; with rollout.agent.answer_from=response, as verl's reward managers score the whole response"
                  if VERL_LOOPS[loop] == "tool_agent" else "")
        c.map(f"{R}.agent.default_agent_loop", "rollout.agent.loop", VERL_LOOPS[loop],
              "rows whose agent_name names another loop are refused when the data loads (rlforge runs one loop per "
              f"run){scored}")
    else:
        c.refuse(f"{R}.agent.default_agent_loop", f"verl's agent loop '{loop}'")
    for key in ("tool_config_path", "function_tool_path"):
        if f"{m}.{key}" in keys:
            keys.remove(f"{m}.{key}")
            _tool_file(c, f"{m}.{key}", f"rollout.agent.{key}", c.get(f"{m}.{key}"))
    if VERL_LOOPS.get(loop) != "tool_agent":
        tagged = c.get("data.custom_cls.path")  # a dataset class may name each row's loop (agent_name=tool_agent)
        for key in keys:
            (c.ignore(key, f"read by verl's tool_agent loop for rows whose agent_name names it, which the dataset "
                           f"class can set; rlforge runs agent.default_agent_loop's loop ({loop}) and refuses such "
                           f"rows when the data loads") if tagged else
             c.unread(key, f"read only by verl's tool_agent loop (agent.default_agent_loop={loop} here)"))
        return
    # verl's tool loop stops after max_assistant_turns model turns, or once max_user_turns tool replies were given
    # (checked after each model turn): at most max_user_turns + 1 model turns
    c.set("rollout.agent.answer_from", "response")  # verl's reward managers decode the whole response
    # without either limit verl's loop runs until the response budget is spent: a model turn takes a token at least
    assistant, user = c.get(f"{m}.max_assistant_turns"), c.get(f"{m}.max_user_turns")
    budget = _budget(c)
    turns = min(t for t in (assistant, user + 1 if user else None, budget) if t)
    by_user = "verl stops after max_user_turns tool replies: at most max_user_turns + 1 model turns"
    table: dict[str, Callable[[Any], None]] = {
        "max_assistant_turns": lambda v: c.map(f"{m}.max_assistant_turns", "rollout.agent.max_turns", turns,
                                               by_user if turns != v else "")
        if v else c.same(f"{m}.max_assistant_turns", "no limit of its own (max_user_turns sets rollout.agent."
                                                     "max_turns)")
        if user else c.map(f"{m}.max_assistant_turns", "rollout.agent.max_turns", budget, NO_LIMIT),
        "max_user_turns": lambda v: c.map(f"{m}.max_user_turns", "rollout.agent.max_turns", turns, by_user)
        if v else c.same(f"{m}.max_user_turns", "off"),
        "max_parallel_calls": lambda v: c.map(f"{m}.max_parallel_calls", "rollout.agent.max_tool_calls_per_turn", v),
        "format": lambda v: c.map(f"{m}.format", "rollout.agent.tool_parser", v) if v == "hermes" else c.refuse(
            f"{m}.format", f"the '{v}' tool-call format (rlforge's parsers: hermes)"),
        "max_tool_response_length": lambda v: c.map(f"{m}.max_tool_response_length",
                                                    "rollout.agent.max_tool_output_tokens", v,
                                                    "verl cuts tool replies in characters, rlforge in tokens"),
    }
    for key in keys:
        leaf = key.rsplit(".", 1)[1]
        if leaf in table:
            table[leaf](c.get(key))
        elif leaf == "tool_response_truncate_side":  # verl's tool loop cuts the middle for any other value
            side = c.get(key) if c.get(key) in ("left", "right") else "middle"
            c.map(key, "rollout.agent.tool_output_truncate_side", side,
                  "" if side == c.get(key) else f"verl's tool loop cuts the middle for '{c.get(key)}'")
        elif leaf in ("use_inference_chat_template", "tokenization_sanity_check_mode"):
            c.ignore(key, "how verl re-tokenizes turns; rlforge inserts tool replies as tokens")
        elif c.get(key) in (None, False, 1):
            c.same(key, "off")
        else:
            c.refuse(key, f"verl's multi_turn.{leaf}")


def _tool_file(c: Context, key: str, target: str, value: Any) -> None:
    if value:
        c.map(key, target, value, "verl's tools, called as verl's tool_agent calls them (verl must be importable; "
                                  "docs/agentic.md#verls-tools)")
    else:
        c.same(key, "no tools")


def verl_loops(c: Context, loop: str, keys: list[str]) -> None:
    """``agent_loop_config_path``: verl's own loops (``rollout.agent.loop=verl_agent``), each row by its
    ``agent_name``; the multi_turn keys rlforge does not decide go to them as they are
    (``rollout.agent.verl_agent.config``)."""
    m, v = f"{R}.multi_turn", "rollout.agent.verl_agent"
    c.set("rollout.agent.loop", VERL_AGENT)
    path = c.get(f"{R}.agent.agent_loop_config_path")
    c.map(f"{R}.agent.agent_loop_config_path", f"{v}.agent_loop_config_path", path,
          "verl's agent loop classes, built and run as verl's agent loop worker runs them, beside its built-in loops "
          "(rollout.agent.loop=verl_agent; verl must be importable; docs/agentic.md#verls-agent-loops)")
    c.map(f"{R}.agent.default_agent_loop", f"{v}.default_agent_loop", loop, "the loop of rows without agent_name")
    for key in ("tool_config_path", "function_tool_path"):
        if f"{m}.{key}" in keys:
            keys.remove(f"{m}.{key}")
            _tool_file(c, f"{m}.{key}", f"rollout.agent.{key}", c.get(f"{m}.{key}"))
    assistant = c.get(f"{m}.max_assistant_turns")
    c.map(f"{m}.max_assistant_turns", "rollout.agent.max_turns", assistant or _budget(c), "" if assistant else NO_LIMIT)
    for key in keys:
        leaf = key.rsplit(".", 1)[1]
        if leaf == "max_assistant_turns":
            continue
        if leaf in OWNED:
            c.map(key, OWNED[leaf], c.get(key))
        elif leaf == "tool_response_truncate_side":  # verl's tool loop cuts the middle for any other value
            side = c.get(key) if c.get(key) in ("left", "right") else "middle"
            c.map(key, "rollout.agent.tool_output_truncate_side", side)
        elif key in c.given:
            c.map(key, f"{v}.config.{key}", c.get(key), "read by verl's loops from verl's config")
        else:
            c.same(key, "verl 0.9.1's default, which verl's loops read")


def _budget(c: Context) -> int:
    """The response budget (verl's rollout.response_length): the most model turns a trajectory can take."""
    return int(c.get(f"{R}.response_length") or c.get("data.max_response_length"))
