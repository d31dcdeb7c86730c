"""The attention shape of a model config (:class:`Heads`) and the checks that a parallel size fits it: tensor
parallelism (the ``tp`` strategy, vLLM, megatron's conversion) and Ulysses sequence parallelism split heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError


@dataclass(frozen=True)
class Heads:
    """The attention shape of a model config."""

    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> Heads:
        """The attention heads of a model config (a vision-language model's: its language model's)."""
        config = config.get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(heads, getattr(config, "num_key_value_heads", None) or heads, head_dim)

    def check(self, tp: int, key: str = "tensor_parallel_size") -> None:
        """``tp`` must divide the query heads, and divide or be a multiple of the KV heads."""
        if self.heads % tp or (self.kv_heads % tp and tp % self.kv_heads):
            raise ConfigError(
                f"{key}={tp} does not fit the model's {self.heads} attention heads and {self.kv_heads} KV heads: "
                f"it must divide the heads, and divide or be a multiple of the KV heads."
            )


    def check_even(self, tp: int, key: str) -> None:
        """``tp`` must divide both the query and the KV heads (DTensor splits without replicating KV heads)."""
        if self.heads % tp or self.kv_heads % tp:
            raise ConfigError(f"{key}={tp} must divide the model's {self.heads} attention heads and its "
                              f"{self.kv_heads} KV heads.")
