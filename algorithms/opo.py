"""OPO (Hao et al., 2025, "On-Policy RL with Optimal Reward Baseline"): length-weighted group baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.algorithms.base import PolicyGradientModule

from rlforge import batch as B
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:

    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")


class OPO(PolicyGradientModule):
    """Advantage = reward minus the group's length-weighted mean reward; one optimizer step per batch."""

    # strictly on-policy as in the paper: the whole batch is one mini-batch
    preset = {"algorithm": {"name": "opo"}, "rollout": {"n": 8}, "actor": {"ppo_mini_batch_size": 32}}
    group_baseline = True

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, F.opo_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID]
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("opo", OPO)
