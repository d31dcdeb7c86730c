"""Per-step data metrics in verl's namespace (critic/*, response_length/*, perf/*) and the samples written per step."""

from __future__ import annotations

from typing import Any

import torch

from rlforge import batch as B
from rlforge.ops import masked_mean


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{prefix}/mean": x.mean().item(), f"{prefix}/max": x.max().item(), f"{prefix}/min": x.min().item()}


def data_metrics(batch: B.Batch, max_new_tokens: int) -> dict[str, float]:
    """Statistics of a step's batch; the reward and rollout ones only when the batch has those columns (an offline
    algorithm's batch of preference pairs has neither)."""
    out: dict[str, float] = {}
    if B.SCORES in batch:
        out.update(_stats("critic/score", batch[B.SCORES]))
    if B.TOKEN_LEVEL_REWARDS in batch:
        out.update(_stats("critic/rewards", batch[B.TOKEN_LEVEL_REWARDS].sum(-1)))
    if B.ACC in batch:
        out["critic/acc/mean"] = batch[B.ACC].float().mean().item()
    if B.ADVANTAGES in batch:
        mask = batch[B.RESPONSE_MASK].bool()
        valid = batch[B.ADVANTAGES][mask]
        if valid.numel():
            out.update(_stats("critic/advantages", valid))
    if B.RESPONSE_MASK in batch:
        resp_len = batch[B.RESPONSE_MASK].sum(-1)
        out.update(_stats("response_length", resp_len))
        if B.ROLLOUT_LOG_PROBS in batch:  # generated: the share cut at the length limit
            out["response_length/clip_ratio"] = (resp_len >= max_new_tokens).float().mean().item()
    out.update(_stats("prompt_length", batch[B.PROMPT_MASK].sum(-1)))
    if B.REF_LOG_PROBS in batch and B.OLD_LOG_PROBS in batch:
        out["actor/ref_kl"] = masked_mean(batch[B.OLD_LOG_PROBS] - batch[B.REF_LOG_PROBS], batch[B.RESPONSE_MASK]).item()
    return out


def token_count(batch: B.Batch) -> int:
    """Prompt and response tokens of the batch (prompt tokens only before a rollout)."""
    responses = batch[B.RESPONSE_MASK].sum() if B.RESPONSE_MASK in batch else 0
    return int(responses + batch[B.PROMPT_MASK].sum())


def val_generations(batch: B.Batch, tokenizer: Any, n: int) -> list[dict[str, Any]]:
    """verl's pick of ``n`` validation generations (``trainer.log_val_generations``): every sample's (input, output,
    score), the input its decoded prompt and the output its response text, sorted by input, shuffled by numpy's
    ``RandomState(42)``, the first ``n``; none when the batch has no generated text."""
    import numpy as np

    if n <= 0 or B.RESPONSE_TEXT not in batch or B.SCORES not in batch:
        return []
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch[B.PROMPTS], batch[B.PROMPT_MASK])]
    inputs = tokenizer.batch_decode(prompts, skip_special_tokens=True)
    samples = sorted(zip(inputs, batch[B.RESPONSE_TEXT], B.reported_scores(batch)), key=lambda s: s[0])
    np.random.RandomState(42).shuffle(samples)
    return [{"input": i, "output": o, "score": s} for i, o, s in samples[:n]]


def sample_records(batch: B.Batch, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` samples of a scored batch as JSON-ready records (prompt, response, ground truth, and the score
    as the reward function returned it: ``reported_scores``); none when the batch has no generated text."""
    if limit <= 0 or B.RESPONSE_TEXT not in batch or B.SCORES not in batch:
        return []
    scores = B.reported_scores(batch)
    return [{
        "prompt": batch[B.RAW_PROMPT][i][-1]["content"],
        "response": batch[B.RESPONSE_TEXT][i],
        "ground_truth": batch[B.GROUND_TRUTH][i],
        "score": scores[i],
    } for i in range(min(limit, len(batch)))]
