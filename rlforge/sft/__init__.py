"""Supervised fine-tuning on Lightning: ``rlforge sft`` (docs/sft.md).

- ``formats``: SFT rows (verl's prompt/response and ``messages``, TRL's ``text`` and prompt/completion) -> token ids and
  a loss mask
- ``data``: rows -> examples -> step-indexed micro-batches (exact resume without sampler state)
- ``module``: the LightningModule (token-mean loss, AdamW, warm-up + cosine decay) and model creation
- ``accuracy``: greedy accuracy on the validation split of ``data.name``
- ``outputs``: loggers, checkpoints and the final Hugging Face folder
- ``record``: what a checkpoint records of its run (config, data fingerprint), and the check that a resume continues
  the same training
- ``run``: ``run_sft(config, plugins)``, which builds the Lightning Trainer from ``sft.*`` and fits
"""

from __future__ import annotations

from rlforge.sft.module import SFTModule, build_model, build_tokenizer
from rlforge.sft.run import run_sft

__all__ = ["SFTModule", "build_model", "build_tokenizer", "run_sft"]
