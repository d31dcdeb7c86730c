"""RLOO (Ahmadian et al., 2024, "Back to Basics"): REINFORCE with a leave-one-out group baseline."""

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


class RLOO(PolicyGradientModule):
    """Advantage = own reward minus the mean reward of the other samples of the same prompt."""

    preset = {"algorithm": {"name": "rloo"}, "rollout": {"n": 8}}
    group_baseline = True

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, F.rloo_outcome_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID]
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("rloo", RLOO)
