"""DAPO (Yu et al., 2025, arXiv:2503.14476): GRPO with clip-higher, token-level loss, dynamic sampling and
overlong reward shaping. The last two are hooks (algorithms/shaping.py) any algorithm can turn on."""

from __future__ import annotations

from rlforge.algorithms.grpo import GRPO

from rlforge.hookspecs import hookimpl


class DAPO(GRPO):
    """Decoupled clip and dynamic sampling: clip-higher, token-mean loss, uniform groups resampled."""

    preset = {
        "algorithm": {"name": "dapo", "filter_groups": True, "max_gen_batches": 4, "overlong_buffer": 2,
                      "overlong_penalty": 1.0},
        "rollout": {"n": 8},
        "actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean"},
    }


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("dapo", DAPO)
