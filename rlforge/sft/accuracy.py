"""Greedy accuracy on the validation split of ``data.name``, scored by the configured reward manager."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from rlforge import batch as B
from rlforge.controller.local import close_reward
from rlforge.data import Prompt, collate, tokenize_rows
from rlforge.errors import RLForgeError
from rlforge.sampling import SamplingParams


class GreedyAccuracy:
    """Built before training: it reads and checks the validation rows and scores each data source's first row
    with its own ground truth as the response, so that a row the reward manager cannot score (no reward function
    for its ``data_source``, a broken ``reward.file``) fails before the first step, not after the last.
    """

    def __init__(self, config: DictConfig, plugins: Any, tokenizer: Any) -> None:
        self.config, self.registry, self.tokenizer = config, plugins.registry, tokenizer
        d = config.data
        rows = self.registry.dataset.get(d.name)(config, "val")
        self.prompts = tokenize_rows(rows, tokenizer, d.max_prompt_length, True, f"{d.name} (val)")
        self.manager = None
        if self.prompts:
            self.manager = self.registry.reward_manager.get(config.reward.manager)(config, tokenizer, self.registry)
            self._check()

    def _check(self) -> None:
        firsts = list({p.data_source: p for p in self.prompts}.values())
        answers = [self.tokenizer(str(p.ground_truth), add_special_tokens=False)["input_ids"] for p in firsts]
        width = max(len(a) for a in answers) + 1
        responses = torch.full((len(firsts), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(responses)
        for i, a in enumerate(answers):
            responses[i, : len(a) + 1] = torch.tensor(a + [self.tokenizer.eos_token_id])
            mask[i, : len(a) + 1] = 1
        batch = self._batch(firsts)
        batch[B.RESPONSES], batch[B.RESPONSE_MASK] = responses, mask
        try:
            self.manager.score(batch)  # type: ignore[union-attr]
        except RLForgeError as exc:
            raise RLForgeError(f"{exc} (needed for the greedy validation accuracy on data.name={self.config.data.name}"
                               f"'s validation rows after SFT; sft.val_accuracy=false skips it)") from None

    def _batch(self, prompts: list[Prompt]) -> B.Batch:
        return collate(prompts, self.tokenizer.pad_token_id, list(range(len(prompts))))

    def measure(self, model: torch.nn.Module) -> float | None:
        """Fraction of validation prompts answered right by greedy decoding; None without validation rows."""
        if self.manager is None:
            return None
        engine = self.registry.rollout.get("hf")(self.config, model, self.tokenizer)
        params = SamplingParams.from_config(self.config.rollout, validation=True)
        batch = self.manager.score(engine.generate(self._batch(self.prompts), params))
        return float(batch[B.ACC].mean())

    def close(self) -> None:
        close_reward(self.manager)
