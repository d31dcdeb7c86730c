"""Gymnasium-style text environments (``data.name=gym_text`` with the interaction ``gym_text``): a guess-the-number
env written here, given as ``module:Class`` and registered through gymnasium; its episodes played by a scripted
model (observations as user turns, the step rewards on the model turns), the env's faults, and (slow) ``rlforge fit
--algo grpo`` on its episodes with the shipped tiny model."""

from __future__ import annotations

import json
import random
import re
import sys
from types import SimpleNamespace

import pytest
import torch

import rlforge
from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS
from rlforge.agent.stage import AgentRolloutStage, evaluator
from rlforge.build import Builder
from rlforge.data import collate, tokenize_rows
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugins.env.gym_text import SOURCE
from rlforge.testing import fake_controller
from tests.agent.conftest import Scripted, sampling

CLASS = f"{__name__}:GuessNumber"
GYM_ID = "rlforge-test/GuessNumber-v0"
PLAY = ["rollout.agent.loop=interaction", "rollout.agent.interaction=gym_text"]
PROMPT = "Guess my number, 1 to {top}."


class GuessNumber:
    """A number in 1..top drawn from the reset seed; each guess gets 'Higher.' or 'Lower.' (reward -0.1) until it is
    right (reward 1, terminated) or ``max_guesses`` are spent (truncated)."""

    def __init__(self, top: int = 8, max_guesses: int = 4) -> None:
        self.top, self.max_guesses = top, max_guesses

    def reset(self, seed=None, options=None):
        self.secret, self.guesses = random.Random(seed).randint(1, self.top), 0
        return PROMPT.format(top=self.top), {}

    def step(self, action: str):
        self.guesses += 1
        numbers = re.findall(r"\d+", action)
        guess = int(numbers[-1]) if numbers else 0
        if guess == self.secret:
            return "Yes!", 1.0, True, False, {}
        hint = "Higher." if guess < self.secret else "Lower."
        return hint, -0.1, False, self.guesses >= self.max_guesses, {}


class Telling(GuessNumber):
    """A broken env: its first observation tells the secret, and its reset is not seeded."""

    def reset(self, seed=None, options=None):
        super().reset(random.randrange(10**6))
        return f"It is {self.secret}.", {}


class Numeric(GuessNumber):
    def step(self, action):
        return 3, 0.0, False, False, {}


class Constant(GuessNumber):
    """Every episode is one step with reward 1."""

    def step(self, action):
        return "Done.", 1.0, True, False, {}


