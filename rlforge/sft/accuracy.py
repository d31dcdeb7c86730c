"""Greedy accuracy on the validation split of ``data.name``, scored by the configured reward manager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig

from rlforge import batch as B
from rlforge.build import Builder
from rlforge.data import Prompt, collate, tokenize_rows
from rlforge.errors import RLForgeError
from rlforge.evaluation import SCORED_FOR, VALIDATION
from rlforge.sampling import SamplingParams

if TYPE_CHECKING:
    from rlforge.protocols import RewardManager

ENGINE = "hf"  # generates with the trained model object itself


class GreedyAccuracy:
    """Built before training: it reads and checks the validation rows and scores each data source's first row
    with its own ground truth as the response, so that a row the reward manager cannot score (no reward function
    for its ``data_source``, a broken ``reward.file``) fails before the first step, not after the last.
    """

    def __init__(self, config: DictConfig, plugins: Any, tokenizer: Any) -> None:
        self.config, self.builder, self.tokenizer = config, Builder(config, plugins), tokenizer
        d = config.data
        rows = self.builder.registry.dataset.get(d.name)(config, "val")
        self.prompts = tokenize_rows(rows, tokenizer, d.max_prompt_length, True, f"{d.name} (val)")
        self.manager: RewardManager | None = None
        if self.prompts:
            self.manager = self.builder.reward(tokenizer)
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
        batch.meta[SCORED_FOR] = VALIDATION  # the reward manager's errors say validation, not a training step
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
        engine = self.builder.registry.rollout.get(ENGINE)(self.config, model, self.tokenizer)
        evaluate = self.builder.evaluator(engine, self.tokenizer, self.manager, ENGINE)
        try:
            batch = evaluate(self._batch(self.prompts), SamplingParams.from_config(self.config.rollout, validation=True))
        finally:
            evaluate.close()
        return float(batch[B.ACC].mean())

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
