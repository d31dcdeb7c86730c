"""``rule`` reward manager: per-sample reward functions chosen by ``data_source`` or by config.

A user function loads from a file (``reward.file``, ``reward.fn_name``) with verl's contract
``compute_score(data_source, solution_str, ground_truth, extra_info)``, so verl reward code ports unchanged.
The file is imported once in a throwaway child process first, so one that exits or hangs at import time is
a clear error instead of a dead or stuck trainer.
Without one, each row's ``data_source`` picks the function: one registered under that name, else the built-in
that verl's default scorer uses for it (``DATA_SOURCES``). Keys of a dict result besides ``score`` and ``acc``
are kept per sample (column ``reward_extra_info``) and their batch means reported as ``reward/extra/<key>/mean``.

Reward functions run in persistent worker processes (``RewardWorkers``), forked from this process on the
first ``score`` and reused across steps. A call that uses more than ``reward.timeout_s`` of CPU time (its
worker's, sandboxed programs included), or gives no result within a wall-clock backstop of
``WALL_BACKSTOP`` times that, is stopped by killing its worker (which is then restarted): a CPU-time limit
gives the same verdict on a loaded machine as on an idle one. A call that raises, or returns NaN/inf, a
value outside the float32 range of the reward tensor or a non-number, gives the sample
``reward.fallback_score``. The run continues; ``reward/errors`` and ``reward/timeouts`` count them. A
reward function that raises ``RLForgeError`` (a configuration mistake, such as the code sandbox refusing
to run without isolation) stops the run with that message.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import inspect
import logging
import math
import multiprocessing
import numbers
import pickle
import signal
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.plugins.reward.code import CodeRewardConfig, code_exec_score
from rlforge.plugins.reward.cputime import process_cpu_seconds
from rlforge.plugins.reward.functions import arith_score, gsm8k_score, qa_em_score
from rlforge.plugins.reward.math import geo3k_score, math_boxed_score, math_dapo_score

from rlforge import batch as B
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

ScoreFn = Callable[..., Any]
log = logging.getLogger("rlforge.reward")

OK, RAISED, BAD_VALUE, CRASHED, TIMEOUT = "ok", "raised", "bad value", "crashed", "timeout"
FATAL = "fatal"  # the function raised RLForgeError: the run stops
ERROR_KINDS = (RAISED, BAD_VALUE, CRASHED)  # counted in reward/errors; TIMEOUT in reward/timeouts
FIXED = "<reward.fn or reward.file>"  # the function table's key for a function set by config
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max (scores go into float32 tensors); no torch import at registration
WALL_BACKSTOP = 10.0  # wall-clock limit of a call, as a multiple of its CPU-time limit (reward.timeout_s)
POLL_S = 0.05  # how often the CPU time of a running call is checked

REWARD_EXTRA_INFO = "reward_extra_info"  # list column: each sample's extra keys (verl's reward_extra_info)
EXTRA_METRIC = "reward/extra/{key}/mean"  # batch mean of a numeric extra key

Task = tuple[int, str, tuple[Any, ...]]  # (sample index, function key, call arguments)
Outcome = tuple[str, Any]  # (OK, (score, acc, extras)) or (error kind, reason)

# verl's data_source names (default_compute_score, verl/utils/reward_score/__init__.py) -> built-in reward function.
# A reward function registered under the data_source itself comes first.
DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    **dict.fromkeys(["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"], "math_boxed"),
    **dict.fromkeys(["math_dapo", "math", "math_dapo_reasoning"], "math_dapo"),
    **dict.fromkeys([f"numina_{name}" for name in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc",
                                                   "cn_k12", "olympiads")], "math_boxed"),
    **dict.fromkeys(["codecontests", "apps", "codeforces", "taco"], "code"),
    "hiyouga/geometry3k": "geo3k",
    **dict.fromkeys([f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa",
                                                     "musique", "bamboogle")], "qa_em"),
}
DATA_SOURCE_PREFIXES: dict[str, str] = {"aime": "math_dapo"}  # aime2024, aime_2025, ...


def load_user_function(path: str, name: str = "compute_score", timeout_s: float = 10.0) -> ScoreFn:
    """Import ``name`` from the Python file at ``path``, with errors that name the file and function.

    The file is imported in a throwaway child process first, limited like a reward call (``timeout_s`` of
    CPU time, a wall-clock backstop of ``WALL_BACKSTOP`` times that): a file that calls ``sys.exit``, kills
    its process or loops forever at import time is an ``RLForgeError`` instead of a dead or hung trainer.
    """
    if not Path(path).is_file():
        raise RLForgeError(f"Reward file not found: {path} (reward.file).")
    probe = RewardWorkers({"import": lambda: _import_function(path, name) and 0.0}, 1, timeout_s)
    try:
        kind, reason = probe.run([(0, "import", ())])[0]
    finally:
        probe.close()
    if kind != OK:
        raise RLForgeError(_IMPORT_FAILURES[kind].format(path=path, reason=reason, timeout_s=timeout_s))
    return _import_function(path, name)  # now in this process: the workers are forked from it


# what a failed import check means (a file that raises at import comes back as the RLForgeError of
# _import_function, which RewardWorkers.run raises itself)
_IMPORT_FAILURES = {
    RAISED: "Reward file {path} failed to import: {reason}.",
    CRASHED: "Reward file {path} ended its process while being imported: {reason} (os._exit or a crash at "
             "import time?).",
    TIMEOUT: "Reward file {path} did not finish importing: it {reason} (reward.timeout_s={timeout_s:g}). An "
             "infinite loop or a blocking call at import time?",
}


def _import_function(path: str, name: str) -> ScoreFn:
    file = Path(path)
    spec = importlib.util.spec_from_file_location(f"rlforge_user_reward_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise RLForgeError(f"Reward file {path} has a syntax error at line {exc.lineno}: {exc.msg}.") from None
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: importing must never end the trainer
        raise RLForgeError(f"Reward file {path} failed to import: {_describe(exc)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RLForgeError(
            f"Reward file {path} has no function '{name}' (reward.fn_name). It must define "
            f"{name}(data_source, solution_str, ground_truth, extra_info)."
        )
    return fn


def split_result(result: Any) -> tuple[float, float]:
    """A reward function's result -> (score, accuracy). Accuracy is ``acc`` if given, else score >= 1.

    Raises ``ValueError`` naming the problem unless the score (and ``acc``, when given) is a real number
    (a float, int, bool or numpy scalar) that is finite and within the float32 range of the reward tensor.
    Both stay Python floats (float64) here; the manager builds the float32 tensor from them.
    """
    if isinstance(result, dict):
        if not isinstance(result.get("score"), numbers.Real):
            raise ValueError(f"returned a dict without a numeric 'score' ({_short(result)})")
        score = _real(result["score"], "score")
        acc = _real(result["acc"], "'acc'") if "acc" in result else float(score >= 1.0)
        return score, acc
    if not isinstance(result, numbers.Real):
        raise ValueError(f"returned {type(result).__name__} ({_short(result)}), not a number")
    score = _real(result, "score")
    return score, float(score >= 1.0)


def _real(value: Any, what: str) -> float:
    if not isinstance(value, numbers.Real):
        raise ValueError(f"returned {what} {type(value).__name__} ({_short(value)}), not a number")
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError) as exc:
        raise ValueError(f"returned {what} {_short(value)}, which is not a float ({exc})") from None
    if not math.isfinite(number):
        raise ValueError(f"returned {number}" if what == "score" else f"returned {what} {number}")
    if abs(number) > FLOAT32_MAX:
        raise ValueError(f"returned {what} {number:g}, beyond the float32 range of the reward tensor "
                         f"(|x| <= {FLOAT32_MAX:.4g})")
    return number


def _short(value: Any, limit: int = 100) -> str:
    """``repr`` cut to ``limit`` characters; never raises (a huge int's repr does, past 4300 digits)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any broken __repr__
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception; never raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - a broken __str__
        return type(exc).__name__


def bind_config(fn: ScoreFn, *sections: Any) -> ScoreFn:
    """Pass each config value to the keyword-only parameter of ``fn`` of the same name. ``sections``: the core
    ``reward`` section (e.g. ``timeout_s``), then the function's own (``reward.<fn name>.*``, e.g. the ``code``
    function's ``sandbox_timeout_s``); a later section wins."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return fn
    wanted = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    kwargs = {k: section[k] for section in sections if section is not None for k in section.keys() if k in wanted}
    return functools.partial(fn, **kwargs) if kwargs else fn


def _fn_section(config: Any, registry: Any, name: str) -> Any:
    """The reward function ``name``'s own config section, if it declared one."""
    path = registry.reward_fn.entry(name).config_path(registry.SPECS["reward_fn"])
    section = config if path else None
    for part in (path or "").split("."):
        section = getattr(section, part, None)
    return section


def extra_values(result: Any) -> dict[str, float | str]:
    """A dict result's keys besides ``score`` and ``acc`` whose values are finite numbers (as floats) or strings
    (verl's ``reward_extra_info``); other values are dropped."""
    if not isinstance(result, dict):
        return {}
    return {str(k): v if isinstance(v, str) else float(v) for k, v in result.items()
            if k not in ("score", "acc") and (isinstance(v, str) or isinstance(v, numbers.Real) and math.isfinite(v))}


def _evaluate(fn: ScoreFn, args: tuple[Any, ...]) -> Outcome:
    try:
        result = fn(*args)
    except RLForgeError as exc:
        return FATAL, str(exc)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too: the worker must answer
        return RAISED, f"raised {_describe(exc)}"
    try:
        return OK, (*split_result(result), extra_values(result))
    except Exception as exc:  # noqa: BLE001 - ValueError, or a number type whose __float__ misbehaves
        return BAD_VALUE, str(exc) if isinstance(exc, ValueError) else f"returned a value that broke: {_describe(exc)}"


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the trainer dies, even by SIGKILL (no orphan holds its pipes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: EOF on the pipe still ends the loop
        pass


def _serve(conn: Connection, parent_end: Connection, fns: dict[str, ScoreFn]) -> None:
    """Worker loop: receive a list of tasks, send back ``(index, outcome)`` for each as soon as it is done."""
    _die_with_parent()
    parent_end.close()  # else the pipe never reports EOF when the trainer goes away
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    while True:
        try:
            tasks: list[Task] = conn.recv()
        except EOFError:  # the trainer closed the pipe or died
            return
        for index, key, args in tasks:
            outcome = _evaluate(fns[key], args)
            conn.send((index, outcome, process_cpu_seconds()))


class _Worker:
    """One forked worker process, the tasks it has been sent but not yet answered, and the clock of the
    call it is running (its CPU time and the wall clock when that call started)."""

    def __init__(self, fns: dict[str, ScoreFn]) -> None:
        self.fns = fns
        self.pending: deque[Task] = deque()
        self.cpu_start, self.wall_start = 0.0, math.inf
        self._start()

    def _start(self) -> None:
        # fork: the worker inherits the functions (closures, user files, registry entries) without pickling
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, self.conn, self.fns), name="rlforge-reward",
                                   daemon=True)
        self.process.start()
        child.close()

    def send(self, tasks: list[Task]) -> None:
        if not self.process.is_alive():  # died while idle (e.g. the OOM killer)
            self.stop()
            self._start()
        try:
            self.conn.send(tasks)  # pickles first: a failure writes nothing
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise RLForgeError(f"Reward function arguments (ground_truth, extra_info) of samples "
                               f"{tasks[0][0]}..{tasks[-1][0]} cannot be sent to the reward worker process; "
                               f"they must be picklable: {exc}") from None
        self.pending.extend(tasks)
        self.start_clock(process_cpu_seconds(self.process.pid))

    def start_clock(self, cpu: float | None) -> None:
        """The next call starts now, with the worker's CPU time at ``cpu``."""
        self.cpu_start, self.wall_start = cpu or 0.0, time.monotonic()

    def overrun(self, cpu_limit_s: float, wall_limit_s: float) -> str | None:
        """Why the running call is past its limits, or None while it is within them."""
        cpu = process_cpu_seconds(self.process.pid)
        if cpu is not None and cpu - self.cpu_start > cpu_limit_s:
            return f"used more than reward.timeout_s={cpu_limit_s:g} s of CPU time"
        if time.monotonic() - self.wall_start > wall_limit_s:
            return (f"gave no result within the wall-clock backstop of {wall_limit_s:g} s ({WALL_BACKSTOP:g} x "
                    f"reward.timeout_s): it waits without using CPU, or the machine is overloaded")
        return None

    def restart(self) -> list[Task]:
        """Kill the process, start a fresh one; return the tasks it still owed."""
        self.stop()
        owed = list(self.pending)
        self.pending.clear()
        self._start()
        return owed

    def stop(self) -> None:
        self.conn.close()
        self.process.kill()
        self.process.join()

    def exit_description(self) -> str:
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        if code is None:
            return "lost the pipe to the reward worker"
        if code < 0:
            return f"reward worker was killed by {signal.Signals(-code).name}"
        return f"reward worker exited with code {code}"


