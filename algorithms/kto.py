"""KTO (Ethayarajh et al., 2024): unpaired desirable / undesirable completions against a reference model.

Rows are ``prompt``, ``completion``, ``label`` (pairs are split into one desirable and one undesirable
example). Each batch row is one example (``rollout.n=1``). The reference point ``z0`` comes from mismatched
pairs: every prompt of the batch with the next example's completion (TRL's shift), scored by the policy
and the reference model in the ``kto_reference_point`` stage, once per training batch and before the update
(TRL recomputes it per micro-batch with the current policy; both are estimates without gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.offline import PreferenceConfig, PreferenceModule, example_sums, sequence_sums

from rlforge import batch as B
from rlforge.dataflow import Stage, StepContext
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import preference as P

    from rlforge.protocols import Controller
else:
    torch = lazy_import("torch")
    P = lazy_import("rlforge.algorithms.preference")

KTO_KL = "kto_kl"  # [B] the batch's reference point z0 (the same value on every row)


@dataclass
class KTOConfig(PreferenceConfig):
    desirable_weight: float = 1.0  # lambda_D: weight of the desirable examples' losses
    undesirable_weight: float = 1.0  # lambda_U: weight of the undesirable examples' losses


def mismatched(batch: B.Batch) -> B.Batch:
    """Each prompt with the next row's completion (the last with the first): the pairs of KTO's reference point."""
    shift = torch.roll(torch.arange(len(batch)), -1)
    responses, mask = batch[B.RESPONSES][shift], batch[B.RESPONSE_MASK][shift]
    return B.Batch({
        B.PROMPTS: batch[B.PROMPTS], B.PROMPT_MASK: batch[B.PROMPT_MASK], B.RESPONSES: responses,
        B.RESPONSE_MASK: mask, B.INPUT_IDS: torch.cat([batch[B.PROMPTS], responses], 1),
        B.ATTENTION_MASK: torch.cat([batch[B.PROMPT_MASK], mask], 1),
    })


def reference_point(controller: Controller, batch: B.Batch) -> torch.Tensor:
    """``z0`` of ``batch`` (0-d): ``kto_kl_estimate`` over its mismatched pairs, under the current policy."""
    pairs = mismatched(batch)
    mask = pairs[B.RESPONSE_MASK]
    policy = (controller.workers.actor.compute_log_probs(pairs, "actor") * mask).sum(-1)
    ref = (controller.workers.actor.compute_log_probs(pairs, "ref") * mask).sum(-1)
    return P.kto_kl_estimate(policy, ref)


class KTOReferencePoint(Stage):
    """Writes ``kto_kl`` (the batch's ``z0``) and logs it as ``kl``, as TRL does."""

    name = "kto_reference_point"
    requires = frozenset({B.RESPONSES, B.RESPONSE_MASK, B.PROMPTS, B.PROMPT_MASK})
    produces = frozenset({KTO_KL})

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        z0 = reference_point(ctx.controller, batch)
        batch[KTO_KL] = z0.expand(len(batch)).clone()
        ctx.log({"kl": float(z0)})
        return batch


class KTO(PreferenceModule):
    """KTO: unpaired binary feedback; a prospect-theory loss around the reference point z0."""

    config_class = KTOConfig
    preset = {"rollout": {"n": 1}, "data": {"name": "arith_pairs"}, "algorithm": {"name": "kto"}}
    paired = False

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        a = config.algorithm
        if a.desirable_weight < 0 or a.undesirable_weight < 0:
            raise ConfigError(f"'algorithm.desirable_weight' ({a.desirable_weight}) and 'algorithm.undesirable_weight' "
                              f"({a.undesirable_weight}) must be >= 0.")

    def extra_stages(self) -> list[Stage]:
        return [KTOReferencePoint()]

    def batch_loss(self, batch: B.Batch, logps: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        a = self.config.algorithm
        policy = sequence_sums(batch, logps, paired=False)
        ref = sequence_sums(batch, batch[B.REF_LOG_PROBS].to(logps), paired=False)
        out = P.kto_loss(policy.chosen, policy.rejected, ref.chosen, ref.rejected, batch[KTO_KL][0], a.beta,
                         a.desirable_weight, a.undesirable_weight)
        return out.losses.sum(), example_sums(out.chosen_rewards, out.rejected_rewards, policy, paired=False)

    def evaluation_batch(self, controller: Controller, batch: B.Batch) -> B.Batch:
        batch = super().evaluation_batch(controller, batch)
        batch[KTO_KL] = reference_point(controller, batch).expand(len(batch)).clone()
        return batch


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("kto", KTO)
