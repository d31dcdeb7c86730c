"""verl's own tools through ``rollout.agent.tool_config_path`` / ``function_tool_path``: classes that subclass the real
verl 0.9.1 ``BaseTool``, functions decorated with its ``@function_tool``, loaded by verl's own loader and called as its
``tool_agent`` loop calls them (docs/agentic.md#verls-tools)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from rlforge import batch as B
from rlforge.agent.chat import ChatFormat
from rlforge.agent.types import ParsedTurn, Sample, ToolCall, ToolStats
from rlforge.data import collate, tokenize_rows
from rlforge.errors import ConfigError, RLForgeError
from tests.agent.conftest import Scripted, sampling

pytest.importorskip("verl.tools.tool_registry", reason="the test extra installs verl (scripts/setup.sh)")

TOOL_CLASSES = '''
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

CALLS = []


class Grader(BaseTool):
    """Grades an answer against the row's ground truth, given through create_kwargs (verl's tools_kwargs)."""

    async def create(self, instance_id=None, **kwargs):
        CALLS.append(("create", kwargs))
        return "inst-1", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        truth = CALLS[-1][1].get("create_kwargs", {}).get("ground_truth")
        agent_data = kwargs["agent_data"]
        agent_data.extra_fields["seen"] = agent_data.extra_fields.get("seen", 0) + 1
        CALLS.append(("execute", instance_id, parameters, agent_data.request_id, agent_data.extra_fields["seen"]))
        ok = str(parameters.get("answer")) == str(truth)
        return ToolResponse(text="correct" if ok else "wrong"), 1.0 if ok else 0.0, {"ok": ok}

    async def release(self, instance_id, **kwargs):
        CALLS.append(("release", instance_id))


class Nosy(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(len(kwargs["agent_data"].messages))), 0.0, {}


class Painter(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="see", image=["an image"]), 0.0, {}
'''

FUNCTIONS = '''
import asyncio

from verl.tools.function_tool import function_tool


@function_tool
def {prefix}add(a: int, b: int) -> dict:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return {{"sum": a + b}}


@function_tool("{prefix}shout")
async def loud(text: str):
    """Upper-case a text.

    Args:
        text: The text.
    """
    await asyncio.sleep(0)
    return text.upper(), 5.0
'''


def _schema(name: str, *params: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": {
        "type": "object", "properties": {p: {"type": "string", "description": p} for p in params},
        "required": list(params)}}}


@pytest.fixture
def tool_files(tmp_path, monkeypatch, request):
    """A tool module (unique name per test: verl caches modules), its verl tool config, and a function-tool file."""
    from verl.tools import function_tool

    module = f"verl_tools_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(TOOL_CLASSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    # verl's function-tool registry is global: restore it after the test
    monkeypatch.setattr(function_tool, "FUNCTION_TOOL_REGISTRY", dict(function_tool.FUNCTION_TOOL_REGISTRY))
    monkeypatch.setattr(function_tool, "_LOADED_FUNCTION_TOOL_PATHS", dict(function_tool._LOADED_FUNCTION_TOOL_PATHS))

    def config(*classes: str) -> str:
        entries = [{"class_name": f"{module}.{cls}", "config": {"type": "native"}, "tool_schema": _schema(name, *ps)}
                   for cls, name, ps in (_ENTRIES[c] for c in classes)]
        path = tmp_path / f"tools_{'_'.join(classes)}.yaml"
        path.write_text(json.dumps({"tools": entries}))  # JSON is YAML
        return str(path)

    def functions(prefix: str = "") -> str:
        path = tmp_path / f"fn_{prefix or 'plain'}.py"
        path.write_text(FUNCTIONS.format(prefix=prefix))
        return str(path)

    yield config, functions, lambda: sys.modules[module].CALLS
    sys.modules.pop(module, None)


_ENTRIES = {"Grader": ("Grader", "grade", ("answer",)), "Nosy": ("Nosy", "nosy", ()),
            "Painter": ("Painter", "paint", ())}


def _box(pm, *overrides):
    import rlforge
    from rlforge.agent.toolbox import Toolbox
    from rlforge.agent.verl_tools import load_verl_tools

    cfg = rlforge.load_config("grpo", ["rollout.agent.loop=tool_agent", *overrides], plugins=pm)
    return Toolbox(load_verl_tools(cfg), cfg.rollout.agent)


def _run(box, tok, calls, extra_info=None):
    sample = Sample([], [], "arith", "7", extra_info, "u3", 5)

    async def go():
        async with box.session(sample, ChatFormat(tok), ToolStats()) as session:
            return await session.run(ParsedTurn("", [ToolCall(n, a, "") for n, a in calls]))

    try:
        return asyncio.run(go())
    finally:
        box.close()


def test_a_base_tool_gets_create_kwargs_execute_and_release_per_call_as_in_verl(pm, tok, tool_files):
    config, _, calls = tool_files
    box = _box(pm, f"rollout.agent.tool_config_path={config('Grader')}")
    assert box.schemas() == [_schema("grade", "answer")]  # verl's schema, as its loop renders it
    kwargs = {"grade": {"create_kwargs": {"ground_truth": "7"}}}
    messages, reward = _run(box, tok, [("grade", {"answer": "7"}), ("grade", {"answer": "8"})], {"tools_kwargs": kwargs})
    assert [m["content"] for m in messages] == ["correct", "wrong"]
    assert reward == 0.0  # verl keeps a tool's step reward out of the score
    log = calls()
    assert [c[0] for c in log].count("create") == 2 and [c[0] for c in log].count("release") == 2
    assert ("create", {"create_kwargs": {"ground_truth": "7"}}) in log
    executes = [c for c in log if c[0] == "execute"]
    assert {c[3] for c in executes} == {"u3-5"}  # agent_data.request_id
    assert sorted(c[4] for c in executes) == [1, 2]  # agent_data.extra_fields lives for the trajectory


def test_a_row_without_tools_kwargs_gets_empty_create_kwargs(pm, tok, tool_files):
    config, _, calls = tool_files
    messages, _ = _run(_box(pm, f"rollout.agent.tool_config_path={config('Grader')}"), tok,
                       [("grade", {"answer": "7"})], extra_info=None)
    assert messages[0]["content"] == "wrong" and ("create", {"create_kwargs": {}}) in calls()


def test_function_tools_return_values_are_read_as_verl_reads_them(pm, tok, tool_files):
    _, functions, _ = tool_files
    box = _box(pm, f"rollout.agent.function_tool_path={functions()}")
    assert sorted(box.tools) == ["add", "shout"]
    assert box.tools["add"].schema()["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    messages, reward = _run(box, tok, [("add", {"a": 2, "b": 5}), ("shout", {"text": "hi"})])
    assert [m["content"] for m in messages] == ['{"sum": 7}', "HI"] and reward == 0.0


def test_both_files_together_and_a_tool_error_is_an_error_reply(pm, tok, tool_files):
    config, functions, _ = tool_files
    box = _box(pm, f"rollout.agent.tool_config_path={config('Grader', 'Nosy', 'Painter')}",
               f"rollout.agent.function_tool_path={functions('f_')}")
    assert sorted(box.tools) == ["f_add", "f_shout", "grade", "nosy", "paint"]
    messages, _ = _run(box, tok, [("nosy", {}), ("paint", {}), ("f_add", {"a": 1})])
    nosy, paint, add = (m["content"] for m in messages)
    assert nosy.startswith("Error: ") and "AgentData.messages is not given to tools by rlforge" in nosy
    assert paint.startswith("Error: ") and "replied with images, which a text model cannot see" in paint
    assert add.startswith("Error: ") and "TypeError" in add  # a missing argument, as verl's fn(**parameters)


def test_tool_selection_offers_a_row_only_its_tools(pm, tok, tool_files):
    """verl's extra_info.tool_selection: the prompt renders the selected tools' schemas, and only they can be called."""
    config, functions, _ = tool_files
    import rlforge
    from rlforge.build import Builder

    cfg = rlforge.load_config("grpo", ["rollout.agent.loop=tool_agent", "data.max_prompt_length=64",
                                       "rollout.max_new_tokens=160", f"rollout.agent.function_tool_path={functions()}",
                                       "rollout.agent.max_turns=2"], plugins=pm)
    runner = Builder(cfg, pm).agent(tok)
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": "2+5?"}],
             "reward_model": {"ground_truth": "7"}, "extra_info": {"tool_selection": sel}}
            for sel in (["shout", "unknown"], None, ["shout", "add", "shout"])]
    batch = collate(tokenize_rows(rows, tok, 64, True, "test"), tok.pad_token_id, ["u0", "u1", "u2"])
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 5}}</tool_call>'
    engine = Scripted(tok, lambda text: call if "<|tool|>" not in text else "7")
    try:
        out, _ = runner.rollout(batch, sampling(), engine)
    finally:
        runner.close()
    first_prompts = engine.waves[0]
    assert "tools: shout<" in first_prompts[0] and "add" not in first_prompts[0]
    assert "tools: add, shout<" in first_prompts[1]
    assert "tools: shout, add<" in first_prompts[2]  # the row's order, each once (as verl renders them)
    texts = [tok.decode([t for t, m in zip(ids, mask) if m]) for ids, mask in
             zip(out[B.INPUT_IDS].tolist(), out[B.ATTENTION_MASK].tolist())]
    assert "Error: there is no tool 'add'. Available tools: shout" in texts[0]
    assert '<|tool|>{"sum": 7}<|end|>' in texts[1]


def test_config_errors_name_the_key_and_file(pm, tool_files, tmp_path):
    import rlforge

    with pytest.raises(ConfigError, match=r"'rollout.agent.tool_config_path' names '/nope.yaml', which is not a file "
                                          r"\(missing"):
        rlforge.load_config("grpo", ["rollout.agent.loop=tool_agent", "rollout.agent.tool_config_path=/nope.yaml"],
                            plugins=pm)
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"tools": [{"class_name": "no_such_module_x.Tool", "config": {"type": "native"}}]}))
    with pytest.raises(RLForgeError, match=r"verl could not load the tools of rollout.agent.tool_config_path=.*bad.yaml"
                                           r".*module was not found: verl imports 'module.Class' from sys.path"):
        _box(pm, f"rollout.agent.tool_config_path={bad}")
    config, _, _ = tool_files
    twice = tmp_path / "twice.yaml"
    entry = json.loads(open(config("Grader")).read())["tools"][0]
    twice.write_text(json.dumps({"tools": [entry, entry]}))
    with pytest.raises(RLForgeError, match="name 'grade' twice"):
        _box(pm, f"rollout.agent.tool_config_path={twice}")


def test_rlforge_verl_print_loads_the_tool_files_as_the_run_would(tool_files, tmp_path, capsys):
    from rlforge.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"tools": [{"class_name": "no_such_module_x.Tool", "config": {"type": "native"}}]}))
    data = Path(__file__).parents[1] / "tools" / "data"
    launch = ["algorithm.adv_estimator=grpo", f"data.train_files={data / 'gsm8k_train.jsonl'}",
              f"data.val_files={data / 'verl_gsm8k_test.jsonl'}", "data.max_prompt_length=32",
              "data.max_response_length=8", "actor_rollout_ref.model.path=builtin:tiny-arith", "trainer.device=cpu",
              "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1",
              "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"]
    config, _, _ = tool_files
    assert main(["verl", "--print", *launch, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={config('Grader')}"]) == 0
    assert main(["verl", "--print", *launch, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}"]) == 2
    assert "the run would stop here: verl could not load the tools" in capsys.readouterr().err


def test_a_verl_tool_named_as_a_registered_tool_is_refused(pm, tok, tool_files):
    import rlforge
    from rlforge.build import Builder

    _, functions, _ = tool_files
    path = functions()
    text = open(path).read().replace("def add(", "def calculator(")
    open(path, "w").write(text)
    cfg = rlforge.load_config("grpo", ["rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                                       f"rollout.agent.function_tool_path={path}"], plugins=pm)
    with pytest.raises(RLForgeError, match="The tool 'calculator' of rollout.agent.tool_config_path/function_tool_path"):
        Builder(cfg, pm).agent(tok)


def test_without_verl_the_error_says_how_to_install_it(pm, tool_files, monkeypatch):
    _, functions, _ = tool_files
    monkeypatch.setitem(sys.modules, "verl.tools.tool_registry", None)
    with pytest.raises(RLForgeError, match=r"verl cannot be imported .*pip install --no-deps verl==0.9.1"):
        _box(pm, f"rollout.agent.function_tool_path={functions()}")


def test_verl_launch_keys_map_to_the_tool_files(tool_files):
    from rlforge.config import verl, verl_hydra
    from rlforge.config.verl_launch import given_keys

    config, functions, _ = tool_files
    args = ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={config('Grader')}",
            f"actor_rollout_ref.rollout.multi_turn.function_tool_path={functions()}"]
    parsed = verl_hydra.parse_args(args, verl_hydra.ENTRY_CONFIGS["verl.trainer.main_ppo"])
    t = verl.translate(verl_hydra.compose_tree(parsed), given_keys(parsed.overrides))
    assert t.overrides["rollout.agent.loop"] == "tool_agent"
    assert t.overrides["rollout.agent.answer_from"] == "response"  # what verl's reward managers score
    assert t.overrides["rollout.agent.tool_config_path"] == config("Grader")
    assert t.overrides["rollout.agent.function_tool_path"] == functions()
    assert not t.refused


def test_fit_trains_with_verl_tools(tmp_path, tool_files, capsys):
    from rlforge.cli import main
    from tests.agent.test_fit import FAST

    config, functions, _ = tool_files
    code = main(["fit", "--algo", "grpo", *FAST, f"trainer.runs_root={tmp_path}", "rollout.agent.loop=tool_agent",
                 f"rollout.agent.tool_config_path={config('Grader')}", f"rollout.agent.function_tool_path={functions()}"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(next(tmp_path.glob("default/*/summary.json")).read_text())["steps"] == 2

