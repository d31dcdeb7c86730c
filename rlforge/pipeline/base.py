"""The ``sync`` pipeline, which every pipeline extends: generate with the current weights, then train."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlforge import batch as B
from rlforge.dataflow import DataFlow
from rlforge.errors import ConfigError


class Pipeline:
    """``sync``: generate and train in order, each step from its own weights (the flow as the algorithm gives it)."""

    name = "sync"
    own_rollout_weights = False  # the engine needs weights of its own (it generates while the actor trains)

    def __init__(self, config: Any) -> None:
        self.config = config

    @classmethod
    def validate_config(cls, config: Any) -> None:
        """Refuse options this pipeline cannot serve (at compose time, before any model loads)."""
        if config.trainer.max_staleness is not None:
            raise ConfigError(f"trainer.max_staleness={config.trainer.max_staleness} bounds the lag of "
                              f"trainer.pipeline=async; trainer.pipeline={cls.name} has none. Set "
                              f"trainer.pipeline=async, or leave trainer.max_staleness unset (null).")

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

    def close(self) -> None:
        """Wait for and release what the pipeline runs in the background."""
