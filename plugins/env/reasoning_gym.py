"""reasoning-gym tasks as a dataset and a reward (``data.name=reasoning_gym``; docs/environments.md).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates its problems procedurally from a seed, so
the data is made offline. A row is verl-style: the task's question as the user message (after one of reasoning-gym's
system prompts), its answer as the ground truth, and in ``extra_info`` what regenerates the item (task, options,
seed, size, index). The reward (registered under the data source ``reasoning_gym``) regenerates the item and returns
the task's own ``score_answer(answer, entry)``, a number in [0, 1], of the response's last ``<answer>...</answer>``
(``reward.reasoning_gym.answer_tag``; null scores the whole response).

Validation problems are distinct, drawn with a seed of their own (``VAL_SEED``), and never trained on: training rows
whose question is one of them are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from rlforge.config.schema import option, plain
from rlforge.errors import DataError, RLForgeError, did_you_mean
from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import

SOURCE = "reasoning_gym"
VAL_SEED = 54321  # the held-out problems are the same whatever trainer.seed is
DRAWS = 2  # items generated per row wanted, for the ones skipped as repeats or held out
COMPOSITE = "composite"  # reasoning-gym's mixture of tasks; its config lists them (datasets: [{name, weight, config}])
INSTALL = "pip install 'rlforge[envs]' (or pip install reasoning-gym)"


@dataclass
class ReasoningGymConfig:
    """reasoning-gym tasks (``data.name=reasoning_gym``)."""

    task: str = "basic_arithmetic"  # a reasoning-gym dataset name (reasoning_gym.factory.DATASETS), or composite
    config: dict[str, Any] = field(default_factory=dict)  # the task's own options (the fields of its config class, e.g. {min_terms: 2, max_terms: 2}); for composite: {datasets: [{name: ..., weight: ..., config: {...}}]}
    train_size: int = option(1000, ge=1)  # training problems, seeded by trainer.seed
    val_size: int = option(100, ge=0)  # distinct held-out problems, never seen in training
    system_prompt: Optional[str] = "default"  # a name of reasoning_gym.utils.SYSTEM_PROMPTS (default asks for <answer>...</answer>); null (data.reasoning_gym.system_prompt=) for none


@dataclass
class ReasoningGymRewardConfig:
    """The ``reasoning_gym`` reward function (``reward.reasoning_gym``)."""

    answer_tag: Optional[str] = "answer"  # score the text of the response's last <answer_tag>...</answer_tag> (no tag: 0); null (reward.reasoning_gym.answer_tag=) scores the whole response, stripped


def _library() -> Any:
    return optional_import("reasoning_gym", "data.name=reasoning_gym (or a row of data source 'reasoning_gym')",
                           INSTALL)


def _options(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the task's config class: checked names, composite's dataset specs as objects."""
    rg = _library()
    if task not in rg.factory.DATASETS:
        raise DataError(f"Unknown reasoning-gym task '{task}' (data.reasoning_gym.task)."
                        f"{did_you_mean(task, rg.factory.DATASETS)} Available: "
                        f"{', '.join(sorted(rg.factory.DATASETS))}.")
    taken = sorted({"size", "seed"} & set(options))
    if taken:
        raise DataError(f"data.reasoning_gym.config sets {', '.join(taken)}: rlforge sets them (data.reasoning_gym."
                        f"train_size / val_size, trainer.seed); remove {', '.join(taken)} from the task's config.")
    names = {f.name for f in dataclasses.fields(rg.factory.DATASETS[task][1])} - {"size", "seed"}
    unknown = sorted(set(options) - names)
    if unknown:
        raise DataError(f"data.reasoning_gym.config: the task '{task}' has no option {', '.join(map(repr, unknown))}."
                        f"{did_you_mean(unknown[0], names)} Its options: {', '.join(sorted(names))}.")
    if task == COMPOSITE and "datasets" in options:
        DatasetSpec = rg.composite.DatasetSpec  # noqa: N806 (reasoning-gym's class)
        specs = options["datasets"]
        if not isinstance(specs, list) or not all(isinstance(s, dict) and "name" in s for s in specs):
            raise DataError("data.reasoning_gym.config.datasets (task composite): give a list of {name: TASK, "
                            f"weight: NUMBER, config: {{...}}}}, got {specs!r:.200}.")
        return {**options, "datasets": [DatasetSpec(name=s["name"], weight=s.get("weight", 1.0),
                                                    config=dict(s.get("config") or {})) for s in specs]}
    return dict(options)