def bisect(text: str) -> str:
    """The scripted model: halves the range the env's hints leave (reads its own guesses and the replies)."""
    lo, hi = 1, 8
    for guess, hint in re.findall(r"(\d+)<\|end\|><\|user\|>(Higher|Lower)\.", text):
        lo, hi = (int(guess) + 1, hi) if hint == "Higher" else (lo, int(guess) - 1)
    return str((lo + hi) // 2)


@pytest.fixture
def config(pm):
    def make(*overrides: str):
        return rlforge.load_config("grpo", ["data.name=gym_text", f"data.gym_text.env={CLASS}",
                                            "data.gym_text.train_size=12", "data.gym_text.val_size=4",
                                            "data.max_prompt_length=64", "rollout.max_new_tokens=120",
                                            "rollout.agent.max_turns=5", *PLAY, *overrides], plugins=pm)
    return make


def test_rows_are_first_observations_of_distinct_seeds(config, pm):
    train = Builder(config(), pm).dataset("train")
    val = Builder(config("trainer.seed=9"), pm).dataset("val")
    assert len(train) == 12 and len(val) == 4
    for row in train + val:
        assert row["data_source"] == SOURCE
        assert row["prompt"] == [{"role": "user", "content": PROMPT.format(top=8)}]
        assert row["extra_info"]["env"] == CLASS and row["extra_info"]["env_kwargs"] == {}
    seeds = [r["extra_info"]["seed"] for r in train]
    assert len(set(seeds)) == 12 and not set(seeds) & {r["extra_info"]["seed"] for r in val}
    assert Builder(config("trainer.seed=9"), pm).dataset("val") == Builder(config(), pm).dataset("val")
    system = Builder(config("data.gym_text.system_prompt=Play well.", "data.gym_text.env_kwargs={top: 4}"),
                     pm).dataset("train")[0]
    assert system["prompt"] == [{"role": "system", "content": "Play well."},
                                {"role": "user", "content": PROMPT.format(top=4)}]
    assert system["extra_info"]["env_kwargs"] == {"top": 4}


def play(config, pm, tok, reply, *overrides: str, rows: int = 3):
    cfg = config(*overrides)
    builder = Builder(cfg, pm)
    data = builder.dataset("train")[:rows]
    batch = collate(tokenize_rows(data, tok, 64, True, "test"), tok.pad_token_id, [f"u{i}" for i in range(rows)])
    runner = builder.agent(tok)
    try:
        return data, *runner.rollout(batch, sampling(), Scripted(tok, reply))
    finally:
        runner.close()


def test_an_episode_observations_are_user_turns_and_its_return_is_the_reward(config, pm, char_tokenizer):
    tok = char_tokenizer
    data, out, metrics = play(config, pm, tok, bisect)
    for i, row in enumerate(data):
        env = GuessNumber()
        env.reset(seed=row["extra_info"]["seed"])
        text = tok.decode(out[B.RESPONSES][i][out[B.ATTENTION_MASK][i][out[B.PROMPTS].shape[1]:].bool()])
        guesses = re.findall(r"(\d+)<\|end\|>", text)
        assert guesses[-1] == str(env.secret) and text.endswith(f"{env.secret}<|end|>")
        hints = re.findall(r"<\|user\|>(Higher|Lower)\.<\|end\|><\|assistant\|>", text)
        assert len(hints) == len(guesses) - 1  # every wrong guess got the env's reply as the next user turn
        mask = out[B.RESPONSE_MASK][i]
        turn_ends = [j for j in range(len(mask)) if mask[j] == 1 and (j + 1 == len(mask) or mask[j + 1] == 0)]
        rewards = out[AGENT_REWARDS][i]
        assert rewards[turn_ends].tolist() == pytest.approx([-0.1] * len(hints) + [1.0])
        assert rewards.sum().item() == pytest.approx(1.0 - 0.1 * len(hints))  # the episode's return
    assert metrics["agent/turn_limit_ratio"] == 0


def test_truncation_ends_the_episode(config, pm, char_tokenizer):
    _, out, metrics = play(config, pm, char_tokenizer, lambda _: "9", "data.gym_text.env_kwargs={max_guesses: 2}")
    assert torch.allclose(out[AGENT_REWARDS].sum(-1), torch.tensor([-0.2] * 3))  # two guesses, then truncated
    assert metrics["agent/model_turns/max"] == 2 and metrics["agent/turn_limit_ratio"] == 0


def test_a_gymnasium_registered_id_plays_the_same_episodes(config, pm, char_tokenizer):
    gym = pytest.importorskip("gymnasium")

    class GymGuessNumber(gym.Env, GuessNumber):  # gymnasium.make takes subclasses of gymnasium.Env
        reset, step = GuessNumber.reset, GuessNumber.step

    if GYM_ID not in gym.registry:
        gym.register(GYM_ID, entry_point=GymGuessNumber, kwargs={"max_guesses": 3})
    by_id = Builder(config(f"data.gym_text.env={GYM_ID}"), pm).dataset("train")
    by_class = Builder(config(), pm).dataset("train")
    assert [r["prompt"] for r in by_id] == [r["prompt"] for r in by_class]
    assert [r["extra_info"]["seed"] for r in by_id] == [r["extra_info"]["seed"] for r in by_class]
    _, out, _ = play(config, pm, char_tokenizer, lambda _: "9", f"data.gym_text.env={GYM_ID}")
    assert torch.allclose(out[AGENT_REWARDS].sum(-1), torch.tensor([-0.3] * 3))  # the registered max_guesses=3
    with pytest.raises(ConfigError, match="gymnasium cannot make it: NameNotFound"):
        Builder(config("data.gym_text.env=NoSuchGame-v0"), pm).dataset("train")


@pytest.mark.parametrize(("overrides", "error", "message"), [
    (["rollout.agent.loop=single_turn"], ConfigError, "set rollout.agent.loop=interaction rollout.agent.interaction="
                                                      "gym_text"),
    (['data.gym_text.env=""'], ConfigError, "'data.gym_text.env' is empty"),
    ([f"data.gym_text.env={__name__}:Nothing"], ConfigError, "gymnasium cannot make it"),
    (["data.gym_text.env=no_such_module_xyz:Env"], ConfigError, "cannot import 'no_such_module_xyz'"),
    ([f"data.gym_text.env={__name__}:PROMPT"], ConfigError, "'PROMPT' is a str, not a class or factory"),
])
def test_bad_env_settings_are_clear_errors(config, pm, overrides, error, message):
    with pytest.raises(error, match=message):
        Builder(config(*overrides), pm).dataset("train")


def test_a_file_without_the_class_is_named_not_given_to_gymnasium(config, pm, tmp_path, monkeypatch):
    (tmp_path / "envs.py").write_text("class Other:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"data.gym_text.env='./envs.py:Missing': './envs.py' has no attribute "
                                          r"'Missing'\.$"):
        Builder(config("data.gym_text.env=./envs.py:Missing"), pm).dataset("train")


REWARD: object = None  # what Rewarding's steps give (set by the tests)


class Rewarding(GuessNumber):
    def step(self, action):
        return "Again.", REWARD, False, False, {}


@pytest.mark.parametrize("reward", [None, "1.0", True, float("nan")])
def test_a_reward_that_is_not_a_number_stops_the_run_naming_the_env_and_step(config, pm, char_tokenizer,
                                                                            monkeypatch, reward):
    monkeypatch.setattr(sys.modules[__name__], "REWARD", reward)
    with pytest.raises(RLForgeError, match=rf"env '{__name__}:Rewarding': step\(\) of turn 1 gave the reward "
                                           rf"{re.escape(repr(reward))} \({type(reward).__name__}\), not a finite "
                                           "number"):
        play(config, pm, char_tokenizer, lambda _: "1", f"data.gym_text.env={__name__}:Rewarding")


def test_numpy_and_int_rewards_are_numbers(config, pm, char_tokenizer, monkeypatch):
    np = pytest.importorskip("numpy")
    for reward in (np.float32(0.5), np.int64(2), 3):
        monkeypatch.setattr(sys.modules[__name__], "REWARD", reward)
        _, out, _ = play(config, pm, char_tokenizer, lambda _: "1", f"data.gym_text.env={__name__}:Rewarding",
                         "rollout.agent.max_turns=2", rows=1)
        assert out[AGENT_REWARDS].sum().item() == pytest.approx(2 * float(reward))


@pytest.mark.parametrize(("env", "message"), [
    ("Telling", r"reset\(seed=\d+\) shows 'It is \d\.', but the row's prompt is 'It is \d\.'"),
    ("Numeric", r"step\(\) of turn 1 gave a int observation, not a str"),
])
def test_env_faults_stop_the_run_naming_the_env(config, pm, char_tokenizer, env, message):
    with pytest.raises(RLForgeError, match=message):
        play(config, pm, char_tokenizer, lambda _: "1", f"data.gym_text.env={__name__}:{env}")


def test_validation_scores_the_episode_return(config, pm, char_tokenizer):
    """Validation scores as training does: the env's return (the reward function of ``gym_text`` adds 0)."""
    cfg = config(f"data.gym_text.env={__name__}:Constant")
    builder = Builder(cfg, pm)
    module = builder.module()
    stage = AgentRolloutStage()
    run = SimpleNamespace(config=cfg, builder=builder, module=module, flow=SimpleNamespace(stages=[stage]), step=0,
                          controller=fake_controller(generate_tokens=Scripted(char_tokenizer, lambda _: "1"),
                                                     score=builder.reward(module.tokenizer).score))
    try:
        module.evaluator = evaluator(run)
        metrics, batch = module.validate(run.controller, module.prepare_data(builder.dataset("val"), "val"))
    finally:
        stage.close()
    assert metrics["val/reward"] == pytest.approx(1.0)
    assert batch[B.SCORES].tolist() == pytest.approx([1.0] * 4)  # the scores of val_samples.jsonl
    assert batch[B.TOKEN_LEVEL_SCORES].sum(-1).tolist() == pytest.approx([1.0] * 4)


@pytest.mark.slow
def test_grpo_fit_on_text_env_episodes(tmp_path, capsys):
    """Two GRPO steps of guess-the-number episodes with the shipped tiny model, through ``rlforge fit``."""
    from rlforge.cli import main

    code = main(["fit", "--algo", "grpo", f"trainer.runs_root={tmp_path}", "data.name=gym_text",
                 f"data.gym_text.env={CLASS}", "data.gym_text.train_size=16", "data.gym_text.val_size=0", *PLAY,
                 "rollout.agent.max_turns=3", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2",
                 "trainer.total_steps=2", "trainer.val_every=0", "trainer.val_before_train=false",
                 "trainer.progress=false", "logger.backends=[console]", "rollout.max_new_tokens=48"])
    assert code == 0, capsys.readouterr().err
    run = next(tmp_path.glob("default/*/"))
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 * 2 and {s["prompt"] for s in samples} == {PROMPT.format(top=8)}
    # a score is an episode's return: right at guess k of 3 (1 - 0.1 (k - 1)), or 1 to 3 wrong guesses
    returns = [1.0, 0.9, 0.8, -0.1, -0.2, -0.3]
    assert all(min(abs(s["score"] - r) for r in returns) < 1e-6 for s in samples), [s["score"] for s in samples]


def test_rlforge_eval_scores_the_episode_return(pm):
    """``rlforge eval`` of an environment run counts the trajectories' rewards too (the shipped tiny model plays)."""
    from rlforge import load_config
    from rlforge.tools.evaluate import evaluate

    cfg = load_config(None, ["data.name=gym_text", f"data.gym_text.env={__name__}:Constant", "data.gym_text.val_size=2",
                             *PLAY, "rollout.max_new_tokens=4", "rollout.val_n=1"], plugins=pm)
    report = evaluate(cfg, pm, log=lambda _: None)
    assert report["metrics"]["reward/mean"] == pytest.approx(1.0)
