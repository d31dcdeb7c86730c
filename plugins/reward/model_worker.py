"""The ``reward_model`` role: the ``model`` reward manager's reward model on ranks of its own.

Each rank loads the reward model of ``reward.model.path`` (on ``reward.model.device``: ``auto`` is the GPU the rank
was given, else the CPU) and scores its share of the rows (the ``rows`` dispatch: no collectives, any number of
rows). Under the Ray controller the role has a resource pool of ``reward.model.num_workers`` ranks; under torchrun
every process holds one rank; the local controller (and ``rlforge eval``) holds one in its own process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlforge import batch as B
from rlforge import ops
from rlforge.controller.ray_workers import WorkerProcess
from rlforge.worker import remote

if TYPE_CHECKING:
    from rlforge.build import Builder
    from rlforge.module import RLModule


class RewardModelWorker(WorkerProcess):
    """One rank of the ``reward_model`` role: a frozen ``...ForSequenceClassification`` that scores sequences."""

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        self.load(builder.config, module.tokenizer)

    def load(self, config: Any, tokenizer: Any) -> None:
        """Load the reward model and its tokenizer; ``tokenizer`` is the policy's (the rows' tokens)."""
        from rlforge.models import frozen_model_device, load_reward_model, load_tokenizer
        from rlforge.plugins.reward.model import check_reward_model_folder
        from rlforge.tools.export import model_folder

        m = self.options = config.reward.model
        folder = model_folder(m.path)
        check_reward_model_folder(folder, m.path)
        self.rm_tokenizer = load_tokenizer(folder, trust_remote_code=m.trust_remote_code)
        self.device = frozen_model_device(m.device)
        model = load_reward_model(folder, self.rm_tokenizer.pad_token_id, m.dtype, m.trust_remote_code,
                                  key="reward.model.path")
        self.model = model.requires_grad_(False).eval().to(self.device)
        # the policy's tokens are read as they are when both models tokenize and render chats alike
        self.same_tokens = (self.rm_tokenizer.get_vocab() == tokenizer.get_vocab()
                            and self.rm_tokenizer.chat_template == tokenizer.chat_template)

    @remote("rows", "concat")
    @torch.no_grad()
    def compute_scores(self, batch: B.Batch) -> torch.Tensor:
        """The reward model's score of every row [B], in batches of ``reward.model.batch_size``. Rows are read as the
        policy's tokens, or (another tokenizer or template) rendered from ``raw_prompt`` + ``response_text``."""
        ids, mask = ((batch[B.INPUT_IDS], batch[B.ATTENTION_MASK]) if self.same_tokens else self._render(batch))
        size, pad = self.options.batch_size, self.rm_tokenizer.pad_token_id
        parts = [ops.sequence_scores(self.model, ids[i:i + size].to(self.device), mask[i:i + size].to(self.device),
                                     pad).float().cpu() for i in range(0, len(ids), size)]
        return torch.cat(parts)

    def _render(self, batch: B.Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt messages + response text through the reward model's chat template, right-padded."""
        seqs = []
        for messages, text in zip(batch[B.RAW_PROMPT], batch[B.RESPONSE_TEXT]):
            enc = self.rm_tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": text}],
                                                        tokenize=True)
            seqs.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.rm_tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        return ids, mask
