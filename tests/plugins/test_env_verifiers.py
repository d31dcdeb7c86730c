"""verifiers environments (``data.name=verifiers rollout.agent.loop=verifiers``): with real verifiers 0.1.10
environments (a ``vf.MultiTurnEnv`` and a ``vf.ToolEnv`` scored by a ``vf.Rubric``), and with an environment of
verifiers 0.1's shape written here (no verifiers needed: the interface the adapter relies on, whatever the 0.1.x
release): a dataset, a rubric, and a multi-turn rollout (``env_response`` between model turns until
``is_completed``) that talks to the model through an ``openai.AsyncOpenAI`` client. Their rollouts run against the
rollout's OpenAI endpoint, driven by a scripted model; and (slow) ``rlforge fit --algo grpo`` runs the shape-alike
with the shipped tiny model."""

from __future__ import annotations

import inspect
import json
import sys

import pytest
import verifiers as vf
from datasets import Dataset

import rlforge
from rlforge import batch as B
from rlforge.agent import AgentLoopError
from rlforge.agent.batching import AGENT_REWARDS
from rlforge.build import Builder
from rlforge.data import collate, tokenize_rows
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.plugins.env.verifiers_env import SOURCE
from tests.agent.conftest import Scripted, calculator_then_answer, sampling

pytest.importorskip("openai")

FACTORY = f"{__name__}:load_environment"
RETRY = "No, try again."


async def _value(result):
    return await result if inspect.isawaitable(result) else result


class Rubric:
    """verifiers' Rubric: reward functions (sync or async) called with the state fields they name, weighted; the
    weighted sum is the reward, each function's score a metric."""

    def __init__(self, funcs, weights):
        self.funcs, self.weights = funcs, weights

    async def score_rollout(self, state):
        scores = {}
        for fn in self.funcs:
            wanted = inspect.signature(fn).parameters
            scores[fn.__name__] = float(await _value(fn(**{k: state[k] for k in wanted})))
        state["metrics"] = {**scores, "num_turns": len(state["trajectory"])}
        state["reward"] = sum(w * scores[f.__name__] for f, w in zip(self.funcs, self.weights))


def exact_answer(completion, answer):
    return float(completion[-1]["content"].strip() == answer)


async def brevity(completion):
    return 1.0 / sum(m["role"] == "assistant" for m in completion)


class SayTheNumber:
    """MultiTurnEnv's shape: "Say 3." until the model says it (the env answers "No, try again."), at most
    ``max_turns`` model turns."""

    def __init__(self, max_turns=3, size=6):
        self.max_turns = max_turns
        self.rubric = Rubric([exact_answer, brevity], [1.0, 0.5])
        self.dataset = [self.row(i, i) for i in range(size)]
        self.eval_dataset = [self.row(i, 10 + i) for i in range(3)]

    @staticmethod
    def row(i, number):
        return {"prompt": [{"role": "user", "content": f"Say {number}."}], "answer": str(number),
                "info": {"number": number}, "task": "say", "example_id": i}

    def get_dataset(self, n=-1, seed=None):
        return self.dataset[:n] if n > 0 else self.dataset

    def get_eval_dataset(self, n=-1, seed=None):
        return self.eval_dataset[:n] if n > 0 else self.eval_dataset

    async def env_response(self, messages, state):
        return [{"role": "user", "content": RETRY}]

    async def is_completed(self, state):
        return state["done"] or len(state["trajectory"]) >= self.max_turns

    async def rollout(self, input, client, model, sampling_args=None):
        state = {**input, "trajectory": [], "done": False, "error": None}
        messages = list(input["prompt"])
        while not await self.is_completed(state):
            if state["trajectory"]:
                messages += await self.env_response(messages, state)
            response = await client.chat.completions.create(model=model, messages=messages, **(sampling_args or {}))
            reply = response.choices[0].message.content
            messages.append({"role": "assistant", "content": reply})
            state["trajectory"].append({"completion": reply})
            state["done"] = reply.strip() == input["answer"]
        state["completion"] = messages[len(input["prompt"]):]
        return state

    async def run_rollout(self, input, client, model, sampling_args, max_retries=0, state_columns=None):
        state = await self.rollout(input, client, model, sampling_args)
        await self.rubric.score_rollout(state)
        return {key: state.get(key) for key in ("example_id", "prompt", "completion", "answer", "task", "info",
                                                "reward", "error", "metrics")}