class RewardWorkers:
    """A pool of forked worker processes that evaluate reward calls, each limited in CPU time.

    Tasks go out in chunks and results stream back one by one; a call's clock starts when the previous
    result of its worker arrived. A call over ``timeout_s`` of CPU time, or over ``WALL_BACKSTOP`` times
    that of wall-clock time, is a timeout: its worker is killed and replaced, and its unfinished tasks are
    resent. Each step with timeouts logs a warning with their count.
    """

    def __init__(self, fns: dict[str, ScoreFn], num_workers: int, timeout_s: float) -> None:
        if not (isinstance(num_workers, int) and num_workers >= 1):
            raise RLForgeError(f"reward.num_workers must be an integer >= 1 (worker processes that run reward "
                               f"functions), got {num_workers!r}.")
        self.fns = fns
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.workers: list[_Worker] = []
        self._finalizer: weakref.finalize | None = None

    def run(self, tasks: list[Task]) -> dict[int, Outcome]:
        """Evaluate every task; return ``{sample index: outcome}``. ``RLForgeError`` if a function raised one."""
        if not self.workers:  # first use, or first use after close()
            self.workers.extend(_Worker(self.fns) for _ in range(self.num_workers))
            self._finalizer = weakref.finalize(self, _stop_all, self.workers)
        queue = deque(tasks)
        # a lone worker gets everything at once; several get ~4 chunks each, so one stuck on slow samples
        # does not hold back the rest of the batch
        parts = 1 if self.num_workers == 1 else 4 * self.num_workers
        chunk = max(1, math.ceil(len(tasks) / parts))
        outcomes: dict[int, Outcome] = {}
        while len(outcomes) < len(tasks):
            for w in self.workers:
                if not w.pending and queue:
                    w.send([queue.popleft() for _ in range(min(chunk, len(queue)))])
            busy = [w for w in self.workers if w.pending]
            ready = wait([w.conn for w in busy], timeout=POLL_S)
            for w in busy:
                if w.conn in ready:
                    self._receive(w, outcomes, queue)
                elif reason := w.overrun(self.timeout_s, WALL_BACKSTOP * self.timeout_s):
                    outcomes[w.pending.popleft()[0]] = (TIMEOUT, reason)
                    queue.extendleft(reversed(w.restart()))
        self._warn_timeouts(outcomes)
        return outcomes

    def _receive(self, w: _Worker, outcomes: dict[int, Outcome], queue: deque[Task]) -> None:
        try:
            while w.pending and w.conn.poll():
                index, outcome, cpu = w.conn.recv()
                w.pending.popleft()
                if outcome[0] == FATAL:
                    raise RLForgeError(outcome[1])
                outcomes[index] = outcome
                w.start_clock(cpu)
        except (EOFError, OSError):  # the worker died mid-call (os._exit, a segfault, the OOM killer)
            index = w.pending.popleft()[0]
            outcomes[index] = (CRASHED, w.exit_description())
            queue.extendleft(reversed(w.restart()))

    def _warn_timeouts(self, outcomes: dict[int, Outcome]) -> None:
        count = sum(kind == TIMEOUT for kind, _ in outcomes.values())
        if count:
            log.warning("%d of %d reward calls timed out (over reward.timeout_s=%g s of CPU time, or %g s of wall "
                        "clock); they get reward.fallback_score and are counted in reward/timeouts.",
                        count, len(outcomes), self.timeout_s, WALL_BACKSTOP * self.timeout_s)

    def close(self) -> None:
        """Stop the worker processes (they are also stopped when this object is collected or at exit)."""
        if self._finalizer is not None:
            self._finalizer()


