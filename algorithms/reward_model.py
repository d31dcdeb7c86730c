"""Reward-model training (``--algo rm``): a Bradley-Terry loss on preference pairs.

The model is the policy architecture with a sequence-classification head (``...ForSequenceClassification``,
one label, the tokenizer's pad token in its config), trained as the ``actor`` role: the same workers,
strategies, checkpoints and resume as every algorithm. A checkpoint's ``actor/`` folder is a plain Hugging Face
reward model: ``rlforge export`` copies it, ``reward.manager=model`` scores rollouts with it.

The reward of a sequence is the head's output at its last real token, as the model's own forward pools it
(padding positions are set to the pad token first, so any batch layout pools the same). Validation reports the
held-out pairwise accuracy as ``val/accuracy`` (and ``val/rewards/*``, ``val/loss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge.algorithms.offline import PreferenceModule, example_sums, finish_metrics, split_sides

from rlforge import batch as B
from rlforge.config.schema import AlgorithmConfig
from rlforge.errors import ConfigError, DataError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.module import LossContext

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import preference as P

    from rlforge import ops
    from rlforge.protocols import Controller
else:
    torch = lazy_import("torch")
    ops = lazy_import("rlforge.ops")
    P = lazy_import("rlforge.algorithms.preference")


@dataclass
class RewardModelConfig(AlgorithmConfig):
    center_rewards_coefficient: float = 0.0  # adds c (r_chosen + r_rejected)^2 to keep rewards centred on 0 (0 = off)
    max_completion_length: int = 256  # completion tokens kept: longer completions are cut (as TRL truncates)


class RewardModel(PreferenceModule):
    """Bradley-Terry reward model: a sequence-classification head trained on preference pairs."""

    config_class = RewardModelConfig
    preset = {"rollout": {"n": 2}, "data": {"name": "arith_pairs"}, "algorithm": {"name": "rm"}}
    reference = False
    generates = False

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        if config.model.lora.rank:
            raise ConfigError(f"'model.lora.rank' is {config.model.lora.rank}, but '--algo rm' trains the whole reward "
                              f"model (LoRA is not offered for reward models yet): set model.lora.rank=0.")

    def prepare_data(self, rows: list[dict[str, Any]], split: str) -> list[Any]:
        examples = super().prepare_data(rows, split)
        if any(e.prompt.multi_modal is not None for e in examples):  # all pairs: rm generates nothing
            raise DataError(f"{self.config.data.name} ({split}): rows with images: reward-model training (--algo rm) "
                            f"scores text only (its sequence-classification head has no vision inputs); the other "
                            f"preference algorithms (dpo, ipo, simpo, orpo, kto) train on image pairs "
                            f"(docs/multimodal.md).")
        return examples

    def configure_model(self) -> None:
        """The reward model (``model.path``'s body with a scalar head, or a trained reward model) as the actor."""
        from rlforge import precision
        from rlforge.models import load_reward_model

        cfg = self.config.model
        if self.tokenizer is None:
            self.configure_tokenizer()
        if self.loads("actor"):
            weights = precision.for_config(self.config).weights
            self.actor = load_reward_model(cfg.path, self.tokenizer.pad_token_id, weights, cfg.trust_remote_code)

    def rewards(self, model: torch.nn.Module, batch: B.Batch) -> torch.Tensor:
        """The reward of each row [B] (``ops.sequence_scores``)."""
        return ops.sequence_scores(model, batch[B.INPUT_IDS], batch[B.ATTENTION_MASK], self.tokenizer.pad_token_id)

    def forward_responses(self, model: torch.nn.Module, micro: B.Batch, temperature: float) -> torch.Tensor:
        """The sequence's reward on its last response token, 0 elsewhere (what ``compute_log_probs`` returns)."""
        rewards = self.rewards(model, micro)
        mask = micro[B.RESPONSE_MASK]
        out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
        out[torch.arange(len(mask)), (mask.sum(-1) - 1).clamp(min=0)] = rewards
        return out

    def training_step(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        assert self.actor is not None
        loss_sum, sums = self.pair_rewards_loss(micro, self.rewards(self.actor, micro))
        loss = loss_sum / (ctx.global_seqs / 2)
        return loss, {"actor/loss": loss.item(), **sums}

    def pair_rewards_loss(self, batch: B.Batch, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The summed Bradley-Terry loss over the pairs (``margin`` column) and the metric sums."""
        chosen, rejected = split_sides(batch, rewards, paired=True)
        margin = batch[B.MARGIN][0::2].to(rewards)
        losses = P.reward_model_loss(chosen, rejected, margin, self.config.algorithm.center_rewards_coefficient)
        return losses.sum(), example_sums(chosen, rejected, None, paired=True)

    def validate(self, controller: Controller, examples: list[Any]) -> tuple[dict[str, float], B.Batch | None]:
        """Held-out pairwise accuracy (``val/accuracy`` = ``val/rewards/accuracies``), rewards and loss."""
        batch = self.collate(examples, list(range(len(examples))))
        rewards = controller.workers.actor.compute_log_probs(batch, "actor").sum(-1)
        loss_sum, sums = self.pair_rewards_loss(batch, rewards)
        out = {f"val/{k}": v for k, v in finish_metrics(sums).items()}
        out["val/loss"] = float(loss_sum) / len(examples)
        out["val/accuracy"] = out["val/rewards/accuracies"]
        return out, None


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("rm", RewardModel)
