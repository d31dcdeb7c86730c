"""PolicyGradientModule: what the PPO family shares.

- the policy loss ``actor.policy_loss`` names (the ``policy_loss`` registry, ``policy_losses.py``; PPO clip with
  dual-clip by default) + optional KL loss to the reference + entropy bonus;
- the shared ``algorithm.*`` options: KL in the reward (fixed or adaptive coefficient), the constant
  length of ``seq-mean-token-sum-norm``, DAPO's dynamic sampling and overlong shaping (applied by the
  hooks in :mod:`rlforge.algorithms.shaping`, for any algorithm that turns them on), and the rollout
  correction options ``rollout_is*``/``rollout_rs*`` (the policy loss multiplies its per-token loss by
  the batch's ``rollout_is_weights`` column when a stage has written it).

Subclasses implement ``compute_advantages``; their presets pick the policy loss (GSPO, GPG, SPPO).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from rlforge.algorithms import rollout_correction as RC
from rlforge.algorithms.names import KL_ESTIMATORS, LOSS_AGG_MODES
from rlforge.algorithms.shaping import DynamicSampling, MaskTruncated

from rlforge import batch as B
from rlforge.config.schema import AlgorithmConfig, option
from rlforge.dataflow import DataFlow, Stage
from rlforge.errors import ConfigError, RLForgeError
from rlforge.lazy import lazy_import
from rlforge.module import LossContext, RLModule
from rlforge.protocols import PolicyLoss, PolicyLossInputs, PolicyLossOutput

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")
    torch = lazy_import("torch")

KL_TYPES = KL_ESTIMATORS + tuple(e + "+" for e in KL_ESTIMATORS)
ROLLOUT_IS_WEIGHTS = RC.ROLLOUT_IS_WEIGHTS
log = logging.getLogger("rlforge")


@dataclass
class PolicyGradientConfig(AlgorithmConfig):
    use_kl_in_reward: bool = False  # subtract kl_coef x KL(old || ref) from the token rewards
    kl_penalty: str = "kl"  # KL estimator for the reward penalty (k1/kl, k2, k3/low_var_kl, abs)
    kl_ctrl: str = "fixed"  # fixed | adaptive (Ziegler et al. proportional controller)
    kl_coef: float = option(0.001, ge=0)  # initial KL-in-reward coefficient
    kl_target: float = option(0.1, gt=0)  # adaptive controller: target KL per token
    kl_horizon: int = option(10000, ge=1)  # adaptive controller: horizon in samples
    norm_length: int = option(0, ge=0)  # constant length of seq-mean-token-sum-norm; 0 = rollout.max_new_tokens
    filter_groups: bool = False  # DAPO dynamic sampling: drop groups whose rewards all agree, refill
    max_gen_batches: int = option(4, ge=1)  # dynamic sampling: at most this many generation rounds per step
    filter_metric: str = option("reward", choices=("reward", "score", "acc"))  # dynamic sampling keeps the groups whose values of it differ: reward (the sequence reward, overlong shaping included) | score (the reward function's score) | acc (its acc, as verl's: the function's own, or its score where it returns a number)
    overlong_buffer: int = option(0, ge=0)  # DAPO overlong shaping: penalty ramps over the last N tokens (0 = off)
    overlong_penalty: float = option(1.0, ge=0)  # DAPO overlong shaping: penalty at the maximum length
    mask_truncated: bool = False  # DAPO overlong filtering (TRL's mask_truncated_completions): responses cut off before a stop token (by rollout.max_new_tokens or an agent's token budget) train none of their tokens; their rewards still count in the advantages
    overlong_log: bool = True  # DAPO overlong shaping: log critic/overlong_penalty/mean and critic/overlong/ratio (the share of responses penalised) each step
    # rollout correction, engine vs trainer log-probs (verl: algorithm.rollout_correction.*)
    rollout_is: Optional[str] = None  # weights pi_old / pi_rollout in the policy loss, per token | sequence; None = off
    rollout_is_threshold: str = "2.0"  # a number: weights truncated above it (TIS); "lower_upper" (e.g. "0.5_5.0", quoted in YAML): 0 outside (IcePop)
    rollout_is_batch_normalize: bool = False  # rescale the weights to mean 1 over the batch
    rollout_rs: Optional[str] = None  # rejection, comma-separated: token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2..3; None = off
    rollout_rs_threshold: Optional[str] = None  # per rollout_rs option, or one for all: k1 "lower_upper" (u alone = 1/u to u), k2/k3 an upper bound


class PolicyGradientModule(RLModule):
    """Clipped surrogate + KL loss + entropy bonus, with the shared options above."""

    config_class = PolicyGradientConfig
    group_baseline: ClassVar[bool] = False  # its advantage compares the samples of a prompt (rollout.n >= 2 expected)

    def __init__(self, config: DictConfig) -> None:
        super().__init__(config)
        alg = config.algorithm
        self.kl_ctrl: Any = None
        if alg.use_kl_in_reward:
            self.kl_ctrl = (F.AdaptiveKLController(alg.kl_coef, alg.kl_target, alg.kl_horizon)
                            if alg.kl_ctrl == "adaptive" else F.FixedKLController(alg.kl_coef))

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        a, alg = config.actor, config.algorithm
        choices = {
            "actor.loss_agg_mode": (a.loss_agg_mode, LOSS_AGG_MODES),
            "actor.kl_loss_type": (a.kl_loss_type, KL_TYPES),
            "algorithm.kl_penalty": (alg.kl_penalty, KL_TYPES),
            "algorithm.kl_ctrl": (alg.kl_ctrl, ("fixed", "adaptive")),
        }
        for key, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"'{key}' is '{value}'. Allowed: {', '.join(allowed)}.")
        if alg.overlong_buffer >= config.rollout.max_new_tokens:
            raise ConfigError(
                f"'algorithm.overlong_buffer' ({alg.overlong_buffer}) must be smaller than "
                f"'rollout.max_new_tokens' ({config.rollout.max_new_tokens})."
            )
        if cls.group_baseline and config.rollout.n < 2:
            log.warning("rollout.n=1 with --algo %s: each prompt's group holds one sample, so its advantage has no "
                        "group baseline to compare with (the algorithm's page in docs/algorithms/ says what a group "
                        "of one gets); set rollout.n to 2 or more.", alg.name)
        if alg.kl_ctrl == "adaptive" and not alg.use_kl_in_reward:
            log.warning("algorithm.kl_ctrl=adaptive adapts the coefficient of the KL in the reward, which "
                        "algorithm.use_kl_in_reward=false leaves out: nothing adapts (actor.use_kl_loss's coefficient is "
                        "actor.kl_loss_coef, fixed).")
        if alg.mask_truncated and config.rollout.ignore_eos:
            raise ConfigError("'algorithm.mask_truncated' with 'rollout.ignore_eos': every response runs to "
                              "rollout.max_new_tokens without a stop token, so every one would be masked.")
        t = config.trainer
        if t.critic_warmup and t.total_epochs is None and t.critic_warmup >= t.total_steps:
            raise ConfigError(f"'trainer.critic_warmup' ({t.critic_warmup}) is not below 'trainer.total_steps' "
                              f"({t.total_steps}): the actor waits for the critic's first {t.critic_warmup} steps, so "
                              f"it would never train. Raise total_steps or lower critic_warmup.")
        cls._validate_rollout_correction(config)

    @staticmethod
    def _validate_rollout_correction(config: DictConfig) -> None:
        alg = config.algorithm
        if (alg.rollout_is is not None or alg.rollout_rs is not None) and config.actor.reuse_rollout_log_probs:
            raise ConfigError(
                "Rollout correction (algorithm.rollout_is / algorithm.rollout_rs) compares the engine's log-probs "
                "with the trainer's: set actor.reuse_rollout_log_probs=null (recompute when correcting) or false."
            )
        if alg.rollout_is is not None and alg.rollout_is not in RC.ROLLOUT_IS_LEVELS:
            raise ConfigError(f"'algorithm.rollout_is' is '{alg.rollout_is}'. "
                              f"Allowed: {', '.join(RC.ROLLOUT_IS_LEVELS)}, or null (off).")
        try:
            RC.parse_is_threshold(alg.rollout_is_threshold)
            if alg.rollout_rs is not None:
                RC.parse_rs_thresholds(alg.rollout_rs, alg.rollout_rs_threshold)
        except ValueError as e:
            raise ConfigError(str(e).replace("'rollout_", "'algorithm.rollout_")) from None  # name the config key

    def needs_reference(self) -> bool:
        return bool(self.config.actor.use_kl_loss or self.config.algorithm.use_kl_in_reward)

    def flow(self) -> DataFlow:
        flow = super().flow()
        alg = self.config.algorithm
        if alg.filter_groups:
            flow.insert_before(Stage.FILTER, DynamicSampling())
        if alg.mask_truncated:
            flow.replace(Stage.UPDATE_ACTOR, MaskTruncated())
        if getattr(self.policy_loss_fn, "uses_rollout_log_probs", False):  # bypass: corrected inside the loss
            flow.replace(Stage.OLD_LOGPROB, RC.RolloutLogProbsAsOld())
        elif alg.rollout_is is not None or alg.rollout_rs is not None:
            flow.insert_after(Stage.OLD_LOGPROB, RC.RolloutCorrection())
        return flow

    @property
    def policy_loss_fn(self) -> PolicyLoss:
        """The policy loss ``actor.policy_loss`` names, from the ``policy_loss`` registry."""
        return self.registry.policy_loss.get(self.config.actor.policy_loss)

    # --- rewards ----------------------------------------------------------------------------------
    def compute_rewards(self, batch: B.Batch) -> B.Batch:
        if self.kl_ctrl is None:
            return batch
        rewards, kl = F.kl_in_reward(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.OLD_LOG_PROBS], batch[B.REF_LOG_PROBS], batch[B.RESPONSE_MASK],
            self.kl_ctrl.value, self.config.algorithm.kl_penalty,
        )
        batch[B.TOKEN_LEVEL_REWARDS] = rewards
        self.log("actor/reward_kl_penalty", float(kl))
        self.log("actor/reward_kl_penalty_coeff", self.kl_ctrl.value)
        self.kl_ctrl.update(float(kl), len(batch))
        return batch

    @staticmethod
    def set_advantages(batch: B.Batch, advantages_and_returns: tuple[torch.Tensor, torch.Tensor]) -> B.Batch:
        """Store an estimator's ``(advantages, returns)`` in the batch."""
        batch[B.ADVANTAGES], batch[B.RETURNS] = advantages_and_returns
        return batch

    # --- losses -----------------------------------------------------------------------------------------
    def policy_gradient_loss(self, batch: B.Batch, log_probs: torch.Tensor, mask: torch.Tensor) -> PolicyLossOutput:
        """The policy-gradient term of one micro-batch: the per-token loss of ``actor.policy_loss`` and its stats."""
        rollout = batch[B.ROLLOUT_LOG_PROBS] if B.ROLLOUT_LOG_PROBS in batch else None
        out = self.policy_loss_fn(PolicyLossInputs(log_probs, batch[B.OLD_LOG_PROBS], batch[B.ADVANTAGES], mask,
                                                   self.config, self.is_weights(batch), rollout))
        return checked_output(out, mask, f"actor.policy_loss={self.config.actor.policy_loss}", log_probs.requires_grad)

    @staticmethod
    def is_weights(batch: B.Batch) -> torch.Tensor | None:
        """The rollout-correction weights column, or None when the batch has none."""
        return batch[ROLLOUT_IS_WEIGHTS] if ROLLOUT_IS_WEIGHTS in batch else None

    def aggregate(self, mat: torch.Tensor, mask: torch.Tensor, ctx: LossContext, mode: str | None = None) -> torch.Tensor:
        """This micro-batch's share of the mini-batch aggregate of ``mat`` [B, R] over ``mask`` (``agg_loss`` with
        ``mode``, by default ``actor.loss_agg_mode``, and the mini-batch counts of ``ctx``)."""
        norm_length = self.config.algorithm.norm_length or self.config.rollout.max_new_tokens
        return F.agg_loss(mat, mask, mode or self.config.actor.loss_agg_mode, ctx.global_tokens, ctx.global_seqs,
                          norm_length)

    def policy_loss(
        self, batch: B.Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        a = self.config.actor
        mask = batch[B.RESPONSE_MASK].to(log_probs.dtype)

        def agg(mat: torch.Tensor, mode: str | None = None, on: torch.Tensor = mask) -> torch.Tensor:
            return self.aggregate(mat, on, ctx, mode)

        pg = self.policy_gradient_loss(batch, log_probs, mask)
        pg_loss = agg(pg.loss, pg.agg_mode, mask if pg.mask is None else pg.mask.to(mask.dtype))
        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.item()}
        for key, stat in pg.stats.items():
            metrics[key] = agg(stat.detach().to(mask.dtype), "token-mean").item()
        if entropy is not None:
            metrics["actor/entropy"] = agg(entropy.detach(), "token-mean").item()
            if a.entropy_coeff:
                loss = loss - a.entropy_coeff * agg(entropy)
        if a.use_kl_loss:
            kl = agg(F.kl_penalty(log_probs, batch[B.REF_LOG_PROBS], a.kl_loss_type))
            loss = loss + a.kl_loss_coef * kl
            metrics["actor/kl_loss"] = kl.item()
        return loss, metrics

    # --- checkpointed state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"kl_ctrl": self.kl_ctrl.state_dict()} if self.kl_ctrl is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.kl_ctrl is not None and "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])


