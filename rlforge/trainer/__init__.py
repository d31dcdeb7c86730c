"""The Trainer: runs an algorithm's dataflow step after step, with hooks, metrics and checkpoints."""

from rlforge.trainer.trainer import Trainer

__all__ = ["Trainer"]
