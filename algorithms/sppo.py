"""SPPO (Wu et al., "Self-Play Preference Optimization for Language Model Alignment", arXiv:2405.00675): regress each
response's log-ratio to the previous policy onto ``eta`` times how much better than average it is: verl's recipe
(reward minus its soft mean over the batch) or the paper's win rate against the prompt's other responses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.base import PolicyGradientConfig, PolicyGradientModule

from rlforge import batch as B
from rlforge.config.schema import option
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from rlforge.algorithms import functional as F
else:
    F = lazy_import("rlforge.algorithms.functional")


@dataclass
class SPPOConfig(PolicyGradientConfig):
    target: str = option("softmean", choices=("softmean", "win_rate"))  # softmean: reward - softmean over the batch (verl's recipe); win_rate: P(beats the prompt's other responses) - 1/2 (the paper)
    softmean_beta: float = option(1.0, ge=0)  # softmean's temperature; 0 = the plain mean (verl: algorithm.sppo_eta)


class SPPO(PolicyGradientModule):
    """Squared loss of the sequence log-ratio against eta x (reward - soft mean), or eta x (win rate - 1/2)."""

    config_class = SPPOConfig
    preset = {
        "algorithm": {"name": "sppo"},
        "rollout": {"n": 8},
        "actor": {"policy_loss": "sppo", "loss_agg_mode": "seq-mean-token-mean"},
    }

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        if config.algorithm.target == "win_rate" and config.rollout.n < 2:
            raise ConfigError(f"algorithm.target=win_rate compares each response with the prompt's others: it needs "
                              f"rollout.n >= 2 (got {config.rollout.n}).")

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        cfg = self.config.algorithm
        rewards, mask = batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK]
        if cfg.target == "win_rate":
            return self.set_advantages(batch, F.sppo_win_rate_advantage(rewards, mask, batch[B.UID]))
        return self.set_advantages(batch, F.sppo_softmean_advantage(rewards, mask, cfg.softmean_beta))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("sppo", SPPO)