def _stop_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()
    workers.clear()


class RuleRewardManager:
    """Decodes each response and calls its reward function; the score goes on the last token of the response mask.
    With an agent loop the function scores the trajectory's answer (``solution_text``), not the whole response.

    Faults never stop the run: a sample whose function raised, hung past ``reward.timeout_s`` or returned
    a non-number gets ``reward.fallback_score``; the first fault of each kind is logged.
    """

    def __init__(self, config: Any, tokenizer: Any, registry: Any) -> None:
        self.tokenizer = tokenizer
        self.registry = registry
        rc = config.reward
        if not rc.timeout_s > 0:
            raise RLForgeError(f"reward.timeout_s must be > 0 seconds, got {rc.timeout_s}.")
        self.fallback_score = float(rc.fallback_score)
        self.fixed = rc.file or rc.fn
        fns = {name: bind_config(registry.reward_fn.get(name), rc, _fn_section(config, registry, name))
               for name in registry.reward_fn.available()}
        if rc.file:
            fns[FIXED] = bind_config(load_user_function(rc.file, rc.fn_name, float(rc.timeout_s)), rc)
        elif rc.fn:
            registry.reward_fn.get(rc.fn)  # an unknown name: the registry's error, with the known ones
            fns[FIXED] = fns[rc.fn]
        self.workers = RewardWorkers(fns, int(rc.get("num_workers", 1)), float(rc.timeout_s))
        self._logged: set[str] = set()

    @staticmethod
    def check_data_sources(config: Any, registry: Any, data_sources: Iterable[str]) -> None:
        """Called by the Builder on every dataset it loads, before any model loads (module function below)."""
        check_data_sources(config, registry, data_sources)

    def key_for(self, data_source: str) -> str:
        if self.fixed:
            return FIXED
        name = function_for(data_source, self.registry)
        if name is None:
            raise RLForgeError(no_function_message([data_source], self.registry))
        return name

    def score(self, batch: B.Batch) -> B.Batch:
        texts = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        solutions = batch.lists.get(B.SOLUTION_TEXT, texts)  # an agent loop's answer, when it gives one
        n = len(batch)
        sources, truths = batch[B.DATA_SOURCE], batch[B.GROUND_TRUTH]
        extra = batch.lists.get(B.EXTRA_INFO, [None] * n)
        tasks = [(i, self.key_for(sources[i]), (sources[i], solutions[i], truths[i], extra[i])) for i in range(n)]
        outcomes = self.workers.run(tasks)
        scores = torch.full((n,), self.fallback_score)
        accs = torch.zeros(n)
        extras: list[dict[str, Any]] = [{} for _ in range(n)]
        faults: Counter[str] = Counter()
        for i in range(n):
            kind, value = outcomes[i]
            if kind == OK:
                scores[i], accs[i], extras[i] = value
            else:
                faults[kind] += 1
                self._log_first(kind, sources[i], i, value)
        mask = batch[B.RESPONSE_MASK]
        last = (mask * torch.arange(1, mask.shape[1] + 1)).argmax(-1)  # the last response token of the model
        token_scores = torch.zeros(mask.shape, dtype=torch.float32)
        token_scores[torch.arange(n), last] = scores
        batch[B.SCORES] = scores
        batch[B.TOKEN_LEVEL_SCORES] = token_scores
        batch[B.ACC] = accs
        batch[B.RESPONSE_TEXT] = texts
        batch[REWARD_EXTRA_INFO] = extras
        batch.meta["metrics"] = {**batch.meta.get("metrics", {}),
                                 "reward/errors": float(sum(faults[k] for k in ERROR_KINDS)),
                                 "reward/timeouts": float(faults[TIMEOUT]),
                                 **extra_metrics(extras)}
        return batch

    def _log_first(self, kind: str, data_source: str, index: int, reason: str) -> None:
        if kind in self._logged:
            return
        self._logged.add(kind)
        metric = "reward/timeouts" if kind == TIMEOUT else "reward/errors"
        log.warning("Reward function for data_source '%s' failed on sample %d (%s): %s. The sample gets "
                    "reward.fallback_score=%g; later '%s' faults are only counted in %s.",
                    data_source, index, kind, reason, self.fallback_score, kind, metric)

    def close(self) -> None:
        """Stop the reward worker processes."""
        self.workers.close()


