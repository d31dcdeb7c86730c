"""PolicyGradientModule: the clipped policy loss with KL and entropy terms that PPO-family algorithms share."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from rlforge import batch as B
from rlforge.errors import ConfigError
from rlforge.module import LossContext, RLModule

from rlforge.algorithms import functional as F


class PolicyGradientModule(RLModule):
    """Clipped surrogate (dual-clip) + optional KL loss to the reference + entropy bonus.

    Subclasses implement ``compute_advantages``; the loss aggregation follows ``actor.loss_agg_mode``.
    """

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        a = config.actor
        if a.loss_agg_mode not in F.LOSS_AGG_MODES:
            raise ConfigError(
                f"'actor.loss_agg_mode' is '{a.loss_agg_mode}'. Allowed: {', '.join(F.LOSS_AGG_MODES)}."
            )
        kl_types = F.KL_ESTIMATORS + tuple(e + "+" for e in F.KL_ESTIMATORS)
        if a.kl_loss_type not in kl_types:
            raise ConfigError(f"'actor.kl_loss_type' is '{a.kl_loss_type}'. Allowed: {', '.join(kl_types)}.")
        if a.clip_ratio_c <= 1.0:
            raise ConfigError(f"'actor.clip_ratio_c' must be > 1.0 (dual-clip), got {a.clip_ratio_c}.")

    def policy_loss(
        self, batch: B.Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        a = self.config.actor
        mask = batch[B.RESPONSE_MASK].to(log_probs.dtype)

        def agg(mat: torch.Tensor, mode: str = a.loss_agg_mode) -> torch.Tensor:
            return F.agg_loss(mat, mask, mode, ctx.global_tokens, ctx.global_seqs)

        pg_mat, stats = F.clipped_policy_loss(
            log_probs, batch[B.OLD_LOG_PROBS], batch[B.ADVANTAGES], mask,
            a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c,
        )
        pg_loss = agg(pg_mat)
        loss = pg_loss
        metrics = {
            "actor/pg_loss": pg_loss.item(),
            "actor/pg_clipfrac": agg(stats["clipped"], "token-mean").item(),
            "actor/pg_clipfrac_lower": agg(stats["clipped_lower"], "token-mean").item(),
            "actor/ppo_kl": agg(stats["neg_log_ratio"], "token-mean").item(),
        }
        if entropy is not None:
            ent = agg(entropy)
            metrics["actor/entropy"] = agg(entropy.detach(), "token-mean").item()
            if a.entropy_coeff:
                loss = loss - a.entropy_coeff * ent
        if a.use_kl_loss:
            kl = agg(F.kl_penalty(log_probs, batch[B.REF_LOG_PROBS], a.kl_loss_type))
            loss = loss + a.kl_loss_coef * kl
            metrics["actor/kl_loss"] = kl.item()
        return loss, metrics
