"""verl's tools, unchanged: ``rollout.agent.tool_config_path`` (a verl tool config YAML of ``BaseTool`` classes) and
``rollout.agent.function_tool_path`` (a Python file of ``@function_tool`` functions) are loaded by verl's own loader
(``verl.tools.tool_registry.load_all_tools``) and each tool is offered as an rlforge :class:`Tool`, called as verl
0.9.1's ``tool_agent`` loop calls it (docs/agentic.md#verls-tools).

A ``BaseTool`` is called as verl calls it, once per call: ``create(create_kwargs=...)`` with the row's
``extra_info.tools_kwargs[<tool>].create_kwargs``, ``execute(instance_id, arguments, agent_data=...)``, then
``release(instance_id)``. A function tool is ``fn(**arguments)`` with its return value read by verl's
``normalize_function_tool_return``. The tool's step reward is left out of the training reward, as verl leaves it
(its ``tool_rewards`` field is not read by its reward managers). verl must be importable: the tool files import it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rlforge.agent.base import Tool
from rlforge.agent.types import Sample, ToolError, ToolResult
from rlforge.errors import RLForgeError
from rlforge.verl_code import INSTALL, search_working_directory

KEYS = ("tool_config_path", "function_tool_path")  # rollout.agent.<key>, as verl's rollout.multi_turn.<key>


class AgentData:
    """What verl's ``AgentData`` holds that rlforge can give a tool: ``request_id`` (the sample's group id and row),
    ``tools_kwargs`` (the row's ``extra_info.tools_kwargs``), ``extra_fields`` and ``metrics`` (dicts a tool may keep
    state in: one per tool and trajectory). The conversation so far and its images are not given."""

    def __init__(self, sample: Sample, tools_kwargs: dict[str, Any]) -> None:
        self.request_id = f"{sample.uid}-{sample.index}"
        self.tools_kwargs = tools_kwargs
        self.extra_fields: dict[str, Any] = {}
        self.metrics: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"verl's AgentData.{name} is not given to tools by rlforge (only request_id, "
                             f"tools_kwargs, extra_fields and metrics; docs/agentic.md#verls-tools)")


class VerlTool(Tool):
    """One verl tool (a ``BaseTool`` or a ``FunctionTool``) as an rlforge tool."""

    def __init__(self, config: Any, tool: Any) -> None:
        super().__init__(config)
        self.tool = tool
        self._schema = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)  # what verl renders

    def schema(self) -> dict[str, Any]:
        return self._schema

    def create(self, sample: Sample) -> AgentData:
        extra = sample.extra_info if isinstance(sample.extra_info, dict) else {}
        return AgentData(sample, extra.get("tools_kwargs") or {})

    async def execute(self, arguments: dict[str, Any], state: AgentData) -> ToolResult:
        from verl.tools.function_tool import FunctionTool, normalize_function_tool_return

        name = self.tool.name
        if isinstance(self.tool, FunctionTool):
            response, _, _ = normalize_function_tool_return(await self.tool.call(arguments))
        else:
            kwargs = state.tools_kwargs.get(name) or {}
            instance_id, _ = await self.tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
            try:
                result = await self.tool.execute(instance_id, arguments, agent_data=state)
            finally:
                await self.tool.release(instance_id)
            response = result[0] if isinstance(result, tuple) and len(result) == 3 else None
            if response is None or not hasattr(response, "text"):
                raise ToolError(f"the verl tool '{name}' returned {result!r:.80}, not verl's (ToolResponse, reward, "
                                f"metrics)")
        if getattr(response, "video", None):
            raise ToolError(f"the verl tool '{name}' replied with video; rlforge's tool replies show text and images")
        return ToolResult(response.text or "", images=list(getattr(response, "image", None) or []))


def load_verl_tools(config: Any) -> dict[str, Tool]:
    """The tools of ``rollout.agent.tool_config_path`` and ``function_tool_path`` by name ({} when neither is set)."""
    a = config.rollout.agent
    given = {key: a.get(key) for key in KEYS if a.get(key)}
    if not given:
        return {}
    where = " and ".join(f"rollout.agent.{k}={v}" for k, v in given.items())
    try:
        from verl.tools.tool_registry import load_all_tools
    except ImportError as exc:
        raise RLForgeError(f"{where}: verl's tools are loaded with verl's own loader, and verl cannot be imported "
                           f"({exc}). The tool files import verl too: {INSTALL} (docs/agentic.md#verls-tools).") from None
    search_working_directory()
    try:
        tools = load_all_tools(given.get("tool_config_path"), given.get("function_tool_path"))
    except Exception as exc:
        hint = (" (a class_name's module was not found: verl imports 'module.Class' from sys.path, which holds the "
                "working directory; set PYTHONPATH for modules elsewhere)" if "has no attribute 'loader'" in str(exc)
                else " (class_name must be 'module.Class')" if "not enough values to unpack" in str(exc) else "")
        raise RLForgeError(f"verl could not load the tools of {where}: {type(exc).__name__}: {exc}{hint}") from None
    twice = sorted(n for n, c in Counter(t.name for t in tools).items() if c > 1)
    if twice:
        raise RLForgeError(f"The tools of {where} name '{twice[0]}' twice (verl would keep only the last one).")
    return {t.name: VerlTool(config, t) for t in tools}
