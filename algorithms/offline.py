"""Offline preference algorithms as RLModules: what DPO, IPO, SimPO, ORPO, KTO and reward-model training share.

There is no rollout. The module brings its own data (``prepare_data``/``collate``): preference rows become
batches in the rollout layout, one row per completion (left-padded prompt, right-padded response), a pair's
chosen and rejected rows adjacent and sharing a uid, so ``rollout.n=2`` (KTO: one row per completion,
``rollout.n=1``). The standard stages and workers then do the rest: the reference log-probs come from the
``ref_logprob`` stage (a no-grad forward of the reference model once per training batch; they are not cached
across epochs), mini-/micro-batches come from the actor worker (micro-batches of an even number of rows keep
pairs whole: ``validate_config`` checks it), checkpoints, resume, loggers and validation are the Trainer's.

Flow: ``[ref_logprob] -> [algorithm stages] -> update_actor -> sync_weights``.

Metrics use TRL's names (``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``,
``logps/chosen``, ``logps/rejected``). A micro-batch reports sums and counts (``_sum/<side>/<name>``,
``_count/<side>``), which the workers add up over micro-batches and ranks; ``finish_metrics`` turns them into
means once per step, so every mean is over the whole step whatever the micro-batching.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from rlforge import batch as B
from rlforge.config.batches import micro_batch_size
from rlforge.config.schema import AlgorithmConfig
from rlforge.dataflow import PAIR_COLUMNS, DataFlow, Stage, StepContext
from rlforge.errors import ConfigError, RLForgeError
from rlforge.lazy import lazy_import
from rlforge.module import LossContext, RLModule

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

    from rlforge import ops
    from rlforge.protocols import Controller
else:
    torch = lazy_import("torch")
    ops = lazy_import("rlforge.ops")

SUM, COUNT = "_sum/", "_count/"
SIDES = ("chosen", "rejected")


@dataclass
class PreferenceConfig(AlgorithmConfig):
    """Shared by the preference algorithms (each page in docs/algorithms/ lists its own keys)."""

    beta: float = 0.1  # the loss's beta (DPO: strength of the implicit KL constraint); > 0
    max_completion_length: int = 256  # completion tokens kept: longer completions are cut (as TRL truncates)


class Sides(NamedTuple):
    """Per-example sums of a per-token quantity (log-probs), split by side, with the completions' token counts."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_lengths: torch.Tensor
    rejected_lengths: torch.Tensor


