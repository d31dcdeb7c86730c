"""verifiers environments (dataset + rubric + multi-turn rollout) as a dataset and an agent loop
(``data.name=verifiers rollout.agent.loop=verifiers``; docs/environments.md).

A `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment brings its data (``get_dataset(n)``,
``get_eval_dataset(n)``: rows with ``prompt`` messages, ``answer``, ``info``, ``task``, ``example_id``), its rollout
(``MultiTurnEnv.rollout``: the model's turns, ``env_response`` between them, until ``is_completed``) and its
``rubric``. It talks to the model through an OpenAI client: ``run_rollout(input, client, model, sampling_args)``
generates the rollout and scores it with the rubric, returning ``reward`` and ``metrics``. So the loop ``verifiers``
is an :class:`~rlforge.plugins.agent.openai_server.OpenAIAgentLoop`: each trajectory runs the environment's own
``run_rollout`` against the rollout's OpenAI endpoint, which records the model's tokens and log-probs (tool calls
included, read by ``rollout.agent.tool_parser``); the rubric's reward is the trajectory's reward and its metrics are
logged as ``agent/verifiers/<name>/mean``. The reward function of the data source ``verifiers`` gives 0: the rubric
is the score.

``data.verifiers.env`` is an installed environment's id (``verifiers.load_environment(id, **env_args)``) or a
factory or class ``module:name`` / ``path/to/file.py:name`` called with ``env_args``. The interface is verifiers
0.1's (an ``openai.AsyncOpenAI`` client); verifiers itself is not needed for an environment of that shape.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from rlforge.agent import Sample
from rlforge.config.schema import option, plain
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import
from rlforge.plugins.agent.openai_server import Endpoint, OpenAIAgentLoop
from rlforge.plugins.env.loading import load_reference, scored_by_the_loop, split_reference

SOURCE = "verifiers"
INPUT_KEYS = ("answer", "info", "task", "example_id")  # a verifiers row's columns besides the prompt
log = logging.getLogger("rlforge.env.verifiers")


@dataclass
class VerifiersConfig:
    """A verifiers environment's rows (``data.name=verifiers``; run them with ``rollout.agent.loop=verifiers``)."""

    env: str = ""  # the environment: an installed verifiers environment's id (verifiers.load_environment), or a factory or class module:name / path/to/file.py:name
    env_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of load_environment or of the factory
    train_size: int = option(-1, ge=-1)  # rows of the env's get_dataset(n); -1 = all
    val_size: int = option(0, ge=-1)  # rows of the env's get_eval_dataset(n) (its eval set, else its dataset); 0 = none, -1 = all


@functools.lru_cache(maxsize=8)
def _environment(spec: str, args_json: str) -> Any:
    """The environment ``spec`` built with these arguments (JSON), once per process: the dataset and the loop share
    it, and one environment serves every rollout."""
    key, args = "data.verifiers.env", json.loads(args_json)
    if not spec:
        raise ConfigError(f"'{key}' is empty: name a verifiers environment (an installed id, or module:factory).")
    if split_reference(spec) is not None:
        factory = load_reference(spec, key)
        if not callable(factory):
            raise ConfigError(f"{key}={spec!r} is a {type(factory).__name__}, not a factory or class.")
        env = factory(**args)
    else:
        vf = optional_import("verifiers", f"{key}={spec!r} is a verifiers environment id",
                             "pip install verifiers (or give a factory as module:name)")
        try:
            env = vf.load_environment(spec, **args)
        except (ValueError, RuntimeError) as exc:  # verifiers' wrapping of an id it cannot import, or of its error
            cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
            raise ConfigError(f"{key}={spec!r}: verifiers cannot load it ({type(cause).__name__}: {cause}): give an "
                              "installed verifiers environment's id (its package pip-installed), or a factory or "
                              "class as module:name or path/to/file.py:name.") from None
    missing = [m for m in ("get_dataset", "run_rollout") if not callable(getattr(env, m, None))]
    if missing:
        raise ConfigError(f"{key}={spec!r} gave a {type(env).__name__} without {' and '.join(missing)}(): a verifiers "
                          "Environment has get_dataset(n), get_eval_dataset(n) and async run_rollout(input, client, "
                          "model, sampling_args).")
    return env


