"""``local`` controller: every worker in this process (the default; no Ray)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.agent.engine import token_generator
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.protocols import Generation, SamplingParams

if TYPE_CHECKING:
    import torch

    from rlforge.build import Builder

log = logging.getLogger("rlforge")


class LocalController:
    """The strategy, the actor (and critic) worker, the rollout engine and the reward manager, in this process."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        strategy = registry.strategy.get(config.strategy.name)
        if config.strategy.num_processes != 1 or getattr(strategy, "sharded", False):
            raise ConfigError(
                f"strategy.name={config.strategy.name} with strategy.num_processes={config.strategy.num_processes} "
                f"needs one process per rank, which the local controller (one process) does not start. "
                f"Set trainer.controller=ray, or torchrun under torchrun (see docs/distributed.md)."
            )
        ray = config.get("ray")
        if ray is not None and ray.get("rollout_workers"):
            log.warning("ray.rollout_workers=%s is ignored: trainer.controller=local generates in this process "
                        "(rollout workers are the Ray controller's; set trainer.controller=ray).", ray.rollout_workers)

    def __init__(self, builder: Builder, module: RLModule) -> None:
        from rlforge.controller.worker import ActorWorker, CriticWorker

        self.config = builder.config
        module.configure_model()
        self.strategy = builder.strategy()
        self.actor = ActorWorker(self.config, module, self.strategy, builder.hook)
        self.critic = CriticWorker(self.config, module, self.strategy, builder.hook) if module.critic else None
        self.rollout = builder.rollout(self.actor.rollout_model, module.tokenizer)
        self.logprobs_match_actor = bool(getattr(self.rollout, "logprobs_match_actor", False))
        self._tokens = token_generator(self.rollout, module.tokenizer)
        self.reward = builder.reward(module.tokenizer)

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        return self.rollout.generate(batch, params)

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Token-in/token-out requests of agent loops (``rlforge.protocols.TokenGenerator``)."""
        return self._tokens(prompts, params)

    def score(self, batch: B.Batch) -> B.Batch:
        return self.reward.score(batch)

    def compute_log_probs(self, batch: B.Batch, role: str = "actor") -> torch.Tensor:
        return self.actor.compute_log_probs(batch, role)

    def update_actor(self, batch: B.Batch) -> dict[str, float]:
        return self.actor.update(batch)

    def compute_values(self, batch: B.Batch) -> torch.Tensor:
        if self.critic is None:
            raise RLForgeError("compute_values needs a critic (the algorithm's needs_critic() is False).")
        return self.critic.compute_values(batch)

    def update_critic(self, batch: B.Batch) -> dict[str, float]:
        if self.critic is None:
            raise RLForgeError("update_critic needs a critic (the algorithm's needs_critic() is False).")
        return self.critic.update(batch)

    def sync_weights(self) -> float:
        return self.load_weights(self.actor.named_weights())

    def snapshot_weights(self) -> list[tuple[str, torch.Tensor]]:
        """A copy of the weights :meth:`sync_weights` gives the engine now, for :meth:`load_weights` to give it later
        (``trainer.pipeline=async``: the actor trains on while the engine finishes older generations)."""
        return [(name, tensor.clone()) for name, tensor in self.actor.named_weights()]

    def load_weights(self, snapshot: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Give the engine these weights (a :meth:`snapshot_weights` copy, from the thread that generates)."""
        start = time.perf_counter()
        self.rollout.update_weights(iter(snapshot))
        return time.perf_counter() - start

    def state_dict(self, staging: Path) -> dict[str, Any]:
        """Optimizer/scheduler state of every worker, and the critic's weights (the actor's are saved as HF)."""
        state: dict[str, Any] = {"actor": self.actor.state_dict()}
        if self.critic is not None:
            state["critic"] = {**self.critic.state_dict(), "model": self.critic.model_state_dict()}
        return state

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
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
