"""PRIME (Cui et al., "Process Reinforcement through Implicit Rewards", arXiv:2502.01456; verl-recipe ``prime/``):
PPO-clip on RLOO advantages of two reward sources, the verifier's outcome ``acc`` and the token rewards of an
implicit process reward model (PRM) that is trained online on the same outcome labels.

The PRM is a role of the dataflow, built the way any trainable role is (docs/plugins.md, "Add a role"): the role
``prm`` (``prime_worker.PRMRank``, a ``RankWorker``) holds the PRM ``pi_psi`` (a causal LM, by default a copy of the policy's
initial weights) with its optimizer and a frozen reference ``pi_ref`` beside it, on the run's strategy; the
controllers place it like the actor (Ray: on the actor's bundles; torchrun: a rank in every process), checkpoint it
(weights, optimizer, scheduler) and resume it. The flow:

    rollout -> reward -> prime_filter -> old_logprob [-> ref_logprob] -> prm -> advantage -> update_actor -> sync

- ``prime_filter``: ``algorithm.oversample_factor`` rounds of prompts are generated and scored; the prompts whose
  mean ``acc`` lies in ``[accuracy_lower_bound, accuracy_upper_bound]`` (and, with ``filter_truncate``, no response
  hit the length limit) come first, and ``data.train_batch_size`` prompts are kept (verl's ``filter_and_downsample``).
- ``prm``: with ``algorithm.prm.update=before`` (verl's default) the PRM is trained on the batch (BCE of
  ``sigmoid(beta * sum_t q_t)`` against ``acc``, ``q = log pi_psi - log pi_ref``), then scores it; ``after``: it
  scores first, then trains; ``none``: it only scores. Token rewards ``beta * q_t`` (0 on the last token), divided by
  the batch's largest return-to-go (``prm.norm=batch_norm``).
- ``advantage``: ``reward_dpo_coef x RLOO(process) + reward_gt_coef x RLOO(acc)``, reverse cumulative sums, whitened.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from rlforge.algorithms import implicit_prm as P
from rlforge.algorithms.base import PolicyGradientConfig, PolicyGradientModule

from rlforge import batch as B
from rlforge.config.batches import check_batch_sizes
from rlforge.config.schema import LR_SCHEDULERS, ScoringConfig, option
from rlforge.controller.remote import Role
from rlforge.dataflow import DataFlow, Stage, StepContext
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import LossContext, schedule_steps

if TYPE_CHECKING:
    import torch
else:
    from rlforge.lazy import lazy_import

    torch = lazy_import("torch")

PRM_SCORES = "rm_scores"  # [B, R] the implicit PRM's token rewards (verl's column name)
UPDATES = ("before", "after", "none")
NORMS = ("batch_norm", "none")


@dataclass
class PRMConfig:
    """The implicit PRM (verl: ``reward_model.*`` of ``prime_trainer.yaml``)."""

    path: Optional[str] = None  # the PRM's and its reference's initial weights; None = model.path (verl: reward_model.model.path / ref_path)
    beta_train: float = option(0.05, gt=0)  # beta: q is scaled by it in the rewards and in the loss (verl: reward_model.model.beta_train)
    update: str = option("before", choices=UPDATES)  # before: train on the batch, then score it | after: score, then train | none: score only (verl: reward_model.model.update)
    norm: str = option("batch_norm", choices=NORMS)  # batch_norm: divide the token rewards by the batch's largest |return-to-go| | none (verl: reward_model.prime_norm)
    lam: float = option(0.0, ge=0, le=1)  # > 0: token rewards accumulated as sum_k lam^(k-t) beta q_k (verl: reward_model.lambda)
    use_gt: bool = False  # lam > 0: the last token's term is acc - the others' sum (verl: reward_model.prime_use_gt)
    heldout_metrics: bool = True  # update=before: also score the batch before training on it, for prm/heldout_* (one more forward pass)
    lr: float = option(1e-6, ge=0)  # AdamW learning rate (verl: reward_model.model.optim.lr)
    weight_decay: float = option(0.01, ge=0)  # AdamW weight decay (verl's default 1e-2)
    warmup_steps: int = option(0, ge=0)  # linear warm-up from 0, in training steps
    warmup_ratio: float = option(0.0, ge=0, le=1)  # where warmup_steps is 0: a warm-up of this share of the run (verl: optim.lr_warmup_steps_ratio)
    lr_scheduler: str = option("constant", choices=tuple(LR_SCHEDULERS))  # after the warm-up, as actor.lr_scheduler
    min_lr_ratio: float = option(0.0, ge=0, le=1)  # lr_scheduler=cosine: the end rate as a share of lr
    num_cycles: float = option(0.5, gt=0)  # lr_scheduler=cosine: cosine waves after the warm-up
    grad_clip: float = option(10.0, ge=0)  # max global gradient norm (verl: optim.grad_clip)
    ppo_epochs: int = option(1, ge=1)  # passes over each batch
    ppo_mini_batch_size: int = option(8, ge=1)  # prompts per optimizer step (x rollout.n samples) (verl: reward_model.mini_batch_size)
    ppo_micro_batch_size: Optional[int] = option(None, ge=1)  # samples per forward/backward; None = the whole mini-batch
    max_tokens_per_micro_batch: int = option(0, ge=0)  # > 0: micro-batches by token budget (per rank)
    log_prob: ScoringConfig = field(default_factory=ScoringConfig)  # micro-batches of the scoring pass (memory and speed only)


@dataclass
class PRIMEConfig(PolicyGradientConfig):
    reward_dpo_coef: float = option(5.0, ge=0)  # weight of the process rewards' RLOO advantage (verl: algorithm.reward_dpo_coef)
    reward_gt_coef: float = option(5.0, ge=0)  # weight of the outcome (acc) RLOO advantage (verl: algorithm.reward_gt_coef)
    filter_accuracy: bool = True  # keep the prompts whose mean acc is in the band first (verl: data.filter_accuracy)
    accuracy_lower_bound: float = option(0.2, ge=0, le=1)  # (verl: data.accuracy_lower_bound)
    accuracy_upper_bound: float = option(0.8, ge=0, le=1)  # (verl: data.accuracy_upper_bound)
    oversample_factor: int = option(4, ge=1)  # rounds of data.train_batch_size prompts generated per step, of which one round's worth is kept (verl: data.oversample_factor, a float there)
    filter_truncate: bool = True  # a prompt with a response that hit rollout.max_new_tokens does not pass (verl: data.filter_truncate)
    prm: PRMConfig = field(default_factory=PRMConfig)


class PrimeFilter(Stage):
    """``oversample_factor`` rounds of prompts, ``data.train_batch_size`` kept pass-first (``implicit_prm.accuracy_band``)."""

    name = "prime_filter"
    requires = frozenset({B.UID, B.RESPONSE_MASK})  # and acc, which only some reward managers set: need_acc
    uses_engine = True  # the extra rounds go through ctx.regenerate

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        alg = ctx.config.algorithm
        need_acc(ctx, batch)
        rounds = [batch] + [ctx.regenerate(before=self) for _ in range(alg.oversample_factor - 1)]
        batch = B.Batch.concat(rounds)
        if not alg.filter_accuracy:
            lower, upper = 0.0, 1.0
        else:
            lower, upper = alg.accuracy_lower_bound, alg.accuracy_upper_bound
        too_long = batch[B.RESPONSE_MASK].sum(-1) >= ctx.config.rollout.max_new_tokens if alg.filter_truncate else None
        passes = P.band_passes(batch[B.ACC], batch[B.UID], lower, upper, too_long)
        ctx.log({"prime/passing_prompts": float(sum(passes.values())), "prime/generated_prompts": float(len(passes))})
        return batch.select(P.accuracy_band(batch[B.ACC], batch[B.UID], ctx.config.data.train_batch_size, lower, upper,
                                            too_long))


def need_acc(ctx: StepContext, batch: B.Batch) -> None:
    """PRIME learns from outcome labels: the reward manager must set ``acc`` (the rule manager does)."""
    if B.ACC not in batch:
        raise RLForgeError(f"--algo prime trains its PRM on the outcome labels 'acc', which reward.manager="
                           f"{ctx.config.reward.manager} did not set: use a reward function that returns acc (the rule "
                           f"manager's functions do; docs/rewards.md).")


class ImplicitPRMStage(Stage):
    """Train the PRM on the batch's outcome labels and score it (``algorithm.prm.update``): ``rm_scores``."""

    name = "prm"
    requires = frozenset({B.INPUT_IDS, B.ATTENTION_MASK, B.RESPONSE_MASK, B.UID})  # and acc (need_acc)
    produces = frozenset({PRM_SCORES})

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        p, prm = ctx.config.algorithm.prm, ctx.workers.prm
        update = p["update"]  # not p.update: a DictConfig's mapping method of that name
        need_acc(ctx, batch)
        mask, acc = batch[B.RESPONSE_MASK], batch[B.ACC].float()
        before = prm.implicit_q(batch) if update != "before" or p.heldout_metrics else None
        if before is not None:  # the PRM has not trained on these rows yet
            sums = (before * mask).sum(-1)
            ctx.log({"prm/heldout_pairwise_acc": P.pairwise_accuracy(sums, acc, batch[B.UID]),
                     "prm/heldout_acc": float(((sums > 0).float() == acc).float().mean())})
        if update != "none":
            ctx.log(prm.update(batch, ctx.step))
        q = before if update != "before" else prm.implicit_q(batch)
        rewards = P.implicit_process_rewards(q, mask, p.beta_train, p.lam, acc if p.use_gt else None)
        if p.norm == "batch_norm":
            rewards = P.batch_norm(rewards)
        batch[PRM_SCORES] = rewards
        ctx.log({"prm/pairwise_acc": P.pairwise_accuracy((q * mask).sum(-1), acc, batch[B.UID]),
                 "prm/reward": float(rewards.sum(-1).mean()), "prm/raw_reward": float((q * mask).sum(-1).mean())})
        return batch


