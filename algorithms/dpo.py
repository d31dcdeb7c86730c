"""Pairwise preference optimization: DPO, IPO (with a reference model), SimPO and ORPO (reference-free).

Each is a :class:`~rlforge.algorithms.offline.PreferenceModule` whose ``pair_loss`` calls the pure loss of
:mod:`rlforge.algorithms.preference`; the pages docs/algorithms/{dpo,ipo,simpo,orpo}.md give the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.offline import PreferenceConfig, PreferenceModule, Sides

from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import preference as P
else:
    P = lazy_import("rlforge.algorithms.preference")

PAIRS_PRESET = {"rollout": {"n": 2}, "data": {"name": "arith_pairs"}}
Loss = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "dict[str, torch.Tensor]"]


def _check_smoothing(config: DictConfig) -> None:
    eps = config.algorithm.label_smoothing
    if not 0.0 <= eps <= 0.5:
        raise ConfigError(f"'algorithm.label_smoothing' must be in [0, 0.5], got {eps}.")


@dataclass
class DPOConfig(PreferenceConfig):
    label_smoothing: float = 0.0  # cDPO: assumed rate of flipped labels, in [0, 0.5]


class DPO(PreferenceModule):
    """DPO (sigmoid loss, optional label smoothing): preference pairs against a frozen reference model."""

    config_class = DPOConfig
    preset = {**PAIRS_PRESET, "algorithm": {"name": "dpo"}}

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        _check_smoothing(config)

    def pair_loss(self, policy: Sides, ref: Sides | None) -> Loss:
        assert ref is not None
        a = self.config.algorithm
        out = P.dpo_loss(policy.chosen, policy.rejected, ref.chosen, ref.rejected, a.beta, a.label_smoothing)
        return out.losses, out.chosen_rewards, out.rejected_rewards, {}


class IPO(PreferenceModule):
    """IPO: a squared loss on the length-normalized log-ratio margin, target 1 / (2 beta)."""

    config_class = PreferenceConfig
    preset = {**PAIRS_PRESET, "algorithm": {"name": "ipo"}}

    def pair_loss(self, policy: Sides, ref: Sides | None) -> Loss:
        assert ref is not None
        out = P.ipo_loss(policy.chosen, policy.rejected, ref.chosen, ref.rejected, policy.chosen_lengths,
                         policy.rejected_lengths, self.config.algorithm.beta)
        return out.losses, out.chosen_rewards, out.rejected_rewards, {}


@dataclass
class SimPOConfig(PreferenceConfig):
    beta: float = 2.0  # reward scale (the paper uses 2.0 to 2.5); > 0
    simpo_gamma: float = 1.0  # target reward margin
    label_smoothing: float = 0.0  # assumed rate of flipped labels, in [0, 0.5]


class SimPO(PreferenceModule):
    """SimPO: reference-free, the average log-prob as the reward, with a target margin."""

    config_class = SimPOConfig
    preset = {**PAIRS_PRESET, "algorithm": {"name": "simpo"}}
    reference = False

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        _check_smoothing(config)

    def pair_loss(self, policy: Sides, ref: Sides | None) -> Loss:
        a = self.config.algorithm
        out = P.simpo_loss(policy.chosen, policy.rejected, policy.chosen_lengths, policy.rejected_lengths, a.beta,
                           a.simpo_gamma, a.label_smoothing)
        return out.losses, out.chosen_rewards, out.rejected_rewards, {}


class ORPO(PreferenceModule):
    """ORPO: the chosen completion's NLL plus an odds-ratio term; no reference model."""

    config_class = PreferenceConfig
    preset = {**PAIRS_PRESET, "algorithm": {"name": "orpo"}}
    reference = False

    def pair_loss(self, policy: Sides, ref: Sides | None) -> Loss:
        out = P.orpo_odds_ratio_loss(policy.chosen, policy.rejected, policy.chosen_lengths, policy.rejected_lengths,
                                     self.config.algorithm.beta)
        nll = -policy.chosen / policy.chosen_lengths.clamp(min=1)  # each chosen completion's token-mean NLL
        extra = {"nll_loss": nll, "log_odds_ratio": out.log_odds_ratio, "log_odds_chosen": out.log_odds}
        return nll + out.losses, out.chosen_rewards, out.rejected_rewards, extra


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("dpo", DPO)
    registry.algorithm.register("ipo", IPO)
    registry.algorithm.register("simpo", SimPO)
    registry.algorithm.register("orpo", ORPO)
