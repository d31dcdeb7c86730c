"""verl's own agent loops through ``rollout.agent.loop=verl_agent``: verl 0.9.1's ``single_turn_agent`` and
``tool_agent`` classes, unchanged, and loops of a verl agent loop config (``agent_loop_config_path``), each row by its
``agent_name``, generating on rlforge's engine (docs/agentic.md#verls-agent-loops)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from rlforge import batch as B
from rlforge.agent.types import AgentLoopError
from rlforge.data import collate, tokenize_rows
from rlforge.errors import ConfigError, DataError, RLForgeError
from tests.agent.conftest import Scripted, runner_for, sampling

pytest.importorskip("verl.experimental.agent_loop", reason="the test extra installs verl (scripts/setup.sh)")

LOOPS = '''
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

SEEN = []


class Shouter(AgentLoopBase):
    """Two generations: the prompt, then the prompt and the first answer upper-cased as a user turn."""

    def __init__(self, *args, loud="!", **kwargs):
        super().__init__(*args, **kwargs)
        self.loud = loud

    async def run(self, sampling_params, **kwargs):
        from verl.workers.rollout.llm_server import LLMServerClient

        SEEN.append({"kwargs": kwargs, "params": dict(sampling_params), "loud": self.loud,
                     "typed": isinstance(self.server_manager, LLMServerClient),
                     "response_length": self.rollout_config.response_length,
                     "user_turns": self.rollout_config.multi_turn.max_user_turns,
                     "custom": self.config.get("custom", {}).get("knob")})
        text = self.tokenizer.apply_chat_template(kwargs["raw_prompt"], add_generation_prompt=True, tokenize=False)
        prompt = self.tokenizer.encode(text, add_special_tokens=False)
        first = await self.server_manager.generate("r1", prompt_ids=prompt, sampling_params=dict(sampling_params))
        text = self.tokenizer.decode(first.token_ids, skip_special_tokens=True).upper() + self.loud
        user = self.tokenizer.encode("<|user|>" + text + "<|end|><|assistant|>", add_special_tokens=False)
        second = await self.server_manager.generate("r1", prompt_ids=prompt + first.token_ids + user,
                                                    sampling_params=dict(sampling_params, max_tokens=3))
        return AgentLoopOutput(
            prompt_ids=prompt, response_ids=first.token_ids + user + second.token_ids,
            response_mask=[1] * len(first.token_ids) + [0] * len(user) + [1] * len(second.token_ids),
            response_logprobs=first.log_probs + [0.0] * len(user) + second.log_probs, num_turns=4, metrics={},
            extra_fields={"shouted": text})


class Scorer(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        out = await self.server_manager.generate("r", prompt_ids=[5, 6], sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids=[5, 6], response_ids=out.token_ids, response_mask=[1] * len(out.token_ids),
                               response_logprobs=out.log_probs, reward_score=1.0, metrics={})


class NoLogProbs(AgentLoopBase):
    """Two turns with a user turn between, returned without log-probs (as verl-recipe's LangGraph loop does)."""

    async def run(self, sampling_params, **kwargs):
        first = await self.server_manager.generate("r", prompt_ids=[5, 6], sampling_params=sampling_params)
        second = await self.server_manager.generate("r", prompt_ids=[5, 6, *first.token_ids, 7],
                                                    sampling_params=sampling_params)
        ids = first.token_ids + [7] + second.token_ids
        mask = [1] * len(first.token_ids) + [0] + [1] * len(second.token_ids)
        return AgentLoopOutput(prompt_ids=[5, 6], response_ids=ids, response_mask=mask, num_turns=4, metrics={})


class Retokenized(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        out = await self.server_manager.generate("r", prompt_ids=[5, 6], sampling_params=sampling_params)
        return AgentLoopOutput(prompt_ids=[5, 6], response_ids=[9, *out.token_ids], metrics={},
                               response_mask=[1] * (len(out.token_ids) + 1))


class Stopper(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        await self.server_manager.generate("r", prompt_ids=[5, 6], sampling_params={**sampling_params, "stop": ["a"]})
'''


@pytest.fixture
def loop_files(tmp_path, monkeypatch, request):
    """A module of verl agent loops (unique name per test) and a verl agent loop config naming them."""
    module = f"verl_loops_{request.node.name.replace('[', '_').replace(']', '_').replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(LOOPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps([{"name": "shouter", "_target_": f"{module}.Shouter", "loud": "?"},
                                *({"name": n.lower(), "_target_": f"{module}.{n}"} for n in
                                  ("Scorer", "NoLogProbs", "Retokenized", "Stopper"))]))
    yield str(path), lambda: sys.modules[module].SEEN
    sys.modules.pop(module, None)


def _batch(tok, rows):
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": a},
             **extra} for q, a, extra in rows]
    return collate(tokenize_rows(rows, tok, 64, True, "test"), tok.pad_token_id, [f"u{i}" for i in range(len(rows))])


def _rollout(pm, tok, engine, rows, *overrides, n=1):
    runner = runner_for(pm, tok, *overrides)
    try:
        return runner.rollout(_batch(tok, rows), sampling(n=n), engine)
    finally:
        runner.close()


def _columns(out):
    return {k: out[k].tolist() for k in (B.PROMPTS, B.RESPONSES, B.RESPONSE_MASK, B.ROLLOUT_LOG_PROBS)} | {
        B.NUM_TURNS: out[B.NUM_TURNS]}


def test_verl_single_turn_agent_gives_the_batch_of_rlforge_single_turn(pm, tok):
    rows = [("2+3?", "5", {}), ("1+1?", "2", {})]
    ours, _ = _rollout(pm, tok, Scripted(tok, lambda t: "5"), rows, "rollout.agent.loop=single_turn", n=2)
    engine = Scripted(tok, lambda t: "5")
    verls, _ = _rollout(pm, tok, engine, rows, "rollout.agent.loop=verl_agent", n=2)
    assert _columns(verls) == _columns(ours)
    assert engine.params[0].max_new_tokens == 160  # verl's default: min(response_length, what is left of the window)


def test_verl_tool_agent_loop_unchanged_gives_the_tokens_of_rlforge_tool_agent(pm, tok, tmp_path, monkeypatch):
    from tests.agent.test_verl_tools import TOOL_CLASSES, _schema

    (tmp_path / "vl_grader_tools.py").write_text(TOOL_CLASSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = tmp_path / "tools.yaml"
    tools.write_text(json.dumps({"tools": [{"class_name": "vl_grader_tools.Grader", "config": {"type": "native"},
                                            "tool_schema": _schema("grade", "answer")}]}))
    call = '<tool_call>{"name": "grade", "arguments": {"answer": "5"}}</tool_call>'
    rows = [("2+3?", "5", {"extra_info": {"tools_kwargs": {"grade": {"create_kwargs": {"ground_truth": "5"}}}}})]
    outs = []
    for loop in ("rollout.agent.loop=tool_agent", "rollout.agent.loop=verl_agent"):
        engine = Scripted(tok, lambda t: call if "<|tool|>" not in t else "5")
        out, _ = _rollout(pm, tok, engine, rows, loop, f"rollout.agent.tool_config_path={tools}",
                          "rollout.agent.verl_agent.default_agent_loop=tool_agent")
        outs.append(out)
    assert _columns(outs[1]) == _columns(outs[0])
    text = tok.decode(outs[1][B.RESPONSES][0].tolist())
    assert "<|tool|>correct<|end|>" in text  # verl's loop passed the row's create_kwargs to the tool
    assert outs[1][B.NUM_TURNS] == [4]  # prompt, call, tool reply, answer
    sys.modules.pop("vl_grader_tools", None)


def test_each_row_runs_the_loop_its_agent_name_names(pm, tok, loop_files):
    path, seen = loop_files
    rows = [("2+3?", "5", {"agent_name": "shouter", "extra_info": {"index": 7, "tools_kwargs": {"t": 1}}}),
            ("1+1?", "2", {})]
    engine = Scripted(tok, lambda t: "ok" if "OK" not in t else "x")
    out, _ = _rollout(pm, tok, engine, rows, "rollout.agent.loop=verl_agent",
                      f"rollout.agent.verl_agent.agent_loop_config_path={path}",
                      "rollout.agent.verl_agent.config.actor_rollout_ref.rollout.multi_turn.max_user_turns=2",
                      "rollout.agent.verl_agent.config.custom.knob=3")
    shouted = tok.decode([t for t, m in zip(out[B.RESPONSES][0].tolist(), out[B.RESPONSE_MASK][0].tolist()) if m])
    assert tok.decode(out[B.RESPONSES][0].tolist()).startswith("ok<|end|><|user|>OK?<|end|><|assistant|>x")
    assert shouted.startswith("ok<|end|>x")
    assert out[B.NUM_TURNS] == [4, 2]  # the shouter's count, and single_turn_agent's (the row without agent_name)
    assert tok.decode(out[B.RESPONSES][1].tolist()).startswith("ok<|end|>")
    # the reward function gets what verl's naive reward manager gives it: the whole response, the loop's extra_fields
    assert out[B.SOLUTION_TEXT][0] == tok.decode(out[B.RESPONSES][0][out[B.RESPONSE_MASK][0] >= 0].tolist(),
                                                 skip_special_tokens=True).rstrip()
    assert out[B.EXTRA_INFO][0]["shouted"] == "OK?" and out[B.EXTRA_INFO][0]["index"] == 7
    (call,) = seen()
    assert call["typed"]  # the server manager is a verl LLMServerClient (loops that check its type take it)
    assert call["loud"] == "?" and call["response_length"] == 160 and call["user_turns"] == 2 and call["custom"] == 3
    kwargs = call["kwargs"]
    assert kwargs["raw_prompt"] == [{"role": "user", "content": "2+3?"}] and kwargs["index"] == 7
    assert kwargs["tools_kwargs"] == {"t": 1} and kwargs["reward_model"]["ground_truth"] == "5"
    assert kwargs["data_source"] == "arith" and kwargs["uid"] == "u0"
    assert call["params"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                              "logprobs": True}
    assert sorted(p.max_new_tokens for p in engine.params) == [3, 160, 160]  # the loop's max_tokens, else verl's


def test_a_loop_that_returns_no_log_probs_gets_those_of_its_generate_calls(pm, tok, loop_files):
    path, _ = loop_files
    out, _ = _rollout(pm, tok, Scripted(tok, lambda t: "5"), [("2+3?", "5", {"agent_name": "nologprobs"})],
                      "rollout.agent.loop=verl_agent", f"rollout.agent.verl_agent.agent_loop_config_path={path}")
    mask = out[B.RESPONSE_MASK][0].tolist()
    assert mask[:5] == [1, 1, 0, 1, 1] and out[B.NUM_TURNS] == [4]
    assert out[B.ROLLOUT_LOG_PROBS][0].tolist()[:5] == [-0.5, -0.5, 0.0, -0.5, -0.5]  # the engine's, per model token


def test_a_loop_s_reward_score_replaces_the_reward_function_s(pm, tok, loop_files):
    """verl uses an AgentLoopOutput's reward_score as the trajectory's score and does not call the reward function."""
    from rlforge.agent.batching import AGENT_REWARDS, add_agent_rewards
    from rlforge.build import Builder

    path, _ = loop_files
    rows = [("2+3?", "5", {"agent_name": "scorer"}), ("2+3?", "5", {})]
    out, _ = _rollout(pm, tok, Scripted(tok, lambda t: "5"), rows, "rollout.agent.loop=verl_agent",
                      f"rollout.agent.verl_agent.agent_loop_config_path={path}")
    assert out[B.LOOP_SCORES] == [1.0, None]
    cfg = runner_for(pm, tok, "rollout.agent.loop=verl_agent").context.config
    manager = Builder(cfg, pm).reward(tok)
    try:
        scored = manager.score(out)
    finally:
        manager.close()
    assert scored[B.SCORES].tolist() == [1.0, 1.0] and scored[B.ACC].tolist() == [1.0, 1.0]  # "5" is right too
    # a reward manager that does not take loop scores (a reward model): the loop's replaces its own
    scored[B.SCORES] = torch.tensor([0.25, 0.25])
    scored[B.TOKEN_LEVEL_SCORES] = torch.zeros(scored[B.RESPONSES].shape)
    scored[AGENT_REWARDS] = torch.zeros(scored[B.RESPONSES].shape)
    add_agent_rewards(scored)
    assert scored[B.SCORES].tolist() == [1.0, 0.25] and scored[B.TOKEN_LEVEL_SCORES].sum(-1).tolist() == [0.75, 0.0]


@pytest.mark.parametrize(("name", "error"), [
    ("retokenized", "returned no response_logprobs, and its model tokens .* are not the tokens its generate calls "
                    "returned"),
    ("stopper", "asked for stop=\\['a'\\], which rlforge's engines do not apply"),
    ("nowhere", "the row's agent_name 'nowhere' is not a verl agent loop here \\(.*: nologprobs, retokenized, scorer, "
                "shouter, single_turn_agent, stopper, tool_agent\\)"),
], ids=["retokenized", "stop", "unknown_loop"])
def test_what_rlforge_cannot_take_from_a_loop_is_an_error_naming_the_loop_and_sample(pm, tok, loop_files, name, error):
    path, _ = loop_files
    with pytest.raises(AgentLoopError, match=f"Agent loop 'verl_agent' .* failed on sample 0 .*{error}"):
        _rollout(pm, tok, Scripted(tok, lambda t: "5"), [("2+3?", "5", {"agent_name": name})],
                 "rollout.agent.loop=verl_agent", f"rollout.agent.verl_agent.agent_loop_config_path={path}")


def test_config_errors_name_the_key(pm, tok, make_config, loop_files, tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.agent.tools=\['calculator'\] with rollout.agent.loop=verl_agent"):
        make_config("rollout.agent.loop=verl_agent", "rollout.agent.tools=[calculator]")
    with pytest.raises(ConfigError, match="'rollout.agent.verl_agent.agent_loop_config_path' names '/nope.yaml', "
                                          "which is not a file"):
        make_config("rollout.agent.loop=verl_agent", "rollout.agent.verl_agent.agent_loop_config_path=/nope.yaml")
    with pytest.raises(ConfigError, match=r"sets 'actor_rollout_ref.rollout.response_length=9', but this run's own "
                                          r"settings make it 160"):
        make_config("rollout.agent.loop=verl_agent",
                    "rollout.agent.verl_agent.config.actor_rollout_ref.rollout.response_length=9")
    with pytest.raises(ConfigError, match="default_agent_loop=react is not a verl agent loop here: single_turn_agent, "
                                          "tool_agent"):
        runner_for(pm, tok, "rollout.agent.loop=verl_agent", "rollout.agent.verl_agent.default_agent_loop=react")
    with pytest.raises(ConfigError, match="sets 'actor_rollout_ref.rollout.multi_turn.max_user_turnz', but verl's "
                                          "actor_rollout_ref.rollout.multi_turn has no key 'max_user_turnz'"):
        make_config("rollout.agent.loop=verl_agent",
                    "rollout.agent.verl_agent.config.actor_rollout_ref.rollout.multi_turn.max_user_turnz=2")
    with pytest.raises(ConfigError, match="sets 'actor_rollout_ref.rollout.val_kwargs.temperature=0.3', but this "
                                          "run's own settings make it 0.0"):
        make_config("rollout.agent.loop=verl_agent",
                    "rollout.agent.verl_agent.config.actor_rollout_ref.rollout.val_kwargs.temperature=0.3")
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps([{"name": "x", "_target_": "no_such_module_x.Loop"}]))
    with pytest.raises(RLForgeError, match="bad.yaml: the agent loop 'x' names _target_=no_such_module_x.Loop, which "
                                           "does not import: ModuleNotFoundError: No module named 'no_such_module_x'"):
        runner_for(pm, tok, "rollout.agent.loop=verl_agent", f"rollout.agent.verl_agent.agent_loop_config_path={bad}")
    bad.write_text(json.dumps([{"name": "x"}]))
    with pytest.raises(ConfigError, match="bad.yaml, entry 0: each agent loop entry needs 'name' and '_target_'"):
        runner_for(pm, tok, "rollout.agent.loop=verl_agent", f"rollout.agent.verl_agent.agent_loop_config_path={bad}")
    bad.write_text("name: x\n_target_: m.X\n")
    with pytest.raises(ConfigError, match="bad.yaml: verl's agent loop config is a list of"):
        runner_for(pm, tok, "rollout.agent.loop=verl_agent", f"rollout.agent.verl_agent.agent_loop_config_path={bad}")


def test_rows_of_several_loops_load_under_verl_agent_and_the_error_elsewhere_says_so():
    from rlforge.agent.config import check_row_loops

    rows = [{"agent_name": "shouter"}, {"agent_name": "tool_agent"}]
    check_row_loops(rows, "verl_agent", "files (train)")
    with pytest.raises(DataError, match="set rollout.agent.loop=verl_agent to run verl's loops row by row"):
        check_row_loops(rows, "tool_agent", "files (train)")


def test_a_row_naming_another_loop_stops_at_its_trajectory_where_the_loader_could_not_check_it(pm, tok):
    """Streamed rows are not read at load: the runner checks each row's agent_name when its trajectory starts."""
    with pytest.raises(AgentLoopError, match="failed on sample 0 .* agent_name 'tool_agent' asks for verl's agent loop "
                                             "of that name, but this run's loop is rollout.agent.loop=interaction"):
        _rollout(pm, tok, Scripted(tok, lambda t: "5"), [("2+3?", "5", {"agent_name": "tool_agent"})],
                 "rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor")
    out, _ = _rollout(pm, tok, Scripted(tok, lambda t: "5"), [("2+3?", "5", {"agent_name": "tool_agent"})],
                      "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    assert out[B.NUM_TURNS] == [2]  # its own loop: runs


def test_a_launch_with_an_agent_loop_config_runs_verl_loops(loop_files):
    from rlforge.config import verl, verl_hydra
    from rlforge.config.verl_launch import given_keys

    path, _ = loop_files
    args = ["actor_rollout_ref.rollout.agent.default_agent_loop=shouter", "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
            "actor_rollout_ref.rollout.multi_turn.max_user_turns=3",
            "actor_rollout_ref.rollout.multi_turn.format=gpt-oss",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5"]
    parsed = verl_hydra.parse_args(args, verl_hydra.ENTRY_CONFIGS["verl.trainer.main_ppo"])
    t = verl.translate(verl_hydra.compose_tree(parsed), given_keys(parsed.overrides))
    assert not t.refused
    agent = t.nested()["rollout"]["agent"]
    assert agent["loop"] == "verl_agent" and agent["max_turns"] == 5
    assert agent["verl_agent"] == {"agent_loop_config_path": path, "default_agent_loop": "shouter", "config": {
        "actor_rollout_ref": {"rollout": {"multi_turn": {"max_user_turns": 3, "format": "gpt-oss"}}}}}


def test_fit_trains_through_a_verl_agent_loop(tmp_path, loop_files, capsys):
    from rlforge.cli import main
    from tests.agent.test_fit import FAST

    path, seen = loop_files
    code = main(["fit", "--algo", "grpo", *FAST, f"trainer.runs_root={tmp_path}", "rollout.agent.loop=verl_agent",
                 f"rollout.agent.verl_agent.agent_loop_config_path={path}",
                 "rollout.agent.verl_agent.default_agent_loop=shouter"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(next(tmp_path.glob("default/*/summary.json")).read_text())["steps"] == 2
    assert len(seen()) == 2 * 4 * 2 + 4  # steps x prompts x rollout.n, and the last validation of the 4 val prompts
