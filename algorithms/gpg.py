"""GPG (Chu et al., 2025, "Group Policy Gradient"): a plain policy-gradient loss with a rescaled group baseline."""

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
class GPGConfig(PolicyGradientConfig):
    f_norm: float = option(1.0, gt=0)  # divides the advantage
    alpha: float = option(1.0, gt=0)  # multiplies the batch-size / non-zero-reward count factor


class GPG(PolicyGradientModule):
    """No ratio, no clipping: loss = -log pi(a) * A, A = alpha * (B / M) * (r - group mean) / f_norm."""

    config_class = GPGConfig
    group_baseline = True
    preset = {"algorithm": {"name": "gpg"}, "rollout": {"n": 8}, "actor": {"policy_loss": "gpg"}}

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        return self.set_advantages(batch, F.gpg_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID], cfg.f_norm, cfg.alpha
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("gpg", GPG)
