"""PPO (Schulman et al., 2017; Ouyang et al., 2022): a critic, GAE advantages and a clipped value loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rlforge.algorithms.base import PolicyGradientConfig, PolicyGradientModule

from rlforge import batch as B
from rlforge.config.batches import check_batch_sizes
from rlforge.config.schema import option
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.module import LossContext

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")


@dataclass
class PPOConfig(PolicyGradientConfig):
    gamma: float = option(1.0, ge=0, le=1)  # discount factor
    lam: float = option(1.0, ge=0, le=1)  # GAE lambda


class PPO(PolicyGradientModule):
    """Proximal Policy Optimization with a learned value function and GAE."""

    config_class: ClassVar[type[PolicyGradientConfig]] = PPOConfig  # VAPO brings its own, not a PPOConfig
    preset = {"algorithm": {"name": "ppo"}}

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        check_batch_sizes(config, "critic")
        if config.critic.loss_agg_mode not in F.LOSS_AGG_MODES:
            raise ConfigError(
                f"'critic.loss_agg_mode' is '{config.critic.loss_agg_mode}'. Allowed: {', '.join(F.LOSS_AGG_MODES)}."
            )

    def needs_critic(self) -> bool:
        return True

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        return self.set_advantages(batch, F.gae_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.VALUES], batch[B.RESPONSE_MASK], cfg.gamma, cfg.lam
        ))

    def value_loss(
        self, batch: B.Batch, values: torch.Tensor, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config.critic
        mask = batch[B.RESPONSE_MASK].to(values.dtype)
        loss, clipfrac = F.value_loss(
            values, batch[B.RETURNS], batch[B.VALUES], mask, c.cliprange_value, c.loss_agg_mode,
            ctx.global_tokens, ctx.global_seqs,
        )
        vpred = F.agg_loss(values.detach(), mask, "token-mean", ctx.global_tokens, ctx.global_seqs)
        return loss, {"critic/vf_loss": loss.item(), "critic/vf_clipfrac": float(clipfrac),
                      "critic/vpred_mean": vpred.item()}


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("ppo", PPO)