def checked_output(out: Any, mask: torch.Tensor, name: str, trains: bool = False) -> PolicyLossOutput:
    """A policy loss's result as rlforge aggregates it (``name``: the loss, for the message): a
    :class:`PolicyLossOutput` whose loss is per token (the mask's shape; a loss already reduced would be aggregated
    again), depends on the log-probs where they carry a gradient (``trains``), and whose stats are tensors that
    broadcast to it."""
    shape = tuple(mask.shape)
    if not isinstance(out, PolicyLossOutput):
        raise RLForgeError(f"{name} returned {type(out).__name__}: return a PolicyLossOutput(loss, stats) with the "
                           f"per-token loss (docs/algorithms/policy_losses.md).")
    if not isinstance(out.loss, torch.Tensor) or tuple(out.loss.shape) != shape:
        what = f"shape {tuple(out.loss.shape)}" if isinstance(out.loss, torch.Tensor) else type(out.loss).__name__
        raise RLForgeError(f"{name} returned a loss of {what}: it takes the per-token loss, of the response mask's "
                           f"shape {shape} (rlforge aggregates it by actor.loss_agg_mode).")
    if trains and not out.loss.requires_grad:
        raise RLForgeError(f"{name} returned a loss without a gradient (computed from detached tensors, or under "
                           f"torch.no_grad): compute it from the log_probs it is given.")
    for key, stat in out.stats.items():
        if not isinstance(stat, torch.Tensor) or not _broadcasts(stat.shape, mask.shape):
            what = f"shape {tuple(stat.shape)}" if isinstance(stat, torch.Tensor) else type(stat).__name__
            raise RLForgeError(f"{name} returned the stat {key!r} as {what}: stats are per-token tensors of the "
                               f"response mask's shape {shape} (logged as their mean over the response tokens).")
    return out


def _broadcasts(shape: Any, to: Any) -> bool:
    try:
        return torch.broadcast_shapes(shape, to) == to
    except RuntimeError:
        return False

