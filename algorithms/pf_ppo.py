"""PF-PPO (Zhang et al., "Policy Filtration for RLHF to Mitigate Noise in Reward Models", arXiv:2409.06957): PPO that
trains on the responses whose rewards are most reliable: verl's batch-wide reweighting, or the paper's per-prompt
filtering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlforge.algorithms.names import PF_FILTER_METHODS as FILTER_METHODS
from rlforge.algorithms.names import PF_REWEIGHT_METHODS as REWEIGHT_METHODS
from rlforge.algorithms.ppo import PPO, PPOConfig

from rlforge import batch as B
from rlforge.config.schema import option
from rlforge.dataflow import DataFlow, Stage, StepContext
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig
    from rlforge.algorithms import functional as F
else:
    torch = lazy_import("torch")
    F = lazy_import("rlforge.algorithms.functional")

SEED_STRIDE = 1_000_003  # the generator of step k is seeded with trainer.seed * stride + k: reproducible, resumable


@dataclass
class PFPPOConfig(PPOConfig):
    pf_mode: str = option("reweight", choices=("reweight", "filter"))  # reweight: verl's batch-wide resampling with replacement; filter: the paper's per-prompt selection
    reweight_method: str = option("pow", choices=REWEIGHT_METHODS)  # reweight: pow (|score|^weight_pow) | max_min | max_random (verl: pf_ppo.reweight_method)
    weight_pow: float = option(2.0, ge=0)  # reweight=pow: the exponent (0 = uniform) (verl: pf_ppo.weight_pow)
    filter_method: str = option("best_random", choices=FILTER_METHODS)  # filter: best_of_n | best_random | best_worst responses of each prompt


class PolicyFiltration(Stage):
    """After ``advantage``: the rows the critic and the actor train on, resampled (``reweight``) or filtered per
    prompt (``filter``) from the sequence scores, with a generator seeded from ``trainer.seed`` and the step."""

    name = "policy_filtration"
    requires = frozenset({B.TOKEN_LEVEL_SCORES, B.ADVANTAGES, B.UID})
    produces: frozenset[str] = frozenset()

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        alg = ctx.config.algorithm
        scores = batch[B.TOKEN_LEVEL_SCORES].sum(-1)
        generator = torch.Generator().manual_seed(ctx.config.trainer.seed * SEED_STRIDE + ctx.step)
        if alg.pf_mode == "filter":
            rows = F.pf_ppo_filter_indices(scores, batch[B.UID], alg.filter_method, generator)
        else:
            rows = F.pf_ppo_resample_indices(scores.cpu(), alg.reweight_method, alg.weight_pow, generator)
        ctx.log({"pf_ppo/score_before/mean": float(scores.float().mean()),
                 "pf_ppo/score_after/mean": float(scores[rows.to(scores.device)].float().mean()),
                 "pf_ppo/kept_rows": float(len(rows)), "pf_ppo/distinct_rows": float(len(rows.unique()))})
        return batch.select(rows)


class PFPPO(PPO):
    """PPO (GAE, critic) that trains on the batch resampled by reward weight, or on chosen responses per prompt."""

    config_class = PFPPOConfig
    preset = {"algorithm": {"name": "pf_ppo"}, "rollout": {"n": 8}}

    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        super().validate_config(config)
        alg, defaults = config.algorithm, PFPPOConfig()
        unread = {"reweight": ("filter_method",), "filter": ("reweight_method", "weight_pow")}[alg.pf_mode]
        for key in unread:
            if alg[key] != getattr(defaults, key):
                raise ConfigError(f"'algorithm.{key}' ({alg[key]}) is read only with algorithm.pf_mode="
                                  f"{'filter' if alg.pf_mode == 'reweight' else 'reweight'}, and the run has "
                                  f"pf_mode={alg.pf_mode}: set pf_mode to use it, or drop it.")

    def flow(self) -> DataFlow:
        return super().flow().insert_after(Stage.ADVANTAGE, PolicyFiltration())


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("pf_ppo", PFPPO)
