"""The pool of forked worker processes that run reward calls, each limited in CPU time (``RewardWorkers``).

Workers are forked from the trainer on first use and serve every later step. A call that uses more than
``timeout_s`` of CPU time (its worker's, sandboxed programs included), or gives no result within a wall-clock
backstop of ``WALL_BACKSTOP`` times that, is stopped by killing its worker, which is then restarted: a
CPU-time limit gives the same verdict on a loaded machine as on an idle one (docs/reliability.md).
"""

from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import pickle
import signal
import time
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

from rlforge.plugins.reward.cputime import process_cpu_seconds
from rlforge.plugins.reward.results import CRASHED, FATAL, TIMEOUT, Outcome, ScoreFn, evaluate

from rlforge.errors import RLForgeError

log = logging.getLogger("rlforge.reward")

WALL_BACKSTOP = 10.0  # wall-clock limit of a call, as a multiple of its CPU-time limit (reward.timeout_s)
POLL_S = 0.05  # how often the CPU time of a running call is checked

Task = tuple[int, str, tuple[Any, ...]]  # (sample index, function key, call arguments)


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
            outcome = evaluate(fns[key], args)
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

    def run(self, tasks: list[Task], quiet: bool = False) -> dict[int, Outcome]:
        """Evaluate every task; return ``{sample index: outcome}``. ``RLForgeError`` if a function raised one.
        ``quiet``: no warning counts the calls that timed out (the caller words that outcome itself)."""
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
        if not quiet:
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
