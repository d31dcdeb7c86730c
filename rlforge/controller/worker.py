"""ActorWorker: the actor (and reference) model on a strategy; log-probs and the PPO-style update loop.

The same worker class serves the local controller and (later) Ray actors.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from rlforge import batch as B
from rlforge.module import LossContext, RLModule
from rlforge.ops import response_logprobs


class ActorWorker:
    """Owns the module's models on ``strategy`` plus the optimizer and scheduler."""

    def __init__(self, config: Any, module: RLModule, strategy: Any, hook: Any = None, trainer: Any = None) -> None:
        self.config = config
        self.module = module
        self.strategy = strategy
        self.hook = hook
        self.trainer = trainer
        module.actor = strategy.setup_model(module.actor)
        module.actor.train()
        if module.ref is not None:
            module.ref = strategy.setup_model(module.ref)
        self.optimizer, self.scheduler = module.configure_optimizers()
        self.skipped_steps = 0

    @torch.no_grad()
    def compute_log_probs(self, batch: B.Batch, role: str = "actor") -> torch.Tensor:
        """Per-token log-probs of the responses under the actor or the reference model."""
        model = self.module.actor if role == "actor" else self.module.ref
        if model is None:
            raise RuntimeError(f"No {role} model is loaded (does the algorithm need a reference model?)")
        resp_len = batch[B.RESPONSES].shape[1]
        temp = self.config.rollout.temperature
        out = []
        for mb in batch.split(self.config.actor.ppo_micro_batch_size):
            mb = mb.to(self.strategy.device)
            logp, _ = response_logprobs(model, mb[B.INPUT_IDS], mb[B.ATTENTION_MASK], resp_len, temp)
            out.append(logp.cpu())
        return torch.cat(out) * batch[B.RESPONSE_MASK]

    def update(self, batch: B.Batch) -> dict[str, float]:
        """``ppo_epochs`` passes over mini-batches; each mini-batch is one optimizer step."""
        a = self.config.actor
        n = self.config.rollout.n
        mini_size = a.ppo_mini_batch_size * n
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        for _ in range(a.ppo_epochs):
            for mini in batch.split(mini_size):
                metrics = self._optimizer_step(mini)
                for k, v in metrics.items():
                    totals[k] += v
                steps += 1
        if self.scheduler is not None:
            self.scheduler.step()
        out = {k: v / max(steps, 1) for k, v in totals.items()}
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        out["actor/skipped_steps"] = float(self.skipped_steps)
        return out

    def _optimizer_step(self, mini: B.Batch) -> dict[str, float]:
        a = self.config.actor
        ctx = LossContext(
            global_tokens=self.strategy.all_reduce_sum(float(mini[B.RESPONSE_MASK].sum())),
            global_seqs=self.strategy.all_reduce_sum(float(len(mini))),
            temperature=self.config.rollout.temperature,
        )
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        for micro in mini.split(a.ppo_micro_batch_size):
            loss, metrics = self.module.training_step(micro.to(self.strategy.device), ctx)
            self.strategy.backward(loss)
            for k, v in metrics.items():
                sums[k] += v
        grad_norm = self.strategy.clip_grad_norm(self.module.actor.parameters(), a.grad_clip)
        sums["actor/grad_norm"] = grad_norm
        if not math.isfinite(grad_norm):
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
            return dict(sums)
        if self.hook is not None:
            self.hook.rlforge_before_optimizer_step(trainer=self.trainer, module=self.module, optimizer=self.optimizer)
        self.optimizer.step()
        return dict(sums)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.strategy.named_weights(self.module.actor)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
