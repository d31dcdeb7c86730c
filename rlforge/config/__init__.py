"""Configuration: schema dataclasses and composition with clear errors."""

from rlforge.config.batches import explain_batch_sizes
from rlforge.config.compose import compose, compose_with_plugins
from rlforge.config.schema import RLForgeConfig

__all__ = ["RLForgeConfig", "compose", "compose_with_plugins", "explain_batch_sizes"]
