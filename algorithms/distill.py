"""On-policy distillation (``--algo opd``): GRPO whose policy also learns from a frozen teacher's log-probs of the
tokens it sampled (Agarwal et al., "On-Policy Distillation of Language Models", arXiv:2306.13649; the policy-gradient
form of Thinking Machines' "On-Policy Distillation", 2025). verl 0.9's ``distillation.*`` with an estimator loss.

The teacher is a role of the dataflow (docs/plugins.md, "Add a role"): ``teacher`` (``distill_worker.TeacherWorker``)
holds the causal LM of ``algorithm.teacher.path`` (unset: the policy's initial weights, ``model.path``), frozen, on
ranks of its own (Ray: a pool of ``algorithm.teacher.num_workers``; torchrun: one rank per process; local: in the
driver's process). The flow:

    rollout -> reward -> old_logprob [-> ref_logprob] -> teacher_logprob -> advantage -> update_actor -> sync

Per response token ``d_t = kl_penalty(log pi(a_t), log pi_teacher(a_t), loss_mode)`` (student's log-probs at the
rollout temperature with their gradient, the teacher's at temperature 1), clamped to ``+-loss_max_clamp``; then
(``algorithms/functional.distillation_loss``):

- ``use_policy_gradient=false`` (verl's default): ``d`` aggregated by ``actor.loss_agg_mode`` is the loss;
- ``use_policy_gradient=true``: PPO clip (``clip_ratio_low/high``, dual clip ``clip_ratio_c``) with advantages
  ``-d`` (detached) and the batch's old log-probs, aggregated the same way;
- ``use_task_rewards=true`` (verl's default): GRPO's whole actor loss (task advantages, entropy, KL loss) plus
  ``distillation_loss_coef`` x the distillation loss; ``false``: the distillation loss alone.

Teacher and student must share the tokenizer (the rows' tokens are read as they are); a teacher with another
vocabulary is refused when it loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from rlforge.algorithms.grpo import GRPO, GRPOConfig
from rlforge.algorithms.distill_routes import check_batch_routes, check_prompt_routes, validate_routes
from rlforge.algorithms.names import KL_ESTIMATORS

from rlforge import batch as B
from rlforge.config.checks import check_device
from rlforge.config.schema import option
from rlforge.controller.remote import Role
from rlforge.dataflow import DataFlow, Stage, StepContext
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.module import LossContext

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge import ops
    from rlforge.algorithms import functional as F
else:
    from rlforge.lazy import lazy_import

    F = lazy_import("rlforge.algorithms.functional")
    ops = lazy_import("rlforge.ops")
    torch = lazy_import("torch")

TEACHER_LOG_PROBS = "teacher_log_probs"  # [B, R] the teacher's log-probs of the sampled response tokens
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"  # [B, R, K] loss_mode=forward_kl_topk: the teacher's top-k log-probs
TEACHER_TOPK_IDS = "teacher_topk_ids"  # [B, R, K] ... and their token ids
TOPK_LOSSES = ("forward_kl_topk",)  # the losses over the teacher's top-k tokens (verl 0.9.1 has this one)
TOPK_STRATEGIES = ("single", "fsdp")  # the strategies whose actor runs ops.response_logits as it is


@dataclass
class TeacherConfig:
    """The frozen teacher (verl: ``distillation.teacher_models.<name>``)."""

    path: Optional[str] = None  # the teacher's causal LM (folder, Hub id, builtin:NAME, run or checkpoint); None = model.path: the policy's initial weights, a self-distillation anchor (verl: model_path, required there)
    dtype: str = option("float32", choices=("float32", "bfloat16", "float16"))  # the teacher's weights and forward pass
    device: str = "auto"  # auto (the rank's GPU if it has one, else cpu) | cpu | cuda | cuda:N
    batch_size: int = option(16, ge=1)  # sequences per teacher forward pass (memory and speed only)
    trust_remote_code: bool = False  # for the teacher's code
    num_workers: int = option(1, ge=1)  # trainer.controller=ray: ranks of the teacher role (a resource pool of their own, ray.cpus_per_worker / gpus_per_worker each); torchrun: one per process
    routes: dict[str, str] = field(default_factory=dict)  # several teachers (MOPD): a row's route_by value -> its teacher's causal LM (as path); every teacher rank holds them all; {} = the one teacher of path (verl: teacher_models.<name>.key / .model_path)
    route_by: str = "data_source"  # with routes: the row field that picks a row's teacher: data_source or extra_info.<name> (verl: distillation.teacher_key)


@dataclass
class DistillLossConfig:
    """The distillation loss (verl: ``distillation.distillation_loss``; its defaults)."""

    loss_mode: str = option("k3", choices=(*KL_ESTIMATORS, *TOPK_LOSSES))  # an estimator of KL(student || teacher) at the sampled tokens (k1/kl, abs, k2/mse, k3/low_var_kl), or forward_kl_topk: KL(teacher || student) over the teacher's top-k tokens at each position (verl: loss_mode)
    topk: int = option(32, ge=1)  # forward_kl_topk: the teacher's tokens per position (verl: topk)
    log_prob_min_clamp: Optional[float] = None  # forward_kl_topk: both top-k log-probs clamped below at this (e.g. -10); None = no clamp (verl: log_prob_min_clamp)
    use_policy_gradient: bool = False  # true: -d as the advantage of a PPO-clip term (use k1); false: d itself is the loss (use k3)
    use_task_rewards: bool = True  # true: GRPO's actor loss on the task rewards + distillation_loss_coef x the distillation loss; false: the distillation loss alone
    distillation_loss_coef: float = option(1.0, ge=0)  # weight of the distillation loss beside the task loss (use_task_rewards only)
    loss_max_clamp: Optional[float] = option(None, gt=0)  # d clamped to [-c, c] before it is used; None = no clamp
    clip_ratio_low: float = option(0.2, ge=0)  # use_policy_gradient: PPO clip below 1 (verl: clip_ratio_low)
    clip_ratio_high: float = option(0.2, ge=0)  # use_policy_gradient: PPO clip above 1 (verl: clip_ratio_high)
    clip_ratio_c: float = option(3.0, gt=1)  # use_policy_gradient: dual-clip bound where the advantage is negative


@dataclass
class OPDConfig(GRPOConfig):
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    distill: DistillLossConfig = field(default_factory=DistillLossConfig)


class TeacherLogProbs(Stage):
    """The teacher's log-probs of every sampled response token, from the ``teacher`` role's ranks."""

    name = "teacher_logprob"
    requires = frozenset({B.INPUT_IDS, B.ATTENTION_MASK, B.RESPONSES, B.RESPONSE_MASK})
    produces = frozenset({TEACHER_LOG_PROBS})

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        d = ctx.config.algorithm.distill
        if ctx.config.algorithm.teacher.routes:
            check_batch_routes(batch, ctx.config.algorithm.teacher)
        if d.loss_mode in TOPK_LOSSES:
            if any(v is not None for v in batch.lists.get(B.MULTI_MODAL_INPUTS, [])):
                raise ConfigError(f"algorithm.distill.loss_mode={d.loss_mode} does not read images yet: use an "
                                  f"estimator loss (k1, k3, ...) for vision-language rows.")
            scores = ctx.workers.teacher.teacher_topk(batch, d.topk)
            for key in (TEACHER_TOPK_LOG_PROBS, TEACHER_TOPK_IDS):
                batch[key] = scores[key]
            teacher = scores[TEACHER_LOG_PROBS]
        else:
            teacher = ctx.workers.teacher.teacher_log_probs(batch)
        batch[TEACHER_LOG_PROBS] = teacher
        if B.OLD_LOG_PROBS in batch:  # the student before this step's update, as a reference figure
            mask = batch[B.RESPONSE_MASK].to(teacher.dtype)
            gap = (batch[B.OLD_LOG_PROBS] - teacher) * mask
            ctx.log({"distillation/reverse_kl_k1": float(gap.sum() / mask.sum().clamp_min(1))})
        return batch


class OPD(GRPO):
    """On-policy distillation from a frozen teacher, on top of GRPO's task advantages."""

    config_class = OPDConfig
    preset = {"algorithm": {"name": "opd"}, "rollout": {"n": 8}}

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        check_device(config.algorithm.teacher.device, "algorithm.teacher.device")
        validate_routes(config.algorithm.teacher)
        mode, strategy = config.algorithm.distill.loss_mode, config.strategy.name
        d = config.algorithm.distill
        if not d.use_task_rewards and d.distillation_loss_coef != DistillLossConfig.distillation_loss_coef:
            raise ConfigError(f"'algorithm.distill.distillation_loss_coef' ({d.distillation_loss_coef}) weighs the "
                              f"distillation loss beside the task loss, which algorithm.distill.use_task_rewards=false "
                              f"leaves out (the distillation loss alone is the loss, as in verl): drop the coefficient "
                              f"(lower actor.lr to scale the loss), or set use_task_rewards=true.")
        if mode in ("k1", "kl") and not config.algorithm.distill.use_policy_gradient:
            raise ConfigError(f"algorithm.distill.loss_mode={mode} as a direct loss (use_policy_gradient=false) does "
                              f"not learn from the teacher: the gradient of log pi - log pi_T is that of log pi alone. "
                              f"Use it as a reward (algorithm.distill.use_policy_gradient=true), or loss_mode=k3 (as "
                              f"verl 0.9.1, which refuses it too).")
        if mode in TOPK_LOSSES:
            if strategy not in TOPK_STRATEGIES:
                raise ConfigError(f"algorithm.distill.loss_mode={mode} computes the student's whole distribution in "
                                  f"a forward pass of its own, which strategy.name={strategy} does not run yet "
                                  f"(it runs with {', '.join(TOPK_STRATEGIES)}): use an estimator loss (k1, k3, ...).")
            sp = config.strategy.get("fsdp", {}).get("sequence_parallel_size", 1) if strategy == "fsdp" else 1
            if sp and sp > 1:
                raise ConfigError(f"algorithm.distill.loss_mode={mode} with Ulysses sequence parallelism "
                                  f"(strategy.fsdp.sequence_parallel_size={sp}) is not built: use an estimator loss, "
                                  f"or sequence_parallel_size=1.")

    def worker_roles(self) -> list[str]:
        return [*super().worker_roles(), "teacher"]

    def prepare_data(self, rows: Any, split: str) -> list[Any]:
        """GRPO's prompts; with several teachers every training prompt must have one (checked before any model
        loads)."""
        prompts = super().prepare_data(rows, split)
        teacher = self.config.algorithm.teacher
        if split == "train" and teacher.routes:
            check_prompt_routes(prompts, rows, f"{self.config.data.name} ({split})", teacher)
        return prompts

    def flow(self) -> DataFlow:
        return super().flow().insert_after(Stage.OLD_LOGPROB, TeacherLogProbs())

    def training_step(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        """With ``forward_kl_topk`` the loss needs the student's whole distribution at each response position: one
        padded forward pass gives the sampled tokens' log-probs, the entropy, the log-probs at the teacher's top-k
        tokens and the student's own top-k (``ops.response_logits``, then ``ops.topk_logprobs``: the fp32 log-softmax
        in chunks, recomputed in the backward pass); the estimator losses take the base class's step."""
        if self.config.algorithm.distill.loss_mode not in TOPK_LOSSES:
            return super().training_step(micro, ctx)
        assert self.actor is not None
        mask = micro[B.ATTENTION_MASK][:, -micro[B.RESPONSES].shape[1]:].float()
        logits = ops.response_logits(self.actor, micro[B.INPUT_IDS], micro[B.ATTENTION_MASK],
                                     micro[B.RESPONSES].shape[1], ctx.temperature)
        log_probs, entropy, at_teacher, student_ids = ops.topk_logprobs(logits, micro[B.RESPONSES],
                                                                        micro[TEACHER_TOPK_IDS])
        return self.distill_loss(micro, log_probs * mask, entropy * mask, ctx, at_teacher, student_ids)

    def policy_loss(
        self, batch: B.Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return self.distill_loss(batch, log_probs, entropy, ctx)

    def distill_loss(
        self, batch: B.Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None, ctx: LossContext,
        student_topk: torch.Tensor | None = None, student_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The actor's loss: the distillation loss (``student_topk``: the student's log-probs at the teacher's top-k
        tokens, for ``forward_kl_topk``, and ``student_ids`` its own top-k tokens, for the overlap metrics), with GRPO's
        task loss when ``use_task_rewards``."""
        d = self.config.algorithm.distill
        mask = batch[B.RESPONSE_MASK].to(log_probs.dtype)
        divergence: torch.Tensor | None = None
        topk_stats: dict[str, torch.Tensor] = {}
        if student_topk is not None:
            divergence, topk_stats = F.forward_kl_topk(student_topk, batch[TEACHER_TOPK_LOG_PROBS],
                                                       d.log_prob_min_clamp, batch[TEACHER_TOPK_IDS], student_ids)
        loss_mat, stats = F.distillation_loss(
            log_probs, batch[TEACHER_LOG_PROBS], batch[B.OLD_LOG_PROBS], mask, d.loss_mode, d.loss_max_clamp,
            d.use_policy_gradient, (d.clip_ratio_low, d.clip_ratio_high, d.clip_ratio_c), self.is_weights(batch),
            divergence,
        )
        overlap = self._overlap_metrics(topk_stats, batch, mask, ctx)  # out of topk_stats: not token means
        stats.update(topk_stats)

        def agg(mat: torch.Tensor, mode: str | None = None) -> torch.Tensor:
            return self.aggregate(mat, mask, ctx, mode)

        distill = agg(loss_mat)
        metrics = {"distillation/loss": distill.item(), **overlap}
        metrics.update({f"distillation/{k}": agg(v.detach().to(mask.dtype), "token-mean").item()
                        for k, v in stats.items()})
        if not d.use_task_rewards:
            if entropy is not None:
                metrics["actor/entropy"] = agg(entropy.detach(), "token-mean").item()
            return distill, metrics
        loss, task = super().policy_loss(batch, log_probs, entropy, ctx)
        return loss + d.distillation_loss_coef * distill, {**task, **metrics}

    def _overlap_metrics(self, stats: dict[str, torch.Tensor], batch: B.Batch, mask: torch.Tensor,
                         ctx: LossContext) -> dict[str, float]:
        """verl's top-k overlap diagnostics, taken out of ``stats``: ``overlap_ratio``, the token mean of the overlap
        count over K (verl divides by ``topk``: the same unless the vocabulary is smaller); ``overlap_token_advantage``,
        the mean over positions with an overlap, in each micro-batch, weighted across micro-batches and ranks by their
        response tokens (verl averages its micro-batches' means)."""
        if "overlap_count" not in stats:
            return {}
        count, advantage = stats.pop("overlap_count"), stats.pop("overlap_token_advantage")
        k = batch[TEACHER_TOPK_IDS].shape[-1]  # the teacher's K: topk, or its vocabulary where that is smaller
        ratio = self.aggregate(count / k, mask, ctx, "token-mean").item()
        where = mask * (count > 0)
        mean = float((advantage * where).sum() / where.sum()) if where.sum() > 0 else 0.0
        return {"distillation/overlap_ratio": ratio,
                "distillation/overlap_token_advantage": mean * float(mask.sum()) / max(ctx.global_tokens, 1.0)}


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.role.register("teacher", Role("rlforge.algorithms.distill_worker:TeacherWorker", pool="teacher",
                                           ranks="algorithm.teacher.num_workers"),
                           description="on-policy distillation's frozen teacher on ranks of its own")
    registry.algorithm.register("opd", OPD)
