"""REINFORCE++ (Hu, 2025, arXiv:2501.03262) and its group-baseline variant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.base import PolicyGradientConfig, PolicyGradientModule

from rlforge import batch as B
from rlforge.config.schema import option
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:

    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")


@dataclass
class ReinforcePPConfig(PolicyGradientConfig):
    gamma: float = option(1.0, ge=0, le=1)  # discount of the returns-to-go


class ReinforcePP(PolicyGradientModule):
    """REINFORCE++: discounted returns-to-go, whitened over the batch; no critic, no groups needed."""

    config_class = ReinforcePPConfig
    preset = {"algorithm": {"name": "reinforce_pp"}, "rollout": {"n": 8}}

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, F.reinforce_pp_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], self.config.algorithm.gamma
        ))


class ReinforcePPBaseline(PolicyGradientModule):
    """REINFORCE++ with a baseline: subtract the group-mean reward, then whiten over the batch."""

    preset = {"algorithm": {"name": "reinforce_pp_baseline"}, "rollout": {"n": 8}}
    group_baseline = True

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, F.reinforce_pp_baseline_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID]
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("reinforce_pp", ReinforcePP)
    registry.algorithm.register("reinforce_pp_baseline", ReinforcePPBaseline)
