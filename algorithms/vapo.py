"""VAPO (Yue et al., "VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks",
arXiv:2504.05118): PPO with a critic and seven changes, each an option here, all on in the preset:

1. value pretraining: ``trainer.critic_warmup`` steps train only the critic on rollouts of the initial policy;
2. decoupled GAE: the critic's targets with ``lam_critic`` (1.0: Monte-Carlo returns), the policy's advantages with
   ``lam_policy``;
3. length-adaptive GAE: ``lam_policy = 1 - 1 / (lam_alpha * length)`` per response;
4. token-level loss (``actor.loss_agg_mode=token-mean``); 5. clip-higher (``actor.clip_ratio_high=0.28``);
6. the positive-example LM loss: ``pos_lm_coef`` x the NLL of the correct responses;
7. group sampling (``rollout.n``).

verl has no VAPO (its README announces it; no code). docs/algorithms/vapo.md has the formulas and the choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from rlforge.algorithms.base import PolicyGradientConfig
from rlforge.algorithms.ppo import PPO

from rlforge import batch as B
from rlforge.config.schema import option
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.module import LossContext

if TYPE_CHECKING:
    import torch
    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")

POS_LM_WEIGHT = "pos_lm_weight"  # [B] the weight of each row's NLL in the positive-example LM loss


@dataclass
class VAPOConfig(PolicyGradientConfig):
    gamma: float = option(1.0, ge=0, le=1)  # discount factor
    lam_critic: float = option(1.0, ge=0, le=1)  # GAE lambda of the critic's targets (1.0: reward-to-go, unbiased)
    lam_policy: float = option(0.95, ge=0, le=1)  # GAE lambda of the policy's advantages when lam_alpha is null
    lam_alpha: Optional[float] = option(0.05, gt=0)  # length-adaptive lambda_policy = 1 - 1/(lam_alpha x length), clamped at 0; null = lam_policy for every response
    pos_lm_coef: float = option(0.1, ge=0)  # mu: weight of the NLL of the correct responses (acc) in the actor loss; 0 = off


class VAPO(PPO):
    """Value-augmented PPO: decoupled, length-adaptive GAE, critic warm-up, clip-higher, LM loss on correct answers."""

    config_class = VAPOConfig
    preset = {
        "algorithm": {"name": "vapo", "lam_critic": 1.0, "lam_policy": 0.95, "lam_alpha": 0.05, "pos_lm_coef": 0.1},
        "rollout": {"n": 8},
        "actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean"},
        "trainer": {"critic_warmup": 5},
    }

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        mask = batch[B.RESPONSE_MASK]
        lam_policy = cfg.lam_policy if cfg.lam_alpha is None else F.length_adaptive_lambda(mask, cfg.lam_alpha)
        self.set_advantages(batch, F.decoupled_gae_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.VALUES], mask, cfg.gamma, cfg.lam_critic, lam_policy))
        if cfg.pos_lm_coef:
            positive = batch[B.ACC] > 0.5 if B.ACC in batch else batch[B.SCORES] >= 1
            rows = self.config.actor.ppo_mini_batch_size * self.config.rollout.n
            batch[POS_LM_WEIGHT] = F.positive_lm_weights(positive, mask, rows)
        return batch

    def policy_loss(
        self, batch: B.Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().policy_loss(batch, log_probs, entropy, ctx)
        coef = self.config.algorithm.pos_lm_coef
        if coef and POS_LM_WEIGHT in batch:
            nll = F.positive_lm_loss(log_probs, batch[B.RESPONSE_MASK], batch[POS_LM_WEIGHT])
            loss = loss + coef * nll
            metrics["actor/pos_lm_loss"] = nll.item()
        return loss, metrics


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("vapo", VAPO)
