"""The engine handle: requests of concurrent loops batched into waves, a wave that does not wait for a slow tool,
errors reaching every waiting loop; ``tokens_via_generate`` on a batch engine."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlforge import batch as B
from rlforge.agent.engine import EngineHandle, TrajectoryEngine, tokens_via_generate
from rlforge.sampling import Generation, SamplingParams

PARAMS = SamplingParams(n=4, temperature=0.0, max_new_tokens=4)


def echo_backend(waves):
    def backend(prompts, params):
        waves.append(len(prompts))
        return [Generation([p[-1] + 1], [-0.1], "stop") for p in prompts]
    return backend


def test_concurrent_loops_share_waves_and_a_finished_loop_is_not_waited_for():
    waves: list[int] = []
    handle = EngineHandle(echo_backend(waves), PARAMS, max_len=64)

    async def loop(turns):
        engine = TrajectoryEngine(handle)
        try:
            ids = [1]
            for _ in range(turns):
                ids.append((await engine.generate(ids)).ids[0])
                await asyncio.sleep(0)  # a tool that answers at once
            return ids
        finally:
            engine.finished()

    async def main():
        return await asyncio.gather(loop(3), loop(3), loop(1))

    results = asyncio.run(main())
    handle.close()
    assert results == [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2]]
    assert waves == [3, 2, 2] and handle.waves == waves
    assert handle.defaults.n == 1


def test_a_wave_is_in_trajectory_order_and_seeded_waves_get_their_own_seeds():
    """Trajectory 0's tool answers last, yet its request comes first in the wave; a seeded request samples with a
    seed derived from its seed and the wave's number (wave 0: the seed itself), an unseeded one stays unseeded."""
    seen: list[tuple[list[int], list[int | None]]] = []

    def backend(prompts, params):
        seen.append(([p[0] for p in prompts], [p.seed for p in params]))
        return [Generation([7], [-0.1], "stop") for _ in prompts]

    handle = EngineHandle(backend, SamplingParams(temperature=1.0, max_new_tokens=4, seed=5), max_len=64,
                          wave_wait_s=30)

    async def trajectory(row, tool_s):
        engine = TrajectoryEngine(handle, row)
        try:
            await engine.generate([row])
            await asyncio.sleep(tool_s)  # trajectory 0's tool is the slowest
            await engine.generate([row, 7])
        finally:
            engine.finished()

    async def main():
        await asyncio.gather(*(trajectory(row, tool_s) for row, tool_s in ((2, 0.0), (0, 0.05), (1, 0.01))))

    asyncio.run(main())
    handle.close()
    stride, top = 0x9E3779B1, 2**30
    assert seen == [([0, 1, 2], [5, 5, 5]), ([0, 1, 2], [(5 + stride) % top] * 3)]


def test_a_slow_tool_does_not_hold_back_the_others():
    waves: list[int] = []
    released = asyncio.Event()
    loop_ref = {}

    def backend(prompts, params):
        waves.append(len(prompts))
        if len(waves) == 2:  # the fast loops' second turn went without the slow one: let it finish its tool
            loop_ref["loop"].call_soon_threadsafe(released.set)
        return [Generation([7], [-0.1], "stop") for _ in prompts]

    handle = EngineHandle(backend, PARAMS, max_len=64)

    async def trajectory(slow):
        engine = TrajectoryEngine(handle)
        try:
            await engine.generate([1])
            if slow:
                await released.wait()
            await engine.generate([1, 7])
        finally:
            engine.finished()

    async def main():
        loop_ref["loop"] = asyncio.get_running_loop()
        await asyncio.gather(trajectory(False), trajectory(False), trajectory(True))

    asyncio.run(main())
    handle.close()
    assert waves == [3, 2, 1]


def test_an_engine_error_reaches_every_waiting_loop():
    def backend(prompts, params):
        raise RuntimeError("out of memory")

    handle = EngineHandle(backend, PARAMS, max_len=64)

    async def main():
        return await asyncio.gather(handle.generate([1]), handle.generate([2]), return_exceptions=True)

    errors = asyncio.run(main())
    handle.close()
    assert [str(e) for e in errors] == ["out of memory"] * 2


@pytest.mark.parametrize("prompt, overrides, reason", [
    ([], {}, "at least one prompt token"),
    ([1] * 62, {}, "62 prompt tokens \\+ max_new_tokens=4 does not fit the engine's 64 tokens"),
    ([1], {"max_new_tokens": 0}, "max_new_tokens=0"),
])
def test_requests_that_cannot_fit_are_refused(prompt, overrides, reason):
    handle = EngineHandle(echo_backend([]), PARAMS, max_len=64)
    with pytest.raises(ValueError, match=reason):
        asyncio.run(handle.generate(prompt, **overrides))
    handle.close()


class BatchEngine:
    """A batch ``generate`` that answers every prompt with tokens 10, 11, ... and EOS (2) after ``length`` tokens."""

    def __init__(self, length):
        self.length, self.calls = length, []

    def generate(self, batch, params):
        self.calls.append((batch[B.PROMPTS].tolist(), batch[B.PROMPT_MASK].tolist(), params))
        n, width = len(batch), params.max_new_tokens
        ids = torch.arange(10, 10 + width).repeat(n, 1)
        mask = torch.ones(n, width, dtype=torch.long)
        if self.length < width:
            ids[:, self.length] = 2
            mask[:, self.length + 1:] = 0
        out = batch
        out[B.RESPONSES], out[B.RESPONSE_MASK] = ids, mask
        out[B.ROLLOUT_LOG_PROBS] = -torch.ones(n, width) * mask
        return out


def test_tokens_via_generate_groups_by_sampling_and_cuts_each_to_its_limit():
    engine = BatchEngine(length=3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=2)
    out = tokens_via_generate(engine, [[5, 6], [7], [8]], [greedy, SamplingParams(temperature=1.0, max_new_tokens=6),
                                                            SamplingParams(temperature=0.0, max_new_tokens=8)],
                              pad_id=0, stop_ids={2})
    # one call per sampling setting, with the largest max_new_tokens of its group; prompts left-padded
    assert [(c[0], c[1], c[2].max_new_tokens, c[2].temperature) for c in engine.calls] == [
        ([[5, 6], [0, 8]], [[1, 1], [0, 1]], 8, 0.0), ([[7]], [[1]], 6, 1.0)]
    assert out[0] == Generation([10, 11], [-1.0, -1.0], "length")  # cut to its own limit
    assert out[1] == Generation([10, 11, 12, 2], [-1.0] * 4, "stop")
    assert out[2] == Generation([10, 11, 12, 2], [-1.0] * 4, "stop")
