"""ReMax (Li et al., 2023, arXiv:2310.10505): REINFORCE with the greedy response's reward as the baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.algorithms.base import PolicyGradientModule

from rlforge import batch as B
from rlforge.agent.batching import add_agent_rewards
from rlforge.agent.stage import agent_stage
from rlforge.dataflow import DataFlow, Stage, StepContext
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.sampling import SamplingParams

if TYPE_CHECKING:
    import torch
    from rlforge.algorithms import functional as F
else:
    torch = lazy_import("torch")
    F = lazy_import("rlforge.algorithms.functional")


class GreedyBaseline(Stage):
    """Generate greedily once per prompt, score it, and store the score as each sample's baseline. In a flow with an
    agent loop the greedy rollout is one trajectory of that loop, its score the reward function's plus the
    trajectory's own rewards (as the samples')."""

    name = "greedy_baseline"
    requires = frozenset({B.PROMPTS, B.UID, B.SCORES})
    produces = frozenset({B.REWARD_BASELINES})
    uses_engine = True

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        first: dict[str, int] = {}
        for i, uid in enumerate(batch[B.UID]):
            first.setdefault(uid, i)
        prompts = batch.select(list(first.values()))
        prompts = B.Batch(
            {k: prompts[k] for k in (B.PROMPTS, B.PROMPT_MASK)},
            {k: prompts[k] for k in (B.UID, B.RAW_PROMPT, B.DATA_SOURCE, B.GROUND_TRUTH, B.EXTRA_INFO)},
        )
        params = SamplingParams(1, 0.0, 1.0, 0, ctx.config.rollout.max_new_tokens)
        agent = agent_stage(ctx.flow)
        if agent is None:
            greedy = ctx.controller.score(ctx.workers.rollout.generate(prompts, params))
        else:
            greedy = ctx.controller.score(agent.rollout(ctx, prompts, params)[0])
            add_agent_rewards(greedy)
        greedy.meta.pop("metrics", None)  # the reward manager's counters describe the training samples
        by_uid = dict(zip(greedy[B.UID], greedy[B.SCORES].tolist()))
        batch[B.REWARD_BASELINES] = torch.tensor([by_uid[u] for u in batch[B.UID]])
        ctx.log({"critic/greedy_score/mean": float(greedy[B.SCORES].mean())})
        return batch


class ReMax(PolicyGradientModule):
    """Adds a greedy rollout per prompt after the reward stage; advantage = return - greedy reward."""

    preset = {"algorithm": {"name": "remax"}, "rollout": {"n": 8}}

    def flow(self) -> DataFlow:
        return super().flow().insert_after(Stage.REWARD, GreedyBaseline())

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        return self.set_advantages(batch, F.remax_advantage(
            batch[B.TOKEN_LEVEL_REWARDS], batch[B.REWARD_BASELINES], batch[B.RESPONSE_MASK]
        ))


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("remax", ReMax)
