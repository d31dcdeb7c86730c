"""What the multi-process controllers share: the rank layout checks and the dataflow dispatched to worker groups.

A *worker group* is the ranks of one role (``actor``, ``critic``), each running ``ray_workers.RankWorker``; the
``ray`` controller runs them as Ray actors, the ``torchrun`` controller in the processes torchrun started (the
``ray`` controller's ``rollout`` group runs ``ray_workers.RolloutWorker``, outside any process group). A group
offers ``world_size``, ``dp_size`` (data-parallel groups: ``strategy.tp.size`` consecutive ranks see the same
rows), ``call(method, *args)`` (every rank, the same arguments), ``call_each(method, args)`` (per-rank arguments,
None = skip a rank) and ``call_dp`` (:func:`data_parallel_call`). :class:`GroupController` dispatches the dataflow:

- generation: the prompts are split over the workers that own the engines (every actor rank, or the Ray
  controller's rollout group), the responses gathered in order;
- log-probs and values: equal slices per data-parallel group (sharded models run collectives);
- updates: each data-parallel group gets its slice of every mini-batch (``shard_for_update``);
- checkpoints: gathered (``strategy.checkpoint=full``) or written by every rank (``sharded``); the driver's
  ``module.actor`` mirrors the trained weights, so ``checkpoint.save`` writes the plain HF folder.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.config.compose import micro_batch_size
from rlforge.controller.dispatch import restore, shard_for_scoring, shard_for_update, split_rows
from rlforge.errors import ConfigError, RLForgeError
from rlforge.protocols import Generation, SamplingParams, derived_seed

if TYPE_CHECKING:
    import torch

CHECKPOINT_MODES = ("full", "sharded")


def data_parallel_size(config: Any, strategy_factory: Any) -> int:
    """The data-parallel groups that ``strategy.num_processes`` ranks form: each rank alone, unless the strategy
    groups them (``tp``: tensor-parallel groups that see the same rows)."""
    size = getattr(strategy_factory, "data_parallel_size", None)
    return int(size(config)) if size is not None else int(config.strategy.num_processes)


def check_layout(config: Any, strategy_factory: Any, needs_critic: bool) -> None:
    """Fail before any worker starts: rank count, strategy, checkpoint mode, batch sizes per data-parallel group (at
    compose time with the actor's batch sizes, ``validate_config``; the critic's when the controller starts)."""
    world = config.strategy.num_processes
    if world < 1:
        raise ConfigError(f"strategy.num_processes must be >= 1, got {world}.")
    if world > 1 and not getattr(strategy_factory, "sharded", False):
        raise ConfigError(
            f"strategy.name={config.strategy.name} trains one copy per process without synchronizing gradients: "
            f"with strategy.num_processes={world} use strategy.name=fsdp (or tp)."
        )
    world = data_parallel_size(config, strategy_factory)
    unit = f"strategy.num_processes={world} ranks" if world == config.strategy.num_processes else (
        f"{world} data-parallel groups (strategy.num_processes={config.strategy.num_processes})")
    if config.strategy.checkpoint not in CHECKPOINT_MODES:
        raise ConfigError(
            f"strategy.checkpoint='{config.strategy.checkpoint}'. Allowed: {', '.join(CHECKPOINT_MODES)}."
        )
    n = config.rollout.n
    if (config.data.train_batch_size * n) % world:
        raise ConfigError(
            f"data.train_batch_size x rollout.n = {config.data.train_batch_size * n} sequences must split evenly "
            f"over {unit}."
        )
    for section in ("actor", "critic") if needs_critic else ("actor",):
        mini, micro = config[section].ppo_mini_batch_size * n, micro_batch_size(config, section)
        if mini % world:
            raise ConfigError(
                f"{section}.ppo_mini_batch_size x rollout.n = {mini} sequences must split evenly over {unit}."
            )
        by_count = not config[section].max_tokens_per_micro_batch
        if by_count and micro < mini // world and (mini // world) % micro:
            raise ConfigError(
                f"{section}.ppo_micro_batch_size ({micro} sequences per rank) must divide each rank's share of the "
                f"mini-batch ({mini // world} sequences with {unit})."
            )


def data_parallel_call(group: Any, method: str, shards: list[tuple]) -> list[Any]:
    """Run ``method(*shards[g])`` on every rank of data-parallel group ``g`` (ranks ``g * per`` to
    ``(g + 1) * per - 1``: a tensor-parallel group); the results of each group's first rank, in group order."""
    per = group.world_size // len(shards)
    return group.call_each(method, [shards[r // per] for r in range(group.world_size)])[::per]


class GroupController:
    """The dataflow and checkpoints over worker groups. A subclass sets ``config``, ``module`` (the driver's
    actor mirror), ``reward``, ``actor``, ``critic`` (None without a value model), ``rollout`` (a group that owns the
    rollout engines; None: the actor ranks own them) and may override ``_share``."""

    config: Any
    module: Any
    reward: Any
    actor: Any
    critic: Any
    rollout: Any = None

    def _share(self, obj: Any) -> Any:
        """``obj`` as sent to every rank (Ray: one copy in the object store)."""
        return obj

    # --- the dataflow ------------------------------------------------------------------------------
    def _balance(self, role: str) -> bool:
        """Spread real tokens evenly over the ranks (``trainer.balance_batch``; unset: when micro-batches are cut by
        token budget)."""
        balance = self.config.trainer.balance_batch
        return bool(self.config[role].max_tokens_per_micro_batch) if balance is None else bool(balance)

    def _engines(self) -> Any:
        """The group whose workers own the rollout engines."""
        return self.actor if self.rollout is None else self.rollout

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        """The prompts split over the engines; with a seed, each engine samples from a stream of its own."""
        engines = self._engines()
        shards = split_rows(batch, engines.world_size)
        args = [(s, replace(params, seed=derived_seed(params.seed, i))) if len(s) else None
                for i, s in enumerate(shards)]
        return B.Batch.concat(engines.call_each("generate", args))

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Agent loops' requests (one wave), split in contiguous parts over the engines (seeded as in ``generate``)."""
        engines = self._engines()
        n = engines.world_size
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        parts = [(prompts[a:b], [replace(p, seed=derived_seed(p.seed, i)) for p in params[a:b]]) if b > a else None
                 for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        return [g for part in engines.call_each("generate_tokens", parts) for g in part]

    def score(self, batch: B.Batch) -> B.Batch:
        return self.reward.score(batch)

    def compute_log_probs(self, batch: B.Batch, role: str = "actor") -> torch.Tensor:
        import torch

        shards, order = shard_for_scoring(batch, self.actor.dp_size, f"{role} log-probs", self._balance("actor"))
        return restore(torch.cat(self.actor.call_dp("compute_log_probs", [(s, role) for s in shards])), order)

    def update_actor(self, batch: B.Batch) -> dict[str, float]:
        mini = self.config.actor.ppo_mini_batch_size * self.config.rollout.n
        shards = shard_for_update(batch, self.actor.dp_size, mini, balance=self._balance("actor"))
        return self.actor.call_dp("update", [(s,) for s in shards])[0]

    def compute_values(self, batch: B.Batch) -> torch.Tensor:
        import torch

        assert self.critic is not None, "compute_values needs a critic (module.needs_critic())"
        shards, order = shard_for_scoring(batch, self.critic.dp_size, "values", self._balance("critic"))
        return restore(torch.cat(self.critic.call_dp("compute_values", [(s,) for s in shards])), order)

    def update_critic(self, batch: B.Batch) -> dict[str, float]:
        assert self.critic is not None, "update_critic needs a critic (module.needs_critic())"
        mini = self.config.critic.ppo_mini_batch_size * self.config.rollout.n
        shards = shard_for_update(batch, self.critic.dp_size, mini, balance=self._balance("critic"))
        return self.critic.call_dp("update", [(s,) for s in shards])[0]

    def sync_weights(self) -> float:
        return max(self.actor.call("sync_weights"))

    # --- checkpoints -------------------------------------------------------------------------------
    def _roles(self) -> list[Any]:
        return [g for g in (self.actor, self.critic) if g is not None]

    def state_dict(self, staging: Path) -> dict[str, Any]:
        """The local controller's layout (gathered optimizer state; critic weights) plus each rank's RNG state,
        or with ``strategy.checkpoint=sharded`` the small state while the ranks write their shards to ``staging``
        (``checkpoint.save`` moves that folder into the checkpoint as ``sharded/``)."""
        state: dict[str, Any] = {"world_size": self.actor.world_size, "rng": {}}
        sharded = self.config.strategy.checkpoint == "sharded"
        if sharded:
            state["sharded"] = True
            staging = staging.resolve()  # the workers' working folder may differ
        for group in self._roles():
            if sharded:
                results = group.call("save_sharded", str(staging / group.role))
            else:
                results = group.call("state_dict", True)
            state["rng"][group.role] = [r.pop("rng") for r in results]
            state[group.role] = results[0]
        weights = self.actor.call("model_state_dict")[0] if sharded else state["actor"].pop("model")
        self.module.actor.load_state_dict(weights)  # the driver's mirror: checkpoint.save writes it as actor/
        return state

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        """Restore what :meth:`state_dict` (or the local controller) saved in the checkpoint ``folder``;
        ``checkpoint.load`` has already put the actor's weights into the driver's ``module.actor``."""
        from rlforge.checkpoint import SHARDED_DIR

        same_ranks = state.get("world_size") == self.actor.world_size
        for group in self._roles():
            rngs = state.get("rng", {}).get(group.role) if same_ranks else None
            rngs = rngs or [None] * group.world_size
            if state.get("sharded") or "sharded_step" in state:
                path = folder.resolve() / SHARDED_DIR / group.role
                if not path.is_dir():
                    raise RLForgeError(f"Checkpoint shards missing: {path} (strategy.checkpoint=sharded).")
                group.call_each("load_sharded", [(str(path), state[group.role], rng) for rng in rngs])
                continue
            role_state = dict(state[group.role])
            if group.role == "actor":
                role_state["model"] = self.module.actor.state_dict()
            ref = self._share(role_state)
            group.call_each("load_state_dict", [(ref, rng) for rng in rngs])

