"""The batch passed between dataflow stages: equal-length tensor columns plus per-sample Python lists."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

# --- column names (tensors, leading dimension = number of sequences) ----------------------------
PROMPTS = "prompts"  # [B, P] left-padded prompt token ids
PROMPT_MASK = "prompt_mask"  # [B, P] 1 on real prompt tokens
RESPONSES = "responses"  # [B, R] right-padded response token ids
INPUT_IDS = "input_ids"  # [B, P+R] prompts ++ responses
ATTENTION_MASK = "attention_mask"  # [B, P+R] 1 on real tokens
RESPONSE_MASK = "response_mask"  # [B, R] 1 on generated tokens up to and including EOS (0 on tokens an agent loop inserted)
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # [B, R] log-probs reported by the rollout engine
OLD_LOG_PROBS = "old_log_probs"  # [B, R] log-probs of the policy that generated (recomputed)
REF_LOG_PROBS = "ref_log_probs"  # [B, R] log-probs of the reference model
VALUES = "values"  # [B, R] critic values
SCORES = "scores"  # [B] per-sample score from the reward function
TOKEN_LEVEL_SCORES = "token_level_scores"  # [B, R] score placed on the last response token
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # [B, R] scores after KL-in-reward / shaping
ADVANTAGES = "advantages"  # [B, R]
RETURNS = "returns"  # [B, R]
ACC = "acc"  # [B] 1.0 where the answer is right (reward function's `acc`, else score >= 1)
LABEL = "label"  # [B] preference data: 1.0 on chosen / desirable completions, 0.0 on rejected / undesirable ones
POLICY_VERSION = "policy_version"  # [B] the policy version that generated the row: its weights' count of updates (pipelines)
MARGIN = "margin"  # [B] preference pairs: the pair's `margin` column (reward-model training), 0 when not given
# --- non-tensor columns (lists of length B) ------------------------------------------------------
UID = "uid"  # group id: samples of the same prompt share it
DATA_SOURCE = "data_source"
GROUND_TRUTH = "ground_truth"
EXTRA_INFO = "extra_info"
RAW_PROMPT = "raw_prompt"  # chat messages
LOOP_SCORES = "loop_scores"  # per row of an agent rollout: the score its loop gave it, in place of the reward function's (verl's AgentLoopOutput.reward_score); None: the function's
AGENT_NAME = "agent_name"  # per row: the verl agent loop its data names (verl's agent_name column; None: the run's default)
MULTI_MODAL_INPUTS = "multi_modal_inputs"  # per row: {pixel_values, image_grid_thw} of its images, None without (rlforge.multimodal)
RESPONSE_TEXT = "response_text"
SOLUTION_TEXT = "solution_text"  # what the reward function scores when set (an agent loop's answer); else the decoded response
NUM_TURNS = "num_turns"  # per row of an agent rollout: its turns as verl counts them (prompt + model + inserted turns)
STOP_REASON = "stop_reason"  # per row of an agent rollout: why its trajectory ended: done | max_turns | max_tokens (rlforge.agent.types)
REWARD_EXTRA_INFO = "reward_extra_info"  # per row: the reward function's keys beside score and acc (verl's reward_extra_info)
REWARD_FAILED = "reward_failed"  # [B] 1.0 where the reward call failed (an error, a timeout, a value out of range) and the row got reward.fallback_score
REWARD_BASELINES = "reward_baselines"  # [B] per-sample baseline score (ReMax: the greedy response's score)

LEFT_PADDED = frozenset({PROMPTS, PROMPT_MASK})
OPTIONAL_LISTS = frozenset({MULTI_MODAL_INPUTS, AGENT_NAME, LOOP_SCORES, STOP_REASON})  # row columns a batch may lack (None for each of its rows in concat)


def reported_scores(batch: Batch) -> list[float]:
    """The batch's scores (``SCORES``, a float32 tensor) as the JSON a run or ``rlforge eval`` writes shows them: each
    the shortest decimal that maps back to the same float32, so a reward function's 0.3 reads 0.3, not float32's
    0.30000001192092896 (:func:`as_returned`)."""
    return [as_returned(score) for score in batch[SCORES].tolist()]


def as_returned(value: float) -> float:
    """``value``, a float32 number (a score read from its tensor), as the shortest decimal that maps back to the same
    float32: what the reward function returned where it returned that decimal (0.3 for 0.30000001192092896)."""
    import numpy as np

    return float(str(np.float32(value)))  # numpy writes a float32 with the fewest digits that round-trip


def last_model_token(mask: torch.Tensor) -> torch.Tensor:
    """[B]: each row's last position where the response mask ``mask`` [B, R] is 1 (its last model token; 0 for a row
    without one), where a score goes."""
    return (mask * torch.arange(1, mask.shape[1] + 1)).argmax(-1)


def on_last_model_token(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, R] float32: each row's score ``scores`` [B] at its :func:`last_model_token`, 0 elsewhere (what a reward
    manager sets as ``token_level_scores``)."""
    token_scores = torch.zeros(mask.shape, dtype=torch.float32)
    token_scores[torch.arange(mask.shape[0]), last_model_token(mask)] = scores
    return token_scores