def extra_metrics(extras: list[dict[str, Any]]) -> dict[str, float]:
    """``EXTRA_METRIC`` for each numeric extra key: its mean over the samples that returned it."""
    values: dict[str, list[float]] = {}
    for sample in extras:
        for key, value in sample.items():
            if isinstance(value, float):
                values.setdefault(key, []).append(value)
    return {EXTRA_METRIC.format(key=key): sum(v) / len(v) for key, v in sorted(values.items())}


def function_for(data_source: str, registry: Any) -> str | None:
    """The reward function for rows of ``data_source``: one registered under that name, else verl's name for it
    (``DATA_SOURCES``, ``DATA_SOURCE_PREFIXES``); None when there is none."""
    if data_source in registry.reward_fn:
        return data_source
    name = DATA_SOURCES.get(data_source) or next(
        (fn for prefix, fn in DATA_SOURCE_PREFIXES.items() if data_source.startswith(prefix)), None)
    return name if name is not None and name in registry.reward_fn else None


def no_function_message(data_sources: list[str], registry: Any) -> str:
    names = ", ".join(f"'{s}'" for s in data_sources)
    return (f"No reward function for data_source {names}. Reward functions: {', '.join(registry.reward_fn.available())}"
            f", and verl's data_source names for them (openai/gsm8k, lighteval/MATH, math_dapo, aime*, ...: "
            f"docs/migration-from-verl.md). Set reward.fn=NAME or reward.file=path.py (a compute_score function), "
            f"or register a function under the data_source's name in a plugin.")


