"""Where tool code runs: never on the rollout's event loop, and never in a thread that keeps the process alive.

- A synchronous function runs in a daemon thread of :class:`DaemonThreads` (at most ``max_threads`` at once; more
  calls wait for a free thread). A call that hangs holds its thread until it returns, but the process exits
  without waiting for it (the standard ``ThreadPoolExecutor`` joins its threads at exit).
- An ``async`` function runs on a :class:`ToolLoop`, an event loop of its own in a daemon thread, so an async tool
  that blocks (``time.sleep``, a socket read without timeout) stalls that loop, not the rollout's, which still
  times the call out.
- A call that returns in a forked child (the function called ``os.fork()``) ends that child at once with status 0,
  so the copy of the trainer never runs rlforge's code.
- ``SystemExit`` and ``KeyboardInterrupt`` raised by a call become a ``RuntimeError`` of that call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("rlforge.agent")


def _contained(exc: BaseException) -> BaseException:
    """The exception a caller gets: a ``SystemExit`` or ``KeyboardInterrupt`` would stop the run, not the call."""
    if isinstance(exc, SystemExit):
        return RuntimeError(f"sys.exit({exc.code!r}) called")
    if not isinstance(exc, Exception):
        return RuntimeError(f"{type(exc).__name__} raised")
    return exc


def _resolve(future: concurrent.futures.Future[None]) -> None:
    try:
        future.set_result(None)
    except concurrent.futures.InvalidStateError:  # cancelled meanwhile: nobody waits for it
        pass


class DaemonThreads:
    """A pool of up to ``max_threads`` daemon threads; ``submit`` returns a ``concurrent.futures.Future`` (await it
    with ``asyncio.wrap_future``). A pending call whose future is cancelled never starts."""

    def __init__(self, max_threads: int, name: str) -> None:
        self.max_threads, self.name = max_threads, name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads = 0
        self._pid = os.getpid()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((future, fn, args))
        if self._idle.acquire(blocking=False):  # an idle thread takes it
            return future
        with self._lock:
            if self._threads < self.max_threads:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._threads}", daemon=True).start()
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            del item
            if future.set_running_or_notify_cancel():
                result, error = None, None
                try:
                    result = fn(*args)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    error = _contained(exc)
                if os.getpid() != self._pid:
                    os._exit(0)  # the function forked and this is the child: it must not run the trainer's code
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
                del future, fn, args, result, error
            self._idle.release()

    def close(self) -> None:
        """Idle threads exit; busy ones finish their call first (daemons: they never delay the process exit)."""
        with self._lock:
            for _ in range(self._threads):
                self._queue.put(None)
            self._threads = 0


def _settle(done: concurrent.futures.Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Set ``done``'s result or exception unless it is already done (cancelled by a timeout)."""
    try:
        if error is None:
            done.set_result(result)
        else:
            done.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass


class ToolLoop:
    """An event loop in a daemon thread, for ``async`` tools."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._pid = os.getpid()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            self.loop.close()

    def submit(self, awaitable: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        """The awaitable's result, set the moment it is ready: not through a callback of the loop, which a tool that
        blocks the loop (a blocking call in an ``async def``) would hold back until it returns. Cancelling the future
        cancels the task."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        task = asyncio.run_coroutine_threadsafe(self._guarded(awaitable, done), self.loop)
        done.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
        return done

    async def _guarded(self, awaitable: Awaitable[Any], done: concurrent.futures.Future[Any]) -> None:
        try:
            _settle(done, result=await awaitable)
        except asyncio.CancelledError as exc:  # the caller gave up (its timeout) or the loop stops
            _settle(done, error=exc)
            raise
        except BaseException as exc:  # SystemExit and KeyboardInterrupt would stop the run, not the call
            _settle(done, error=_contained(exc))
        finally:
            if os.getpid() != self._pid:
                os._exit(0)  # a fork of the tool: see DaemonThreads._work

    async def responsive(self, within_s: float) -> bool:
        """Whether the loop runs a callback within ``within_s`` (False: a tool blocks it)."""
        probe: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(_resolve, probe)
        try:
            await asyncio.wait_for(asyncio.wrap_future(probe), within_s)
        except asyncio.TimeoutError:
            return False
        return True

    def retire(self) -> None:
        """Stop the loop once the tasks it holds have ended (a loop replaced because a tool blocked it: the calls
        queued behind that tool still run when it returns, each within its caller's timeout)."""
        async def drain() -> None:
            me = asyncio.current_task()
            await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not me), return_exceptions=True)
            self.loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(drain(), self.loop)
        except RuntimeError:  # closed meanwhile
            pass

    def close(self) -> None:
        """Stop the loop (a blocked loop stops once its tool returns; the thread is a daemon either way)."""
        if not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
