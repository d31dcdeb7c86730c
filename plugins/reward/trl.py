"""``trl`` reward manager: TRL's reward functions as they are, called once per batch with TRL's ``GRPOTrainer``
contract (docs/migration-from-trl.md).

Each function of ``reward.trl.functions`` (``module:function`` or ``path/to/file.py:function``) is called as
``f(prompts=..., completions=..., completion_ids=..., **columns)`` (an ``async def`` one awaited) and returns one
value per sample: a number, or None where it does not apply. ``columns`` are the keys of the rows' ``extra_info``
(where the page's conversion puts TRL's dataset columns), each a list over the batch (None where a row lacks the
key). With ``reward.trl.conversational`` (default) prompts are the rows' chat messages and completions
``[{"role": "assistant", "content": text}]``, as TRL passes conversational rows; off, the prompt's text (its
messages' contents, one per line) and the completion's text, as TRL passes standard rows. A sample's score is the
``reward.trl.weights``-weighted sum of the values that are not None (TRL's ``nansum``); each function's value is
kept per sample and logged as ``reward/extra/<function name>/mean``. As TRL does, every call also gets
``trainer_state`` (a ``transformers.TrainerState`` with ``global_step``, the updates made so far, and ``max_steps``,
``trainer.total_steps``; its other fields keep their defaults), ``log_metric(name, value)`` (the values a batch's calls
gave a name are averaged and logged under that name) and ``log_extra(column, values)`` (one value per sample: kept in
the sample's ``reward_extra_info``, numbers logged as ``reward/extra/<column>/mean``). A sample whose every function
returned None gets ``reward.fallback_score`` and counts as failed (``reward/error_share``, ``reward.max_error_share``):
TRL leaves it out of its group's baseline instead. The functions run in the trainer's process, as in TRL, without
the rule manager's time limit; one that raises or returns something else than one number or None per sample stops
the run with an error naming it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rlforge.plugins.reward.results import describe, extra_metrics
from rlforge.plugins.reward.rule import ERROR_SHARE, RewardFailure, more_tolerance, why_stop

from rlforge import batch as B
from rlforge.errors import ConfigError, RLForgeError
from rlforge.evaluation import scored_at
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

KEY = "reward.trl"
ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")  # besides the
# rows' columns, what TRL's contract passes


@dataclass
class TrlRewardConfig:
    """``reward.manager=trl``: TRL reward functions, called on whole batches."""

    functions: list[str] = field(default_factory=list)  # TRL reward functions, each 'module:function' or 'path/to/file.py:function' (GRPOTrainer's reward_funcs)
    weights: Optional[list[float]] = None  # one per function (TRL's reward_weights); None = 1.0 each
    conversational: bool = True  # prompts and completions as chat messages (TRL's conversational rows); false: as text (its standard rows)


def load_function(spec: str, key: str) -> Callable[..., Any]:
    """The function ``spec`` names (``module:function`` or ``path/to/file.py:function``), imported in this process;
    every failure a ConfigError naming ``key``."""
    where, _, name = str(spec).rpartition(":")
    if not where or not name.isidentifier():
        raise ConfigError(f"{key}: '{spec}' must be 'module:function' or 'path/to/file.py:function'.")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ConfigError(f"{key}: file not found: {where}.")
            module_spec = importlib.util.spec_from_file_location(f"rlforge_trl_reward_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise ConfigError(f"{key}: {where} cannot be imported as a Python module.")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: importing must never end the trainer
        raise ConfigError(f"{key}: importing {where} failed: {describe(exc)}") from None
    if not hasattr(module, name):
        raise ConfigError(f"{key}: {where} has no function '{name}'.")
    fn = getattr(module, name)
    if not callable(fn):
        raise ConfigError(f"{key}: {where}'s '{name}' is not a function ({type(fn).__name__}).")
    return fn


class TrlRewardManager:
    """Scores each batch with TRL-style reward functions (the module's docstring)."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        t = config.reward.trl
        if not t.functions:
            raise ConfigError(f"reward.manager=trl needs '{KEY}.functions': TRL reward functions, e.g. "
                              f"'{KEY}.functions=[my_rewards:accuracy_reward,my_rewards.py:format_reward]'.")
        if t.weights is not None and len(t.weights) != len(t.functions):
            raise ConfigError(f"'{KEY}.weights' has {len(t.weights)} values for {len(t.functions)} functions "
                              f"('{KEY}.functions'): give one weight per function, or none (1.0 each).")
        bad = next((i for i, w in enumerate(t.weights or []) if not math.isfinite(float(w))), None)
        if bad is not None:
            raise ConfigError(f"'{KEY}.weights[{bad}]' is {t.weights[bad]}: a weight must be a finite number.")
        if config.reward.file or config.reward.fn:
            key = "reward.file" if config.reward.file else "reward.fn"
            raise ConfigError(f"{key} names a per-sample reward function, which reward.manager=trl does not call: "
                              f"list TRL's functions in '{KEY}.functions' (or use reward.manager=rule).")

    @staticmethod
    def check_data_sources(config: Any, registry: Any, data_sources: Any) -> None:
        """Every row is scored by the functions, whatever its data_source."""

    @staticmethod
    def check_function(config: Any) -> None:
        """Every function of ``reward.trl.functions`` imports (what building the manager does first)."""
        for i, spec in enumerate(config.reward.trl.functions):
            load_function(spec, f"{KEY}.functions[{i}]")

    def __init__(self, config: Any, tokenizer: Any, registry: Any) -> None:
        t, rc = config.reward.trl, config.reward
        self.tokenizer = tokenizer
        self.functions = [load_function(spec, f"{KEY}.functions[{i}]") for i, spec in enumerate(t.functions)]
        self.names = [getattr(fn, "__name__", f"function_{i}") for i, fn in enumerate(self.functions)]
        self.weights = [1.0] * len(self.functions) if t.weights is None else [float(w) for w in t.weights]
        self.conversational = bool(t.conversational)
        self.fallback_score = float(rc.fallback_score)
        self.max_steps = int(config.trainer.total_steps)
        self.max_error_share = float(rc.get("max_error_share", 1.0))
        self.loop: asyncio.AbstractEventLoop | None = None  # runs async functions (as TRL runs them), made on first use

    def score(self, batch: B.Batch) -> B.Batch:
        texts = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        solutions = batch.lists.get(B.SOLUTION_TEXT, texts)  # an agent loop's answer, when it gives one
        n = len(batch)
        loop = batch.lists.get(B.LOOP_SCORES) or [None] * n  # rows an agent loop scored: no function is called
        rows = [i for i in range(n) if loop[i] is None]
        arguments = self._arguments(batch, rows, solutions) if rows else {}
        logged = Logged(len(rows))
        values = [self._call(j, fn, {**arguments, **logged.arguments(self._where(j))})
                  for j, fn in enumerate(self.functions)] if rows else []
        scores = torch.full((n,), self.fallback_score)
        failed = torch.zeros(n)
        extras: list[dict[str, Any]] = [{} for _ in range(n)]
        for k, i in enumerate(rows):
            given = {name: v[k] for name, v in zip(self.names, values) if v[k] is not None}
            if given:
                scores[i] = sum(w * v[k] for w, v in zip(self.weights, values) if v[k] is not None)
            else:
                failed[i] = 1.0
            extras[i] = {**given, **{column: v[k] for column, v in logged.columns.items()}}
        for i, value in enumerate(loop):
            if value is not None:
                scores[i] = float(value)
        self._check_error_share(int(failed.sum()), len(rows), batch)
        batch[B.SCORES], batch[B.TOKEN_LEVEL_SCORES] = scores, B.on_last_model_token(scores, batch[B.RESPONSE_MASK])
        batch[B.ACC] = (scores >= 1).float()
        batch[B.RESPONSE_TEXT], batch[B.REWARD_EXTRA_INFO], batch[B.REWARD_FAILED] = texts, extras, failed
        metrics = {"reward/errors": float(failed.sum()), "reward/timeouts": 0.0,
                   ERROR_SHARE: float(failed.sum()) / n if n else 0.0, **extra_metrics(extras)}
        clash = next((name for name in logged.values if name in metrics), None)
        if clash is not None:
            raise RLForgeError(f"A TRL reward function ({', '.join(self.names)}) called log_metric({clash!r}, ...): "
                               f"the trl reward manager logs that metric itself; use a name of its own.")
        batch.meta["metrics"] = {**batch.meta.get("metrics", {}), **metrics, **logged.metrics()}
        return batch

    def _where(self, j: int) -> str:
        return f"TRL reward function {self.names[j]} ({KEY}.functions[{j}])"

    def _arguments(self, batch: B.Batch, rows: list[int], solutions: list[str]) -> dict[str, Any]:
        """What every function is called with for ``rows``: prompts, completions, completion_ids and the rows'
        extra_info keys as columns (built once per batch)."""
        raw = batch.lists.get(B.RAW_PROMPT) or [[] for _ in range(len(batch))]
        if self.conversational:
            prompts: list[Any] = [raw[i] for i in rows]
            completions: list[Any] = [[{"role": "assistant", "content": solutions[i]}] for i in rows]
        else:
            prompts = ["\n".join(str(m.get("content", "")) for m in raw[i]) for i in rows]
            completions = [solutions[i] for i in rows]
        mask = batch[B.RESPONSE_MASK]
        ids = [batch[B.RESPONSES][i][mask[i].bool()].tolist() for i in rows]
        infos = [info if isinstance(info, dict) else {} for info in batch.lists.get(B.EXTRA_INFO) or [{}] * len(batch)]
        keys = list(dict.fromkeys(k for i in rows for k in infos[i]))
        clash = next((k for k in keys if k in ARGUMENTS), None)
        if clash is not None:
            raise RLForgeError(f"The rows' extra_info has the key '{clash}', which is an argument TRL's contract "
                               f"passes the reward functions itself (as TRL refuses a dataset column of that name): "
                               f"rename it.")
        from transformers import TrainerState

        state = TrainerState(global_step=scored_at(batch), max_steps=self.max_steps)
        return {"prompts": prompts, "completions": completions, "completion_ids": ids, "trainer_state": state,
                **{k: [infos[i].get(k) for i in rows] for k in keys}}

    def _call(self, j: int, fn: Callable[..., Any], arguments: dict[str, Any]) -> list[float | None]:
        """Function ``j``'s values for the rows of ``arguments`` (None where it does not apply), checked."""
        count = len(arguments["prompts"])
        where = self._where(j)
        try:
            out = fn(**arguments)
            if inspect.isawaitable(out):  # an async function, as TRL awaits them
                self.loop = self.loop or asyncio.new_event_loop()
                out = self.loop.run_until_complete(out)
        except Exception as exc:
            columns = [k for k in arguments if k not in ARGUMENTS]
            raise RLForgeError(f"{where} raised on a batch of {count} samples: {describe(exc)}. It is called as "
                               f"f(prompts=..., completions=..., completion_ids=..., **columns), the columns being the "
                               f"rows' extra_info keys: {', '.join(columns) or 'none'}.") from exc
        if hasattr(out, "tolist"):  # a tensor or an array
            out = out.tolist()
        if not isinstance(out, (list, tuple)) or len(out) != count:
            what = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RLForgeError(f"{where} returned {what} for {count} samples: return a list of one number (or "
                               f"None) per completion.")
        return [_value(v, where, k) for k, v in enumerate(out)]

    def _check_error_share(self, failed: int, called: int, batch: B.Batch) -> None:
        """Stop when the share of samples no function scored reaches ``reward.max_error_share``."""
        if not failed or failed / called < self.max_error_share:
            return
        advice = more_tolerance(self.max_error_share, "sample")
        raise RewardFailure(
            f"{failed} of {called} samples got None from every TRL reward function ({', '.join(self.names)}), which "
            f"reaches reward.max_error_share={self.max_error_share:g}: {why_stop(self.max_error_share, batch)}"
            + (f". To tolerate more, {advice}." if advice else ".")
        )

    def close(self) -> None:
        """Close the event loop of async functions, if one ran (the functions run in this process)."""
        if self.loop is not None:
            self.loop.close()


def _value(value: Any, where: str, index: int) -> float | None:
    """A function's value for one sample: a finite number (a bool counts as 0 or 1, as TRL's float tensor makes it),
    or None (NaN too, as TRL reads None)."""
    if value is None:
        return None
    if not isinstance(value, numbers.Real):
        raise RLForgeError(f"{where} returned {value!r} ({type(value).__name__}) for sample {index}: each value must "
                           f"be a number, or None where the function does not apply.")
    value = float(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        raise RLForgeError(f"{where} returned {value} for sample {index}: a reward must be finite.")
    return value


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register("trl", TrlRewardManager, config=TrlRewardConfig,
                                     description="TRL's reward functions, once per batch (GRPOTrainer's contract)")


class Logged:
    """What a batch's calls give ``log_metric`` and ``log_extra`` (TRL's callables), checked where given."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.values: dict[str, list[float]] = {}
        self.columns: dict[str, list[Any]] = {}

    def arguments(self, where: str) -> dict[str, Callable[..., None]]:
        def log_metric(name: str, value: float) -> None:
            if not isinstance(name, str) or not name.strip():
                raise RLForgeError(f"{where}: log_metric({name!r}, ...): a metric's name is a non-empty string.")
            if name.startswith(("val/", "val-core/", "val-aux/")):
                raise RLForgeError(f"{where}: log_metric({name!r}, ...): names under val/ are validation's metrics; "
                                   f"log the training batch's under a name of its own.")
            if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
                raise RLForgeError(f"{where}: log_metric({name!r}, {value!r}): the value must be a finite number.")
            self.values.setdefault(name, []).append(float(value))

        def log_extra(column: str, values: list[Any]) -> None:
            if not isinstance(column, str) or not column.strip():
                raise RLForgeError(f"{where}: log_extra({column!r}, ...): a column's name is a non-empty string.")
            if not isinstance(values, (list, tuple)) or len(values) != self.samples:
                what = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
                raise RLForgeError(f"{where}: log_extra({column!r}, ...) got {what} for {self.samples} samples: give "
                                   f"one value per completion.")
            self.columns[column] = [float(v) if isinstance(v, numbers.Real) else v for v in values]

        return {"log_metric": log_metric, "log_extra": log_extra}

    def metrics(self) -> dict[str, float]:
        """Each name's mean over the calls that logged it (as TRL averages them over a logging step)."""
        return {name: sum(v) / len(v) for name, v in self.values.items()}
