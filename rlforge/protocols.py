"""The contracts of pluggable components, defined once. Plugins implement these (duck typing)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from rlforge.batch import Batch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    max_new_tokens: int = 16
    min_new_tokens: int = 0  # EOS is suppressed before this many tokens (benchmarks use min = max)

    @classmethod
    def from_config(cls, rollout: Any, validation: bool = False) -> SamplingParams:
        if validation:
            return cls(rollout.val_n, rollout.val_temperature, 1.0, 0, rollout.max_new_tokens)
        return cls(rollout.n, rollout.temperature, rollout.top_p, rollout.top_k, rollout.max_new_tokens,
                   rollout.min_new_tokens)


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates ``n`` samples per prompt. Registered under ``rollout`` and built as
    ``factory(config, model, tokenizer)``."""

    supports_sleep: bool
    # True when rollout_log_probs equal the actor's recomputed log-probs up to float noise (same weights and
    # numerics, e.g. the hf engine generating with the actor itself): the trainer then skips the recomputation
    logprobs_match_actor: bool

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Return a batch with ``len(batch) * params.n`` rows (each prompt repeated n times in place, lists
        repeated too) and the columns responses, input_ids, attention_mask, response_mask, rollout_log_probs."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (name, tensor) in place."""

    def shutdown(self) -> None: ...


@runtime_checkable
class RewardManager(Protocol):
    """Scores a batch. Registered under ``reward_manager``; built as ``factory(config, tokenizer, registry)``."""

    def score(self, batch: Batch) -> Batch:
        """Set ``scores`` [B], ``token_level_scores`` [B, R]; may add metrics to ``batch.meta['metrics']``."""


@runtime_checkable
class Strategy(Protocol):
    """Places models on devices and runs backward/clip/step. Registered under ``strategy``."""

    device: torch.device
    world_size: int
    rank: int

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float: ...

    def all_reduce_sum(self, value: float) -> float: ...

    def all_reduce_max(self, value: float) -> float: ...

    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]: ...


@runtime_checkable
class Logger(Protocol):
    """Receives metrics. Registered under ``logger``; built as ``factory(config, run_dir)``."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: str) -> None: ...

    def close(self) -> None: ...
