"""The SFT LightningModule: token-mean cross-entropy on the trained tokens, AdamW, the ``sft.lr_scheduler`` schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from rlforge import lora, lr_schedule
from rlforge.models import adapter_folder, build_char_tokenizer, build_tiny_llama, load_model, load_tokenizer

IGNORE = -100  # label of positions out of the loss
FRESH_TINY = "tiny-arith"  # sft.init value: a freshly initialised tiny char-level Llama


def _pretrained_tokenizer(config: DictConfig) -> Any:
    return load_tokenizer(config.sft.init, config.model.trust_remote_code, "sft.init", config.model.chat_template)


def _fresh_tokenizer(config: DictConfig) -> Any:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = config.model.chat_template or tokenizer.chat_template
    return tokenizer


def _pretrained_model(config: DictConfig, tokenizer: Any) -> torch.nn.Module:
    """``sft.init`` in fp32 (Lightning applies the precision); a LoRA adapter folder: merged into its base, or with
    ``model.lora.*`` its base with the adapter going on training (as ``rlforge fit``'s actor)."""
    if not lora.enabled(config):
        return load_model(config.sft.init, "float32", config.model.trust_remote_code)
    base = load_model(config.sft.init, "float32", config.model.trust_remote_code, with_adapter=False)
    return lora.wrap(base, config, adapter_folder(config.sft.init, "sft.init"), "sft.init")


# sft.init -> (tokenizer factory, model factory); any other value is a model folder or builtin:NAME
INITS: dict[str, tuple[Callable[[DictConfig], Any], Callable[[DictConfig, Any], torch.nn.Module]]] = {
    FRESH_TINY: (_fresh_tokenizer, lambda config, tokenizer: build_tiny_llama(tokenizer)),
}
PRETRAINED = (_pretrained_tokenizer, _pretrained_model)


def build_tokenizer(config: DictConfig) -> Any:
    """The tokenizer of ``sft.init`` (read before the model, so that the data is checked before a model loads), with
    ``model.chat_template`` in place of its own chat template when that is set."""
    return INITS.get(config.sft.init, PRETRAINED)[0](config)


def build_model(config: DictConfig, tokenizer: Any) -> torch.nn.Module:
    """The model SFT starts from (``sft.init``): a fresh tiny Llama for ``tiny-arith``, else an HF folder or
    ``builtin:NAME``. The model options shared with RL apply: ``model.trust_remote_code``, ``model.lora.*``
    (adapters on it), and ``model.precision`` (given to Lightning's Trainer)."""
    model = INITS.get(config.sft.init, PRETRAINED)[1](config, tokenizer)
    return lora.wrap(model, config) if lora.enabled(config) and not lora.is_lora(model) else model


def packed_token_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], sp: Any
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_loss` with Ulysses sequence parallelism: the micro-batch's rows (right-padded) packed into one row,
    run over the devices of ``sp`` (``ulysses.SequenceParallel``), each on its slice; every device gets the whole
    result."""
    lengths = batch["attention_mask"].sum(1).tolist()
    ids = torch.cat([row[:n] for row, n in zip(batch["input_ids"], lengths)])[None]
    positions = torch.cat([torch.arange(n, device=ids.device) for n in lengths])[None]
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()[:-1]]
    # the positions whose next token is trained (the label of position p is token p + 1, as in token_loss)
    before = torch.cat([start + torch.nonzero(mask[1:n]).flatten()
                        for start, mask, n in zip(starts, batch["loss_mask"], lengths)])
    (nll,) = sp.packed_outputs(model, ids, positions, before,
                               lambda logits, labels: (F.cross_entropy(logits.float(), labels, reduction="none"),))
    return nll.sum(), batch["loss_mask"][:, 1:].sum()


def token_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the trained tokens' negative log-likelihoods, number of trained tokens) of a padded batch."""
    ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:]
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False).logits
    labels = ids[:, 1:].masked_fill(mask == 0, IGNORE)
    total = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE,
                            reduction="sum")
    return total, mask.sum()


class SFTModule(L.LightningModule):
    """Trains ``model`` on micro-batches from ``rlforge.sft.data``.

    A micro-batch's loss is its summed token loss over the trained tokens of the whole global batch
    (``num_tokens``), times ``ranks * accumulation`` to undo Lightning's division by the accumulation and the
    ranks' gradient averaging: each optimizer step follows the token mean over the global batch, however the
    batch is split over devices and micro-batches.

    With ``sft.sequence_parallel_size`` > 1 (Ulysses, ``rlforge.ulysses``) the devices of a
    data-parallel group share each micro-batch, packed: the parameter gradients of a group's devices sum to the
    one-device gradient, so the loss is scaled by all the devices (``ranks``) as well.
    """

    def __init__(self, model: torch.nn.Module, s: DictConfig, ranks: int) -> None:
        super().__init__()
        self.model = model.train()  # from_pretrained returns a model in eval mode
        self.s = s
        self.ranks = ranks
        self.sp: Any = None  # this device's ulysses.SequenceParallel, with sft.sequence_parallel_size > 1
        self._step_loss = torch.zeros(())
        self._val = torch.zeros(2)

    def setup(self, stage: str) -> None:
        size = int(self.s.sequence_parallel_size)
        if size > 1 and self.sp is None:
            from rlforge import ulysses

            grid = ulysses.sequence_parallel_mesh(self.trainer.strategy.root_device.type, self.trainer.world_size, size)
            self.sp = ulysses.use_ulysses(self.model, ulysses.from_mesh(grid), "sft.sequence_parallel_size")

    def on_train_start(self) -> None:
        """After a checkpoint has loaded: the optimizer follows this run's config, not the values the checkpoint's
        optimizer and schedule hold (``sft.lr``, ``weight_decay`` and ``betas`` where ``sft.resume_force`` continued
        with other ones), and the rate of the next step is that of this run's schedule: a run continued with a larger
        ``sft.steps`` goes on along the schedule over the new length from the step it reached (without this the first
        step after the resume ran at the old schedule's rate). On a fresh run nothing changes."""
        s = self.s
        for config in self.trainer.lr_scheduler_configs:
            sched: Any = config.scheduler  # a LambdaLR (rlforge.lr_schedule)
            sched.base_lrs = [float(s.lr)] * len(sched.base_lrs)
            for group in sched.optimizer.param_groups:
                group.update(initial_lr=float(s.lr), weight_decay=s.weight_decay,
                             betas=(float(s.betas[0]), float(s.betas[1])))
            lr_schedule.continue_at_step(sched)

    def _loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return token_loss(self.model, batch) if self.sp is None else packed_token_loss(self.model, batch, self.sp)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        total, _ = self._loss(batch)
        share = total / batch["num_tokens"].clamp(min=1)
        self._step_loss = self._step_loss.to(share.device) + share.detach().float()
        accumulation = self.trainer.accumulate_grad_batches
        if (batch_idx + 1) % accumulation == 0:
            # every device of a sequence-parallel group holds its group's share
            loss = self.trainer.strategy.reduce(self._step_loss, reduce_op="sum") / int(self.s.sequence_parallel_size)
            self.log("train/loss", loss, prog_bar=True, batch_size=1)
            self.log("train/lr", self.lr_schedulers().get_last_lr()[0], batch_size=1)  # type: ignore[union-attr]
            self._step_loss = torch.zeros((), device=share.device)
        return share * self.ranks * accumulation

    def on_validation_epoch_start(self) -> None:
        self._val = torch.zeros(2, device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        total, count = self._loss(batch)  # a sequence-parallel group's devices add the same: the ratio is kept
        self._val += torch.stack([total.float(), count.float()])

    def on_validation_epoch_end(self) -> None:
        total, count = self.trainer.strategy.reduce(self._val, reduce_op="sum").tolist()
        self.log("val/loss", total / max(count, 1.0), prog_bar=True, rank_zero_only=True)

    def configure_optimizers(self) -> dict[str, Any]:
        s = self.s
        opt = torch.optim.AdamW(lora.trainable_parameters(self.model), lr=s.lr, weight_decay=s.weight_decay,
                                betas=(float(s.betas[0]), float(s.betas[1])))
        sched = lr_schedule.build(opt, s, s.steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
