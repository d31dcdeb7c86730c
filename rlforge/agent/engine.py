"""The async engine handle of agent loops: token-in/token-out requests from every live trajectory, batched.

Two ways, chosen by the caller (``continuous``: the engine's ``continuous_batching`` capability, which a controller
passes on as ``Controller.continuous_batching``):

*Continuous batching* (the ``vllm`` engine, which runs on vLLM's async engine): every request goes to the backend on
its own, at once, from a thread of its own; the engine admits it into its running batch at its next step, so a
trajectory's next turn starts as soon as its tool returns and no one waits for the slowest generation or tool.
Sampling is reproducible whatever the timing: a sampled request is seeded from its trajectory (``order``, the
sample's row) and its turn in that trajectory (the seed of ``SamplingParams.seed``, or one drawn from the torch RNG
per handle when unset), never from what else runs beside it.

*Waves* (the ``hf`` engine, whose batch decoding takes a fixed set of rows): a request waits until the engine is
free; then the pending requests go to the engine in one ``generate_tokens`` call (a *wave*), which runs in a worker
thread while the event loop keeps running tools and other loops. A wave
starts once every live trajectory waits for the engine, or ``wave_wait_s`` (``rollout.agent.wave_wait_s``) after its
first request (so a slow tool does not hold the others back). Which requests share a wave thus depends on how long
tools take: with sampling, a run is reproducible when every tool answers within ``wave_wait_s`` (greedy decoding
always is). The order of the requests in a wave does not depend on timing: they are sorted by trajectory (the
sample's row), and a seeded request (``SamplingParams.seed``, the off-policy pipelines) samples with a seed derived
from it and the wave's number.

A request samples as the rollout does: the trainer scores every token at the rollout's sampling, so a request whose
temperature, top_p or top_k differs from the handle's defaults is refused (``ValueError``) rather than trained
off-policy. ``max_new_tokens`` and ``seed`` may differ.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlforge.agent.workers import DaemonThreads
from rlforge.sampling import SEED_RANGE, Generation, SamplingParams, derived_seed

if TYPE_CHECKING:
    from rlforge.batch import Batch

WAVE_WAIT_S = 0.05  # default longest wait for trajectories still in a tool call before a wave starts without them
CONTINUOUS_THREADS = 256  # requests a continuous handle has at the backend at once (one blocked thread each); more wait
Backend = Callable[..., list[Generation]]  # generate_tokens(prompts, params[, multi_modal=]) -> one per prompt
# submit_tokens(prompt_ids, params, multi_modal) -> a future of its Generation (an engine in this process that takes
# requests without a blocking call: the vllm engine's VLLMRollout.submit_tokens)
Submit = Callable[[list[int], SamplingParams, "VisionInputs | None"], "concurrent.futures.Future[Generation]"]
VisionInputs = dict[str, Any]  # a row's vision inputs (rlforge.multimodal: pixel_values, image_grid_thw, images)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")  # what changes the distribution a token is sampled from
OFF_POLICY = ("the rollout samples with {key}={value:g} (rollout.{key}; rollout.val_* in validation) and the trainer "
              "scores every token at that sampling, so tokens sampled otherwise would be trained off-policy")


def request_seed(seed: int, order: int, turn: int) -> int:
    """The seed of turn ``turn`` of trajectory ``order`` under continuous batching: a stream of its own per pair
    (Cantor's pairing numbers the pairs, ``derived_seed`` spreads them)."""
    return derived_seed(seed, (order + turn) * (order + turn + 1) // 2 + turn)  # type: ignore[return-value]


def off_policy_fields(asked: Mapping[str, Any], rollout: SamplingParams) -> list[tuple[str, Any]]:
    """``(field, the rollout's value)`` for each sampling field in ``asked`` whose value differs from the rollout's."""
    return [(k, getattr(rollout, k)) for k in SAMPLING_FIELDS if k in asked and asked[k] != getattr(rollout, k)]


@dataclass(frozen=True)
class RowImages:
    """What a trajectory with images sends with each request: the vision inputs of its images so far (``inputs``:
    the row's, then those its inserted turns added), and the image-pad token (``token_id``) of which each request's
    prompt must hold ``tokens``."""

    inputs: VisionInputs | None  # None: no image yet (a text row of a vision-language model)
    token_id: int
    tokens: int

    def extended(self, inputs: VisionInputs, tokens: int) -> RowImages:
        """These images followed by more (``inputs``, taking ``tokens`` image-pad tokens)."""
        from rlforge.multimodal import append_inputs

        return RowImages(append_inputs(self.inputs, inputs), self.token_id, self.tokens + tokens)

    def check(self, prompt_ids: list[int]) -> None:
        found = prompt_ids.count(self.token_id)
        if found != self.tokens:
            raise ValueError(f"the request's prompt holds {found} image tokens, but its images take {self.tokens}: "
                             f"each image token stands for a part of an image, so a prompt with images is rendered by "
                             f"the model's processor (Conversation does; AgentContext.chat.prompt_ids(messages, tools, "
                             f"images)) and keeps them in every turn, and inserted text must not spell the image token "
                             f"(Conversation.add_messages escapes it)")


def call_backend(backend: Backend, prompts: list[list[int]], params: list[SamplingParams],
                 multi_modal: list[VisionInputs | None] | None = None) -> list[Generation]:
    """``backend(prompts, params)``; ``multi_modal=`` (each prompt's vision inputs or None) only when a prompt has
    images, so that engines which take no images keep their two-argument ``generate_tokens``."""
    if multi_modal is not None and any(m is not None for m in multi_modal):
        return backend(prompts, params, multi_modal=multi_modal)
    return backend(prompts, params)


class EngineHandle:
    """Sends the ``generate`` requests of concurrent agent loops to ``backend``: each on its own at once (continuous
    batching) or batched into waves (see the module docstring).

    :param backend: ``generate_tokens(prompts, params[, multi_modal=]) -> generations`` of the rollout engine (or
        controller); ``multi_modal`` (each prompt's vision inputs, or None) is given when a request has images.
    :param defaults: the sampling parameters of a request that does not override them (``n`` is ignored).
    :param max_len: the longest sequence (prompt + new tokens) a request may ask for.
    :param wave_wait_s: the longest wait for the trajectories not yet waiting before a wave starts without them.
    :param continuous: continuous batching (True: the backend takes overlapping calls, ``RolloutCapabilities``'s
        ``continuous_batching``) or waves (False).
    :param submit: under continuous batching, the engine's non-blocking request (:data:`Submit`), awaited on the
        rollout's event loop instead of a thread per blocking ``backend`` call (the same tokens; 1.14-1.15x the
        trajectories per second on the CPU benchmark, docs/performance.md). The engine must be held meanwhile.
    """

    def __init__(self, backend: Backend, defaults: SamplingParams, max_len: int,
                 wave_wait_s: float = WAVE_WAIT_S, continuous: bool = False, submit: Submit | None = None) -> None:
        self.backend = backend
        self.continuous = continuous
        self.submit = submit  # used by continuous requests only (_submit)
        self.wave_wait_s = wave_wait_s
        self.defaults = replace(defaults, n=1)
        self.max_len = max_len
        self.waves: list[int] = []  # requests per backend call, in order (1 each under continuous batching)
        self.live = 0  # trajectories running (TrajectoryEngine.track); a wave waits a little for all of them
        self._arrived = asyncio.Event()
        self._pending: list[tuple[tuple[int, int], list[int], SamplingParams, VisionInputs | None,
                                  asyncio.Future[Generation]]] = []
        self._arrivals = 0  # requests so far: the tie-break of a wave's order
        self._task: asyncio.Task[None] | None = None
        self._turns: dict[int, int] = {}  # continuous: requests so far per trajectory (the turn in its seed)
        self._seed: int | None = None  # continuous: the base seed of unseeded sampled requests, drawn once
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rlforge-engine")  # waves: one call at a time
        self._threads = DaemonThreads(CONTINUOUS_THREADS, "rlforge-engine")  # continuous: a thread per request

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                       **overrides: Any) -> Generation:
        """One completion of ``prompt_ids``; ``overrides`` replace fields of ``params`` (default: the rollout's
        sampling parameters), e.g. ``max_new_tokens=64, temperature=0``."""
        return await self.request(0, prompt_ids, params, overrides)

    async def request(self, order: int, prompt_ids: Sequence[int], params: SamplingParams | None,
                      overrides: dict[str, Any], multi_modal: VisionInputs | None = None) -> Generation:
        """:meth:`generate` for trajectory ``order`` (the sample's row): placed in its wave by ``order``, then by
        arrival; under continuous batching sent at once, seeded by ``order`` and its turn. ``multi_modal``: the
        vision inputs of the images in ``prompt_ids`` (a row with images)."""
        p = replace(params or self.defaults, n=1, **overrides)
        off = off_policy_fields({k: getattr(p, k) for k in SAMPLING_FIELDS}, self.defaults)
        if off:
            key, value = off[0]
            raise ValueError(f"generate() asked for {key}={getattr(p, key)!r}, but "
                             f"{OFF_POLICY.format(key=key, value=value)}. Leave {key} out of the request.")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("generate() needs at least one prompt token")
        if p.max_new_tokens <= 0 or len(ids) + p.max_new_tokens > self.max_len:
            raise ValueError(f"a request of {len(ids)} prompt tokens + max_new_tokens={p.max_new_tokens} does not fit "
                             f"the engine's {self.max_len} tokens (data.max_prompt_length + rollout.max_new_tokens)")
        if self.continuous:
            return await self._submit(order, ids, p, multi_modal)
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append(((order, self._arrivals), ids, p, multi_modal, future))
        self._arrivals += 1
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._dispatch())
        return await future

    async def _submit(self, order: int, ids: list[int], p: SamplingParams, multi_modal: VisionInputs | None
                      ) -> Generation:
        """One request at the backend now (continuous batching), in a daemon thread of the handle's."""
        turn = self._turns.get(order, 0)
        self._turns[order] = turn + 1
        if p.temperature > 0:
            p = replace(p, seed=request_seed(p.seed if p.seed is not None else self._base_seed(), order, turn))
        self.waves.append(1)
        if self.submit is not None:
            return await asyncio.wrap_future(self.submit(ids, p, multi_modal))
        outs = await asyncio.wrap_future(self._threads.submit(call_backend, self.backend, [ids], [p], [multi_modal]))
        if len(outs) != 1:
            raise RuntimeError(f"generate_tokens returned {len(outs)} generations for 1 prompt")
        return outs[0]

    def _base_seed(self) -> int:
        """The seed of this handle's unseeded sampled requests: drawn from the torch RNG at the first (a seeded run
        draws the same one whatever the timing)."""
        if self._seed is None:
            import torch

            self._seed = int(torch.randint(0, SEED_RANGE, ()))
        return self._seed

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._gather()
            wave, self._pending = sorted(self._pending, key=lambda w: w[0]), []
            params = [replace(w[2], seed=derived_seed(w[2].seed, len(self.waves))) for w in wave]  # a stream per wave
            self.waves.append(len(wave))
            try:
                outs = await loop.run_in_executor(self._executor, call_backend, self.backend, [w[1] for w in wave],
                                                  params, [w[3] for w in wave])
                if len(outs) != len(wave):
                    raise RuntimeError(f"generate_tokens returned {len(outs)} generations for {len(wave)} prompts")
            except Exception as exc:  # every waiting loop fails with the engine's error
                for *_, future in wave:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (*_, future), out in zip(wave, outs):
                if not future.done():  # a cancelled loop no longer waits
                    future.set_result(out)

    async def _gather(self) -> None:
        """Wait until every live trajectory has a request pending, at most ``wave_wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wave_wait_s
        await self._settle()
        while len(self._pending) < self.live and loop.time() < deadline:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            await self._settle()

    def finished(self) -> None:
        """A trajectory ended: the wave being gathered no longer waits for it."""
        self.live -= 1
        self._arrived.set()

    async def _settle(self) -> None:
        """Let every loop that can run reach its next request (or a tool call) before a wave is formed."""
        count = -1
        while count != len(self._pending):
            count = len(self._pending)
            for _ in range(3):
                await asyncio.sleep(0)

    def close(self) -> None:
        """Release the threads (a request still at the backend, of a cancelled loop, runs to its end there)."""
        self._executor.shutdown(wait=False)
        self._threads.close()


class TrajectoryEngine:
    """One trajectory's view of the :class:`EngineHandle` (what ``AgentLoop.run`` receives): counts its turns
    and the seconds it waited for generations."""

    def __init__(self, handle: EngineHandle, order: int = 0, images: RowImages | None = None) -> None:
        self.handle = handle
        self.order = order  # the sample's row: its requests' place in a wave
        self.images = images  # a row with images: every request carries them
        self.calls = 0
        self.seconds = 0.0
        handle.live += 1

    def finished(self) -> None:
        self.handle.finished()

    @property
    def defaults(self) -> SamplingParams:
        return self.handle.defaults

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                       images: RowImages | None = None, **overrides: Any) -> Generation:
        """One completion of ``prompt_ids`` (``overrides``: sampling fields such as ``max_new_tokens``); ``images``:
        those of the prompt when its inserted turns added some (default: the row's)."""
        self.calls += 1
        images = images or self.images
        if images is not None:
            images.check(list(prompt_ids))
        start = time.perf_counter()
        try:
            return await self.handle.request(self.order, prompt_ids, params, overrides,
                                             None if images is None else images.inputs)
        finally:
            self.seconds += time.perf_counter() - start


@contextlib.contextmanager
def engines_held(engines: Any) -> Iterator[None]:
    """Keep the rollout engines awake across the calls of one agent rollout: ``engines.hold_engine`` (a run's workers
    or an engine outside a run), where there is one. A sleeping engine would offload its weights and drop its KV and
    prefix cache between the rollout's waves or turns."""
    hold = getattr(engines, "hold_engine", None)
    if hold is None:
        yield
        return
    hold(True)
    try:
        yield
    finally:
        hold(False)


def token_generator(engine: Any, tokenizer: Any, token_io: bool) -> Backend:
    """``engine.generate_tokens`` for an engine that declares it (``RolloutCapabilities.token_io``), else
    :func:`tokens_via_generate` on its ``generate``."""
    if token_io:
        return engine.generate_tokens  # type: ignore[no-any-return]
    return functools.partial(tokens_via_generate, engine, pad_id=tokenizer.pad_token_id,
                             stop_ids={tokenizer.eos_token_id})


def tokens_via_generate(engine: Any, prompts: list[list[int]], params: list[SamplingParams], pad_id: int,
                        stop_ids: set[int], multi_modal: list[VisionInputs | None] | None = None) -> list[Generation]:
    """``generate_tokens`` on top of a batch ``engine.generate``: requests that differ only in ``max_new_tokens``
    share one call (with the largest; each result is cut to its own limit, which a sampled sequence allows).
    ``multi_modal``: each prompt's vision inputs (None for a text prompt), the batch's ``B.MULTI_MODAL_INPUTS``."""
    groups: dict[SamplingParams, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(replace(p, n=1, max_new_tokens=1), []).append(i)
    out: dict[int, Generation] = {}
    for key, rows in groups.items():
        longest = max(params[i].max_new_tokens for i in rows)
        vision = [multi_modal[i] for i in rows] if multi_modal is not None else None
        batch = engine.generate(prompt_batch([prompts[i] for i in rows], pad_id, vision),
                                replace(key, max_new_tokens=longest))
        for j, i in enumerate(rows):
            out[i] = _row_generation(batch, j, params[i].max_new_tokens, stop_ids)
    return [out[i] for i in range(len(prompts))]


def prompt_batch(prompts: list[list[int]], pad_id: int, multi_modal: list[VisionInputs | None] | None = None) -> Batch:
    """The loader's columns ``prompts``/``prompt_mask`` (left-padded) for these prompts, and their vision inputs
    (``B.MULTI_MODAL_INPUTS``) when one has images."""
    from rlforge import batch as B
    from rlforge.agent.batching import pad_rows

    lists = {B.MULTI_MODAL_INPUTS: list(multi_modal)} if multi_modal and any(m is not None for m in multi_modal) else {}
    return B.Batch({B.PROMPTS: pad_rows(prompts, pad_id, left=True),
                    B.PROMPT_MASK: pad_rows([[1] * len(p) for p in prompts], 0, left=True)}, lists=lists)


def _row_generation(batch: Batch, row: int, limit: int, stop_ids: set[int]) -> Generation:
    from rlforge import batch as B

    keep = batch[B.RESPONSE_MASK][row].bool()
    ids = batch[B.RESPONSES][row][keep].tolist()
    log_probs = batch[B.ROLLOUT_LOG_PROBS][row][keep].tolist()
    cut = len(ids) > limit
    ids, log_probs = ids[:limit], log_probs[:limit]
    stopped = not cut and bool(ids) and ids[-1] in stop_ids
    return Generation(ids, log_probs, "stop" if stopped else "length")
