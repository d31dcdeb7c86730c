"""The trajectory record (``rollout.agent.record_trajectories=true``): one JSON line per trained sample in
``<run>/trajectories.jsonl``, beside ``samples.jsonl`` (docs/agentic.md, "The trajectory record").

A line holds what the update trained on: the prompt and response token ids, the loss mask (``response_mask`` as
the update saw it), the spans of the response (model turns, tool replies, user turns), the tool calls of each
model turn as ``rollout.agent.tool_parser`` reads them, the policy version that generated the sample (the number
of training steps its weights had taken) and its reward. ``rlforge report RUN --trajectory N`` shows one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge import diskio
from rlforge.agent.types import MODEL, Trajectory
from rlforge.errors import RLForgeError

if TYPE_CHECKING:
    from rlforge.agent.context import AgentContext

RECORD_FILE = "trajectories.jsonl"
AGENT_RECORD = "agent_record"  # list column: the agent loop's part of each sample's record (when recording)
FORMAT = 1  # the record's "format": bumped when a field changes meaning


def agent_record(traj: Trajectory, context: AgentContext) -> dict[str, Any]:
    """The agent loop's part of a sample's record: its spans (model turns with their tool calls, reasoning and
    unreadable calls; inserted turns with their messages), why it stopped, its turn and loop rewards, its tools'
    counts and its metrics."""
    spans = []
    for span in traj.all_spans():
        ids = traj.response_ids[span.start:span.end]
        item: dict[str, Any] = {"role": span.role, "start": span.start, "end": span.end,
                                "text": context.tokenizer.decode(ids)}
        if span.role == MODEL:
            parsed = context.parser.parse(context.chat.decode(ids))
            if parsed.calls:
                item["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
            if parsed.errors:
                item["parse_errors"] = list(parsed.errors)
            if parsed.reasoning:
                item["reasoning"] = parsed.reasoning
        elif span.messages:
            item["messages"] = [{**m, "images": len(m["images"])} if m.get("images") else dict(m)
                                for m in span.messages]  # images shown: their count
        spans.append(item)
    return {"spans": spans, "stop_reason": traj.stop_reason, "turn_rewards": list(traj.turn_rewards),
            "loop_reward": traj.reward,
            "tools": {"calls": traj.tools.calls, "errors": traj.tools.errors, "parse_errors": traj.tools.parse_errors},
            "metrics": dict(traj.metrics)}


def sample_records(batch: B.Batch, tokenizer: Any, step: int) -> list[dict[str, Any]]:
    """One record per row of a trained batch. Rows without the agent loop's part (``single_turn`` rollouts) get
    their spans from the loss mask."""
    prompts, prompt_mask = batch[B.PROMPTS], batch[B.PROMPT_MASK]
    real = batch[B.ATTENTION_MASK][:, prompts.shape[1]:]  # 1 on every response token, inserted ones included
    n = len(batch)
    lists = {k: batch.lists.get(k, [None] * n) for k in (B.UID, B.DATA_SOURCE, B.GROUND_TRUTH, B.SOLUTION_TEXT,
                                                         AGENT_RECORD)}
    versions = batch[B.POLICY_VERSION].tolist() if B.POLICY_VERSION in batch else [step - 1] * n
    scores = B.reported_scores(batch) if B.SCORES in batch else [None] * n
    out = []
    for i in range(n):
        length = int(real[i].sum())
        response = batch[B.RESPONSES][i][:length].tolist()
        mask = [int(m) for m in batch[B.RESPONSE_MASK][i][:length].tolist()]
        prompt_ids = prompts[i][prompt_mask[i].bool()].tolist()
        record: dict[str, Any] = {
            "format": FORMAT, "step": step, "index": i, "policy_version": int(versions[i]), "uid": lists[B.UID][i],
            "data_source": lists[B.DATA_SOURCE][i], "ground_truth": lists[B.GROUND_TRUTH][i],
            "prompt": tokenizer.decode(prompt_ids), "prompt_ids": prompt_ids, "response_ids": response,
            "loss_mask": mask,
            "reward": scores[i], "answer": lists[B.SOLUTION_TEXT][i],
        }
        agent = lists[AGENT_RECORD][i]
        if agent is None:
            spans = Trajectory([0], response, mask, [0.0] * length).all_spans()
            agent = {"spans": [{"role": s.role, "start": s.start, "end": s.end,
                                "text": tokenizer.decode(response[s.start:s.end])} for s in spans]}
        out.append({**record, **agent})
    return out


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to ``path``, one JSON line each (values JSON cannot hold are written as text)."""
    with diskio.disk_errors(f"write {path}", "Free space, or set rollout.agent.record_trajectories=false.",
                            where=path.parent), diskio.open_text(path, append=True) as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``trajectories.jsonl``; a line that is not a JSON object is an error naming it."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise RLForgeError(f"{path}:{number} is not a JSON line ({exc}); was the run stopped mid-write?") from None
        if not isinstance(record, dict) or "spans" not in record:
            raise RLForgeError(f"{path}:{number} is not a trajectory record (no 'spans')")
        records.append(record)
    return records
