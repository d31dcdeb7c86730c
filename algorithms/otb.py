"""OTB (arXiv:2602.07078, verl 0.8's ``optimal_token_baseline`` / ``tir_optimal_token_baseline`` estimators): the
reward-to-go minus a per-token group baseline weighted by each path's variance, which needs ``sum_v pi(v)^2`` of the
old policy at every response token: one extra forward pass of the actor per step, only for these algorithms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.base import PolicyGradientConfig, PolicyGradientModule

from rlforge import batch as B
from rlforge.dataflow import DataFlow, Stage, StepContext
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from rlforge.algorithms import functional as F

    from rlforge import ops
else:
    F = lazy_import("rlforge.algorithms.functional")
    ops = lazy_import("rlforge.ops")

SUM_PI_SQUARED = "sum_pi_squared"  # [B, R] sum_v pi_old(v)^2 before each response token (verl's column)
FORWARD_OUTPUT = "forward_output"  # batch.meta key: what forward_responses returns for this call (travels to workers)


@dataclass
class OTBConfig(PolicyGradientConfig):
    handle_zero_tail: bool = True  # a group's unique longest response gets baseline 0 past the second-longest length


class SumPiSquared(Stage):
    """After ``old_logprob``: ``sum_v pi(v)^2`` of the actor's next-token distributions (one forward pass, no
    gradient), for the optimal token baseline."""

    name = "sum_pi_squared"
    requires = frozenset({B.INPUT_IDS, B.ATTENTION_MASK})
    produces = frozenset({SUM_PI_SQUARED})

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        request = B.Batch(batch.tensors, batch.lists, {**batch.meta, FORWARD_OUTPUT: SUM_PI_SQUARED})
        batch[SUM_PI_SQUARED] = ctx.workers.actor.compute_log_probs(request, "actor")
        return batch


class OTB(PolicyGradientModule):
    """Reward-to-go minus the optimal per-token baseline of the prompt's group (path-variance weighted)."""

    config_class = OTBConfig
    group_baseline = True
    preset = {"algorithm": {"name": "otb"}, "rollout": {"n": 8}}

    def flow(self) -> DataFlow:
        flow = super().flow()
        old = next(s for s in flow.stages if B.OLD_LOG_PROBS in s.produces)  # old_logprob, or bypass mode's stage
        return flow.insert_after(old, SumPiSquared())

    def forward_responses(self, model: torch.nn.Module, micro: B.Batch, temperature: float) -> torch.Tensor:
        if micro.meta.get(FORWARD_OUTPUT) == SUM_PI_SQUARED:
            return ops.response_sum_pi_squared(model, micro[B.INPUT_IDS], micro[B.ATTENTION_MASK],
                                               micro[B.RESPONSES].shape[1], temperature,
                                               remove_padding=self.config.model.remove_padding,
                                               multi_modal=micro.lists.get(B.MULTI_MODAL_INPUTS))
        return super().forward_responses(model, micro, temperature)

    def estimator(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """The estimator function (single-turn OTB here)."""
        return F.optimal_token_baseline_advantage

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, self.estimator()(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID], batch[B.OLD_LOG_PROBS],
            batch[SUM_PI_SQUARED], self.is_weights(batch), self.config.algorithm.handle_zero_tail,
        ))


class TIROTB(OTB):
    """OTB for multi-turn tool rollouts: the baseline compares the k-th model token of each response."""

    preset = {"algorithm": {"name": "tir_otb"}, "rollout": {"n": 8}}

    def estimator(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        return F.tir_optimal_token_baseline_advantage


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("otb", OTB)
    registry.algorithm.register("tir_otb", TIROTB)
