"""How generation and training are scheduled across steps (``trainer.pipeline``; docs/pipelines.md).

- ``sync`` (default): each step generates with the current weights, then trains on that batch (verl's
  synchronous PPO loop). No policy lag.
- ``one_step_off``: the batch of step ``k + 1`` is generated while step ``k`` trains (verl's one-step-off-policy
  recipe). The rollout engine keeps its own copy of the weights; after each update the trainer waits for the
  generation in flight, then syncs the new weights into the engine and the next step launches the following
  generation. Every step but the first trains on samples of the policy one update older than the trainer's.

Policy versions count updates: version ``v`` is the weights after ``v`` training steps. The trainer's weights at
step ``k`` (before its update) are version ``k - 1``; a sample's version is the batch column
``policy_version``; staleness is ``k - 1 - policy_version``: 0 in ``sync``, 1 in ``one_step_off`` from step 2 on
(step 1 trains on version 0, as there is no older policy). The schedule is fixed, never timing-dependent: the
generation of step ``k + 1`` starts after the weights of version ``k - 1`` are synced and its result is awaited
before version ``k`` is synced; its sampling seed is drawn from the trainer's RNG when it is launched.

A pipeline is an object that edits the algorithm's dataflow (:meth:`Pipeline.prepare`) and supplies each step's
prompts; :data:`PIPELINES` maps the config values to the classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.dataflow import DataFlow, OldLogProbStage, RolloutStage, Stage, StepContext
from rlforge.errors import ConfigError
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

SEED_RANGE = 2**30  # generation seeds drawn from the trainer's RNG (the vllm engine adds the row index)


class Pipeline:
    """``sync``: generate and train in order, each step from its own weights (the flow as the algorithm gives it)."""

    name = "sync"
    own_rollout_weights = False  # the engine needs weights of its own (it generates while the actor trains)

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def validate_config(cls, config: Any) -> None:
        """Refuse options this pipeline cannot serve (at compose time, before any model loads)."""

    def prepare(self, flow: DataFlow) -> DataFlow:
        """The flow this pipeline runs (before ``compile``)."""
        return flow

    def prompts(self, draw: Callable[[], B.Batch]) -> B.Batch:
        """The batch the step's first stage receives; ``draw()`` gives the next training prompts."""
        return draw()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue exactly (plain containers and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Restore :meth:`state_dict`; the engine now holds the weights of ``step`` (version ``step``)."""

    def close(self) -> None:
        """Wait for and release what the pipeline runs in the background."""


@dataclass
class InFlight:
    """A generation from ``prompts`` with the weights of ``version``: running (``future``) or done (``batch``)."""

    prompts: B.Batch
    version: int
    future: Future[B.Batch] | None = None
    batch: B.Batch | None = None

    def result(self) -> B.Batch:
        if self.batch is None:
            assert self.future is not None
            self.batch, self.future = self.future.result(), None
        return self.batch


class OneStepOff(Pipeline):
    """``one_step_off``: step ``k + 1``'s batch is generated (in a background thread, with the weights of version
    ``k - 1``) while step ``k`` trains. See the module's docstring for the exact schedule."""

    name = "one_step_off"
    own_rollout_weights = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.engine_version = 0  # the version of the weights the engine holds
        self.pending: InFlight | None = None
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def validate_config(cls, config: Any) -> None:
        key = "trainer.pipeline=one_step_off"
        if config.trainer.controller != "local":
            raise ConfigError(f"{key} runs the generation beside the training in the local controller; "
                              f"trainer.controller={config.trainer.controller} is not supported yet. Use "
                              f"trainer.controller=local, or trainer.pipeline=sync.")
        if config.actor.reuse_rollout_log_probs:
            raise ConfigError(f"{key} generates with weights one update older than the trainer's, so the old "
                              f"log-probs must be recomputed: set actor.reuse_rollout_log_probs=null (or false), "
                              f"not true.")
        if config.model.lora.rank:
            raise ConfigError(f"{key} with LoRA (model.lora.rank={config.model.lora.rank}) is not supported yet: "
                              f"the engine would share the live adapter. Use trainer.pipeline=sync.")

    def prepare(self, flow: DataFlow) -> DataFlow:
        hint = "Use trainer.pipeline=sync."
        rollout = next((s for s in flow.stages if s.name == RolloutStage.name), None)
        if rollout is None:
            raise ConfigError(f"trainer.pipeline=one_step_off needs a rollout stage, and dataflow '{flow.name}' has "
                              f"none ({' -> '.join(flow.names())}): an offline algorithm trains on fixed data. {hint}")
        if type(rollout) is not RolloutStage:
            raise ConfigError(f"trainer.pipeline=one_step_off runs the built-in rollout stage ahead of training; "
                              f"dataflow '{flow.name}' has {type(rollout).__name__} instead (an agent loop, "
                              f"rollout.agent.loop, or a plugin's stage). {hint}")
        others = [s.name for s in flow.stages if s.uses_engine and s is not rollout]
        if others:
            raise ConfigError(f"trainer.pipeline=one_step_off: stage '{others[0]}' of dataflow '{flow.name}' "
                              f"generates during the step (e.g. algorithm.filter_groups=true, or ReMax's greedy "
                              f"baseline), while the engine is busy with the next batch. {hint}")
        if Stage.SYNC_WEIGHTS not in flow:
            raise ConfigError(f"trainer.pipeline=one_step_off needs the sync_weights stage in dataflow "
                              f"'{flow.name}' ({' -> '.join(flow.names())}). {hint}")
        flow.replace(rollout, LaggedRollout(self))
        if Stage.OLD_LOGPROB in flow:
            flow.replace(Stage.OLD_LOGPROB, RecomputedOldLogProb())
        flow.replace(Stage.SYNC_WEIGHTS, SyncAfterGeneration(self))
        return flow

    def prompts(self, draw: Callable[[], B.Batch]) -> B.Batch:
        if self.pending is None:  # the first step (or a resume from a checkpoint without a batch in flight)
            self.pending = InFlight(draw(), self.engine_version)
        return self.pending.prompts

    # --- the generation in flight -----------------------------------------------------------------
    def launch(self, ctx: StepContext) -> None:
        """Start generating the next step's batch from new prompts, with the engine's current weights."""
        prompts = ctx.draw()
        params = dataclasses.replace(ctx.sampling, seed=int(torch.randint(0, SEED_RANGE, ())))
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlforge-rollout")
        future = self._executor.submit(ctx.controller.generate, prompts, params)
        self.pending = InFlight(prompts, self.engine_version, future=future)

    def collect(self, ctx: StepContext) -> B.Batch:
        """The generated batch of this step (waits for it; the first step generates it now)."""
        pending = self.pending
        assert pending is not None, "OneStepOff.prompts() runs before the rollout stage"
        if pending.future is None and pending.batch is None:
            seed = int(torch.randint(0, SEED_RANGE, ()))
            pending.batch = ctx.controller.generate(pending.prompts, dataclasses.replace(ctx.sampling, seed=seed))
        batch = pending.result()
        batch[B.POLICY_VERSION] = torch.full((len(batch),), pending.version, dtype=torch.long)
        staleness = (ctx.step - 1) - batch[B.POLICY_VERSION]
        ctx.log({"async/staleness/mean": float(staleness.double().mean()), "async/staleness/max": float(staleness.max()),
                 "async/policy_version": float(pending.version)})
        self.pending = None
        return batch

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()

    # --- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The batch generated for the next step (waited for), so that a resumed run trains on the same samples."""
        if self.pending is None:
            return {"pending": None}
        p = self.pending
        return {"pending": {"version": p.version, "prompts": _plain(p.prompts),
                            "batch": _plain(p.result())}}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.engine_version = step
        saved = state.get("pending")
        self.pending = None if saved is None else InFlight(
            _batch(saved["prompts"]), saved["version"], batch=_batch(saved["batch"]))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _plain(batch: B.Batch) -> dict[str, Any]:
    return {"tensors": dict(batch.tensors), "lists": dict(batch.lists), "meta": dict(batch.meta)}


