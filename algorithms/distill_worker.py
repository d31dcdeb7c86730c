"""The ``teacher`` role of on-policy distillation (``algorithms/distill.py``): the frozen teacher on ranks of its own.

Each rank loads the causal LM of ``algorithm.teacher.path`` (unset: ``model.path``; on ``algorithm.teacher.device``: ``auto`` is the GPU the
rank was given, else the CPU) and scores its share of the rows (the ``rows`` dispatch: no collectives, any number of
rows). Its own module so that registering ``opd`` (``rlforge algos``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlforge import batch as B
from rlforge import ops
from rlforge.algorithms.distill import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS, TOPK_LOSSES
from rlforge.controller.ray_workers import WorkerProcess
from rlforge.errors import ConfigError, RLForgeError
from rlforge.worker import remote

if TYPE_CHECKING:
    from rlforge.build import Builder
    from rlforge.module import RLModule


class TeacherWorker(WorkerProcess):
    """One rank of the ``teacher`` role: the teacher's log-probs of the sampled response tokens."""

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        from rlforge.models import (
            frozen_model_device,
            load_model,
            load_tokenizer,
            model_vocab_size,
            resolve_model_path,
        )
        from rlforge.tools.export import model_folder

        t = self.options = builder.config.algorithm.teacher
        path = t.path or builder.config.model.path  # unset: the policy's initial weights
        key = "algorithm.teacher.path" if t.path else "model.path"
        try:
            folder = model_folder(path)
        except RLForgeError as exc:
            raise RLForgeError(f"{key}: {exc}") from None
        teacher_vocab = load_tokenizer(folder, trust_remote_code=t.trust_remote_code,
                                       key=key).get_vocab()
        if teacher_vocab != module.tokenizer.get_vocab():
            raise ConfigError(f"'algorithm.teacher.path' ({path}) has another tokenizer than the policy "
                              f"({len(teacher_vocab)} vs {len(module.tokenizer.get_vocab())} tokens, or the same "
                              f"number with other ids): on-policy distillation reads the policy's sampled tokens "
                              f"with the teacher, so both must share one vocabulary.")
        self.device = frozen_model_device(t.device)
        model = load_model(str(folder), t.dtype, t.trust_remote_code, key=key)
        distill = builder.config.algorithm.distill
        if distill.loss_mode in TOPK_LOSSES:  # the teacher's top-k ids index the student's output
            ours = model_vocab_size(resolve_model_path(builder.config.model.path))  # config.json only
            theirs = model.get_output_embeddings().weight.shape[0]
            if ours is not None and theirs > ours:
                raise ConfigError(f"'algorithm.teacher.path' ({path}) has an output layer of {theirs} tokens and the "
                                  f"policy one of {ours}: with algorithm.distill.loss_mode={distill.loss_mode} the "
                                  f"teacher's top-k ids must be the policy's tokens (same tokenizer, but padded "
                                  f"vocabularies differ). Use an estimator loss (k3, ...) or a teacher of the policy's "
                                  f"vocabulary size.")
        self.model = model.requires_grad_(False).eval().to(self.device)

    @remote("rows", "concat")
    @torch.no_grad()
    def teacher_log_probs(self, batch: B.Batch) -> torch.Tensor:
        """The teacher's log-probs (temperature 1) of each row's response tokens [B, R] in fp32, 0 at padding; in
        batches of ``algorithm.teacher.batch_size``."""
        ids, mask, width = batch[B.INPUT_IDS], batch[B.ATTENTION_MASK], batch[B.RESPONSES].shape[1]
        size = self.options.batch_size
        mm = batch[B.MULTI_MODAL_INPUTS] if B.MULTI_MODAL_INPUTS in batch else None
        parts = [ops.response_logprobs(self.model, ids[i:i + size].to(self.device), mask[i:i + size].to(self.device),
                                       width, multi_modal=None if mm is None else mm[i:i + size])[0].float().cpu()
                 for i in range(0, len(ids), size)]
        return torch.cat(parts)

    @remote("rows", "concat")
    @torch.no_grad()
    def teacher_topk(self, batch: B.Batch, k: int) -> B.Batch:
        """The teacher's log-probs (temperature 1, fp32) of its ``k`` most likely tokens at each response position
        and their ids, [B, R, k] (``TEACHER_TOPK_LOG_PROBS``, ``TEACHER_TOPK_IDS``), and of the sampled tokens [B, R]
        (``TEACHER_LOG_PROBS``, 0 at padding); in batches of ``algorithm.teacher.batch_size``."""
        ids, mask, width = batch[B.INPUT_IDS], batch[B.ATTENTION_MASK], batch[B.RESPONSES].shape[1]
        size, parts = self.options.batch_size, []
        for i in range(0, len(ids), size):
            logits = ops.response_logits(self.model, ids[i:i + size].to(self.device), mask[i:i + size].to(self.device),
                                         width)
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            top = log_probs.topk(min(k, log_probs.shape[-1]), dim=-1)
            sampled = log_probs.gather(-1, batch[B.RESPONSES][i:i + size, :, None].to(self.device)).squeeze(-1)
            resp = mask[i:i + size, -width:].to(self.device)
            parts.append(B.Batch({TEACHER_LOG_PROBS: (sampled * resp).cpu(),
                                  TEACHER_TOPK_LOG_PROBS: (top.values * resp[..., None]).cpu(),
                                  TEACHER_TOPK_IDS: top.indices.cpu()}))
        return B.Batch.concat(parts)
