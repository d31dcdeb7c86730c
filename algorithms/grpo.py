"""GRPO: group-relative advantages (Shao et al., 2024, DeepSeekMath), clipped policy loss, optional KL loss."""

from __future__ import annotations

from dataclasses import dataclass

from rlforge import batch as B
from rlforge.config.schema import AlgorithmConfig
from rlforge.hookspecs import hookimpl

from rlforge.algorithms import functional as F
from rlforge.algorithms.base import PolicyGradientModule


@dataclass
class GRPOConfig(AlgorithmConfig):
    norm_adv_by_std: bool = True  # divide by the group std (False: Dr. GRPO-style mean-centering only)
    epsilon: float = 1e-6  # added to the group std


class GRPO(PolicyGradientModule):
    """Group Relative Policy Optimization: n samples per prompt, advantage = group-normalized reward."""

    config_class = GRPOConfig
    preset = {"algorithm": {"name": "grpo"}, "rollout": {"n": 8}}

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        adv, ret = F.grpo_outcome_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID], cfg.norm_adv_by_std, cfg.epsilon
        )
        batch[B.ADVANTAGES] = adv
        batch[B.RETURNS] = ret
        return batch


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("grpo", GRPO)
