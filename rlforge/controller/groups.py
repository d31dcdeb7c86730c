"""What the controllers share: the rank layout checks, and the engines and checkpoints over worker groups.

A *worker group* (``rlforge.controller.remote.WorkerGroup``) is the ranks of one role (``actor``, ``critic``, the Ray
controller's ``rollout``) with the worker class's declared methods bound to it; its transport is the local
controller's process, Ray actors or torchrun's processes. Each operation's split and join is its worker method's
declaration (``rlforge.worker.remote``, on the classes of ``ray_workers.py`` and ``rlforge.worker``):

- generation: the prompts are split over the workers that own the engines (every actor rank, or the Ray
  controller's rollout group), the responses gathered in order; weight syncs go to those engines;
- log-probs, values and updates are the stages' calls on the groups (``ctx.workers.actor.compute_log_probs``,
  ``ctx.workers.critic.update``): equal slices per data-parallel group for forward passes, each data-parallel group
  its slice of every mini-batch for updates (``shard_for_update``);
- checkpoints: every role whose worker declares ``state_dict`` (actor, critic, a plugin's trained role), gathered
  (``strategy.checkpoint=full``) or written by every rank (``sharded``), under every controller; the actor's weights
  are the plain HF ``actor/``, which the driver writes from the gathered weights (it holds no model between
  checkpoints under ``ray`` and ``torchrun``) and reads back on resume.
- roles a plugin adds (``registry.role``: PRIME's ``prm``, the ``model`` reward manager's ``reward_model``) are placed
  like the built-in ones and reached as ``controller.workers.<role>``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.checkpoint import SHARDED_DIR, load_weights, staged_actor, write_actor
from rlforge.config.batches import micro_batch_size
from rlforge.controller.dispatch import PerRank
from rlforge.dataflow import Workers
from rlforge.errors import ConfigError, RLForgeError


if TYPE_CHECKING:
    from rlforge.registry import Entry
    from rlforge.weight_sync import SyncStats

CHECKPOINT_MODES = ("full", "sharded", "async")


def check_layout(config: Any, strategy: Entry[Any], needs_critic: bool) -> None:
    """Fail before any worker starts: rank count, strategy (its registry entry), checkpoint mode, batch sizes per
    data-parallel group (at compose time with the actor's batch sizes, ``validate_config``; the critic's when the
    controller starts)."""
    world = config.strategy.num_processes
    if world < 1:
        raise ConfigError(f"strategy.num_processes must be >= 1, got {world}.")
    if world > 1 and not strategy.capabilities.sharded:
        raise ConfigError(
            f"strategy.name={config.strategy.name} trains one copy per process without synchronizing gradients: "
            f"with strategy.num_processes={world} use strategy.name=fsdp (or tp)."
        )
    world = strategy.capabilities.data_parallel_size(config)
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


def rank_module_class(module: Any) -> type:
    """The class each rank rebuilds the module from, as ``cls(config)`` (``ray_workers.WorkerProcess``). A module
    whose constructor needs more than the config, or was given more (``RLModule.__new__`` keeps what it was given),
    would run on the ranks without those arguments, so it is refused; optional ones left at their defaults are fine."""
    import inspect

    cls = type(module)
    signature = inspect.signature(cls.__init__)
    params = list(signature.parameters.values())[2:]  # after self and the config
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    args, kwargs = module._init_args
    given = [n for n in signature.bind_partial(None, *args, **kwargs).arguments if n in {p.name for p in params}]
    extra = list(dict.fromkeys([*required, *given]))
    if extra:
        raise ConfigError(
            f"{cls.__qualname__}.__init__ {'needs' if required else 'is given'} {', '.join(extra)} besides the config; "
            f"under trainer.controller={module.config.trainer.controller} every rank rebuilds the module as "
            f"{cls.__qualname__}(config), so those arguments would be lost there. Put them in the algorithm's config "
            f"(its config_class) and read them from self.config, or use trainer.controller=local.")
    return cls


class GroupController:
    """The engines and checkpoints over worker groups (the stages call the groups themselves: ``workers``). A subclass
    sets ``config``, ``module`` (the driver's; it holds the actor only where the driver trains it, ``local``),
    ``reward``, ``groups`` (role -> ``WorkerGroup``: every role ``Builder.roles`` names), ``rollout`` (a group that
    owns the rollout engines; None: the actor ranks own them) and may override ``_share``."""

    config: Any
    module: Any
    reward: Any
    groups: dict[str, Any]
    rollout: Any = None
    continuous_batching = False  # agent requests go in waves (the local controller on vllm: each at once)
    submit_tokens: Any = None  # the engine's non-blocking agent request (agent.engine.Submit), where it is in this process

    @property
    def workers(self) -> Workers:
        """The worker groups by role: ``workers.actor.compute_log_probs(batch, "ref")``, a plugin role's
        ``workers.prm.update(batch, step)``, the engines' ``workers.rollout.generate(batch, params)``."""
        return Workers(self.groups, self.rollout if self.rollout is not None else self.groups.get("actor"))

    @property
    def actor(self) -> Any:
        return self.groups["actor"]

    def _share(self, obj: Any) -> Any:
        """``obj`` as sent to every rank (Ray: one copy in the object store)."""
        return obj

    def score(self, batch: B.Batch) -> B.Batch:
        return self.reward.score(batch)

    def sync_weights(self) -> SyncStats:
        """The actor ranks give their engines the new weights (``ActorRank.sync_weights``): bytes moved, seconds. A
        controller's own operation, not a pass-through: where a rollout group owns the engines (Ray) the weights
        move between two groups (``RayController.sync_weights``)."""
        return self.actor.sync_weights()

    # --- checkpoints -------------------------------------------------------------------------------
    def _roles(self) -> list[Any]:
        """The groups with state to checkpoint (their worker class declares ``state_dict``): actor first."""
        return [g for g in self.groups.values() if "state_dict" in g.methods]

    def state_dict(self, staging: Path, background: bool = False) -> dict[str, Any]:
        """Each trained role's state and each rank's RNG state: gathered (``strategy.checkpoint=full``: the optimizer
        state, and the weights of every role but the actor), or with ``sharded`` (or ``async``) the small state while
        the ranks write their shards to ``staging`` (``checkpoint.save`` moves that folder into the checkpoint as
        ``sharded/``). The actor's weights become the plain HF ``actor/``: ``checkpoint.save`` writes the driver's
        ``module.actor`` where the driver trains it (``local``); elsewhere the driver holds no model, so they are
        gathered and written to ``checkpoint.staged_actor(staging)`` here. ``background`` (``async``): the ranks
        write in the background (:meth:`finish_checkpoint` waits), and that checkpoint has no ``actor/``."""
        live = self.module.loads("actor")  # the local controller's workers train the driver's module.actor itself
        state: dict[str, Any] = {"world_size": self.actor.world_size, "rng": {}}
        sharded = self.config.strategy.checkpoint in ("sharded", "async")
        if sharded:
            state["sharded"] = True
        for group in self._roles():
            if sharded:  # the workers' working folder may differ: an absolute path
                results = group.save_sharded(str(staging.resolve() / group.role), background)
            else:
                results = group.state_dict(group.role != "actor" or not live)
            state["rng"][group.role] = [r.pop("rng") for r in results]
            state[group.role] = results[0]
        if not (background or live):
            weights = self.actor.model_state_dict() if sharded else state["actor"].pop("model")
            with self._driver_actor() as actor:
                actor.load_state_dict(weights)
                write_actor(staged_actor(staging), actor, self.module.tokenizer, self.module.processor)
        return state

    def finish_checkpoint(self) -> float:
        """Wait for the ranks' background writes of :meth:`state_dict` (``background=True``) and raise a rank's
        error; the seconds the slowest rank's write took (0.0 when none was running)."""
        return max((max(group.finish_sharded()) for group in self._roles()), default=0.0)

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        """Restore what :meth:`state_dict` saved in the checkpoint ``folder``: each role's shards, or its gathered state
        with the actor's weights read from ``actor/`` (into the driver's ``module.actor`` where the driver trains it,
        else into a copy loaded only while they are sent to the ranks)."""
        same_ranks = state.get("world_size") == self.actor.world_size
        saved = [k for k, v in state.items() if isinstance(v, dict) and k != "rng"]
        missing = [group.role for group in self._roles() if group.role not in saved]
        if missing:
            raise RLForgeError(f"This checkpoint holds no state of the {', '.join(map(repr, missing))} role (it has: "
                               f"{', '.join(saved)}): it was saved by a run with other roles (another algorithm or "
                               f"reward manager).")
        for group in self._roles():
            rngs = state.get("rng", {}).get(group.role) if same_ranks else None
            rngs = rngs or [None] * group.world_size
            if state.get("sharded") or "sharded_step" in state:
                path = folder.resolve() / SHARDED_DIR / group.role
                if not path.is_dir():
                    raise RLForgeError(f"Checkpoint shards missing: {path} (strategy.checkpoint=sharded).")
                group.load_sharded(str(path), state[group.role], PerRank(rngs))
                continue
            role_state = dict(state[group.role])
            if group.role == "actor":
                role_state.update(self._actor_weights(folder))
            group.load_state_dict(self._share(role_state), PerRank(rngs))

    def _actor_weights(self, folder: Path) -> dict[str, Any]:
        """What the actor ranks need besides their state to resume from ``actor/``: nothing where the driver trains
        ``module.actor`` (its weights are loaded in place), else the weights as ``{"model": ...}``."""
        if self.module.loads("actor"):
            load_weights(folder, self.module.actor)
            return {}
        with self._driver_actor() as actor:
            load_weights(folder, actor)
            return {"model": actor.state_dict()}

    @contextlib.contextmanager
    def _driver_actor(self) -> Iterator[Any]:
        """The actor as the driver would load it (``model.path``, LoRA and precision as configured), only while a
        checkpoint's ``actor/`` is written or read: between checkpoints the driver of ``ray`` and ``torchrun`` holds
        no model, the ranks hold the trained one."""
        module = self.module
        module.roles = frozenset({"actor"})
        try:
            module.configure_model()
            yield module.actor
        finally:
            module.actor, module.roles = None, frozenset()
