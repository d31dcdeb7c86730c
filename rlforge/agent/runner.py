"""Runs an agent loop over a rollout batch: ``rollout.n`` trajectories per prompt, all concurrently (asyncio, in the
driver), their generations batched through one :class:`EngineHandle`."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from rlforge import batch as B
from rlforge.agent.batching import agent_metrics, to_batch
from rlforge.agent.config import VERL_AGENT, VERL_LOOPS
from rlforge.agent.context import AgentContext
from rlforge.agent.engine import Backend, EngineHandle, Submit, TrajectoryEngine
from rlforge.agent.loop import AgentLoop
from rlforge.agent.record import AGENT_RECORD, agent_record
from rlforge.agent.types import AgentLoopError, Sample, Trajectory
from rlforge.multimodal import IMAGES
from rlforge.sampling import SamplingParams

T = TypeVar("T")


class AgentRunner:
    """The run's agent loop (``name`` is its registered name, used in errors) and what it shares."""

    def __init__(self, loop: AgentLoop, name: str, context: AgentContext) -> None:
        self.loop, self.name, self.context = loop, name, context

    def rollout(self, batch: B.Batch, sampling: SamplingParams, backend: Backend, continuous: bool = False,
                submit: Submit | None = None) -> tuple[B.Batch, dict[str, float]]:
        """``sampling.n`` trajectories per prompt row of ``batch`` (repeated in place, as engines do); returns the
        training batch and the agent metrics. ``continuous``: each request goes to ``backend`` at once (it takes
        overlapping calls: the ``continuous_batching`` capability), else in waves; ``submit``: there, the engine's
        non-blocking request instead (``EngineHandle``; the engine held by the caller)."""
        rows = batch.repeat_interleave(sampling.n)
        cfg = self.context.config
        handle = EngineHandle(backend, replace(sampling, min_new_tokens=0),
                              cfg.data.max_prompt_length + cfg.rollout.max_new_tokens, cfg.rollout.agent.wave_wait_s,
                              continuous, submit)
        try:
            done = run_async(self._run_all(samples(rows), handle))
        finally:
            handle.close()
        trajectories = [t for t, _ in done]
        answers = [t.answer if t.answer is not None else self.default_answer(t) for t in trajectories]
        out = to_batch(rows, trajectories, answers, self.context.tokenizer.pad_token_id)
        if cfg.rollout.agent.record_trajectories:
            out[AGENT_RECORD] = [agent_record(t, self.context) for t in trajectories]
        return out, agent_metrics(trajectories, [s for _, s in done], handle.waves)

    def default_answer(self, traj: Trajectory) -> str:
        """What the reward function scores of a trajectory without an answer (``rollout.agent.answer_from``)."""
        if self.context.config.rollout.agent.answer_from == "response":
            return str(self.context.tokenizer.decode(traj.response_ids, skip_special_tokens=True))
        return self.last_turn_text(traj)

    def last_turn_text(self, traj: Trajectory) -> str:
        spans = traj.turn_spans()
        return self.context.chat.decode(traj.response_ids[spans[-1][0]:spans[-1][1]]) if spans else ""

    async def _run_all(self, items: list[Sample], handle: EngineHandle) -> list[tuple[Trajectory, float]]:
        # a rollout scope is the AgentLoop base class's (a loop that only implements the Protocol has none)
        async with self.loop.rollout_scope() if isinstance(self.loop, AgentLoop) else contextlib.nullcontext():
            tasks = [asyncio.ensure_future(self._run_one(s, handle)) for s in items]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:  # the first failure stops the others
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _run_one(self, sample: Sample, handle: EngineHandle) -> tuple[Trajectory, float]:
        engine = TrajectoryEngine(handle, sample.index, self.context.row_images(sample))
        try:
            check_agent_name(sample.agent_name, self.name)
            traj = await self.loop.run(sample, engine)
            if not isinstance(traj, Trajectory):
                raise TypeError(f"run() returned {type(traj).__name__}, not a rlforge.agent.Trajectory")
            traj.check(int(self.context.config.rollout.max_new_tokens))
        except Exception as exc:
            turn = f"at turn {engine.calls}" if engine.calls else "before its first turn"
            raise AgentLoopError(
                f"Agent loop '{self.name}' (rollout.agent.loop) failed on sample {sample.index} (data_source "
                f"'{sample.data_source}', uid {sample.uid!r}) {turn}: {type(exc).__name__}: {exc}") from exc
        finally:
            engine.finished()
        return traj, engine.seconds

    def close(self) -> None:
        self.loop.close()
        self.context.tools.close()


def check_agent_name(asked: str | None, loop: str) -> None:
    """A row that names verl's agent loop (``agent_name``) runs under the loop it names: the rows the loader could
    not check (streamed ones) are checked here; ``verl_agent`` picks each row's loop itself."""
    if asked is None or loop == VERL_AGENT or VERL_LOOPS.get(asked) == loop:
        return
    raise ValueError(f"the row's agent_name '{asked}' asks for verl's agent loop of that name, but this run's loop is "
                     f"rollout.agent.loop={loop} (rlforge's own loops run one per run; rollout.agent.loop={VERL_AGENT} "
                     f"runs verl's loops row by row)")


def samples(rows: B.Batch) -> list[Sample]:
    """One :class:`Sample` per row (the loader's columns; messages copied, so loops may extend them)."""
    n = len(rows)
    lists = {col: rows.lists.get(col, [None] * n) for col in (B.RAW_PROMPT, B.DATA_SOURCE, B.GROUND_TRUTH,
                                                               B.EXTRA_INFO, B.UID, B.AGENT_NAME,
                                                               B.MULTI_MODAL_INPUTS)}
    vision = [None if v is None else {**v, **({IMAGES: list(v[IMAGES])} if IMAGES in v else {})}  # loops' own copies
              for v in lists[B.MULTI_MODAL_INPUTS]]
    return [Sample(messages=copy.deepcopy(lists[B.RAW_PROMPT][i] or []),
                   prompt_ids=rows[B.PROMPTS][i][rows[B.PROMPT_MASK][i].bool()].tolist(),
                   data_source=lists[B.DATA_SOURCE][i] or "", ground_truth=lists[B.GROUND_TRUTH][i],
                   extra_info=lists[B.EXTRA_INFO][i], uid=lists[B.UID][i], index=i,
                   agent_name=lists[B.AGENT_NAME][i], multi_modal=vision[i]) for i in range(n)]


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, also when this thread already runs an event loop
    (a notebook): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, name="rlforge-agents")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