class PRIME(PolicyGradientModule):
    """PPO-clip on outcome + implicit process rewards, with an online-trained implicit PRM (the ``prm`` role)."""

    config_class = PRIMEConfig
    preset = {"algorithm": {"name": "prime"}, "rollout": {"n": 4}, "actor": {"entropy_coeff": 0.001}}

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.prm: torch.nn.Module | None = None
        self.prm_ref: torch.nn.Module | None = None

    @classmethod
    def validate_config(cls, config: Any) -> None:
        super().validate_config(config)
        alg = config.algorithm
        if alg.accuracy_lower_bound > alg.accuracy_upper_bound:
            raise ConfigError(f"'algorithm.accuracy_lower_bound' ({alg.accuracy_lower_bound}) is above "
                              f"'algorithm.accuracy_upper_bound' ({alg.accuracy_upper_bound}).")
        if config.rollout.n < 2:
            raise ConfigError(f"--algo prime's RLOO needs rollout.n >= 2 samples per prompt, got {config.rollout.n}.")
        if not alg.reward_dpo_coef and not alg.reward_gt_coef:
            raise ConfigError("'algorithm.reward_dpo_coef' and 'algorithm.reward_gt_coef' are both 0: every advantage "
                              "would be 0 and the policy would not learn; give one of them a weight (verl: 5 and 5).")
        for key, on, hint in (("use_kl_in_reward", alg.use_kl_in_reward, "; for a KL term use actor.use_kl_loss"),
                              ("overlong_buffer", alg.overlong_buffer, "")):
            if on:
                raise ConfigError(f"'algorithm.{key}' shapes the token rewards, which --algo prime does not use: its "
                                  "advantages come from the outcome 'acc' and the PRM's process rewards only (as in "
                                  f"verl's recipe). Drop {key}{hint}.")
        if alg.filter_groups:
            raise ConfigError("'algorithm.filter_groups' (DAPO's dynamic sampling) does not apply to --algo prime, "
                              "which filters prompts by accuracy band (algorithm.filter_accuracy, "
                              "accuracy_lower_bound/accuracy_upper_bound, oversample_factor): drop filter_groups.")
        check_batch_sizes(config, "algorithm.prm")  # the PRM trains on the kept data.train_batch_size prompts
        if alg.prm.use_gt and not alg.prm.lam:
            raise ConfigError("'algorithm.prm.use_gt' changes the accumulated rewards of 'algorithm.prm.lam' > 0; with "
                              "lam=0 it does nothing (as in verl): set algorithm.prm.lam or drop use_gt.")

    def worker_roles(self) -> list[str]:
        return [*super().worker_roles(), "prm"]

    def flow(self) -> DataFlow:
        flow = super().flow()
        flow.replace(Stage.FILTER, PrimeFilter())
        flow.insert_before(Stage.ADVANTAGE, ImplicitPRMStage())
        return flow

    def configure_model(self) -> None:
        """The actor (and reference) as every algorithm loads them; the PRM and its frozen reference where this
        process holds the ``prm`` role."""
        from rlforge import precision
        from rlforge.models import check_vocabulary, load_model, resolve_model_path

        super().configure_model()
        if self.loads("prm"):
            m, p = self.config.model, precision.for_config(self.config)
            path = self.config.algorithm.prm.path or m.path
            key = "algorithm.prm.path" if self.config.algorithm.prm.path else "model.path"
            if self.config.algorithm.prm.path:  # it scores the policy's tokens: an embedding row for each
                check_vocabulary(resolve_model_path(path, key), self.tokenizer, path, key, tokenizer_key="model.path")
            self.prm = load_model(path, p.weights, trust_remote_code=m.trust_remote_code, key=key)
            self.prm_ref = load_model(path, p.frozen, trust_remote_code=m.trust_remote_code, key=key)
            self.prm_ref.requires_grad_(False).eval()

    def configure_prm_optimizers(self) -> tuple[torch.optim.Optimizer, Any]:
        """The PRM's AdamW and schedule (``algorithm.prm.*``)."""
        from rlforge import lr_schedule

        assert self.prm is not None
        p = self.config.algorithm.prm
        opt = torch.optim.AdamW([w for w in self.prm.parameters() if w.requires_grad], lr=p.lr,
                                weight_decay=p.weight_decay)
        return opt, lr_schedule.build(opt, p, schedule_steps(self.config))

    def implicit_q(self, micro: B.Batch, grad: bool) -> torch.Tensor:
        """``log pi_psi - log pi_ref`` per response token of ``micro`` (0 at padding) [B, R]."""
        from rlforge import ops

        assert self.prm is not None and self.prm_ref is not None
        args = (micro[B.INPUT_IDS], micro[B.ATTENTION_MASK], micro[B.RESPONSES].shape[1])
        pad = self.config.model.remove_padding
        with torch.no_grad():
            ref = ops.response_logprobs(self.prm_ref, *args, remove_padding=pad)[0]
        with torch.enable_grad() if grad else torch.no_grad():
            own = ops.response_logprobs(self.prm, *args, remove_padding=pad)[0]
        return (own - ref) * micro[B.RESPONSE_MASK]

    def prm_step(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of the PRM's loss: the mean over the mini-batch's sequences of the outcome BCE."""
        q = self.implicit_q(micro, grad=True)
        acc = micro[B.ACC].float()
        rows = P.outcome_bce(q, acc, micro[B.RESPONSE_MASK], self.config.algorithm.prm.beta_train)
        loss = rows.sum() / ctx.global_seqs
        right = ((q.detach().sum(-1) > 0).float() == acc).float().sum() / ctx.global_seqs
        return loss, {"prm/loss": loss.item(), "prm/acc_before_step": right.item()}

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        alg, mask = self.config.algorithm, batch[B.RESPONSE_MASK]
        advantages, returns = P.prime_advantages(batch[PRM_SCORES], batch[B.ACC], mask, batch[B.UID],
                                                 alg.reward_dpo_coef, alg.reward_gt_coef)
        return self.set_advantages(batch, (advantages, returns))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("prime", PRIME)
    registry.role.register("prm", Role("rlforge.algorithms.prime_worker:PRMRank", ("prm",), section="algorithm.prm"),
                           description="PRIME's implicit process reward model, trained online (and its reference)")