def check_data_sources(config: Any, registry: Any, data_sources: Iterable[str]) -> None:
    """Fail before any model loads when rows of a dataset would have no reward function (rule manager).

    :param config: the composed config; nothing to check when ``reward.fn`` or ``reward.file`` is set
    :param registry: the registries (``registry.reward_fn``)
    :param data_sources: the ``data_source`` values of the dataset's rows
    :raises ConfigError: naming every data source without a function, the known names and the keys to set
    """
    if config.reward.file or config.reward.fn:
        return
    missing = sorted({str(s) for s in data_sources if function_for(str(s), registry) is None})
    if missing:
        raise ConfigError(no_function_message(missing, registry))


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register("rule", RuleRewardManager)
    registry.reward_fn.register("arith", arith_score)
    registry.reward_fn.register("gsm8k", gsm8k_score, description="GSM8K: the number after '####' (verl's rule)")
    registry.reward_fn.register("math_boxed", math_boxed_score,
                                description="MATH: last \\boxed{} answer, math-verify equivalence; 1/0")
    registry.reward_fn.register("math_dapo", math_dapo_score,
                                description="DAPO/AIME: last 'Answer:' line, math-verify equivalence; 1/-1")
    registry.reward_fn.register("geo3k", geo3k_score,
                                description="Geometry3K: 0.9 boxed answer (math-verify) + 0.1 <think> format")
    registry.reward_fn.register("qa_em", qa_em_score,
                                description="Search-R1 QA: exact match of the last <answer></answer>")
    registry.reward_fn.register("code", code_exec_score, config=CodeRewardConfig,
                                description="runs the program in the sandbox on stdin/stdout tests; pass fraction")
