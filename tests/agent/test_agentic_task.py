"""The built-in agentic task ``arith_tool``: its rows and reward, the SFT demonstrations of the shipped base model
(same tokens as the agent loop's trajectories), the well-formed tool-call metric, validation and ``rlforge eval``
through the agent loop, the shipped preset; and (slow) GRPO on it raising accuracy and well-formed calls."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import rlforge
from rlforge import batch as B
from rlforge.agent.stage import AgentRolloutStage, evaluator
from rlforge.errors import ConfigError, DataError
from rlforge.plugins.agent.parsers import HermesParser
from rlforge.plugins.data.arith_tool import (
    KINDS,
    SOURCE,
    arith_tool_dataset,
    arith_tool_rows,
    demonstrations,
)
from rlforge.plugins.reward.rule import function_for
from rlforge.sft.formats import Keys, conversation
from rlforge.testing import fake_controller
from tests.agent.conftest import CALL, Scripted, calculator_then_answer, prompt_batch, sampling

PRESET = "builtin:agentic"


def _config(**arith_tool):
    return OmegaConf.create({"trainer": {"seed": 1}, "data": {"arith_tool": {
        "train_size": 50, "val_size": 20, "a_digits": 3, "b_digits": 2, **arith_tool}}})


# --- the dataset and its reward -----------------------------------------------------------------------------------


def test_rows_are_verl_rows_of_a_three_by_two_digit_product():
    rows = arith_tool_rows(30, 3, 2, seed=0)
    for row in rows:
        a, b = row["extra_info"]["a"], row["extra_info"]["b"]
        assert 100 <= a <= 999 and 10 <= b <= 99
        assert row == {"data_source": "arith_tool", "prompt": [{"role": "user", "content": f"What is {a}*{b}?"}],
                       "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                       "extra_info": {"a": a, "b": b, "expression": f"{a}*{b}"}}
    assert arith_tool_rows(30, 3, 2, seed=0) == rows  # seeded


def test_validation_questions_are_distinct_fixed_and_never_trained_on():
    cfg = _config()
    val = arith_tool_dataset(cfg, "val")
    questions = [r["prompt"][0]["content"] for r in val]
    assert len(val) == 20 and len(set(questions)) == 20
    other_seed = OmegaConf.merge(cfg, {"trainer": {"seed": 7}})
    assert arith_tool_dataset(other_seed, "val") == val  # held-out set does not move with trainer.seed
    train = arith_tool_dataset(cfg, "train")
    assert len(train) == 50 and not set(questions) & {r["prompt"][0]["content"] for r in train}
    assert arith_tool_dataset(other_seed, "train") != train


def test_too_many_questions_for_the_digits_is_a_clear_error():
    with pytest.raises(DataError, match="data.arith_tool.a_digits=1 and b_digits=1"):
        arith_tool_dataset(_config(a_digits=1, b_digits=1, val_size=82), "val")  # 9 x 9 = 81 questions


def test_registered_as_a_dataset_with_its_config_section_and_reward(pm):
    assert pm.registry.dataset.get("arith_tool") is arith_tool_dataset
    cfg = rlforge.load_config("grpo", ["data.name=arith_tool", "data.arith_tool.val_size=5"], plugins=pm)
    assert cfg.data.arith_tool.val_size == 5 and cfg.data.arith_tool.a_digits == 3
    with pytest.raises(ConfigError, match="data.arith_tool.b_digits"):
        rlforge.load_config("grpo", ["data.arith_tool.b_digits=0"], plugins=pm)
    assert function_for(SOURCE, pm.registry) == "arith_tool"


@pytest.mark.parametrize(("answer", "score"), [
    ("10063", 1.0), (" 10063\n", 1.0), ("10,063", 0.0), ("The answer is 10063", 0.0), ("10064", 0.0),
    (CALL, 0.0), ("", 0.0),
])
def test_reward_is_an_exact_match_of_the_final_answer(pm, answer, score):
    fn = pm.registry.reward_fn.get(SOURCE)
    assert fn(SOURCE, answer, "10063", {"a": 347, "b": 29}) == score


# --- SFT demonstrations -------------------------------------------------------------------------------------------

ROW = arith_tool_rows(1, 3, 2, seed=3)[0]  # What is 251*64?


def _rendered(tok, demo):
    return tok.apply_chat_template(demo["messages"], tools=demo["tools"], tokenize=False)


def test_a_solved_demonstration_calls_the_calculator_and_copies_its_reply(char_tokenizer):
    (demo,) = demonstrations([ROW], {"solved": 1.0}, seed=0)
    a, b = ROW["extra_info"]["a"], ROW["extra_info"]["b"]
    assert demo["tools"][0]["function"]["name"] == "calculator"
    assert _rendered(char_tokenizer, demo) == (
        f"<|system|>tools: calculator<|end|><|user|>What is {a}*{b}?<|end|><|assistant|>"
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a}*{b}"}}}}</tool_call><|end|>'
        f"<|tool|>{a * b}<|end|><|assistant|>{a * b}<|end|>")
    call = demo["messages"][1]["tool_calls"][0]["function"]
    assert call == {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}


def test_the_sft_loss_covers_the_assistant_turns_only(char_tokenizer):
    (demo,) = demonstrations([ROW], {"solved": 1.0}, seed=0)
    example = conversation(demo, char_tokenizer, Keys(), "demo")
    trained = char_tokenizer.decode([t for t, m in zip(example.ids, example.mask) if m])
    product = ROW["reward_model"]["ground_truth"]
    assert trained == f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{ROW["extra_info"]["expression"]}"}}}}' \
                      f"</tool_call><|end|>{product}<|end|>"


def test_a_demonstration_is_the_trajectory_the_agent_loop_builds(make_runner, tok):
    """Same tokens: SFT teaches exactly what RL's rollouts look like (prompt with the tool list, the call, the
    inserted tool turn, the answer)."""
    (demo,) = demonstrations([ROW], {"solved": 1.0}, seed=0)
    question, truth = ROW["prompt"][0]["content"], ROW["reward_model"]["ground_truth"]
    reply = demo["messages"][1]
    text = _rendered(tok, {"messages": [*ROW["prompt"], reply], "tools": demo["tools"]})
    call_text = text.split("<|assistant|>", 1)[1].removesuffix("<|end|>")
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    script = Scripted(tok, lambda seen: call_text if "<|tool|>" not in seen else calculator_then_answer(seen))
    out, _ = runner.rollout(prompt_batch(tok, [(question, truth)]), sampling(), script)
    ids = [t for t, m in zip(out[B.INPUT_IDS][0].tolist(), out[B.ATTENTION_MASK][0].tolist()) if m]
    assert ids == tok.encode(_rendered(tok, demo), add_special_tokens=False)
    assert out[B.SOLUTION_TEXT] == [truth]


@pytest.mark.parametrize("seed", range(3))
def test_broken_demonstrations_are_unreadable_tool_calls(seed):
    (demo,) = demonstrations([ROW], {"broken": 1.0}, seed=seed)
    assert [m["role"] for m in demo["messages"]] == ["user", "assistant"]
    parsed = HermesParser().parse(demo["messages"][1]["content"])
    assert not parsed.calls and parsed.errors


def test_in_the_head_demonstrations_answer_without_the_tool():
    (demo,) = demonstrations([ROW], {"in_the_head": 1.0}, seed=0)
    assert demo["messages"][1] == {"role": "assistant", "content": ROW["reward_model"]["ground_truth"]}


def test_demonstration_kinds_follow_the_shares():
    rows = arith_tool_rows(400, 3, 2, seed=0)
    demos = demonstrations(rows, {"solved": 0.5, "broken": 0.5}, seed=0)
    solved = sum("tool_calls" in d["messages"][1] for d in demos)
    assert 160 < solved < 240  # binomial(400, 0.5): far inside
    assert demos == demonstrations(rows, {"solved": 0.5, "broken": 0.5}, seed=0)
    assert set(KINDS) == {"solved", "broken", "in_the_head"}
    with pytest.raises(DataError, match="broken"):
        demonstrations(rows, {"guessed": 1.0}, seed=0)


def test_demonstrations_are_valid_sft_rows_in_a_file(tmp_path, char_tokenizer):
    from rlforge.plugins.data.builtin import read_rows

    demos = demonstrations(arith_tool_rows(20, 3, 2, seed=0), {k: 1.0 for k in KINDS}, seed=0)
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in demos), encoding="utf-8")
    for row in read_rows(str(path)):
        assert sum(conversation(row, char_tokenizer, Keys(), "demo").mask) > 0


# --- the well-formed tool-call metric -----------------------------------------------------------------------------


def test_tool_call_format_ok_is_the_share_of_readable_calls(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    broken = CALL.removesuffix("</tool_call>")
    first = {"1?": CALL, "2?": broken, "3?": broken, "4?": "5"}  # 1 readable call, 2 unreadable, 1 answer

    def reply(text):
        return "5" if "<|tool|>" in text else first[text.split("<|user|>")[1][:2]]

    questions = [(q, "5") for q in first]
    _, metrics = runner.rollout(prompt_batch(tok, questions), sampling(), Scripted(tok, reply))
    assert metrics["agent/tool_call_format_ok"] == pytest.approx(1 / 3)
    assert metrics["agent/parse_errors"] == 2
    _, metrics = runner.rollout(prompt_batch(tok, [("4?", "5")]), sampling(), Scripted(tok, reply))
    assert "agent/tool_call_format_ok" not in metrics  # no call written: no share


# --- validation and rlforge eval run the agent loop ---------------------------------------------------------------


def test_validation_runs_the_agent_loop_with_the_validation_sampling(make_runner, make_config, tok, pm):
    from rlforge.build import Builder

    cfg = make_config("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    script = Scripted(tok, calculator_then_answer)
    stage = AgentRolloutStage()
    module = SimpleNamespace(tokenizer=tok, processor=None)
    trainer = SimpleNamespace(config=cfg, builder=Builder(cfg, pm), module=module,
                              controller=fake_controller(generate_tokens=script, score=None),
                              flow=SimpleNamespace(stages=[stage]), step=0)
    params = sampling(n=2)
    evaluate = evaluator(trainer)
    out = evaluate.generate(prompt_batch(tok, [("2+3?", "5")]), params)
    metrics = evaluate.metrics()
    assert out[B.SOLUTION_TEXT] == ["5", "5"] and len(script.waves) == 2  # n=2 trajectories, two turns each
    assert {p.temperature for p in script.params} == {0.0}
    assert metrics == {"num_turns/mean": 4.0, "tool_call_counts/mean": 1.0,
                       "agent/tool_call_format_ok": 1.0, "agent/turn_limit_ratio": 0.0}
    assert stage.runner is not None  # the flow's own rollout stage ran the loop
    stage.close()


def test_validation_without_an_agent_loop_calls_the_rollout_workers_generate(tok):
    calls = []
    controller = fake_controller(generate=lambda batch, params: calls.append(params) or batch, score=None)
    trainer = SimpleNamespace(controller=controller, flow=SimpleNamespace(stages=[]), step=0)
    batch = prompt_batch(tok, [("2+3?", "5")])
    evaluate = evaluator(trainer)
    assert evaluate.agent is None and evaluate.backend is controller.workers.rollout
    assert evaluate.generate(batch, sampling()) is batch and calls == [sampling()] and evaluate.metrics() == {}


def test_eval_runs_the_agent_loop(make_config, tok, pm):
    from rlforge.build import Builder

    cfg = make_config("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    engine = SimpleNamespace(generate_tokens=Scripted(tok, calculator_then_answer))
    evaluate = Builder(cfg, pm).evaluator(engine, tok, SimpleNamespace(score=None))
    out = evaluate.generate(prompt_batch(tok, [("2+3?", "5"), ("1+1?", "2")]), sampling())
    evaluate.close()
    assert out[B.SOLUTION_TEXT] == ["5", "5"]  # the scripted call is always 2+3
    assert evaluate.metrics()["agent/tool_call_format_ok"] == 1.0


# --- the shipped preset -------------------------------------------------------------------------------------------


def test_the_builtin_agentic_preset_composes(pm):
    cfg = rlforge.load_config("grpo", config_file=PRESET, plugins=pm)
    assert cfg.model.path == "builtin:tiny-agent" and cfg.data.name == "arith_tool"
    assert cfg.rollout.agent.loop == "tool_agent" and list(cfg.rollout.agent.tools) == ["calculator"]


def test_an_unknown_builtin_config_lists_the_known_ones(pm):
    with pytest.raises(ConfigError, match="Built-in configs: builtin:agentic"):
        rlforge.load_config("grpo", config_file="builtin:agentc", plugins=pm)


# --- (slow) GRPO on the task learns to call the tool and copy its reply ----------------------------------------------


@pytest.mark.slow
@pytest.mark.learning_matrix
def test_grpo_on_the_agentic_preset_raises_accuracy_and_well_formed_calls(tmp_path):
    """A shorter version of the documented run (docs/agentic.md): 12 of its 60 steps, 100 of its 200 held-out
    questions, the preset's sampled validation (temperature 1, 4 samples per question)."""
    cfg = rlforge.load_config("grpo", [
        f"trainer.runs_root={tmp_path}", "trainer.total_steps=12", "trainer.val_every=0", "trainer.save_every=0",
        "trainer.progress=false", "logger.backends=[console]", "data.arith_tool.val_size=100",
    ], config_file=PRESET)
    trainer = rlforge.Trainer(cfg)
    summary = trainer.fit()

    def mean(key, steps):
        return sum(h[key] for h in steps) / len(steps)

    first, last = trainer.history[:3], trainer.history[-3:]
    # measured on a 2-core CPU (2026-12-01): reward 0.17 -> 0.40 (first / last 3 steps), validation 20% -> 30.5%
    assert mean("critic/score/mean", last) > mean("critic/score/mean", first) + 0.1, trainer.history
    assert mean("agent/tool_call_format_ok", last) > mean("agent/tool_call_format_ok", first) + 0.05
    assert mean("tool_call_counts/mean", last) > mean("tool_call_counts/mean", first) + 0.1
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.05, summary  # 400 samples: +-2.3 points