class Batch:
    """Columns of equal length: ``tensors`` (torch, first dimension) and ``lists`` (Python objects)."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor] | None = None,
        lists: dict[str, list[Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.lists: dict[str, list[Any]] = dict(lists or {})
        self.meta: dict[str, Any] = dict(meta or {})
        self._check()

    def _check(self) -> None:
        lengths = {k: v.shape[0] for k, v in self.tensors.items()}
        lengths.update({k: len(v) for k, v in self.lists.items()})
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch columns have different lengths: {lengths}")

    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for lst in self.lists.values():
            return len(lst)
        return 0

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.lists

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.lists:
            return self.lists[key]
        raise KeyError(f"Batch has no column '{key}'. Columns: {sorted(self.columns())}")

    def __setitem__(self, key: str, value: Any) -> None:
        is_tensor = isinstance(value, torch.Tensor)
        value = value if is_tensor else list(value)
        n = value.shape[0] if is_tensor else len(value)
        others = {k: v for k, v in [*self.tensors.items(), *self.lists.items()] if k != key}
        if others:
            have = len(next(iter(others.values())))
            if n != have:
                raise ValueError(f"Column '{key}' has length {n}, batch has {have}")
        self.tensors.pop(key, None)
        self.lists.pop(key, None)
        (self.tensors if is_tensor else self.lists)[key] = value

    def columns(self) -> list[str]:
        return [*self.tensors, *self.lists]

    def copy(self) -> Batch:
        """A batch of the same columns (the same tensors and lists, not copied) whose columns can be set or removed
        without changing this one."""
        return Batch(dict(self.tensors), dict(self.lists), self.meta)

    def select(self, index: Sequence[int] | torch.Tensor) -> Batch:
        """Rows at ``index`` (a list of ints, or a bool/long tensor), in that order."""
        idx = index if isinstance(index, torch.Tensor) else torch.as_tensor(index, dtype=torch.long)
        if idx.dtype == torch.bool:
            idx = idx.nonzero(as_tuple=True)[0]
        rows = idx.tolist()
        return Batch(
            {k: v[idx] for k, v in self.tensors.items()},
            {k: [v[i] for i in rows] for k, v in self.lists.items()},
            self.meta,
        )

    def split(self, size: int) -> Iterator[Batch]:
        """Consecutive chunks of ``size`` rows (the last may be shorter)."""
        for start in range(0, len(self), size):
            yield self.select(list(range(start, min(start + size, len(self)))))

    def repeat_interleave(self, n: int) -> Batch:
        """Each row repeated ``n`` times in place: rows a, b -> a, a, b, b (n=2)."""
        idx = torch.arange(len(self)).repeat_interleave(n)
        return self.select(idx)

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.lists, self.meta)

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all ``batches`` in order, padded to a common width with 0 (masked out everywhere).

        Prompt columns are left-padded, the others right-padded; ``input_ids``/``attention_mask`` are
        rebuilt as prompt ++ response so the layout stays ``[left-padded prompt | response]``. A column of
        ``OPTIONAL_LISTS`` that only some batches have is None on the rows of the others.
        """
        if not batches:
            return Batch()
        tensors = {}
        for k in batches[0].tensors:
            parts = [b.tensors[k] for b in batches]
            if parts[0].dim() > 1:
                width = max(p.shape[1] for p in parts)
                left = k in LEFT_PADDED
                parts = [torch.nn.functional.pad(p, (width - p.shape[1], 0) if left else (0, width - p.shape[1]))
                         for p in parts]
            tensors[k] = torch.cat(parts)
        if INPUT_IDS in tensors and RESPONSES in tensors:
            tensors[INPUT_IDS] = torch.cat([tensors[PROMPTS], tensors[RESPONSES]], dim=1)
            width = tensors[RESPONSES].shape[1]
            # the response part of each attention mask, not response_mask: an agent loop's inserted tokens are real
            real = [b.tensors[ATTENTION_MASK][:, b.tensors[PROMPTS].shape[1]:] if ATTENTION_MASK in b.tensors
                    else b.tensors[RESPONSE_MASK] for b in batches]
            real = [torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in real]
            tensors[ATTENTION_MASK] = torch.cat([tensors[PROMPT_MASK], torch.cat(real)], dim=1)
        keys = dict.fromkeys([*batches[0].lists, *(k for k in OPTIONAL_LISTS if any(k in b.lists for b in batches))])
        lists = {k: [x for b in batches for x in (b.lists[k] if k in b.lists or k not in OPTIONAL_LISTS
                                                  else [None] * len(b))] for k in keys}
        return Batch(tensors, lists, batches[0].meta)
