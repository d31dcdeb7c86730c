"""GRPO (Shao et al., 2024, DeepSeekMath) and Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training")."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.base import PolicyGradientConfig, PolicyGradientModule

from rlforge import batch as B
from rlforge.config.schema import option
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")

log = logging.getLogger("rlforge")


@dataclass
class GRPOConfig(PolicyGradientConfig):
    norm_adv_by_std: bool = True  # divide by the group std (False: Dr. GRPO-style mean-centering only)
    epsilon: float = option(1e-6, gt=0)  # added to the group std
    std_scope: str = option("group", choices=("group", "batch"))  # the std that divides r - mean_group: group (GRPO) | batch (one std of the step's sequence rewards: TRL's scale_rewards="batch", the group-mean / batch-std of "Tricks or Traps", arXiv:2508.08221)


class GRPO(PolicyGradientModule):
    """Group Relative Policy Optimization: n samples per prompt, advantage = group-normalized reward."""

    config_class = GRPOConfig
    group_baseline = True
    preset = {"algorithm": {"name": "grpo"}, "rollout": {"n": 8}}

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        alg = config.algorithm
        if alg.epsilon >= 0.01 and alg.norm_adv_by_std:
            log.warning("algorithm.epsilon=%g is added to the std of the rewards the advantages are divided by (1e-6 "
                        "by default): a large one flattens them. TRL's epsilon, the clip range, is "
                        "actor.clip_ratio_low.", alg.epsilon)
        if alg.std_scope == "batch" and not alg.norm_adv_by_std:
            raise ConfigError("'algorithm.std_scope=batch' chooses the std that divides the advantages, and "
                              "'algorithm.norm_adv_by_std=false' divides by none"
                              + (" (the dr_grpo preset sets it)" if alg.name == "dr_grpo" else "")
                              + ": set one of them (TRL's scale_rewards='batch' is std_scope=batch, 'none' is "
                              "norm_adv_by_std=false).")

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        return self.set_advantages(batch, F.grpo_outcome_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID], cfg.norm_adv_by_std, cfg.epsilon,
            cfg.std_scope,
        ))


class DrGRPO(GRPO):
    """Dr. GRPO: GRPO without the std division and with a constant-length sequence loss (no length bias)."""

    preset = {
        "algorithm": {"name": "dr_grpo", "norm_adv_by_std": False},
        "rollout": {"n": 8},
        "actor": {"loss_agg_mode": "seq-mean-token-sum-norm"},
    }


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("grpo", GRPO)
    registry.algorithm.register("dr_grpo", DrGRPO)