def environment(spec: str, args: dict[str, Any]) -> Any:
    return _environment(spec, json.dumps(args, sort_keys=True))


def _row(item: Any, i: int, spec: str, args: dict[str, Any], split: str) -> dict[str, Any]:
    where = f"verifiers env {spec!r}, {split} row {i + 1}"
    if not isinstance(item, dict) or "prompt" not in item:
        columns = sorted(item) if isinstance(item, dict) else type(item).__name__
        raise DataError(f"{where}: no 'prompt' column (got {columns}): verifiers rows have prompt messages.")
    info = {k: item[k] for k in INPUT_KEYS if k in item}
    return {"data_source": SOURCE, "prompt": item["prompt"],
            "reward_model": {"style": "rubric", "ground_truth": item.get("answer", "")},
            "extra_info": {"env": spec, "env_args": args, "input": info}, "_origin": where}


def verifiers_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """The environment's rows: ``get_dataset(train_size)`` for training, ``get_eval_dataset(val_size)`` for
    validation (none with ``val_size=0``)."""
    d = config.data.verifiers
    if config.rollout.agent.loop != SOURCE:
        raise ConfigError("data.name=verifiers rows are run by the environment's own rollout: set "
                          f"rollout.agent.loop=verifiers (now rollout.agent.loop={config.rollout.agent.loop}).")
    args = plain(d.env_args) or {}
    env = environment(d.env, args)
    if split == "val":
        if d.val_size == 0:
            return []
        items = env.get_eval_dataset(n=d.val_size)
    else:
        items = env.get_dataset(n=d.train_size)
    return [_row(dict(item), i, d.env, args, split) for i, item in enumerate(items)]


def _numbers(metrics: Any) -> dict[str, float]:
    """The rubric's metrics that are finite numbers, as ``verifiers/<name>``."""
    out = {}
    for name, value in (metrics or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"verifiers/{name}"] = float(value)
    return out


class VerifiersLoop(OpenAIAgentLoop):
    """Runs the row's verifiers environment: its ``run_rollout`` talks to the rollout's OpenAI endpoint; the rubric's
    reward is the trajectory's reward."""

    def __init__(self, config: Any, context: Any) -> None:
        super().__init__(config, context)
        self._warned = False

    async def agent(self, sample: Sample, endpoint: Endpoint) -> Any:
        info = sample.extra_info if isinstance(sample.extra_info, dict) else {}
        if "env" not in info:
            raise RLForgeError(f"the row (data source '{sample.data_source}') has no extra_info.env: the verifiers "
                               "loop runs the rows of data.name=verifiers.")
        env = environment(str(info["env"]), dict(info.get("env_args") or {}))
        rollout_input = {"prompt": sample.messages, **dict(info.get("input") or {})}
        rollout_input.setdefault("example_id", sample.index)
        rollout_input.setdefault("task", "default")
        openai = optional_import("openai", "rollout.agent.loop=verifiers", "pip install openai")
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        try:
            output = await env.run_rollout(rollout_input, client, endpoint.model, {})
        finally:
            await client.close()
        error = output.get("error")
        if error is not None and not self._warned:
            self._warned = True
            log.warning("verifiers env %r: a rollout ended with an error (counted in agent/verifiers/error/mean; "
                        "later ones are only counted): %s", info["env"], error)
        reward = output.get("reward")
        return {"reward": float(reward) if reward is not None else 0.0,
                "metrics": {**_numbers(output.get("metrics")), "verifiers/error": float(error is not None)}}


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.dataset.register(SOURCE, verifiers_dataset, config=VerifiersConfig,
                              description="a verifiers environment's dataset (run with rollout.agent.loop=verifiers)")
    registry.agent_loop.register(SOURCE, VerifiersLoop)
    registry.reward_fn.register(SOURCE, scored_by_the_loop, description="verifiers: 0 (the rubric's reward is the score)")
