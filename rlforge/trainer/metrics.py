"""Per-step data metrics in verl's namespace (critic/*, response_length/*, perf/*)."""

from __future__ import annotations

from typing import Any

import torch

from rlforge import batch as B
from rlforge.ops import masked_mean


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def data_metrics(batch: B.Batch, max_new_tokens: int) -> dict[str, float]:
    resp_len = batch[B.RESPONSE_MASK].sum(-1)
    prompt_len = batch[B.PROMPT_MASK].sum(-1)
    out: dict[str, float] = {}
    out.update(_stats("critic/score", batch[B.SCORES]))
    out.update(_stats("critic/rewards", batch[B.TOKEN_LEVEL_REWARDS].sum(-1)))
    if B.ACC in batch:
        out["critic/acc/mean"] = batch[B.ACC].float().mean().item()
    if B.ADVANTAGES in batch:
        mask = batch[B.RESPONSE_MASK].bool()
        valid = batch[B.ADVANTAGES][mask]
        if valid.numel():
            out.update(_stats("critic/advantages", valid))
    out.update(_stats("response_length", resp_len))
    out["response_length/clip_ratio"] = (resp_len >= max_new_tokens).float().mean().item()
    out.update(_stats("prompt_length", prompt_len))
    if B.REF_LOG_PROBS in batch and B.OLD_LOG_PROBS in batch:
        out["actor/ref_kl"] = masked_mean(batch[B.OLD_LOG_PROBS] - batch[B.REF_LOG_PROBS], batch[B.RESPONSE_MASK]).item()
    return out


def token_count(batch: B.Batch) -> int:
    return int(batch[B.RESPONSE_MASK].sum() + batch[B.PROMPT_MASK].sum())


def validation_metrics(batch: B.Batch) -> dict[str, Any]:
    out = {"val/reward": batch[B.SCORES].mean().item(), "val/accuracy": batch[B.ACC].mean().item()}
    sources = sorted(set(batch[B.DATA_SOURCE]))
    if len(sources) > 1:
        for src in sources:
            rows = [i for i, s in enumerate(batch[B.DATA_SOURCE]) if s == src]
            out[f"val/{src}/accuracy"] = batch[B.ACC][rows].mean().item()
    return out
