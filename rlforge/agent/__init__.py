"""Agentic (multi-turn) rollouts: agent loops that call tools or talk to a simulated user (docs/agentic.md).

Write a loop by subclassing :class:`AgentLoop`, a tool by subclassing :class:`Tool`, a simulated user by
subclassing :class:`Interaction`, and register them in ``rlforge_register`` (``registry.agent_loop``,
``registry.tool``, ``registry.interaction``, ``registry.tool_parser``).
"""

from __future__ import annotations

from rlforge.agent.base import (
    AgentContext,
    AgentLoop,
    AgentLoopError,
    Interaction,
    ParsedTurn,
    Sample,
    Tool,
    ToolCall,
    ToolError,
    ToolParser,
    ToolResult,
)
from rlforge.agent.config import SINGLE_TURN, AgentConfig
from rlforge.agent.engine import EngineHandle, TrajectoryEngine
from rlforge.agent.trajectory import DONE, TOKEN_LIMIT, TURN_LIMIT, Conversation, ToolStats, Trajectory

__all__ = [
    "DONE", "SINGLE_TURN", "TOKEN_LIMIT", "TURN_LIMIT", "AgentConfig", "AgentContext", "AgentLoop", "AgentLoopError",
    "Conversation", "EngineHandle", "Interaction", "ParsedTurn", "Sample", "Tool", "ToolCall", "ToolError",
    "ToolParser", "ToolResult", "ToolStats", "Trajectory", "TrajectoryEngine",
]
