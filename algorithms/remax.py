"""ReMax (Li et al., 2023, arXiv:2310.10505): REINFORCE with the greedy response's reward as the baseline."""

from __future__ import annotations

import torch

from rlforge import batch as B
from rlforge.dataflow import DataFlow, Stage
from rlforge.hookspecs import hookimpl
from rlforge.protocols import SamplingParams

from rlforge.algorithms import functional as F
from rlforge.algorithms.base import PolicyGradientModule


class ReMax(PolicyGradientModule):
    """Adds a greedy rollout per prompt after the reward stage; advantage = return - greedy reward."""

    preset = {"algorithm": {"name": "remax"}, "rollout": {"n": 8}}

    def flow(self) -> DataFlow:
        return super().flow().insert_after(Stage.REWARD, self.greedy_baseline)

    def greedy_baseline(self, batch: B.Batch) -> B.Batch:
        """Generate greedily once per prompt, score it, and store the score as each sample's baseline."""
        trainer = self.trainer
        first: dict[str, int] = {}
        for i, uid in enumerate(batch[B.UID]):
            first.setdefault(uid, i)
        prompts = batch.select(list(first.values()))
        prompts = B.Batch(
            {k: prompts[k] for k in (B.PROMPTS, B.PROMPT_MASK)},
            {k: prompts[k] for k in (B.UID, B.RAW_PROMPT, B.DATA_SOURCE, B.GROUND_TRUTH, B.EXTRA_INFO)},
        )
        params = SamplingParams(1, 0.0, 1.0, 0, self.config.rollout.max_new_tokens)
        greedy = trainer.controller.score(trainer.controller.generate(prompts, params))
        by_uid = dict(zip(greedy[B.UID], greedy[B.SCORES].tolist()))
        batch[B.REWARD_BASELINES] = torch.tensor([by_uid[u] for u in batch[B.UID]])
        batch.meta.setdefault("metrics", {})["critic/greedy_score/mean"] = float(greedy[B.SCORES].mean())
        return batch

    greedy_baseline.requires = {B.PROMPTS, B.UID, B.SCORES}  # type: ignore[attr-defined]
    greedy_baseline.produces = {B.REWARD_BASELINES}  # type: ignore[attr-defined]
    greedy_baseline.stage_name = "greedy_baseline"  # type: ignore[attr-defined]

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, F.remax_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.REWARD_BASELINES], batch[B.RESPONSE_MASK]
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("remax", ReMax)
