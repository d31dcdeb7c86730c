"""The vllm engine's token-in/token-out requests of agent loops (``TokenRequests``, mixed into ``VLLMRollout``): a
batch of requests waited for (``generate_tokens``: a wave, or one request of a thread under continuous batching), or
one request as a future (``submit_tokens``: awaited on an event loop, no thread per request)."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rlforge.errors import RLForgeError
from rlforge.lazy import lazy_import, no_grad
from rlforge.sampling import Generation, SamplingParams

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


class TokenRequests:
    """Token requests on the engine of a ``VLLMRollout`` (what it provides: below)."""

    vllm: Any  # the vllm module
    adapter: Any  # the LoRA adapter the engine generates with (None: none)
    _llm: Any  # the engine (vllm_async.AsyncEngine), started
    _calls: int  # calls and holds running: the engine sleeps when none is left
    _lock: threading.Lock
    _run: Callable[[list[Any], list[Any]], list[Any]]  # the engine woken, these requests waited for
    _sampling_params: Callable[[SamplingParams, int | None], Any]  # vLLM's sampling parameters of a request

    if TYPE_CHECKING:
        @property
        def _placeholders(self) -> list[int]: ...  # image placeholder tokens of a vision-language model

    @no_grad
    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams],
                        multi_modal: list[dict[str, Any] | None] | None = None) -> list[Generation]:
        """Token-in/token-out requests of agent loops (a wave, or under continuous batching one request per call, from
        several threads at once), each with its own sampling parameters (seeded as in ``generate``: request ``i``
        with ``SamplingParams.seed + i`` when set, else from a base drawn from the torch RNG); ``finish`` is vLLM's
        finish reason. ``multi_modal``: each prompt's vision inputs (None for a text prompt), sent as ``generate``
        sends a row's (``multimodal.engine_prompt``)."""
        requests, sampling = self._token_requests(prompts, params, multi_modal)
        return [_generation(r) for r in self._run(requests, sampling)]

    @no_grad
    def submit_tokens(self, prompt_ids: list[int], params: SamplingParams,
                      multi_modal: dict[str, Any] | None = None) -> concurrent.futures.Future[Generation]:
        """One request of :meth:`generate_tokens` (the same tokens for the same seed), not waited for: the future's
        result is its ``Generation``; cancelling the future aborts the request. For a caller that awaits many requests
        on one event loop (the agent engine under continuous batching) instead of a thread per blocking call. The
        engine must be held (:meth:`hold`) while requests run: a request neither wakes nor puts it to sleep."""
        with self._lock:
            if self._llm is None:
                raise RLForgeError("The vllm engine is not running (shut down by VLLMRollout.shutdown, or not started): "
                                   "submit_tokens needs it started and held (hold(True)).")
            if not self._calls:
                raise RLForgeError("VLLMRollout.submit_tokens needs the engine held (hold(True)) while its requests run: "
                                   "an agent rollout holds it (rlforge.agent.engine.engines_held).")
        (request,), (sampling,) = self._token_requests([prompt_ids], [params], [multi_modal])
        running = self._llm.submit(request, sampling, self.adapter)
        out: concurrent.futures.Future[Generation] = concurrent.futures.Future()

        def finish(done: concurrent.futures.Future) -> None:  # on the engine's loop: no blocking call here
            try:
                if done.cancelled():  # not by the caller (then ``out`` is cancelled already): the engine stopped
                    out.set_exception(RLForgeError("The vllm engine ended the request before it finished (it was shut "
                                                   "down: VLLMRollout.shutdown)."))
                elif done.exception() is not None:
                    out.set_exception(done.exception())  # type: ignore[arg-type]
                else:
                    out.set_result(_generation(done.result()))
            except concurrent.futures.InvalidStateError:  # the caller cancelled it meanwhile
                pass

        running.add_done_callback(finish)
        out.add_done_callback(lambda f: running.cancel() if f.cancelled() else None)
        return out

    def _token_requests(self, prompts: list[list[int]], params: list[SamplingParams],
                        multi_modal: list[dict[str, Any] | None] | None) -> tuple[list[Any], list[Any]]:
        """vLLM's prompts and sampling parameters of token requests (the seeds of :meth:`generate_tokens`)."""
        from rlforge import multimodal

        top = 2**31 - len(prompts)
        unseeded = any(p.temperature > 0 and p.seed is None for p in params)
        seed = int(torch.randint(0, top, ())) if unseeded else 0
        sampling = [self._sampling_params(replace(p, n=1), None if p.temperature == 0 else
                                          (p.seed % top if p.seed is not None else seed) + i)
                    for i, p in enumerate(params)]
        image_token = (self._placeholders or [None])[0]
        vision = multi_modal or [None] * len(prompts)
        return [self.vllm.TokensPrompt(**multimodal.engine_prompt(ids, inputs, image_token))
                for ids, inputs in zip(prompts, vision)], sampling


def _generation(result: Any) -> Generation:
    """A token request's ``Generation`` from vLLM's final ``RequestOutput`` (its one completion)."""
    c = result.outputs[0]
    return Generation(list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)],
                      "length" if c.finish_reason == "length" else "stop")