def _batch(state: dict[str, Any]) -> B.Batch:
    return B.Batch(state["tensors"], state["lists"], state["meta"])


class LaggedRollout(RolloutStage):
    """The rollout stage of ``one_step_off``: serves the batch generated during the previous step (with the weights
    the trainer had then), and launches the generation of the next step's batch."""

    produces = RolloutStage.produces | {B.POLICY_VERSION}

    def __init__(self, pipeline: OneStepOff) -> None:
        self.pipeline = pipeline

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        ctx.call_hook("rollout_start", batch=batch)
        batch = self.pipeline.collect(ctx)
        if ctx.step < ctx.config.trainer.total_steps:
            self.pipeline.launch(ctx)
        ctx.module.on_rollout_end(batch)
        ctx.call_hook("rollout_end", batch=batch)
        return batch


class RecomputedOldLogProb(OldLogProbStage):
    """The old log-probs from the trainer's current weights, always (the engine's are one update older): PPO's
    ratio and rollout correction (``algorithm.rollout_is``) then see the lag."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch[B.OLD_LOG_PROBS] = ctx.controller.compute_log_probs(batch, "actor")
        return batch


class WaitForRollout(Stage):
    """Waits for the generation in flight (``timing_s/wait_prev_gen``, verl's name)."""

    name = "wait_prev_gen"

    def __init__(self, pipeline: OneStepOff) -> None:
        self.pipeline = pipeline

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        self.pipeline.wait()
        return batch


class SyncAfterGeneration(Stage):
    """The sync_weights stage of ``one_step_off``: waits for the generation in flight, then gives the engine the
    actor's new weights (version ``step``)."""

    name, requires, produces, timing_name = Stage.SYNC_WEIGHTS.name, frozenset(), frozenset(), "update_weights"

    def __init__(self, pipeline: OneStepOff) -> None:
        self.pipeline = pipeline
        self.waiting = WaitForRollout(pipeline)

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        ctx.run(self.waiting, batch)
        batch = Stage.SYNC_WEIGHTS.run(ctx, batch)
        self.pipeline.engine_version = ctx.step
        return batch


PIPELINES: dict[str, type[Pipeline]] = {"sync": Pipeline, "one_step_off": OneStepOff}
PIPELINE_NAMES = tuple(PIPELINES)


def for_config(config: Any) -> Pipeline:
    """The pipeline ``trainer.pipeline`` names."""
    return PIPELINES[config.trainer.pipeline](config)
