"""How generation and training are scheduled across steps (``trainer.pipeline``; docs/pipelines.md).

- ``sync`` (default, :class:`Pipeline`): each step generates with the current weights, then trains on that batch
  (verl's synchronous PPO loop). No policy lag.
- ``async`` (:class:`OffPolicy`): a rollout thread generates the batches of the next ``trainer.max_staleness``
  steps while the trainer trains; step ``k`` trains on the weights of ``max(0, k - 1 - max_staleness)`` updates.
- ``one_step_off`` (:class:`OneStepOff`): ``async`` with ``max_staleness`` 1 (verl's one-step-off-policy recipe).
- ``partial`` (:class:`PartialRollouts`): each step decodes at most ``trainer.partial_tokens`` tokens per response;
  the responses that have not ended continue in the next step (Kimi k1.5's partial rollouts).

A sample's policy version is the batch column ``policy_version`` (the number of updates of the weights that
generated it); the exact schedule is in :mod:`rlforge.pipeline.off_policy`. A pipeline is an object that edits the
algorithm's dataflow (:meth:`Pipeline.prepare`) and supplies each step's prompts; :data:`PIPELINES` maps the
config values to the classes.
"""

from __future__ import annotations

from typing import Any

from rlforge.pipeline.base import Pipeline
from rlforge.pipeline.off_policy import DEFAULT_STALENESS, InFlight, OffPolicy, OneStepOff
from rlforge.pipeline.partial import PartialRollouts

PIPELINES: dict[str, type[Pipeline]] = {"sync": Pipeline, "one_step_off": OneStepOff, "async": OffPolicy,
                                        "partial": PartialRollouts}
PIPELINE_NAMES = tuple(PIPELINES)

__all__ = ["DEFAULT_STALENESS", "PIPELINES", "PIPELINE_NAMES", "InFlight", "OffPolicy", "OneStepOff",
           "PartialRollouts", "Pipeline", "for_config"]


def for_config(config: Any) -> Pipeline:
    """The pipeline ``trainer.pipeline`` names."""
    return PIPELINES[config.trainer.pipeline](config)
