"""Pipelines that generate ahead of the trainer: ``async`` (bounded staleness) and ``one_step_off`` (its case 1).

A rollout thread generates the batches of the next ``S = trainer.max_staleness`` steps while the trainer trains
(verl's one-step-off and fully-async recipes, NeMo-RL's and AReaL's staleness bound). The rollout engine keeps
its own weights. Policy versions count updates: version ``v`` is the weights after ``v`` training steps, so at
step ``k`` the trainer holds version ``k - 1`` until its update.

The schedule is fixed, never timing-dependent. In its rollout stage, step ``k``

1. takes the batch of step ``k`` (waiting for it if the rollout thread is still on it; the first step, which has
   none ahead, generates it now with version 0);
2. launches the batches up to step ``min(k + S, trainer.total_steps)``, each from new prompts, with a sampling
   seed drawn from the trainer's RNG now, by the trainer's current weights (version ``k - 1``). When the engine
   holds an older version, the weights go with the first of them: synced at once if no generation is in flight
   (always with ``S = 1``), else as a copy that the rollout thread loads between the generation before it and it.

So step ``k`` trains on version ``max(0, k - 1 - S)``: a staleness of ``min(k - 1, S)`` updates, never more (a
sample over the bound cannot occur, so there is nothing to drop or down-weight). The generations run one after
the other in the rollout thread, each sampling from its own seeded generator (``SamplingParams.seed``), never the
global RNG the training uses: a run is reproducible bit for bit. A checkpoint holds the batches generated ahead
(waited for), so a resumed run trains on the same samples, none lost or repeated.

What generates is :meth:`RolloutStage.rollout` of the flow's rollout stage (``source``): the built-in stage's batch
``generate``, or the agent loops' stage (loops, tools and engine waves, all in the rollout thread); the rollout's
metrics travel with its batch.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from rlforge import batch as B
from rlforge.dataflow import DataFlow, RolloutStage, Stage, StepContext
from rlforge.errors import ConfigError
from rlforge.lazy import lazy_import
from rlforge.pipeline.base import Pipeline
from rlforge.sampling import SEED_RANGE
from rlforge.weight_sync import add_sync_metrics

if TYPE_CHECKING:
    import torch

    from rlforge.protocols import WeightSnapshots
    from rlforge.sampling import SamplingParams
else:
    torch = lazy_import("torch")

DEFAULT_STALENESS = 2  # trainer.max_staleness of trainer.pipeline=async when unset


@dataclass
class InFlight:
    """The batch of one step: its prompts and, once launched, the version of the weights that generate it, running
    (``future``) or done (``batch``, with the rollout's ``metrics``, e.g. the agent loops')."""

    prompts: B.Batch
    version: int | None = None  # None: not launched (the step generates it itself, with the trainer's weights)
    future: Future[tuple[B.Batch, dict[str, float]]] | None = None
    batch: B.Batch | None = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    def done(self) -> bool:
        return self.batch is not None or (self.future is not None and self.future.done())

    def result(self) -> B.Batch:
        if self.batch is None:
            assert self.future is not None, "a batch that was never launched has no result"
            (self.batch, self.metrics), self.future = self.future.result(), None
        return self.batch


class OffPolicy(Pipeline):
    """``async``: the batches of the next ``trainer.max_staleness`` steps are generated in a background thread while
    the trainer trains; step ``k`` trains on the policy of version ``max(0, k - 1 - max_staleness)``. See the
    module's docstring for the exact schedule."""

    name = "async"
    own_rollout_weights = True
    reads = ("max_staleness",)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.max_staleness = self.staleness(config)
        self.engine_version = 0  # the version the engine holds once the generations launched so far have run
        self.buffer: deque[InFlight] = deque()  # the batches of this step and the next ones, in order
        self._handoff: Any = None  # a snapshot of the weights (WeightSnapshots), DeliverWeights -> launch
        self._executor: ThreadPoolExecutor | None = None
        self.source: RolloutStage | None = None  # the rollout stage whose generation runs ahead (prepare)
        self.waiting = WaitForRollout(self)
        self.delivering = DeliverWeights(self)

    @classmethod
    def staleness(cls, config: Any) -> int:
        """The bound ``S``: how many steps ahead batches are generated, the most updates a sample lags."""
        value = config.trainer.max_staleness
        return DEFAULT_STALENESS if value is None else int(value)

    @classmethod
    def validate_config(cls, config: Any) -> None:
        super().validate_config(config)
        key = f"trainer.pipeline={cls.name}"  # the controller checks that it can generate beside the training
        if config.actor.reuse_rollout_log_probs:
            raise ConfigError(f"{key} generates with weights older than the trainer's, so the old log-probs must "
                              f"be recomputed: set actor.reuse_rollout_log_probs=null (or false), not true.")
        if config.model.lora.rank:
            raise ConfigError(f"{key} with LoRA (model.lora.rank={config.model.lora.rank}) is not supported yet: "
                              f"the engine would share the live adapter. Use trainer.pipeline=sync.")

    def prepare(self, flow: DataFlow) -> DataFlow:
        key, hint = f"trainer.pipeline={self.name}", "Use trainer.pipeline=sync."
        rollout = next((s for s in flow.stages if s.name == RolloutStage.name), None)
        if rollout is None:
            raise ConfigError(f"{key} needs a rollout stage, and dataflow '{flow.name}' has none "
                              f"({' -> '.join(flow.names())}): an offline algorithm trains on fixed data. {hint}")
        if not isinstance(rollout, RolloutStage) or type(rollout).run is not RolloutStage.run:
            raise ConfigError(f"{key} runs the generation of the rollout stage (RolloutStage.rollout) ahead of "
                              f"training; dataflow '{flow.name}' has {type(rollout).__name__} instead, which "
                              f"{'overrides run()' if isinstance(rollout, RolloutStage) else 'is no RolloutStage'}"
                              f" (a plugin's stage). Subclass RolloutStage and override rollout(), or use "
                              f"trainer.pipeline=sync.")
        self.off_policy_stages(flow, rollout, "while the engine is busy with the next batches")
        if Stage.SYNC_WEIGHTS not in flow:
            raise ConfigError(f"{key} needs the sync_weights stage in dataflow '{flow.name}' "
                              f"({' -> '.join(flow.names())}). {hint}")
        self.source = rollout
        flow.replace(rollout, LaggedRollout(self))
        flow.remove(Stage.SYNC_WEIGHTS)  # the rollout stage gives the engine its weights (DeliverWeights)
        return flow

    def prompts(self, draw: Callable[[], B.Batch]) -> B.Batch:
        if not self.buffer:  # the first step, or a resume (or a longer trainer.total_steps) with nothing ahead
            self.buffer.append(InFlight(draw()))
        return self.buffer[0].prompts

    # --- the rollout stage --------------------------------------------------------------------------
    def collect(self, ctx: StepContext, batch: B.Batch) -> tuple[B.Batch, dict[str, float]]:
        """The generated batch of this step and its rollout's metrics (waited for; one that was not launched is
        generated now)."""
        head = self.buffer[0]
        ready = sum(e.done() for e in self.buffer)  # before a batch that was not launched is generated here
        if head.version is None:
            head.version = ctx.step - 1
            self._weights(ctx, batch, head.version)  # the engine is idle: synced now if it is behind
            head.batch, head.metrics = self._rollout(ctx, head.prompts, self._params(ctx))
        ctx.run(self.waiting, batch)
        generated = self.buffer.popleft().result()
        generated[B.POLICY_VERSION] = torch.full((len(generated),), head.version, dtype=torch.long)
        staleness = (ctx.step - 1) - generated[B.POLICY_VERSION]
        add_sync_metrics(ctx.metrics, head.metrics)  # the snapshot loaded for it, beside a sync of this step's
        return generated, {**head.metrics, "async/staleness/mean": float(staleness.double().mean()),
                           "async/staleness/max": float(staleness.max()), "async/policy_version": float(head.version),
                           "async/buffer/ready": float(ready)}

    def fill(self, ctx: StepContext, batch: B.Batch) -> None:
        """Launch the batches of the steps up to ``step + max_staleness`` (and ``trainer.total_steps``)."""
        while (len(self.buffer) < self.max_staleness
               and ctx.step + len(self.buffer) < ctx.config.trainer.total_steps):
            prompts = ctx.draw()
            snapshot = self._weights(ctx, batch, ctx.step - 1)
            params = self._params(ctx)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlforge-rollout")
            future = self._executor.submit(_generate, self._rollout, ctx, prompts, params, snapshot)
            self.buffer.append(InFlight(prompts, ctx.step - 1, future=future))
        ctx.log({"async/buffer/size": float(len(self.buffer))})

    def idle(self) -> bool:
        """No launched generation is left running (a fixed point of the schedule, not a timing check: a batch counts
        as running until the trainer has waited for it)."""
        return all(e.future is None for e in self.buffer)

    def _weights(self, ctx: StepContext, batch: B.Batch, version: int) -> list[Any]:
        """Before a generation by ``version``: sync the engine now, or return the snapshot the generation loads first,
        in a list it empties (empty when the engine holds that version already, or was synced now)."""
        if version <= self.engine_version:
            return []
        self.engine_version = version
        ctx.run(self.delivering, batch)
        handoff, self._handoff = self._handoff, None
        return [] if handoff is None else [handoff]

    def _rollout(self, run: StepContext, prompts: B.Batch, params: SamplingParams) -> tuple[B.Batch, dict[str, float]]:
        assert self.source is not None, "prepare() names the rollout stage"
        return self.source.rollout(run, prompts, params)

    @staticmethod
    def _params(ctx: StepContext) -> SamplingParams:
        return dataclasses.replace(ctx.sampling, seed=int(torch.randint(0, SEED_RANGE, ())))

    def settle(self, controller: Any, step: int) -> None:
        for entry in self.buffer:
            if entry.version is not None:
                entry.result()
        if self.engine_version < step:
            controller.sync_weights()
            self.engine_version = step

    # --- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The batches generated for the next steps (waited for), so that a resumed run trains on the same
        samples."""
        return {"buffer": [{"version": e.version, "prompts": batch_state(e.prompts),
                            "batch": None if e.version is None else batch_state(e.result()), "metrics": dict(e.metrics)}
                           for e in self.buffer]}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.drop_unread(state, ("buffer", "pending"))
        self.engine_version = step
        saved = state.get("buffer")
        if saved is None:  # a one_step_off checkpoint from before async: its one batch ahead, or none
            saved = [state["pending"]] if state.get("pending") else []
        self.buffer = deque(InFlight(batch_from_state(s["prompts"]), s["version"],
                                     batch=None if s["batch"] is None else batch_from_state(s["batch"]),
                                     metrics=dict(s.get("metrics") or {})) for s in saved)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


class OneStepOff(OffPolicy):
    """``one_step_off``: ``async`` with ``max_staleness`` 1 (verl's one-step-off-policy recipe): step ``k + 1``'s batch
    is generated, by the weights of version ``k - 1``, while step ``k`` trains."""

    name = "one_step_off"

    @classmethod
    def staleness(cls, config: Any) -> int:
        return 1

    @classmethod
    def validate_config(cls, config: Any) -> None:
        super().validate_config(config)
        if config.trainer.max_staleness not in (None, 1):
            raise ConfigError(f"trainer.pipeline=one_step_off lags exactly one update; for trainer.max_staleness="
                              f"{config.trainer.max_staleness} use trainer.pipeline=async.")


def _generate(rollout: Callable[[StepContext, B.Batch, SamplingParams], tuple[B.Batch, dict[str, float]]],
              run: StepContext, prompts: B.Batch, params: SamplingParams,
              snapshot: list[Any]) -> tuple[B.Batch, dict[str, float]]:
    """The rollout thread's work: load the snapshot of the weights handed over (if any; the last reference to it is
    dropped then) into the engine of ``run.controller`` (a ``Controller`` that is also ``WeightSnapshots``), then
    generate; the batch's metrics get that load's ``weight_sync/*``."""
    if not snapshot:
        return rollout(run, prompts, params)
    stats = cast("WeightSnapshots", run.controller).load_weights(snapshot.pop())
    batch, metrics = rollout(run, prompts, params)
    return batch, {**metrics, **stats.metrics()}


def batch_state(batch: B.Batch) -> dict[str, Any]:
    return {"tensors": dict(batch.tensors), "lists": dict(batch.lists), "meta": dict(batch.meta)}


def batch_from_state(state: dict[str, Any]) -> B.Batch:
    return B.Batch(state["tensors"], state["lists"], state["meta"])


class LaggedRollout(RolloutStage):
    """The rollout stage of the off-policy pipelines: serves the batch generated ahead for this step and launches the
    batches of the next steps, each by :meth:`RolloutStage.rollout` of the stage it replaced (``source``: the
    built-in one, or the agent loops')."""

    def __init__(self, pipeline: OffPolicy) -> None:
        assert pipeline.source is not None, "OffPolicy.prepare names the rollout stage first"
        self.pipeline = pipeline
        self.requires, self.produces = pipeline.source.requires, pipeline.source.produces | {B.POLICY_VERSION}

    @property
    def source(self) -> RolloutStage:
        return self.pipeline.source  # named by prepare before this stage is made

    def generate(self, ctx: StepContext, batch: B.Batch) -> tuple[B.Batch, dict[str, float]]:
        generated = self.pipeline.collect(ctx, batch)
        self.pipeline.fill(ctx, batch)
        return generated

    def rollout(self, run: Any, batch: B.Batch, params: SamplingParams) -> tuple[B.Batch, dict[str, float]]:
        return self.source.rollout(run, batch, params)


class WaitForRollout(Stage):
    """Waits for the batch of this step from the rollout thread (``timing_s/wait_prev_gen``, verl's name)."""

    name = "wait_prev_gen"

    def __init__(self, pipeline: OffPolicy) -> None:
        self.pipeline = pipeline

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        self.pipeline.buffer[0].result()
        return batch


class DeliverWeights(Stage):
    """Gives the engine the trainer's weights before the next generation (``timing_s/update_weights``): synced now
    when no generation is running (``rlforge_weight_sync_end`` fires), else copied for the rollout thread to load."""

    name, timing_name = "deliver_weights", "update_weights"

    def __init__(self, pipeline: OffPolicy) -> None:
        self.pipeline = pipeline

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        if self.pipeline.idle():
            return Stage.SYNC_WEIGHTS.run(ctx, batch)
        self.pipeline._handoff = cast("WeightSnapshots", ctx.controller).snapshot_weights()
        return batch