@functools.lru_cache(maxsize=16)
def _dataset(task: str, options_json: str, seed: int, size: int) -> Any:
    """The task's generator with these options (JSON), seed and size; cached per process (the reward workers)."""
    rg = _library()
    options = _options(task, json.loads(options_json))
    try:
        return rg.create_dataset(task, seed=seed, size=size, **options)
    except (AssertionError, ValueError, TypeError) as exc:  # the task's own config checks
        raise DataError(f"reasoning-gym task '{task}' refuses data.reasoning_gym.config={json.loads(options_json)} "
                        f"(size {size}): {type(exc).__name__}: {exc}") from None


def _system_prompt(name: str | None) -> str:
    prompts = _library().utils.SYSTEM_PROMPTS
    if name and name not in prompts:
        raise DataError(f"Unknown system prompt '{name}' (data.reasoning_gym.system_prompt)."
                        f"{did_you_mean(name, prompts)} reasoning-gym's prompts: {', '.join(sorted(prompts))}; "
                        "null for none.")
    return prompts[name] if name else ""


def _rows(d: Any, seed: int, want: int, exclude: frozenset[str], unique: bool) -> list[dict[str, Any]]:
    """Up to ``want`` rows from the task's items at ``seed``; a question in ``exclude`` (or, with ``unique``, one
    already drawn) is skipped. At most ``DRAWS * want + len(exclude)`` items are generated (some tasks generate
    them all up front)."""
    size = DRAWS * want + len(exclude)
    options = plain(d.config) or {}
    options_json = json.dumps(options, sort_keys=True)
    generator = _dataset(d.task, options_json, seed, size)
    system = _system_prompt(d.system_prompt)
    seen, rows = set(exclude), []
    for index in range(size):
        entry = generator[index]
        question = entry["question"]
        if question in seen:
            continue
        if unique:
            seen.add(question)
        rows.append({
            "data_source": SOURCE,
            "prompt": [*([{"role": "system", "content": system}] if system else []),
                       {"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": entry["answer"]},
            "extra_info": {"task": d.task, "config": options, "seed": seed, "size": size, "index": index},
        })
        if len(rows) == want:
            break
    return rows


def reasoning_gym_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """Train/val splits of ``data.reasoning_gym.task``; validation problems are distinct and never trained on."""
    d = config.data.reasoning_gym
    val = _rows(d, VAL_SEED, d.val_size, frozenset(), unique=True) if d.val_size else []
    if split == "val":
        if len(val) < d.val_size:
            raise DataError(f"reasoning-gym task '{d.task}' gave {len(val)} distinct problems out of "
                            f"{d.val_size} (data.reasoning_gym.val_size): lower val_size or widen the task's config.")
        return val
    held_out = frozenset(r["prompt"][-1]["content"] for r in val)
    train = _rows(d, int(config.trainer.seed), d.train_size, held_out, unique=False)
    if len(train) < d.train_size:
        raise DataError(f"reasoning-gym task '{d.task}' gave {len(train)} training problems that are not "
                        f"validation problems, out of {d.train_size} (data.reasoning_gym.train_size): lower "
                        f"data.reasoning_gym.val_size or widen the task's config.")
    return train


def reasoning_gym_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, *,
                        answer_tag: str | None = "answer") -> float:
    """The task's own ``score_answer`` of the response's answer (the last ``<answer>`` tag, or the whole response)."""
    info = extra_info if isinstance(extra_info, dict) else {}
    missing = [k for k in ("task", "config", "seed", "size", "index") if k not in info]
    if missing:
        raise RLForgeError(f"A row of data source '{SOURCE}' has no extra_info {', '.join(missing)}: the reward "
                           "regenerates the reasoning-gym item from them (rows of data.name=reasoning_gym have them).")
    generator = _dataset(info["task"], json.dumps(info["config"], sort_keys=True), int(info["seed"]), int(info["size"]))
    entry = generator[int(info["index"])]
    if ground_truth is not None and entry["answer"] != ground_truth:
        raise RLForgeError(f"reasoning-gym task '{info['task']}' regenerated item {info['index']} (seed "
                           f"{info['seed']}) with the answer {entry['answer']!r:.80}, not the row's "
                           f"{ground_truth!r:.80}: the installed reasoning-gym generates other problems than the one "
                           "that made the rows.")
    if answer_tag:
        answer = _library().utils.extract_answer(solution_str, tag_name=answer_tag)
    else:
        answer = solution_str.strip()
    return float(generator.score_answer(answer, entry))


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.dataset.register(SOURCE, reasoning_gym_dataset, config=ReasoningGymConfig,
                              description="reasoning-gym's procedural tasks, generated offline "
                                          "(pip install reasoning-gym)")
    registry.reward_fn.register(SOURCE, reasoning_gym_score, config=ReasoningGymRewardConfig,
                                description="reasoning-gym: the task's own score_answer of the <answer> tag")
