"""The ``sync`` pipeline, which every pipeline extends: generate with the current weights, then train."""

from __future__ import annotations

import sys

from collections.abc import Callable
from typing import Any

from rlforge import batch as B
from rlforge.dataflow import DataFlow, OldLogProbStage, Stage, StepContext
from rlforge.errors import ConfigError


OPTIONS = {"max_staleness": "async", "partial_tokens": "partial"}  # trainer.<key>: the pipeline it belongs to


class Pipeline:
    """``sync``: generate and train in order, each step from its own weights (the flow as the algorithm gives it)."""

    name = "sync"
    own_rollout_weights = False  # the engine needs weights of its own (it generates while the actor trains)

    def __init__(self, config: Any) -> None:
        self.config = config

    reads: tuple[str, ...] = ()  # the trainer options of OPTIONS this pipeline reads (the others must stay unset)

    @classmethod
    def validate_config(cls, config: Any) -> None:
        """Refuse options this pipeline cannot serve (at compose time, before any model loads)."""
        for key, owner in OPTIONS.items():
            value = config.trainer[key]
            if value is not None and key not in cls.reads:
                raise ConfigError(f"trainer.{key}={value} is an option of trainer.pipeline={owner}; "
                                  f"trainer.pipeline={cls.name} has none. Set trainer.pipeline={owner}, or leave "
                                  f"trainer.{key} unset (null).")

    def prepare(self, flow: DataFlow) -> DataFlow:
        """The flow this pipeline runs (before ``compile``)."""
        return flow

    def prompts(self, draw: Callable[[], B.Batch]) -> B.Batch:
        """The batch the step's first stage receives; ``draw()`` gives the next training prompts."""
        return draw()

    def settle(self, controller: Any, step: int) -> None:
        """Before validation generates: wait for the generations in flight and give the engine the trainer's
        weights (version ``step``). ``sync``'s engine holds them already (its sync_weights stage ran)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue exactly (plain containers and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Restore :meth:`state_dict`; the engine now holds the weights of ``step`` (version ``step``)."""
        self.drop_unread(state, ())

    def drop_unread(self, state: dict[str, Any], reads: tuple[str, ...]) -> None:
        """Warn about what a checkpoint's pipeline state holds that this pipeline does not continue (a resume that
        changed ``trainer.pipeline`` with ``trainer.resume_force=true``): those samples are dropped."""
        left = [key for key, value in state.items() if value and key not in reads]
        if left:
            print(f"rlforge: warning: the checkpoint holds samples of another trainer.pipeline ({', '.join(left)}), "
                  f"which trainer.pipeline={self.name} does not continue: they are dropped.", file=sys.stderr)

    def close(self) -> None:
        """Wait for and release what the pipeline runs in the background."""

    def off_policy_stages(self, flow: DataFlow, rollout: Stage, why: str) -> None:
        """For a pipeline whose samples lag the trainer's weights: refuse other stages that generate during the step
        (``why`` they cannot), and recompute the old log-probs with the trainer's weights."""
        others = [s.name for s in flow.stages if s.uses_engine and s is not rollout]
        if others:
            raise ConfigError(f"trainer.pipeline={self.name}: stage '{others[0]}' of dataflow '{flow.name}' generates "
                              f"during the step (e.g. algorithm.filter_groups=true, or ReMax's greedy baseline), "
                              f"{why}. Use trainer.pipeline=sync.")
        if Stage.OLD_LOGPROB in flow:
            flow.replace(Stage.OLD_LOGPROB, RecomputedOldLogProb())


class RecomputedOldLogProb(OldLogProbStage):
    """The old log-probs from the trainer's current weights, always (the engine's are older): PPO's ratio and
    rollout correction (``algorithm.rollout_is``) then see the lag."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch[B.OLD_LOG_PROBS] = ctx.workers.actor.compute_log_probs(batch, "actor")
        return batch