class Failing(SayTheNumber):
    async def run_rollout(self, input, client, model, sampling_args, max_retries=0, state_columns=None):
        await client.chat.completions.create(model=model, messages=input["prompt"])
        return {"reward": None, "error": "ModelError: the model said nothing", "metrics": {}}


def load_environment(kind="say", **kwargs):
    return {"say": SayTheNumber, "failing": Failing}[kind](**kwargs)


@pytest.fixture
def config(pm):
    def make(*overrides: str):
        return rlforge.load_config("grpo", ["data.name=verifiers", f"data.verifiers.env={FACTORY}",
                                            "rollout.agent.loop=verifiers", "data.max_prompt_length=64",
                                            "rollout.max_new_tokens=120", *overrides], plugins=pm)
    return make


def test_rows_are_the_environments_dataset(config, pm):
    train = Builder(config(), pm).dataset("train")
    assert [r["prompt"] for r in train] == [row["prompt"] for row in SayTheNumber().dataset]
    assert train[2]["data_source"] == SOURCE and train[2]["reward_model"]["ground_truth"] == "2"
    assert train[2]["extra_info"] == {"env": FACTORY, "env_args": {},
                                      "input": {"answer": "2", "info": {"number": 2}, "task": "say", "example_id": 2}}
    assert Builder(config(), pm).dataset("val") == []  # val_size=0: no validation
    small = config("data.verifiers.train_size=2", "data.verifiers.val_size=-1", "data.verifiers.env_args={size: 3}")
    assert len(Builder(small, pm).dataset("train")) == 2
    val = Builder(small, pm).dataset("val")
    assert [r["reward_model"]["ground_truth"] for r in val] == ["10", "11", "12"]
    assert val[0]["extra_info"]["env_args"] == {"size": 3}


def rollout(config, pm, tok, reply, *overrides: str, rows: int = 2):
    builder = Builder(config(*overrides), pm)
    data = builder.dataset("train")[:rows]
    batch = collate(tokenize_rows(data, tok, 64, True, "test"), tok.pad_token_id, [f"u{i}" for i in range(rows)])
    runner = builder.agent(tok)
    try:
        return runner.rollout(batch, sampling(), Scripted(tok, reply))
    finally:
        runner.close()


def second_try(text: str) -> str:
    """The scripted model: a wrong number first, the asked one once the env said to try again."""
    asked = text.split("Say ", 1)[1].split(".", 1)[0]
    return asked if RETRY in text else "7"


def response_text(out, tok, i: int) -> str:
    return tok.decode(out[B.RESPONSES][i][out[B.ATTENTION_MASK][i][out[B.PROMPTS].shape[1]:].bool()])


def check_said_on_the_second_try(out, metrics, tok) -> None:
    """Two rows run with ``second_try``: a wrong turn, the env's retry, the right number; scored by the rubric."""
    for i in range(2):
        assert response_text(out, tok, i) == f"7<|end|><|user|>{RETRY}<|end|><|assistant|>{i}<|end|>"
        inserted = 1 + len(RETRY) + 2  # <|user|>, the env's reply a character a token, <|end|><|assistant|>
        assert out[B.RESPONSE_MASK][i][:2 + inserted + 2].tolist() == [1, 1] + [0] * inserted + [1, 1]
        # the rubric: exact answer 1.0 x 1 + brevity (two model turns) 0.5 x 0.5, on the last model token
        assert out[AGENT_REWARDS][i].sum().item() == pytest.approx(1.25)
        assert out[AGENT_REWARDS][i][2 + inserted + 1].item() == pytest.approx(1.25)
    assert metrics["agent/verifiers/exact_answer/mean"] == 1.0 and metrics["agent/verifiers/brevity/mean"] == 0.5
    assert metrics["agent/verifiers/num_turns/mean"] == 2.0
    assert metrics["agent/verifiers/error/mean"] == 0.0 and metrics["agent/model_turns/mean"] == 2.0


