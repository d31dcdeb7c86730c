"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"): sequence-level ratio and clipping."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.algorithms.grpo import GRPO

from rlforge import batch as B
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")


class GSPO(GRPO):
    """GRPO advantages with the importance ratio of the whole sequence (length-normalized) clipped."""

    preset = {
        "algorithm": {"name": "gspo"},
        "rollout": {"n": 8},
        "actor": {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4, "loss_agg_mode": "seq-mean-token-mean"},
    }

    def pg_loss_matrix(
        self, batch: B.Batch, log_probs: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        a = self.config.actor
        return F.gspo_policy_loss(
            log_probs, batch[B.OLD_LOG_PROBS], batch[B.ADVANTAGES], mask, a.clip_ratio_low, a.clip_ratio_high,
            self.is_weights(batch),
        )


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("gspo", GSPO)
