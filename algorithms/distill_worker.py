"""The ``teacher`` role of on-policy distillation (``algorithms/distill.py``): the frozen teacher on ranks of its own.

Each rank loads the causal LM of ``algorithm.teacher.path`` (unset: ``model.path``), or every teacher of
``algorithm.teacher.routes`` (several teachers: each row goes to the one its ``route_by`` value names), on
``algorithm.teacher.device`` (``auto`` is the GPU the rank was given, else the CPU), and scores its share of the rows
(the ``rows`` dispatch: no collectives, any number of rows). Its own module so that registering ``opd`` (``rlforge
algos``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from rlforge import batch as B
from rlforge import ops
from rlforge.algorithms.distill import TEACHER_LOG_PROBS, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS, TOPK_LOSSES
from rlforge.algorithms.distill_routes import route_value
from rlforge.controller.ray_workers import WorkerProcess
from rlforge.errors import ConfigError, RLForgeError
from rlforge.worker import remote

if TYPE_CHECKING:
    from rlforge.build import Builder
    from rlforge.module import RLModule


class TeacherWorker(WorkerProcess):
    """One rank of the ``teacher`` role: the teacher's log-probs of the sampled response tokens."""

    def build(self, builder: Builder, module: RLModule, engine: bool = True, initial_sync: bool = True) -> None:
        from rlforge.models import frozen_model_device, model_vocab_size, resolve_model_path

        t = self.options = builder.config.algorithm.teacher
        self.device = frozen_model_device(t.device)
        distill = builder.config.algorithm.distill
        policy_vocab = (model_vocab_size(resolve_model_path(builder.config.model.path))  # config.json only
                        if distill.loss_mode in TOPK_LOSSES else None)
        if t.routes:  # several teachers: each row goes to the one its route_by value names
            self.models = {route: self._load(builder, module, path, f"algorithm.teacher.routes.{route}", policy_vocab)
                           for route, path in t.routes.items()}
        else:
            key = "algorithm.teacher.path" if t.path else "model.path"  # unset: the policy's initial weights
            self.models = {None: self._load(builder, module, t.path or builder.config.model.path, key, policy_vocab)}

    def _load(self, builder: Builder, module: RLModule, path: str, key: str,
              policy_vocab: int | None) -> torch.nn.Module:
        """One frozen teacher on this rank's device, after the checks that it reads the policy's tokens."""
        from rlforge.models import load_model, load_tokenizer
        from rlforge.tools.export import model_folder

        t = self.options
        try:
            folder = model_folder(path)
        except RLForgeError as exc:
            raise RLForgeError(f"{key}: {exc}") from None
        teacher_vocab = load_tokenizer(folder, trust_remote_code=t.trust_remote_code, key=key).get_vocab()
        ours = module.tokenizer.get_vocab()
        if teacher_vocab != ours:
            how = (f"{len(teacher_vocab)} vs {len(ours)} tokens" if len(teacher_vocab) != len(ours) else
                   f"the same {len(ours)} tokens with other ids")
            raise ConfigError(f"'{key}' ({path}) has another tokenizer than the policy ({how}): on-policy "
                              f"distillation reads the policy's sampled tokens with the teacher, so both must share "
                              f"one vocabulary.")
        model = load_model(str(folder), t.dtype, t.trust_remote_code, key=key)
        theirs = model.get_output_embeddings().weight.shape[0]
        if policy_vocab is not None and theirs > policy_vocab:  # the teacher's top-k ids index the student's output
            mode = builder.config.algorithm.distill.loss_mode
            raise ConfigError(f"'{key}' ({path}) has an output layer of {theirs} tokens and the "
                              f"policy one of {policy_vocab}: with algorithm.distill.loss_mode={mode} the "
                              f"teacher's top-k ids must be the policy's tokens (same tokenizer, but padded "
                              f"vocabularies differ). Use an estimator loss (k3, ...) or a teacher of the policy's "
                              f"vocabulary size.")
        return model.requires_grad_(False).eval().to(self.device)

    def _routed(self, batch: B.Batch) -> list[tuple[torch.nn.Module, list[int]]]:
        """``(teacher, rows)`` for every teacher with rows in ``batch`` (one teacher: all rows; the driver checked
        that every row has a route, ``distill_routes.check_batch_routes``)."""
        if None in self.models:
            return [(self.models[None], list(range(len(batch))))]
        values = [route_value(source, info, self.options.route_by)
                  for source, info in zip(batch[B.DATA_SOURCE], batch[B.EXTRA_INFO])]
        groups = [(model, [i for i, v in enumerate(values) if v == route]) for route, model in self.models.items()]
        return [(model, rows) for model, rows in groups if rows]

    def _per_teacher(self, batch: B.Batch, score: Callable[[torch.nn.Module, B.Batch], B.Batch]) -> B.Batch:
        """``score(teacher, rows)`` for each teacher's rows of ``batch``, put back in the batch's row order, in
        sub-batches of ``algorithm.teacher.batch_size``."""
        size, parts, order = self.options.batch_size, [], []
        for model, rows in self._routed(batch):
            part = batch.select(rows)
            parts += [score(model, sub) for sub in part.split(size)]
            order += rows
        out = B.Batch.concat(parts)
        return out if order == sorted(order) else out.select(torch.as_tensor(order).argsort())

    @remote("rows", "concat")
    @torch.no_grad()
    def teacher_log_probs(self, batch: B.Batch) -> torch.Tensor:
        """The teacher's log-probs (temperature 1) of each row's response tokens [B, R] in fp32, 0 at padding; in
        batches of ``algorithm.teacher.batch_size``."""
        width = batch[B.RESPONSES].shape[1]

        def score(model: torch.nn.Module, part: B.Batch) -> B.Batch:
            mm = part[B.MULTI_MODAL_INPUTS] if B.MULTI_MODAL_INPUTS in part else None
            return B.Batch({TEACHER_LOG_PROBS: ops.response_logprobs(
                model, part[B.INPUT_IDS].to(self.device), part[B.ATTENTION_MASK].to(self.device), width,
                multi_modal=mm)[0].float().cpu()})

        return self._per_teacher(batch, score)[TEACHER_LOG_PROBS]

    @remote("rows", "concat")
    @torch.no_grad()
    def teacher_topk(self, batch: B.Batch, k: int) -> B.Batch:
        """The teacher's log-probs (temperature 1, fp32) of its ``k`` most likely tokens at each response position
        and their ids, [B, R, k] (``TEACHER_TOPK_LOG_PROBS``, ``TEACHER_TOPK_IDS``), and of the sampled tokens [B, R]
        (``TEACHER_LOG_PROBS``, 0 at padding); in batches of ``algorithm.teacher.batch_size``. ``k`` is at most the
        smallest teacher vocabulary (every row gets as many)."""
        width = batch[B.RESPONSES].shape[1]
        k = min(k, *(m.get_output_embeddings().weight.shape[0] for m in self.models.values()))

        def score(model: torch.nn.Module, part: B.Batch) -> B.Batch:
            mask = part[B.ATTENTION_MASK].to(self.device)
            logits = ops.response_logits(model, part[B.INPUT_IDS].to(self.device), mask, width)
            log_probs = torch.log_softmax(logits.float(), dim=-1)
            top = log_probs.topk(k, dim=-1)
            sampled = log_probs.gather(-1, part[B.RESPONSES][:, :, None].to(self.device)).squeeze(-1)
            resp = mask[:, -width:]
            return B.Batch({TEACHER_LOG_PROBS: (sampled * resp).cpu(),
                            TEACHER_TOPK_LOG_PROBS: (top.values * resp[..., None]).cpu(),
                            TEACHER_TOPK_IDS: top.indices.cpu()})

        return self._per_teacher(batch, score)
