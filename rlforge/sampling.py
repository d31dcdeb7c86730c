"""What a generation is asked for and what it returns: :class:`SamplingParams` and :class:`Generation`, and the seeds
of seeded generations. A leaf module (no rlforge imports): engines, agent loops, pipelines and the contracts in
``rlforge.protocols`` all build on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SEED_RANGE = 2**30  # seeds of SamplingParams.seed are drawn below it: under every engine's limit (vllm adds the row index)
SEED_STRIDE = 0x9E3779B1  # part k of a seeded generation samples with seed + k * stride (mod SEED_RANGE)


def derived_seed(seed: int | None, part: int) -> int | None:
    """The seed of part ``part`` of a seeded generation (an agent loop's wave, one engine's share of the prompts): a
    random stream of its own, no two parts share one. Part 0 keeps ``seed``; None (unseeded) stays None."""
    return None if seed is None else (seed + part * SEED_STRIDE) % SEED_RANGE


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    max_new_tokens: int = 16
    min_new_tokens: int = 0  # EOS is suppressed before this many tokens (benchmarks use min = max)
    # set: the engine samples from a private generator seeded with it, never the global torch RNG (a generation
    # running beside the training stays reproducible, trainer.pipeline=async); None: the torch RNG
    seed: int | None = None

    @classmethod
    def from_config(cls, rollout: Any, validation: bool = False) -> SamplingParams:
        if validation:
            return cls(rollout.val_n, rollout.val_temperature, rollout.val_top_p, rollout.val_top_k,
                       rollout.max_new_tokens)
        return cls(rollout.n, rollout.temperature, rollout.top_p, rollout.top_k, rollout.max_new_tokens,
                   rollout.min_new_tokens)


@dataclass(frozen=True)
class Generation:
    """One completion of a token-in/token-out request (``generate_tokens``)."""

    ids: list[int]  # the generated token ids, up to and including the stop token
    log_probs: list[float]  # the engine's log-prob of each generated token, at the sampling temperature
    finish: str  # "stop" (a stop token ended it) or "length" (max_new_tokens reached)