def test_a_rollout_is_the_environments_turns_scored_by_its_rubric(config, pm, char_tokenizer):
    check_said_on_the_second_try(*rollout(config, pm, char_tokenizer, second_try), char_tokenizer)


def test_the_environment_decides_when_a_rollout_ends(config, pm, char_tokenizer):
    out, metrics = rollout(config, pm, char_tokenizer, lambda _: "7", "data.verifiers.env_args={max_turns: 2}")
    assert metrics["agent/model_turns/max"] == 2 and metrics["agent/verifiers/exact_answer/mean"] == 0.0
    assert out[AGENT_REWARDS].sum(-1).tolist() == pytest.approx([0.25, 0.25])  # brevity only: 0.5 x 1/2


def test_an_errored_rollout_is_counted_and_trained_on_what_it_generated(config, pm, char_tokenizer):
    out, metrics = rollout(config, pm, char_tokenizer, lambda _: "1", "data.verifiers.env_args={kind: failing}")
    assert metrics["agent/verifiers/error/mean"] == 1.0
    assert out[AGENT_REWARDS].sum().item() == 0.0 and out[B.RESPONSE_MASK].sum().item() == 2 * 2


def test_an_environment_that_raises_stops_the_run_naming_the_sample(config, pm, char_tokenizer, monkeypatch):
    async def broken(self, *args, **kwargs):
        raise ValueError("the env broke")

    monkeypatch.setattr(SayTheNumber, "run_rollout", broken)
    with pytest.raises(AgentLoopError, match=r"'verifiers' .* failed on sample 0 .* ValueError: the env broke"):
        rollout(config, pm, char_tokenizer, lambda _: "1", "data.verifiers.env_args={max_turns: 4}")


