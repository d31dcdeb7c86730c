"""``rule`` reward manager: per-sample reward functions chosen by ``data_source`` or by config.

A user function loads from a file (``reward.file``, ``reward.fn_name``) with verl's contract
``compute_score(data_source, solution_str, ground_truth, extra_info)``, so verl reward code ports unchanged.

Reward functions run in persistent worker processes (``RewardWorkers``), forked from this process on the
first ``score`` and reused across steps. A call that takes longer than ``reward.timeout_s`` is stopped by
killing its worker (which is then restarted); a call that raises, or returns NaN/inf or a non-number, gives
the sample ``reward.fallback_score``. The run continues; ``reward/errors`` and ``reward/timeouts`` count them.
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
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.plugins.reward.code import code_exec_score
from rlforge.plugins.reward.functions import arith_score, gsm8k_score

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

ScoreFn = Callable[..., Any]
log = logging.getLogger("rlforge.reward")

OK, RAISED, BAD_VALUE, CRASHED, TIMEOUT = "ok", "raised", "bad value", "crashed", "timeout"
ERROR_KINDS = (RAISED, BAD_VALUE, CRASHED)  # counted in reward/errors; TIMEOUT in reward/timeouts
FIXED = "<reward.fn or reward.file>"  # the function table's key for a function set by config

Task = tuple[int, str, tuple[Any, ...]]  # (sample index, function key, call arguments)
Outcome = tuple[str, Any]  # (OK, (score, acc)) or (error kind, reason)


def load_user_function(path: str, name: str = "compute_score") -> ScoreFn:
    """Import ``name`` from the Python file at ``path``, with errors that name the file and function."""
    file = Path(path)
    if not file.is_file():
        raise RLForgeError(f"Reward file not found: {path} (reward.file).")
    spec = importlib.util.spec_from_file_location(f"rlforge_user_reward_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise RLForgeError(f"Reward file {path} has a syntax error at line {exc.lineno}: {exc.msg}.") from None
    except Exception as exc:
        raise RLForgeError(f"Reward file {path} failed to import: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RLForgeError(
            f"Reward file {path} has no function '{name}' (reward.fn_name). It must define "
            f"{name}(data_source, solution_str, ground_truth, extra_info)."
        )
    return fn


def split_result(result: Any) -> tuple[float, float]:
    """A reward function's result -> (score, accuracy). Accuracy is ``acc`` if given, else score >= 1.

    Raises ``ValueError`` naming the problem unless the score is a finite real number (a float, int or
    numpy scalar, alone or as the dict's ``score``).
    """
    raw = result.get("score") if isinstance(result, dict) else result
    if not isinstance(raw, numbers.Real):
        what = "a dict without a numeric 'score'" if isinstance(result, dict) else type(result).__name__
        raise ValueError(f"returned {what} ({result!r:.100}), not a number")
    score = float(raw)
    if not math.isfinite(score):
        raise ValueError(f"returned {score}")
    acc = float(result.get("acc", score >= 1.0)) if isinstance(result, dict) else float(score >= 1.0)
    return score, acc


def bind_config(fn: ScoreFn, reward_config: Any) -> ScoreFn:
    """Pass ``reward.<key>`` to each keyword-only parameter of ``fn`` named ``<key>`` (e.g. sandbox_timeout_s)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return fn
    keys = set(reward_config.keys())
    kwargs = {p.name: reward_config[p.name] for p in params if p.kind is p.KEYWORD_ONLY and p.name in keys}
    return functools.partial(fn, **kwargs) if kwargs else fn


def _evaluate(fn: ScoreFn, args: tuple[Any, ...]) -> Outcome:
    try:
        result = fn(*args)
    except Exception as exc:
        return RAISED, f"raised {type(exc).__name__}: {exc}"
    try:
        return OK, split_result(result)
    except ValueError as exc:
        return BAD_VALUE, str(exc)


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
            conn.send((index, _evaluate(fns[key], args)))


class _Worker:
    """One forked worker process and the tasks it has been sent but not yet answered."""

    def __init__(self, fns: dict[str, ScoreFn]) -> None:
        self.fns = fns
        self.pending: deque[Task] = deque()
        self.deadline = math.inf
        self._start()

    def _start(self) -> None:
        # fork: the worker inherits the functions (closures, user files, registry entries) without pickling
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, self.conn, self.fns), name="rlforge-reward",
                                   daemon=True)
        self.process.start()
        child.close()

    def send(self, tasks: list[Task], timeout_s: float) -> None:
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
        self.deadline = time.monotonic() + timeout_s

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
    """A pool of forked worker processes that evaluate reward calls with a per-call wall-clock timeout.

    Tasks go out in chunks and results stream back one by one; the timeout of a call starts when the previous
    result of its worker arrived. A worker that overruns is killed and replaced; its unfinished tasks are resent.
    """

    def __init__(self, fns: dict[str, ScoreFn], num_workers: int, timeout_s: float) -> None:
        self.fns = fns
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.workers: list[_Worker] = []
        self._finalizer: weakref.finalize | None = None

    def run(self, tasks: list[Task]) -> dict[int, Outcome]:
        """Evaluate every task; return ``{sample index: outcome}``."""
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
                    w.send([queue.popleft() for _ in range(min(chunk, len(queue)))], self.timeout_s)
            busy = [w for w in self.workers if w.pending]
            ready = wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for w in busy:
                if w.conn in ready:
                    self._receive(w, outcomes, queue)
                elif time.monotonic() >= w.deadline:
                    index = w.pending.popleft()[0]
                    outcomes[index] = (TIMEOUT, f"took longer than reward.timeout_s={self.timeout_s:g} s")
                    queue.extendleft(reversed(w.restart()))
        return outcomes

    def _receive(self, w: _Worker, outcomes: dict[int, Outcome], queue: deque[Task]) -> None:
        try:
            while w.pending and w.conn.poll():
                index, outcome = w.conn.recv()
                w.pending.popleft()
                outcomes[index] = outcome
                w.deadline = time.monotonic() + self.timeout_s
        except (EOFError, OSError):  # the worker died mid-call (os._exit, a segfault, the OOM killer)
            index = w.pending.popleft()[0]
            outcomes[index] = (CRASHED, w.exit_description())
            queue.extendleft(reversed(w.restart()))

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
        fns = {name: bind_config(registry.reward_fn.get(name), rc) for name in registry.reward_fn.available()}
        if rc.file:
            fns[FIXED] = bind_config(load_user_function(rc.file, rc.fn_name), rc)
        elif rc.fn:
            fns[FIXED] = bind_config(registry.reward_fn.get(rc.fn), rc)
        self.workers = RewardWorkers(fns, int(rc.get("num_workers", 1)), float(rc.timeout_s))
        self._logged: set[str] = set()

    def key_for(self, data_source: str) -> str:
        if self.fixed:
            return FIXED
        if data_source not in self.registry.reward_fn:
            known = ", ".join(self.registry.reward_fn.available())
            raise RLForgeError(
                f"No reward function for data_source '{data_source}'. Known: {known}. Set reward.fn=NAME or "
                f"reward.file=path.py (a compute_score function)."
            )
        return data_source

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
        faults: Counter[str] = Counter()
        for i in range(n):
            kind, value = outcomes[i]
            if kind == OK:
                scores[i], accs[i] = value
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
        batch.meta["metrics"] = {**batch.meta.get("metrics", {}),
                                 "reward/errors": float(sum(faults[k] for k in ERROR_KINDS)),
                                 "reward/timeouts": float(faults[TIMEOUT])}
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


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register("rule", RuleRewardManager)
    registry.reward_fn.register("arith", arith_score)
    registry.reward_fn.register("gsm8k", gsm8k_score)
    registry.reward_fn.register("openai/gsm8k", gsm8k_score, description="alias of gsm8k (verl's data_source)")
    registry.reward_fn.register("code", code_exec_score,
                                description="runs the program in the sandbox on stdin/stdout tests; pass fraction")
