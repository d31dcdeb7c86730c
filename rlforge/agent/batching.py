"""Trajectories -> one training batch, and the agent metrics of a rollout.

Trajectories of any length and turn count share the batch layout of single-turn rollouts: prompts left-padded,
responses right-padded, ``attention_mask`` 1 on every real token (inserted turns included), ``response_mask`` 1 on
model tokens only (holes where tools or users spoke), ``rollout_log_probs`` 0 off the mask. Log-probs, advantages
and losses work on it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.agent.types import TOKEN_LIMIT, TURN_LIMIT, Trajectory
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

AGENT_REWARDS = "agent_rewards"  # [B, R] per-turn, tool and loop rewards placed on model tokens


def pad_rows(rows: Sequence[Sequence[float]], value: float, left: bool = False, dtype: Any = None) -> torch.Tensor:
    """Rows of different lengths as one tensor, padded with ``value`` on the left or the right (width >= 1)."""
    width = max(1, *(len(r) for r in rows))
    out = torch.full((len(rows), width), value, dtype=dtype or torch.long)
    for i, r in enumerate(rows):
        if len(r):
            target = out[i, width - len(r):] if left else out[i, :len(r)]
            target.copy_(torch.as_tensor(list(r), dtype=out.dtype))
    return out


def reward_positions(traj: Trajectory) -> list[tuple[int, float]]:
    """``(response position, reward)`` of each turn reward (last token of its turn) and of the final reward."""
    spans = traj.turn_spans()
    placed = [(end - 1, r) for (_, end), r in zip(spans, traj.turn_rewards) if r]
    if traj.reward and spans:
        placed.append((spans[-1][1] - 1, traj.reward))
    return placed


def to_batch(rows: B.Batch, trajectories: list[Trajectory], answers: list[str], pad_id: int) -> B.Batch:
    """``rows`` (the prompt rows, one per trajectory, with their list columns) with the trajectories' columns."""
    out = B.Batch(lists=rows.lists, meta=rows.meta)
    out[B.PROMPTS] = pad_rows([t.prompt_ids for t in trajectories], pad_id, left=True)
    out[B.PROMPT_MASK] = pad_rows([[1] * len(t.prompt_ids) for t in trajectories], 0, left=True)
    out[B.RESPONSES] = pad_rows([t.response_ids for t in trajectories], pad_id)
    out[B.RESPONSE_MASK] = pad_rows([t.response_mask for t in trajectories], 0)
    out[B.ROLLOUT_LOG_PROBS] = pad_rows([[lp * m for lp, m in zip(t.log_probs, t.response_mask)]
                                         for t in trajectories], 0.0, dtype=torch.float32)
    real = pad_rows([[1] * len(t.response_ids) for t in trajectories], 0)
    out[B.INPUT_IDS] = torch.cat([out[B.PROMPTS], out[B.RESPONSES]], dim=1)
    out[B.ATTENTION_MASK] = torch.cat([out[B.PROMPT_MASK], real], dim=1)
    rewards = torch.zeros(out[B.RESPONSES].shape, dtype=torch.float32)
    for i, t in enumerate(trajectories):
        for pos, r in reward_positions(t):
            rewards[i, pos] += r
    out[AGENT_REWARDS] = rewards
    out[B.SOLUTION_TEXT] = answers
    out[B.NUM_TURNS] = [num_turns(t) for t in trajectories]
    out[B.STOP_REASON] = [t.stop_reason for t in trajectories]
    if any(t.multi_modal is not None for t in trajectories):  # inserted turns showed images: the whole sequence's
        rows_mm = rows.lists.get(B.MULTI_MODAL_INPUTS) or [None] * len(trajectories)
        out[B.MULTI_MODAL_INPUTS] = [row if t.multi_modal is None else t.multi_modal
                                     for row, t in zip(rows_mm, trajectories)]
    if any(t.score is not None for t in trajectories):  # loops that scored their trajectories themselves
        out[B.LOOP_SCORES] = [None if t.score is None else float(t.score) for t in trajectories]
    if any(t.extra_info for t in trajectories):  # a loop's additions to what the reward function receives
        rows_info = rows.lists.get(B.EXTRA_INFO) or [None] * len(trajectories)
        out[B.EXTRA_INFO] = [{**(info if isinstance(info, dict) else {}), **t.extra_info} if t.extra_info else info
                             for info, t in zip(rows_info, trajectories)]
    return out