class RealSayTheNumber(vf.MultiTurnEnv):
    """SayTheNumber as a real verifiers MultiTurnEnv: its stop condition, the env's reply, the real rollout."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": RETRY}]

    @vf.stop
    async def said_it(self, state, **kwargs):
        turns = state["trajectory"]
        return bool(turns) and turns[-1]["completion"][-1]["content"].strip() == state["answer"]


def calculator(expression: str) -> str:
    """Adds numbers.

    Args:
        expression: numbers joined by +.
    """
    return str(sum(int(term) for term in expression.split("+")))


def load_real_environment(kind="say"):
    """Real verifiers 0.1.10 environments with a real vf.Rubric: SayTheNumber, or a ToolEnv with a calculator."""
    rubric = vf.Rubric(funcs=[exact_answer, brevity], weights=[1.0, 0.5])
    if kind == "tool":
        rows = [{"question": "2+3?", "answer": "5"}] * 2
        return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[calculator], rubric=rubric, max_turns=3)
    rows = [{"question": f"Say {i}.", "answer": str(i)} for i in range(4)]
    return RealSayTheNumber(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=3)


def test_real_verifiers_environments_run_through_the_endpoint(config, pm, char_tokenizer):
    tok, real = char_tokenizer, f"data.verifiers.env={__name__}:load_real_environment"
    check_said_on_the_second_try(*rollout(config, pm, tok, second_try, real), tok)  # num_turns: MultiTurnEnv's own
    # a ToolEnv: the endpoint renders its tool, reads the model's call; the env's tool result is the next turn
    out, metrics = rollout(config, pm, tok, calculator_then_answer, real, "data.verifiers.env_args={kind: tool}")
    for i in range(2):
        assert response_text(out, tok, i).endswith("<|tool|>5<|end|><|assistant|>5<|end|>")
        model = tok.decode(out[B.RESPONSES][i][out[B.RESPONSE_MASK][i].bool()])
        assert model.startswith('<tool_call>{"name": "calculator"') and model.endswith("</tool_call><|end|>5<|end|>")
    assert out[AGENT_REWARDS].sum(-1).tolist() == pytest.approx([1.25, 1.25])  # 1 + 0.5 x 1/2 turns
    assert metrics["agent/verifiers/total_tool_calls/mean"] == 1.0
    assert metrics["agent/verifiers/calculator_calls/mean"] == 1.0
    assert metrics["agent/verifiers/error/mean"] == 0.0 and metrics["agent/model_turns/mean"] == 2.0


@pytest.mark.parametrize(("overrides", "error", "message"), [
    (["rollout.agent.loop=single_turn"], ConfigError, "set rollout.agent.loop=verifiers"),
    (['data.verifiers.env=""'], ConfigError, "'data.verifiers.env' is empty"),
    ([f"data.verifiers.env={__name__}:RETRY"], ConfigError, "is a str, not a factory or class"),
    ([f"data.verifiers.env={__name__}:Rubric", "data.verifiers.env_args={funcs: [], weights: []}"], ConfigError,
     "gave a Rubric without get_dataset and run_rollout"),
    (["data.verifiers.env=no_such_module_xyz:load"], ConfigError, "cannot import 'no_such_module_xyz'"),
])
def test_bad_environment_settings_are_clear_errors(config, pm, overrides, error, message):
    with pytest.raises(error, match=message):
        Builder(config(*overrides), pm).dataset("train")


def test_an_environment_id_needs_verifiers(config, pm, monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # as where verifiers is not installed
    with pytest.raises(RLForgeError, match="the verifiers package is not installed: pip install verifiers"):
        Builder(config("data.verifiers.env=my-math-env"), pm).dataset("train")


def test_an_environment_id_that_is_not_installed_names_the_key_and_the_forms(config, pm):
    pytest.importorskip("verifiers")
    with pytest.raises(ConfigError, match=r"data.verifiers.env='my-math-env': verifiers cannot load it "
                                          r"\(ModuleNotFoundError: No module named 'my_math_env'\): give an installed "
                                          r"verifiers environment's id .* or path/to/file.py:name"):
        Builder(config("data.verifiers.env=my-math-env"), pm).dataset("train")


def test_a_row_without_a_prompt_names_the_row(config, pm, monkeypatch):
    monkeypatch.setattr(SayTheNumber, "get_dataset", lambda self, n=-1, seed=None: [{"question": "Say 1."}])
    with pytest.raises(DataError, match=r"train row 1: no 'prompt' column \(got \['question'\]\)"):
        Builder(config("data.verifiers.env_args={size: 5}"), pm).dataset("train")


@pytest.mark.slow
def test_grpo_fit_on_a_verifiers_environment(tmp_path, capsys):
    """Two GRPO steps on the environment with the shipped tiny model, through ``rlforge fit``, validation included."""
    from rlforge.cli import main

    code = main(["fit", "--algo", "grpo", f"trainer.runs_root={tmp_path}", "data.name=verifiers",
                 f"data.verifiers.env={FACTORY}", "data.verifiers.val_size=2", "rollout.agent.loop=verifiers",
                 "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "trainer.total_steps=2",
                 "trainer.val_every=2", "trainer.progress=false", "logger.backends=[console]",
                 "rollout.max_new_tokens=48"])
    assert code == 0, capsys.readouterr().err
    run = next(tmp_path.glob("default/*/"))
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 * 2
    # every score is the rubric's: exact answer (0 or 1) + 0.5 x 1/turns, 1 to 3 turns
    assert all(min(abs(s["score"] - (a + 0.5 / t)) for a in (0, 1) for t in (1, 2, 3)) < 1e-5 for s in samples)
    assert len((run / "val_samples.jsonl").read_text().splitlines()) == 2 * 2  # before training and at step 2
