"""Gymnasium-style text environments as episodes (``data.name=gym_text`` with the interaction ``gym_text``;
docs/environments.md).

An environment has gymnasium's API with text on both sides: ``reset(seed=...) -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``, the observation a ``str`` and the action the
model's reply. ``data.gym_text.env`` names it: a gymnasium id (``gymnasium.make``; ``module:Id-v0`` imports the
module that registers it first) or a class or factory ``module:Class`` / ``path/to/file.py:Class``.

The dataset is one row per episode seed: its prompt is the first observation (``reset(seed)``, after an optional
system prompt) and its ``extra_info`` the env, its keyword arguments and the seed. The interaction resets a fresh env
with that seed and checks that it shows the same observation, then each model reply is an action: the next
observation comes back as the user's turn and the step's reward goes on that model turn. The episode ends when the
env says terminated or truncated, or at ``rollout.agent.max_turns``; its return (the sum of the rewards) is the
trajectory's reward. The reward function of the data source ``gym_text`` gives 0: the env's rewards are the score.
"""

from __future__ import annotations

import math
import numbers
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from rlforge.agent import SINGLE_TURN, Interaction, Sample
from rlforge.config.schema import option, plain
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import
from rlforge.plugins.env.loading import (
    import_target,
    is_file,
    load_reference,
    scored_by_the_loop,
    split_reference,
)

SOURCE = "gym_text"
VAL_SEED = 54321  # the held-out episodes' seeds are drawn from this, whatever trainer.seed is
SEEDS = 2**31  # episode seeds are drawn from range(SEEDS)


@dataclass
class GymTextConfig:
    """Text-environment episodes (``data.name=gym_text``; play them with ``rollout.agent.loop=interaction
    rollout.agent.interaction=gym_text``)."""

    env: str = ""  # the environment: a gymnasium id (gymnasium.make), or module:Class / path/to/file.py:Class
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of gymnasium.make or the class
    train_size: int = option(1000, ge=1)  # training episodes (seeds drawn with trainer.seed)
    val_size: int = option(50, ge=0)  # held-out episodes, seeds never used in training
    system_prompt: Optional[str] = None  # a system message before the first observation (null = none)


def make_env(spec: str, kwargs: dict[str, Any], key: str = "data.gym_text.env") -> Any:
    """A new environment: ``path/to/file.py:attr``, or ``module:attr`` when the module has ``attr``, calls that class
    or factory with ``kwargs``; anything else goes to ``gymnasium.make`` (an id, or ``module:Id``, gymnasium's own
    form)."""
    if not spec:
        raise ConfigError(f"'{key}' is empty: name the environment, a gymnasium id or module:Class.")
    parts = split_reference(spec)
    if parts is not None and (is_file(parts[0]) or hasattr(import_target(parts[0], key), parts[1])):
        factory = load_reference(spec, key)  # a file's missing attribute is an error, never a gymnasium id
        if not callable(factory):
            raise ConfigError(f"{key}={spec!r}: '{parts[1]}' is a {type(factory).__name__}, not a class or factory.")
        return _checked(factory(**kwargs), spec, key)
    gym = optional_import("gymnasium", f"{key}={spec!r} is a gymnasium id",
                          "pip install 'rlforge[envs]' (or pip install gymnasium)")
    try:
        env = gym.make(spec, disable_env_checker=True, **kwargs)
    except (gym.error.Error, TypeError) as exc:  # not registered; not a gymnasium.Env, or bad keyword arguments
        raise ConfigError(f"{key}={spec!r}: gymnasium cannot make it: {type(exc).__name__}: {exc} (give a registered "
                          "id, or module:Class for a class)") from None
    return _checked(env, spec, key)


def _checked(env: Any, spec: str, key: str) -> Any:
    missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
    if missing:
        raise ConfigError(f"{key}={spec!r} gave a {type(env).__name__} without {' and '.join(missing)}(): an env has "
                          "reset(seed=...) -> (observation, info) and step(action) -> (observation, reward, "
                          "terminated, truncated, info).")
    return env