def split_sides(batch: B.Batch, values: torch.Tensor, paired: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ``values`` [B] split by ``label`` into (chosen, rejected). Paired batches must alternate chosen,
    rejected (the collate layout): anything else means a pair was split, which is an error."""
    labels = batch[B.LABEL].to(values.device).bool()
    if paired:
        pattern = torch.arange(len(labels), device=labels.device) % 2 == 0
        if len(labels) % 2 or not torch.equal(labels, pattern):
            raise RLForgeError(
                f"A batch of {len(labels)} rows is not whole preference pairs (chosen, rejected adjacent): "
                f"micro-batches must hold an even number of rows (actor.ppo_micro_batch_size) and no token budget."
            )
    return values[labels], values[~labels]


def sequence_sums(batch: B.Batch, per_token: torch.Tensor, paired: bool) -> Sides:
    """``per_token`` [B, R] summed over each response, split by side (``split_sides``), with the token counts."""
    mask = batch[B.RESPONSE_MASK].to(per_token.dtype)
    sums, lengths = split_sides(batch, (per_token * mask).sum(-1), paired), split_sides(batch, mask.sum(-1), paired)
    return Sides(sums[0], sums[1], lengths[0], lengths[1])


def example_sums(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, policy: Sides | None, paired: bool,
                 per_pair: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """The metric sums and counts of one micro-batch (see the module doc); ``policy``: the summed log-probs
    (``logps/*``; None: no such metrics); ``per_pair``: more per-example values averaged over the chosen side
    (pairs), e.g. ORPO's ``nll_loss``."""
    out = {f"{COUNT}chosen": float(len(chosen_rewards)), f"{COUNT}rejected": float(len(rejected_rewards))}
    for side, rewards in (("chosen", chosen_rewards), ("rejected", rejected_rewards)):
        out[f"{SUM}{side}/rewards/{side}"] = float(rewards.detach().double().sum())
        if policy is not None:
            out[f"{SUM}{side}/logps/{side}"] = float(getattr(policy, side).detach().double().sum())
    if paired:
        out[f"{SUM}chosen/rewards/accuracies"] = float((chosen_rewards > rejected_rewards).double().sum())
    for name, values in (per_pair or {}).items():
        out[f"{SUM}chosen/{name}"] = float(values.detach().double().sum())
    return out


def finish_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Sums and counts -> means (a side without examples gets no keys); ``rewards/margins`` = chosen - rejected."""
    out = {k: v for k, v in metrics.items() if not k.startswith((SUM, COUNT))}
    for key, value in metrics.items():
        if key.startswith(SUM):
            side, name = key[len(SUM):].split("/", 1)
            count = metrics.get(f"{COUNT}{side}", 0.0)
            if count:
                out[name] = value / count
    if "rewards/chosen" in out and "rewards/rejected" in out:
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    return out


class PreferenceUpdate(Stage):
    """The policy (or reward model) update on preference data; the metrics become means (``finish_metrics``)."""

    name = "update_actor"

    def __init__(self, requires: frozenset[str]) -> None:
        self.requires = requires

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        ctx.call_hook("update_start", batch=batch)
        metrics = finish_metrics(ctx.workers.actor.update(batch, ctx.step))
        ctx.log(metrics)
        ctx.call_hook("update_end", batch=batch, metrics=metrics)
        return batch


class PreferenceModule(RLModule):
    """Base of the offline preference algorithms. Subclasses implement ``batch_loss`` (or ``pair_loss``)."""

    config_class: ClassVar[type] = PreferenceConfig
    paired: ClassVar[bool] = True  # pairs (rollout.n=2) or unpaired completions (KTO, rollout.n=1)
    reference: ClassVar[bool] = True  # whether the loss uses a frozen reference model
    generates: ClassVar[bool] = True  # a policy: validation may generate from prompt rows (not a reward model)

    # --- configuration ----------------------------------------------------------------------------
    @classmethod
    def batch_words(cls) -> tuple[str, str, str]:
        return ("reads", "pairs", "rows (chosen, rejected)") if cls.paired else ("reads", "examples", "row(s)")

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        alg, rows, unit = config.algorithm, 2 if cls.paired else 1, "pair" if cls.paired else "example"
        if config.rollout.n != rows:
            raise ConfigError(f"'rollout.n' is {config.rollout.n}: '{alg.name}' lays each {unit} out as {rows} "
                              f"row(s), so rollout.n must be {rows} (the preset sets it).")
        if config.rollout.temperature != 1.0:
            raise ConfigError(f"'rollout.temperature' is {config.rollout.temperature}: preference losses use the "
                              f"model's log-probs at temperature 1.0 (validation samples at rollout.val_temperature).")
        for key in ("beta", "max_completion_length"):
            if alg.get(key, 1) <= 0:
                raise ConfigError(f"'algorithm.{key}' must be > 0, got {alg[key]}.")
        if cls.paired and config.actor.max_tokens_per_micro_batch:
            raise ConfigError("'actor.max_tokens_per_micro_batch' would split preference pairs: set it to 0 and size "
                              "micro-batches with actor.ppo_micro_batch_size (an even number of rows).")
        if cls.paired and micro_batch_size(config) % 2:
            raise ConfigError(f"'actor.ppo_micro_batch_size' ({micro_batch_size(config)} rows) must be even: a pair's "
                              f"chosen and rejected rows go into the same micro-batch.")
        if cls.paired and config.actor.ppo_mini_batch_size % config.strategy.num_processes:
            raise ConfigError(f"'actor.ppo_mini_batch_size' ({config.actor.ppo_mini_batch_size} pairs) must split "
                              f"evenly over strategy.num_processes={config.strategy.num_processes} ranks (whole "
                              f"pairs).")

    def needs_reference(self) -> bool:
        return self.reference

    def flow(self) -> DataFlow:
        stages: list[Any] = [Stage.REF_LOGPROB] if self.needs_reference() else []
        stages += self.extra_stages()
        requires = frozenset({B.INPUT_IDS, B.ATTENTION_MASK, B.RESPONSE_MASK, B.LABEL} |
                             ({B.REF_LOG_PROBS} if self.needs_reference() else set()))
        stages.append(PreferenceUpdate(requires))
        if self.generates:
            stages.append(Stage.SYNC_WEIGHTS)
        return DataFlow(self.config.algorithm.name, stages, inputs=PAIR_COLUMNS)

    def extra_stages(self) -> list[Stage]:
        """Stages between the reference log-probs and the update (KTO: its reference point)."""
        return []

    # --- data -------------------------------------------------------------------------------------
    def prepare_data(self, rows: list[dict[str, Any]], split: str) -> list[Any]:
        """Preference rows become examples; validation rows in the prompt format (``reward_model.ground_truth``)
        also give prompts to generate from (a row may be both)."""
        from rlforge.data import row_origin
        from rlforge.preferences import is_preference_row, tokenize_preferences

        d, name = self.config.data, f"{self.config.data.name} ({split})"
        rows = [{**r, "_origin": row_origin(r, i, name)} for i, r in enumerate(rows)]
        use_prompts = self.generates and split == "val"
        prompts = [r for r in rows if use_prompts and _has_ground_truth(r)]
        # every other row must be a preference row: tokenize_preferences names a row that is not, and what it needs
        pairs = [r for r in rows if is_preference_row(r) or not (use_prompts and _has_ground_truth(r))]
        examples: list[Any] = tokenize_preferences(pairs, self.tokenizer, d.max_prompt_length,
                                                   self.config.algorithm.max_completion_length,
                                                   d.filter_overlong_prompts, name, self.paired,
                                                   processor=self.processor, image_key=d.image_key)
        return examples + (super().prepare_data(prompts, split) if prompts else [])

    def collate(self, examples: list[Any], uids: list[Any]) -> B.Batch:
        from rlforge.preferences import collate_preferences

        return collate_preferences(examples, self.tokenizer.pad_token_id, uids)

    # --- training ---------------------------------------------------------------------------------
    def training_step(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss over the micro-batch's examples, normalized by the mini-batch's example count."""
        assert self.actor is not None
        logps = ops.response_logprobs(self.actor, micro[B.INPUT_IDS], micro[B.ATTENTION_MASK],
                                      micro[B.RESPONSES].shape[1], remove_padding=self.config.model.remove_padding,
                                      multi_modal=micro.lists.get(B.MULTI_MODAL_INPUTS))[0]
        loss_sum, sums = self.batch_loss(micro, logps)
        loss = loss_sum / (ctx.global_seqs / (2 if self.paired else 1))
        return loss, {"actor/loss": loss.item(), **sums}

    def batch_loss(self, batch: B.Batch, logps: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The summed loss of ``batch``'s examples and its metric sums, from the policy's per-token ``logps``
        (and the batch's ``ref_log_probs``). Paired algorithms implement ``pair_loss`` instead."""
        policy = sequence_sums(batch, logps, self.paired)
        ref = sequence_sums(batch, batch[B.REF_LOG_PROBS].to(logps), self.paired) if self.needs_reference() else None
        losses, chosen_rewards, rejected_rewards, per_pair = self.pair_loss(policy, ref)
        return losses.sum(), example_sums(chosen_rewards, rejected_rewards, policy, self.paired, per_pair)

    def pair_loss(self, policy: Sides, ref: Sides | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Per-pair losses, the chosen and rejected implicit rewards, and extra per-pair metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement pair_loss or batch_loss")  # abstract

    # --- validation -------------------------------------------------------------------------------
    def validate(self, controller: Controller, examples: list[Any]) -> tuple[dict[str, float], B.Batch | None]:
        """Prompt examples: generate and score (``val/accuracy``); pairs: the loss and metrics on the held-out
        pairs, as ``val/loss``, ``val/rewards/accuracies``, ..."""
        from rlforge.preferences import PreferenceExample

        pairs = [e for e in examples if isinstance(e, PreferenceExample)]
        prompts = [e for e in examples if not isinstance(e, PreferenceExample)]
        metrics, batch = super().validate(controller, prompts) if prompts else ({}, None)
        if pairs:
            metrics.update(self.validate_pairs(controller, pairs))
        return metrics, batch

    def validate_pairs(self, controller: Controller, pairs: list[Any]) -> dict[str, float]:
        batch = self.evaluation_batch(controller, self.collate(pairs, list(range(len(pairs)))))
        loss_sum, sums = self.batch_loss(batch, controller.workers.actor.compute_log_probs(batch, "actor"))
        out = {"loss": float(loss_sum) / len(pairs), **finish_metrics(sums)}
        return {f"val/{k}": v for k, v in out.items()}

    def evaluation_batch(self, controller: Controller, batch: B.Batch) -> B.Batch:
        """The columns the flow's stages add before the update, for a validation batch (the reference log-probs)."""
        if self.needs_reference():
            batch[B.REF_LOG_PROBS] = controller.workers.actor.compute_log_probs(batch, "ref")
        return batch


def _has_ground_truth(row: dict[str, Any]) -> bool:
    reward = row.get("reward_model")
    return isinstance(reward, dict) and "ground_truth" in reward
