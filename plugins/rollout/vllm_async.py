"""vLLM's asynchronous engine (``AsyncLLM``) behind blocking calls: the engine of the ``vllm`` rollout.

The engine lives on an event loop of its own, in a daemon thread started with it. A call from any thread submits a
coroutine to that loop and waits for its result in short slices (a Ctrl-C that lands on another thread still ends
the wait: see ``vllm.interruptible``). Requests that several threads submit at once share the engine's running
batch: vLLM's scheduler admits a new request at its next step (continuous batching). The agent engine relies on
that (``rlforge.agent.engine``): each trajectory's next turn is submitted as soon as its tool returns, while the
other trajectories keep decoding.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from rlforge.errors import RLForgeError

T = TypeVar("T")
WAIT_SLICE_S = 0.1  # how often a waiting thread looks up from its wait (a pending Ctrl-C runs then)
STOP_TIMEOUT_S = 5.0  # how long shutdown waits for the loop thread to end


class AsyncEngine:
    """An ``AsyncLLM`` built from ``engine_args`` (``vllm.engine.arg_utils.AsyncEngineArgs`` fields, as ``vllm.LLM``
    takes them), with blocking methods that any thread may call, also at the same time."""

    def __init__(self, **engine_args: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlforge-vllm-loop", daemon=True)
        self._thread.start()
        self._ids = itertools.count()
        self._closed = False
        try:  # built on its loop: the engine's output handler and sockets belong to that loop (a blocking wait:
            # VLLMRollout builds the engine through vllm.interruptible)
            self.engine: Any = asyncio.run_coroutine_threadsafe(_start(engine_args), self._loop).result()
        except BaseException:
            self._stop_loop()
            raise

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine's loop; its result (or its exception) here."""
        if self._closed:
            coro.close()
            raise RLForgeError("The vllm engine was shut down (VLLMRollout.shutdown): it takes no more requests.")
        return wait(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def submit(self, prompt: Any, sampling: Any, adapter: Any = None) -> concurrent.futures.Future:
        """Start one request now (with the LoRA adapter ``adapter``, a ``LoRARequest``, if given); the future's result
        is its final ``RequestOutput``."""
        if self._closed:
            raise RLForgeError("The vllm engine was shut down (VLLMRollout.shutdown): it takes no more requests.")
        return asyncio.run_coroutine_threadsafe(self._request(prompt, sampling, adapter), self._loop)

    async def _request(self, prompt: Any, sampling: Any, adapter: Any) -> Any:
        final = None
        async for final in self.engine.generate(prompt, sampling, request_id=f"rlforge-{next(self._ids)}",
                                                lora_request=adapter):
            pass
        return final

    def generate(self, prompts: Sequence[Any], sampling: Sequence[Any], adapter: Any = None) -> list[Any]:
        """One ``RequestOutput`` per prompt, in order (all requests submitted at once; any request's error is raised
        once all have ended)."""
        futures = [self.submit(p, s, adapter) for p, s in zip(prompts, sampling)]
        try:
            return [wait(f) for f in futures]
        except BaseException:
            for f in futures:  # a cancelled request is aborted in the engine (AsyncLLM.generate)
                f.cancel()
            raise

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        """``method`` of the worker extension on every engine worker, their results in rank order."""
        return self._wait(self.engine.collective_rpc(method, args=args))

    def call(self, method: str, *args: Any) -> Any:
        """The ``AsyncLLM`` coroutine method ``method(*args)`` (e.g. ``add_lora``, ``update_weights``), waited for."""
        return self._wait(getattr(self.engine, method)(*args))

    def reset_prefix_cache(self) -> bool:
        return self._wait(self.engine.reset_prefix_cache())

    def sleep(self, level: int = 1) -> None:
        self._wait(self.engine.sleep(level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._wait(self.engine.wake_up(tags))

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the engine's processes, then the loop thread; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        try:  # the output handler first: it would log the engine's end as an EngineDeadError
            asyncio.run_coroutine_threadsafe(_cancel([self.engine.output_handler]), self._loop).result(STOP_TIMEOUT_S)
            self.engine.shutdown(timeout=timeout)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        """End the loop's tasks (the engine's socket readers), then the loop and its thread."""
        try:
            asyncio.run_coroutine_threadsafe(_cancel(None), self._loop).result(STOP_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(STOP_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()


async def _cancel(tasks: list[asyncio.Task | None] | None) -> None:
    """Cancel ``tasks`` (None: every other task of the running loop) and wait until they have ended."""
    if tasks is None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    running = [t for t in tasks if t is not None and not t.done()]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def _start(engine_args: dict[str, Any]) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))


def wait(future: concurrent.futures.Future) -> Any:
    """``future.result()``; in the main thread waited for in slices of ``WAIT_SLICE_S`` (see the module docstring:
    signals run there only), elsewhere at once (the agent engine's request threads, many at a time)."""
    if threading.current_thread() is threading.main_thread():
        while not future.done():
            concurrent.futures.wait([future], WAIT_SLICE_S)
    return future.result()
