"""A vLLM logits processor that forces response lengths by position, as ``long_tail.force_lengths`` does for the
Hugging Face model: the next token is the stop token where the input position (prompt + response so far, less one)
is in ``$LONG_TAIL_ENDS`` (comma-separated), and never elsewhere; the stop token is ``$LONG_TAIL_STOP``.

Loaded by vLLM in its engine process (``rollout.vllm.engine_kwargs={logits_processors: [vllm_lengths:ForcedLengths]}``,
with this folder on ``PYTHONPATH``); for benchmarks only (``long_tail_step.py --engines vllm``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor


class ForcedLengths(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.ends = {int(x) for x in os.environ["LONG_TAIL_ENDS"].split(",")}
        self.stop = int(os.environ["LONG_TAIL_STOP"])
        self.rows: dict[int, tuple[int, list[int]]] = {}  # batch index -> (prompt tokens, its live output tokens)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not batch_update:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, prompt, output in batch_update.added:
            self.rows[index] = (len(prompt or ()), output)
        for a, b, direction in batch_update.moved:
            first, second = self.rows.pop(a, None), self.rows.pop(b, None)
            if first is not None:
                self.rows[b] = first
            if second is not None and direction.name == "SWAP":
                self.rows[a] = second

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (prompt, output) in self.rows.items():
            if index >= logits.shape[0]:
                continue
            if prompt + len(output) - 1 in self.ends:
                logits[index, self.stop] = logits[index].max() + 100.0
            else:
                logits[index, self.stop] = float("-inf")
        return logits