def num_turns(traj: Trajectory) -> int:
    """The trajectory's turns as verl counts them: the prompt, each model turn and each inserted turn."""
    return 1 + len(traj.turn_spans()) + traj.inserted_turns


def _stats(name: str, values: Sequence[float], kinds: Sequence[str] = ("mean", "max", "min")) -> dict[str, float]:
    if not values:
        return {}
    table = {"mean": sum(values) / len(values), "max": max(values), "min": min(values)}
    return {f"{name}/{k}": float(table[k]) for k in kinds}


def agent_metrics(trajectories: list[Trajectory], wait_seconds: list[float], waves: list[int]) -> dict[str, float]:
    """The rollout's agent metrics (verl's names where verl has them: ``num_turns``, ``tool_call_counts``,
    ``agent_loop/*``). ``num_turns`` counts as verl does: the prompt, each model turn and each inserted turn."""
    n = len(trajectories)
    model_turns = [len(t.turn_spans()) for t in trajectories]
    model_tokens = sum(sum(t.response_mask) for t in trajectories)
    latencies = [s for t in trajectories for s in t.tools.seconds]
    out = {
        **_stats("num_turns", [num_turns(t) for t in trajectories]),
        **_stats("agent/model_turns", model_turns, ("mean", "max")),
        **_stats("tool_call_counts", [t.tools.calls for t in trajectories]),
        **_stats("agent_loop/tool_calls", [sum(t.tools.seconds) for t in trajectories], ("mean", "max")),
        **_stats("agent_loop/generate_sequences", wait_seconds, ("mean", "max")),
        **_stats("agent/tool_latency_s", latencies, ("mean", "max")),
        **_stats("agent/wave_size", waves, ("mean", "max")),
        "agent/tool_calls": float(sum(t.tools.calls for t in trajectories)),
        "agent/tool_errors": float(sum(t.tools.errors for t in trajectories)),
        "agent/parse_errors": float(sum(t.tools.parse_errors for t in trajectories)),
        "agent/turn_limit_ratio": sum(t.stop_reason == TURN_LIMIT for t in trajectories) / max(n, 1),
        "agent/token_limit_ratio": sum(t.stop_reason == TOKEN_LIMIT for t in trajectories) / max(n, 1),
        "agent/response_tokens_per_turn": model_tokens / max(sum(model_turns), 1),
        "agent/engine_calls": float(len(waves)),
    }
    attempted = sum(t.tools.calls + t.tools.parse_errors for t in trajectories)
    if attempted:  # the share of tool calls the parser could read (undefined when none was written)
        out["agent/tool_call_format_ok"] = sum(t.tools.calls for t in trajectories) / attempted
    for key in sorted({k for t in trajectories for k in t.metrics}):
        values = [float(t.metrics[key]) for t in trajectories if key in t.metrics]
        out[f"agent/{key}/mean"] = sum(values) / len(values)
    return out


def add_agent_rewards(batch: B.Batch) -> Any:
    """Add the trajectories' rewards (``agent_rewards`` [B, R]) to the reward function's ``scores`` and to the
    token-level columns the batch has (``token_level_scores``, ``token_level_rewards``); returns them."""
    extra = batch[AGENT_REWARDS]
    change = extra + replaced_scores(batch)
    batch[B.SCORES] = batch[B.SCORES] + change.sum(-1)
    for key in (B.TOKEN_LEVEL_SCORES, B.TOKEN_LEVEL_REWARDS):
        if key in batch:
            batch[key] = batch[key] + change
    return extra


def replaced_scores(batch: B.Batch) -> Any:
    """[B, R]: on the last model token of each row that its loop scored (``loop_scores``), the loop's score minus
    the reward manager's (0 where the manager already took the loop's score, as ``rule`` does); 0 elsewhere."""
    delta = torch.zeros_like(batch[AGENT_REWARDS])
    loop = batch.lists.get(B.LOOP_SCORES)
    if loop is None:
        return delta
    last = B.last_model_token(batch[B.RESPONSE_MASK])
    for i, score in enumerate(loop):
        if score is not None:
            delta[i, last[i]] = score - float(batch[B.SCORES][i])
    return delta
