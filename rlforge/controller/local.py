"""``local`` controller: every worker in this process (the default; no Ray)."""

from __future__ import annotations

import time
from typing import Any

import torch

from rlforge import batch as B
from rlforge.controller.worker import ActorWorker, CriticWorker
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.protocols import SamplingParams


class LocalController:
    """Builds the strategy, actor worker, rollout engine and reward manager from the registries."""

    def __init__(self, config: Any, module: RLModule, plugins: Any, trainer: Any = None) -> None:
        reg = plugins.registry
        self.config = config
        factory = reg.strategy.get(config.strategy.name)
        if config.strategy.num_processes != 1 or getattr(factory, "sharded", False):
            raise ConfigError(
                f"strategy.name={config.strategy.name} with strategy.num_processes={config.strategy.num_processes} "
                f"needs one process per rank, which the local controller (one process) does not start. "
                f"Set trainer.controller=ray (see docs/distributed.md)."
            )
        self.strategy = factory(config)
        self.actor = ActorWorker(config, module, self.strategy, plugins.hook, trainer)
        self.critic = CriticWorker(config, module, self.strategy, plugins.hook, trainer) if module.critic else None
        self.rollout = reg.rollout.get(config.rollout.name)(config, self.actor.rollout_model, module.tokenizer)
        self.logprobs_match_actor = bool(getattr(self.rollout, "logprobs_match_actor", False))
        self.reward = reg.reward_manager.get(config.reward.manager)(config, module.tokenizer, reg)

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        return self.rollout.generate(batch, params)

    def score(self, batch: B.Batch) -> B.Batch:
        return self.reward.score(batch)

    def compute_log_probs(self, batch: B.Batch, role: str = "actor") -> torch.Tensor:
        return self.actor.compute_log_probs(batch, role)

    def update_actor(self, batch: B.Batch) -> dict[str, float]:
        return self.actor.update(batch)

    def compute_values(self, batch: B.Batch) -> torch.Tensor:
        assert self.critic is not None, "compute_values needs a critic (module.needs_critic())"
        return self.critic.compute_values(batch)

    def update_critic(self, batch: B.Batch) -> dict[str, float]:
        assert self.critic is not None, "update_critic needs a critic (module.needs_critic())"
        return self.critic.update(batch)

    def sync_weights(self) -> float:
        start = time.perf_counter()
        self.rollout.update_weights(self.actor.named_weights())
        return time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """Optimizer/scheduler state of every worker, and the critic's weights (the actor's are saved as HF)."""
        state: dict[str, Any] = {"actor": self.actor.state_dict()}
        if self.critic is not None:
            state["critic"] = {**self.critic.state_dict(), "model": self.critic.model_state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "sharded_step" in state:
            raise RLForgeError("This checkpoint holds sharded state (strategy.checkpoint=sharded): resume it with "
                               "trainer.controller=ray, or save with strategy.checkpoint=full.")
        self.actor.load_state_dict(state["actor"])
        if self.critic is not None:
            self.critic.load_model_state_dict(state["critic"]["model"])
            self.critic.load_state_dict(state["critic"])

    def shutdown(self) -> None:
        self.rollout.shutdown()
        close_reward(self.reward)


def close_reward(manager: Any) -> None:
    """Stop a reward manager's processes, if it has any (``close`` is optional for reward managers)."""
    close = getattr(manager, "close", None)
    if close is not None:
        close()


@hookimpl
def rlforge_register(registry):
    registry.controller.register("local", LocalController, description="all workers in this process")
