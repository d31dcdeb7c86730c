"""GDPO (arXiv:2601.05242, verl 0.8's ``gdpo`` estimator): GRPO normalization per reward component, then summed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from rlforge.algorithms.grpo import GRPO, GRPOConfig

from rlforge import batch as B
from rlforge.errors import ConfigError, DataError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import functional as F
else:
    torch = lazy_import("torch")
    F = lazy_import("rlforge.algorithms.functional")


@dataclass
class GDPOConfig(GRPOConfig):
    reward_keys: list[str] = field(default_factory=list)  # the reward components: keys of compute_score's dict result (or [B] batch columns such as acc); [] = one component, the total reward (verl: gdpo_reward_keys)
    reward_weights: Optional[list[float]] = None  # one weight per reward key; None = 1 each (verl: gdpo_reward_weights)


class GDPO(GRPO):
    """GRPO-normalize each reward component within its group, sum them (weighted), whiten over the batch."""

    config_class = GDPOConfig
    preset = {"algorithm": {"name": "gdpo"}, "rollout": {"n": 8}}

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        alg = config.algorithm
        if alg.std_scope != "group":
            raise ConfigError(f"'algorithm.std_scope={alg.std_scope}' is GRPO's: GDPO normalizes each reward component "
                              f"within its group and then whitens the sum over the batch already. Leave it at group.")
        if alg.reward_weights is not None and len(alg.reward_weights) != len(alg.reward_keys):
            raise ConfigError(f"'algorithm.reward_weights' has {len(alg.reward_weights)} entries for "
                              f"{len(alg.reward_keys)} 'algorithm.reward_keys' ({list(alg.reward_keys)}): give one "
                              f"weight per key, or null for 1 each.")
        twice = sorted({k for k in alg.reward_keys if list(alg.reward_keys).count(k) > 1})
        if twice:
            raise ConfigError(f"'algorithm.reward_keys' names {twice[0]!r} more than once ({list(alg.reward_keys)}): "
                              f"give each component once, and its weight in algorithm.reward_weights.")
        shaping = [f"algorithm.{k}={alg[k]}" for k in ("overlong_buffer", "use_kl_in_reward")
                   if alg.reward_keys and alg[k]]
        if shaping:
            raise ConfigError(f"'{shaping[0]}' shapes the token rewards, which GDPO with algorithm.reward_keys does "
                              f"not read: its advantage comes from the components alone (as verl's), so the shaping "
                              f"would change the logged rewards and not the training. Return a length penalty as a "
                              f"component of compute_score's dict and name it in algorithm.reward_keys, use "
                              f"actor.use_kl_loss for a KL term, or leave algorithm.reward_keys empty (the shaped total "
                              f"reward is then the one component).")
        if alg.reward_weights is not None and alg.reward_keys and not any(alg.reward_weights):
            raise ConfigError(f"'algorithm.reward_weights' are all 0 ({list(alg.reward_weights)}): every advantage "
                              f"would be 0 and the policy would not learn; give a component a weight.")

    def reward_components(self, batch: B.Batch) -> list[torch.Tensor] | None:
        """One score vector ``[B]`` per ``algorithm.reward_keys``: a batch column (summed over tokens when it is
        ``[B, R]``) or the key of each sample's ``reward_extra_info``. None when no key is set. A sample whose reward
        call failed (``reward_failed``: it got ``reward.fallback_score``) has ``reward.fallback_score`` for every
        component."""
        keys = list(self.config.algorithm.reward_keys)
        if not keys:
            return None
        extras: list[dict[str, Any]] = batch[B.REWARD_EXTRA_INFO] if B.REWARD_EXTRA_INFO in batch else []
        failed = batch[B.REWARD_FAILED].bool().tolist() if B.REWARD_FAILED in batch else [False] * len(extras)
        fallback = float(self.config.reward.fallback_score)
        out = []
        for key in keys:
            if key in batch.tensors:
                column = batch[key].double()
                column = column.sum(-1) if column.dim() > 1 else column
                out.append(torch.where(torch.tensor(failed), fallback, column) if any(failed) else column)
                continue
            missing = [i for i, e in enumerate(extras) if key not in e and not failed[i]] if extras else [0]
            if missing:
                own = sorted(extras[missing[0]]) if extras else []
                raise DataError(f"GDPO reward key '{key}' (algorithm.reward_keys) is not in the reward of sample "
                                f"{missing[0]}: compute_score must return a dict with it as a finite number (a None, "
                                f"NaN or other value is not kept; that sample's extra keys: {own or 'none'}), or "
                                f"name a [B] batch column (e.g. acc).")
            out.append(torch.tensor([fallback if failed[i] else float(e[key]) for i, e in enumerate(extras)],
                                    dtype=torch.float64))
        return out

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        weights = list(cfg.reward_weights) if cfg.reward_weights is not None else None
        return self.set_advantages(batch, F.gdpo_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID], self.reward_components(batch),
            weights, cfg.norm_adv_by_std, cfg.epsilon,
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("gdpo", GDPO)
