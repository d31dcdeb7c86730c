"""Agentic (multi-turn) rollouts: agent loops that call tools or talk to a simulated user (docs/agentic.md).

Write a loop by subclassing :class:`AgentLoop`, a tool by subclassing :class:`Tool`, a simulated user by
subclassing :class:`Interaction`, and register them in ``rlforge_register`` (``registry.agent_loop``,
``registry.tool``, ``registry.interaction``, ``registry.tool_parser``).

Importing the package loads only its leaves (the plain types of ``rlforge.agent.types`` and the config); the
classes that run agents load on first use, so ``rlforge.protocols`` and the config schema can name agent types
without loading the agent machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlforge.agent.config import SINGLE_TURN, AgentConfig
from rlforge.agent.types import (
    DONE,
    TOKEN_LIMIT,
    TURN_LIMIT,
    AgentLoopError,
    ParsedTurn,
    Sample,
    ToolCall,
    ToolError,
    ToolResult,
    ToolStats,
    Trajectory,
)

if TYPE_CHECKING:
    from rlforge.agent.base import Interaction, Tool, ToolParser
    from rlforge.agent.context import AgentContext
    from rlforge.agent.conversation import Conversation
    from rlforge.agent.engine import EngineHandle, TrajectoryEngine
    from rlforge.agent.loop import AgentLoop

_LAZY = {
    "AgentContext": "rlforge.agent.context", "AgentLoop": "rlforge.agent.loop",
    "Conversation": "rlforge.agent.conversation", "EngineHandle": "rlforge.agent.engine",
    "Interaction": "rlforge.agent.base", "Tool": "rlforge.agent.base", "ToolParser": "rlforge.agent.base",
    "TrajectoryEngine": "rlforge.agent.engine",
}


def __getattr__(name: str) -> Any:
    """``rlforge.agent.AgentLoop`` and the other classes that run agents load on first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlforge.agent' has no attribute '{name}'")


__all__ = [
    "DONE", "SINGLE_TURN", "TOKEN_LIMIT", "TURN_LIMIT", "AgentConfig", "AgentContext", "AgentLoop", "AgentLoopError",
    "Conversation", "EngineHandle", "Interaction", "ParsedTurn", "Sample", "Tool", "ToolCall", "ToolError",
    "ToolParser", "ToolResult", "ToolStats", "Trajectory", "TrajectoryEngine",
]