def first_observation(env: Any, seed: int, spec: str) -> str:
    result = env.reset(seed=seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise RLForgeError(f"env {spec!r}: reset(seed={seed}) returned {result!r:.100}; it must return (observation, "
                           "info), as gymnasium's Env.reset does.")
    return _text(result[0], spec, f"reset(seed={seed})")


def _text(observation: Any, spec: str, call: str) -> str:
    if not isinstance(observation, str):
        raise RLForgeError(f"env {spec!r}: {call} gave a {type(observation).__name__} observation, not a str: a text "
                           "environment's observations are what the model reads (wrap the env in a "
                           "gymnasium.ObservationWrapper that writes them as text).")
    return observation


def _reward(reward: Any, spec: str, call: str) -> float:
    """A step's reward: a finite real number (int, float, a numpy scalar); a bool, None or str is refused."""
    if isinstance(reward, numbers.Real) and not isinstance(reward, bool) and math.isfinite(reward):
        return float(reward)
    raise RLForgeError(f"env {spec!r}: {call} gave the reward {reward!r:.80} ({type(reward).__name__}), not a finite "
                       "number: the reward is step()'s 2nd item, a float (write float(success) for a bool).")


def _seeds(rng: random.Random, count: int, exclude: set[int]) -> list[int]:
    seeds: list[int] = []
    while len(seeds) < count:
        seed = rng.randrange(SEEDS)
        if seed not in exclude:
            exclude.add(seed)
            seeds.append(seed)
    return seeds


def gym_text_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """One row per episode: the first observation of ``reset(seed)`` as the prompt; distinct seeds, the held-out
    ones never trained on."""
    d, agent = config.data.gym_text, config.rollout.agent
    if agent.loop == SINGLE_TURN or (agent.loop == "interaction" and agent.interaction != SOURCE):
        raise ConfigError("data.name=gym_text rows are episodes that the gym_text interaction plays: set "
                          "rollout.agent.loop=interaction rollout.agent.interaction=gym_text (now "
                          f"rollout.agent.loop={agent.loop}, rollout.agent.interaction={agent.interaction}).")
    kwargs = plain(d.env_kwargs) or {}
    val = _seeds(random.Random(VAL_SEED), d.val_size, set())
    seeds = val if split == "val" else _seeds(random.Random(int(config.trainer.seed)), d.train_size, set(val))
    env = make_env(d.env, kwargs)
    try:
        rows = []
        for seed in seeds:
            system = [{"role": "system", "content": d.system_prompt}] if d.system_prompt else []
            observation = first_observation(env, seed, d.env)
            if not observation.strip():
                raise DataError(f"env {d.env!r}: reset(seed={seed}) gave an empty observation: the prompt is empty.")
            rows.append({"data_source": SOURCE, "prompt": [*system, {"role": "user", "content": observation}],
                         "reward_model": {"style": "env", "ground_truth": ""},
                         "extra_info": {"env": d.env, "env_kwargs": kwargs, "seed": seed}})
        return rows
    finally:
        _close(env)


def _close(env: Any) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        close()


class GymTextInteraction(Interaction):
    """Plays the row's episode: a fresh env reset with the row's seed; each model reply is a step's action."""

    name = SOURCE

    def reset(self, sample: Sample) -> None:
        info = sample.extra_info if isinstance(sample.extra_info, dict) else {}
        if not {"env", "seed"} <= set(info):
            raise RLForgeError(f"the row (data source '{sample.data_source}') has no extra_info env and seed: the "
                               "gym_text interaction plays the rows of data.name=gym_text.")
        self.spec, self.steps = str(info["env"]), 0
        self.env = make_env(self.spec, dict(info.get("env_kwargs") or {}), "the row's extra_info.env")
        shown = sample.messages[-1]["content"] if sample.messages else None
        observation = first_observation(self.env, int(info["seed"]), self.spec)
        if observation != shown:
            raise RLForgeError(f"env {self.spec!r}: reset(seed={info['seed']}) shows {observation!r:.80}, but the "
                               f"row's prompt is {shown!r:.80}: the env must give the same first observation for a "
                               "seed.")

    def step(self, message: str) -> tuple[str, float, bool]:
        self.steps += 1
        result = self.env.step(message)
        if not (isinstance(result, tuple) and len(result) == 5):
            raise RLForgeError(f"env {self.spec!r}: step() returned {result!r:.100}; it must return (observation, "
                               "reward, terminated, truncated, info), as gymnasium's Env.step does.")
        observation, reward, terminated, truncated, _ = result
        call = f"step() of turn {self.steps}"
        done = bool(terminated) or bool(truncated)
        return _text(observation, self.spec, call), _reward(reward, self.spec, call), done

    def close(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            _close(env)


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.dataset.register(SOURCE, gym_text_dataset, config=GymTextConfig,
                              description="episodes of a gymnasium-style text environment, one per seed")
    registry.interaction.register(SOURCE, GymTextInteraction,
                                  description="plays a gym_text row's episode: replies are actions, observations "
                                              "come back as user turns")
    registry.reward_fn.register(SOURCE, scored_by_the_loop, description="gym_text: 0 (the env's rewards are the score)")
