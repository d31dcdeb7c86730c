"""``rule`` reward manager: per-sample reward functions chosen by ``data_source`` or by config.

A user function loads from a file (``reward.file``, ``reward.fn_name``) with verl's contract
``compute_score(data_source, solution_str, ground_truth, extra_info)``, so verl reward code ports unchanged.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlforge import batch as B
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl

from rlforge.plugins.reward.functions import arith_score, gsm8k_score

ScoreFn = Callable[..., Any]


def load_user_function(path: str, name: str = "compute_score") -> ScoreFn:
    """Import ``name`` from the Python file at ``path``, with errors that name the file and function."""
    file = Path(path)
    if not file.is_file():
        raise RLForgeError(f"Reward file not found: {path} (reward.file).")
    spec = importlib.util.spec_from_file_location(f"rlforge_user_reward_{file.stem}", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise RLForgeError(f"Reward file {path} has a syntax error at line {exc.lineno}: {exc.msg}.") from None
    except Exception as exc:
        raise RLForgeError(f"Reward file {path} failed to import: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RLForgeError(
            f"Reward file {path} has no function '{name}' (reward.fn_name). It must define "
            f"{name}(data_source, solution_str, ground_truth, extra_info)."
        )
    return fn


def split_result(result: Any) -> tuple[float, float]:
    """A reward function's result -> (score, accuracy). Accuracy is ``acc`` if given, else score >= 1."""
    if isinstance(result, dict):
        score = float(result["score"])
        acc = float(result.get("acc", score >= 1.0))
    else:
        score = float(result)
        acc = float(score >= 1.0)
    return score, acc


class RuleRewardManager:
    """Decodes each response and calls its reward function; the score goes on the last valid token."""

    def __init__(self, config: Any, tokenizer: Any, registry: Any) -> None:
        self.tokenizer = tokenizer
        self.registry = registry
        rc = config.reward
        self.fixed: ScoreFn | None = None
        if rc.file:
            self.fixed = load_user_function(rc.file, rc.fn_name)
        elif rc.fn:
            self.fixed = registry.reward_fn.get(rc.fn)

    def fn_for(self, data_source: str) -> ScoreFn:
        if self.fixed is not None:
            return self.fixed
        if data_source not in self.registry.reward_fn:
            known = ", ".join(self.registry.reward_fn.available())
            raise RLForgeError(
                f"No reward function for data_source '{data_source}'. Known: {known}. Set reward.fn=NAME or "
                f"reward.file=path.py (a compute_score function)."
            )
        return self.registry.reward_fn.get(data_source)

    def score(self, batch: B.Batch) -> B.Batch:
        texts = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        n = len(batch)
        scores = torch.zeros(n)
        accs = torch.zeros(n)
        extra = batch.lists.get(B.EXTRA_INFO, [None] * n)
        for i, text in enumerate(texts):
            src = batch[B.DATA_SOURCE][i]
            result = self.fn_for(src)(src, text, batch[B.GROUND_TRUTH][i], extra[i])
            score, acc = split_result(result)
            if not math.isfinite(score):
                raise RLForgeError(f"Reward function for '{src}' returned {score} for sample {i}: {text!r}.")
            scores[i], accs[i] = score, acc
        mask = batch[B.RESPONSE_MASK]
        last = (mask.sum(-1) - 1).clamp(min=0)
        token_scores = torch.zeros(mask.shape, dtype=torch.float32)
        token_scores[torch.arange(n), last] = scores
        batch[B.SCORES] = scores
        batch[B.TOKEN_LEVEL_SCORES] = token_scores
        batch[B.ACC] = accs
        batch[B.RESPONSE_TEXT] = texts
        return batch


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register("rule", RuleRewardManager)
    registry.reward_fn.register("arith", arith_score)
    registry.reward_fn.register("gsm8k", gsm8k_score)
    registry.reward_fn.register("openai/gsm8k", gsm8k_score, description="alias of gsm8k (verl's data_source)")
