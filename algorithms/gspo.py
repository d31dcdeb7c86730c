"""GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization"): sequence-level ratio and clipping."""

from __future__ import annotations

from rlforge.algorithms.grpo import GRPO

from rlforge.hookspecs import hookimpl


class GSPO(GRPO):
    """GRPO advantages with the importance ratio of the whole sequence (length-normalized) clipped."""

    preset = {
        "algorithm": {"name": "gspo"},
        "rollout": {"n": 8},
        "actor": {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4,
                  "loss_agg_mode": "seq-mean-token-mean"},
    }


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("gspo", GSPO)
