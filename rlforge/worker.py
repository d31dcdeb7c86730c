"""What runs on the ranks: worker methods declared for the driver (:func:`remote`), and the training worker (a model
on a strategy with its optimizer and the mini-/micro-batch update loop).

A worker class marks each method the driver may call with :func:`remote` (its dispatch and collect modes); the
controller's worker groups (``rlforge.controller.remote.WorkerGroup``) bind what :func:`declared` finds. The worker
half of a run lives here, beside the module (``rlforge.module``) whose losses it runs; the controller only places and
calls it.

``ActorWorker`` trains the policy (and holds the reference model and the model the rollout engine
generates with); ``CriticWorker`` trains the value model. The same classes serve every controller: one process
(``local``), and one worker per data-parallel rank (``ray``, ``torchrun``: ``rlforge.controller.ray_workers``).

With several ranks, each worker sees its share of every mini-batch (``dispatch.shard_for_update``); losses
are normalized by mini-batch-wide counts summed over the ranks, so the summed gradients equal one
process's. The strategy does the rest: backward, clipping, the optimizer step and the state dicts.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rlforge import batch as B
from rlforge import lora, lr_schedule
from rlforge.config.batches import config_section, micro_batch_size
from rlforge.capabilities import remote
from rlforge.errors import ConfigError, NonFiniteError, RLForgeError
from rlforge.microbatch import Cut, fixed_plan, scoring_cut, token_budget_plan
from rlforge.module import LossContext, RLModule, builtin_metric, checked_loss
from rlforge.ops import SHARE_ALWAYS, SHARE_REPEATED, compile_forward, response_values, share_prompts
from rlforge.pipeline import PIPELINES

log = logging.getLogger("rlforge")

def _lengths(batch: B.Batch) -> list[int]:
    """Real tokens (prompt + response) per row."""
    return batch[B.ATTENTION_MASK].sum(-1).tolist()


def shared_prefix_applies(config: Any, strategy: Any, model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward passes share prompts (``model.shared_prefix``): only in the padded layout (packed
    rows, ``model.remove_padding``, have no per-row cache), eagerly (``model.compile`` is not verified with a KV cache),
    for a model that keeps its cache (transformers drops it in gradient-checkpointed layers in training mode), on a
    strategy verified with it (``shares_prompts``: single, fsdp)."""
    m = config.model
    return bool(m.shared_prefix and not m.remove_padding and not m.compile
                and not getattr(model, "is_gradient_checkpointing", False) and strategy.capabilities.shares_prompts)


# what the update of every trained role reads from its config section (ActorConfig's fields of the same names)
TRAIN_KEYS = ("ppo_epochs", "ppo_mini_batch_size", "ppo_micro_batch_size", "max_tokens_per_micro_batch", "grad_clip")


class TrainWorker:
    """Shared update loop: ``ppo_epochs`` passes over mini-batches, one optimizer step per mini-batch,
    gradients accumulated over micro-batches whose losses are normalized by mini-batch-wide counts."""

    role = ""  # the model (``module.<role>``) and metric prefix: "actor", "critic", a plugin role's ("prm")
    section_key = ""  # the config section of its batch and optimizer options (dotted: "algorithm.prm"); "" = role
    optimizer: torch.optim.Optimizer  # set by the subclass (the module's configure_*optimizers)
    scheduler: Any
    _writing: tuple[Any, float, list[float]] | None = None  # a background checkpoint write: future, start, end

    def __init__(self, config: Any, module: RLModule, strategy: Any, hook: Any = None) -> None:
        self.config = config
        key = self.section_key or self.role
        self.section = config_section(config, key)
        missing = [k for k in TRAIN_KEYS if k not in self.section]
        if missing:
            raise ConfigError(f"The '{self.role}' role's config section '{key}' lacks {', '.join(missing)}, which the "
                              f"update of a trained role reads (the actor's are actor.{', actor.'.join(TRAIN_KEYS)}): "
                              f"add them to its config class (docs/plugins.md, 'A trainable role').")
        self.module = module
        self.strategy = strategy
        self.hook = hook
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite gradient, in total
        self.bad_in_a_row = 0
        # the update's micro-batches; the forward-only passes cut theirs by scoring_cut
        self.cut = Cut(micro_batch_size(config, key), int(self.section.max_tokens_per_micro_batch))
        self.remove_padding = bool(config.model.remove_padding)

    @property
    def model(self) -> torch.nn.Module:
        return getattr(self.module, self.role)

    def loss(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError  # abstract: each worker's loss

    def optimize(self, model: torch.nn.Module, configured: Any, method: str) -> torch.nn.Module:
        """Take what the module's ``method`` (``configure_optimizers``, ``configure_critic_optimizers``, ...) returned
        for ``model``: ``(optimizer, scheduler or None)``, or a bare optimizer as Lightning takes it. Sets
        ``self.optimizer`` and ``self.scheduler`` and puts both on the strategy (DeepSpeed through ``fabric`` wraps
        model and optimizer; the others keep both); returns the model to use."""
        optimizer, scheduler = (configured, None) if isinstance(configured, torch.optim.Optimizer) else (
            tuple(configured) if isinstance(configured, (tuple, list)) and len(configured) == 2 else (None, None))
        where = f"{type(self.module).__qualname__}.{method}()"
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise RLForgeError(f"{where} returned {_shown(configured)}: return (optimizer, scheduler or None), e.g. "
                               f"(torch.optim.AdamW(self.{self.role}.parameters(), lr=...), None), or the optimizer "
                               f"alone.")
        if scheduler is not None and not (callable(getattr(scheduler, "step", None))
                                          and callable(getattr(scheduler, "state_dict", None))):
            raise RLForgeError(f"{where} returned a scheduler of type {type(scheduler).__name__}, which has no step() "
                               f"and state_dict(): return a torch.optim.lr_scheduler object (LambdaLR, ...), or None.")
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise RLForgeError(f"{where} returned ReduceLROnPlateau, whose step() needs a metric: rlforge steps the "
                               f"scheduler once per training step without one. Return a schedule of the step (LambdaLR, "
                               f"CosineAnnealingLR, ...), or lower the rate from a hook (rlforge_step_end) yourself.")
        self.scheduler = scheduler
        model, self.optimizer = self.strategy.setup_optimizer(model, optimizer)
        return model

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Put a model of this role on the strategy, with the ``model.*`` training options."""
        if self.config.model.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return self._setup(model, self.role)

    def _setup(self, model: torch.nn.Module, role: str) -> torch.nn.Module:
        """``model`` (this worker's of ``role``: actor, ref, critic) on the strategy, its forward passes compiled with
        ``model.compile``, sharing prompts with ``model.shared_prefix`` where that applies. A strategy that places
        models by role (fsdp: ``strategy.fsdp.offload_params``) overrides ``setup_model_for(model, role)``."""
        model = self.strategy.setup_model_for(model, role)
        if self.config.model.compile:
            compile_forward(model, self.config.model.compile_backend)
        if shared_prefix_applies(self.config, self.strategy, model):
            # the ranks of a sharded model run the same forward passes on every micro-batch, repeats or not
            share_prompts(model, SHARE_ALWAYS if self.strategy.world_size > 1 else SHARE_REPEATED)
        return model

    def micro_plan(self, batch: B.Batch, cut: Cut | None = None) -> list[list[int]]:
        """The rows of each micro-batch of ``batch`` (see ``rlforge.microbatch``), cut as the update's (or ``cut``).
        Collective with a token budget on several ranks: they agree on the number of micro-batches. A token budget is
        per rank: with sequence parallelism a micro-batch holds ``sequence_parallel_size`` x the budget, which its
        ranks split (verl's ``max_token_len_per_gpu x ulysses_sequence_parallel_size``)."""
        cut = cut or self.cut
        if not cut.tokens:
            return fixed_plan(len(batch), cut.rows)
        lengths = _lengths(batch)
        budget = cut.tokens * self.strategy.sequence_parallel_size
        plan = token_budget_plan(lengths, budget, self.remove_padding)
        if self.strategy.world_size > 1:
            parts = int(self.strategy.all_reduce_max(float(len(plan))))
            if parts != len(plan):
                plan = token_budget_plan(lengths, budget, self.remove_padding, parts)
        return plan

    def _per_row(self, batch: B.Batch, forward: Any, scoring: str) -> torch.Tensor:
        """``forward(micro)`` over the micro-batches of the forward-only pass ``<role>.<scoring>``, the results (0 at
        padding) put back in ``batch``'s row order."""
        out = torch.zeros(batch[B.RESPONSE_MASK].shape)
        for rows in self.micro_plan(batch, scoring_cut(self.cut, self.section[scoring])):
            with self.strategy.autocast():
                out[rows] = forward(batch.select(rows).to(self.strategy.device)).float().cpu()
        return out

    @remote("dp_update", "first")
    def update(self, batch: B.Batch, step: int | None = None) -> dict[str, float]:
        """``batch`` is this rank's shard (``shard_for_update``): its mini-batches are 1/world_size of the global.
        ``step``: the driver's training step, which the module sees as ``module.step`` and the losses as
        ``LossContext.step`` during the update (None: the module's own). What the module ``log``s during the update
        is returned with the metrics. Gradients are freed when it returns; with ``strategy.offload_optimizer`` the
        optimizer state waits in CPU memory between updates."""
        if getattr(self, "optimizer", None) is None:
            raise RLForgeError(f"{type(self).__qualname__} (role '{self.role}') has no optimizer: its __init__ sets one "
                               f"with self.optimize(model, <the module's configure method>(), '<its name>') "
                               f"(docs/plugins.md, 'A trainable role').")
        mini_size = self.section.ppo_mini_batch_size * self.config.rollout.n // self.strategy.world_size
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        offload = bool(self.config.strategy.offload_optimizer)
        module = self.module
        if step is not None:
            module.step = int(step)
        logged: dict[str, float] = {}
        outer, module._metrics = module._metrics, logged
        if offload:
            self._move_optimizer_state(to_cpu=False)
        try:
            for _ in range(self.section.ppo_epochs):
                for mini in batch.split(mini_size):
                    for k, v in self._optimizer_step(mini).items():
                        totals[k] += v
                    steps += 1
        finally:
            module._metrics = outer
            self.optimizer.zero_grad(set_to_none=True)  # no gradient memory held through the rollout
            if offload:
                self._move_optimizer_state(to_cpu=True)
        out = {k: v / max(steps, 1) for k, v in totals.items()}
        out[f"{self.role}/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this update ran at (as verl logs)
        out[f"{self.role}/skipped_steps"] = float(self.skipped_steps)
        clash = sorted(logged.keys() & out.keys())
        if clash:
            raise builtin_metric(type(module).__name__, clash[0], "the update")
        out.update(logged)
        if self.scheduler is not None and self.bad_in_a_row < steps:  # at least one optimizer step ran
            self.scheduler.step()
        return out

    def _move_optimizer_state(self, to_cpu: bool) -> None:
        """Optimizer state tensors (the moments; not Adam's scalar step counts, which stay where torch keeps them)
        to the CPU, or back beside their parameter (on the device; in CPU memory where the strategy offloads the
        parameters, ``strategy.fsdp.offload_params``). Works on plain and on sharded (DTensor) state."""
        from torch.distributed.tensor import DTensor

        for param, state in self.optimizer.state.items():
            local = param.to_local() if isinstance(param, DTensor) else param
            device = torch.device("cpu") if to_cpu else local.device
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != device:
                    state[key] = value.to(device)

    def _optimizer_step(self, mini: B.Batch) -> dict[str, float]:
        ctx = LossContext(
            # at least 1: a mini-batch without a trained token (every response masked) has a loss of 0, not 0/0
            global_tokens=max(1.0, self.strategy.all_reduce_sum(float(mini[B.RESPONSE_MASK].sum()))),
            global_seqs=self.strategy.all_reduce_sum(float(len(mini))),
            temperature=self.config.rollout.temperature,
            step=self.module.step,
        )
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        for rows in self.micro_plan(mini):
            micro = mini.select(rows)
            with self.strategy.autocast():
                loss, metrics = checked_loss(self.loss(micro.to(self.strategy.device), ctx),
                                             f"{type(self.module).__name__}'s {self.role} loss")
            self.strategy.backward(loss)
            for k, v in metrics.items():
                sums[k] += v
        if self.strategy.world_size > 1:  # each rank's metrics are its share of the mini-batch value
            sums = defaultdict(float, {k: self.strategy.all_reduce_sum(sums[k]) for k in sorted(sums)})
        self.strategy.unscale_gradients(self.optimizer)
        grad_norm = self.strategy.clip_grad_norm(self.model, self.section.grad_clip)
        sums[f"{self.role}/grad_norm"] = grad_norm
        if not math.isfinite(grad_norm):
            self.skipped_steps += 1
            self.bad_in_a_row += 1
            self.strategy.skip_step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
            limit = self.config.trainer.max_nonfinite_steps
            log.warning("%s: non-finite gradient norm (%s); optimizer step skipped (%d in a row, limit %d)",
                        self.role, grad_norm, self.bad_in_a_row, limit)
            if self.bad_in_a_row >= limit:
                raise NonFiniteError(
                    f"{self.role}: {self.bad_in_a_row} optimizer steps in a row had a NaN/Inf loss or gradient "
                    f"(trainer.max_nonfinite_steps={limit}). Lower the learning rate or check the rewards."
                )
            return dict(sums)
        self.bad_in_a_row = 0
        if self.hook is not None:
            self.hook.rlforge_before_optimizer_step(trainer=None, module=self.module, optimizer=self.optimizer,
                                                    rank=self.strategy.rank)
        self.strategy.optimizer_step(self.optimizer)
        return dict(sums)

    # --- state: full (gathered on rank 0) or sharded (the strategy's checkpoint layout) -------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer (gathered: complete on rank 0 only), scheduler and counters. Collective: every rank calls it."""
        return {"optimizer": self.strategy.optimizer_state_dict(self.model, self.optimizer), **self._small_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (every rank gets the complete state)."""
        configured = _settings(self.optimizer)
        self.strategy.load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self._load_small_state(state, configured)

    @remote(collect="first")
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full weights on the CPU (complete on rank 0 only). Collective."""
        return self.strategy.model_state_dict(self.model)

    @remote()
    def load_model_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        """Load full weights (every rank gets them; sharded models keep their shard)."""
        self.strategy.load_model_state_dict(self.model, weights)

    def save_sharded(self, path: Path, background: bool = False) -> dict[str, Any]:
        """Write model and optimizer shards to ``path`` (every rank its own) and return the small state.
        ``background`` (``strategy.checkpoint=async``): return once the state is copied, a thread writes the files
        while training goes on, :meth:`finish_sharded` waits for them."""
        self.finish_sharded()  # one write at a time
        if not background:
            self.strategy.save_sharded(path, self.model, self.optimizer)
            return self._small_state()
        done: list[float] = []
        future = self.strategy.save_sharded_async(path, self.model, self.optimizer)
        self._writing = (future, time.perf_counter(), done)
        future.add_done_callback(lambda _: done.append(time.perf_counter()))
        return self._small_state()

    @remote()
    def finish_sharded(self) -> float:
        """Wait for the background write of :meth:`save_sharded` (raising its error); the seconds it took from start
        to end, however long ago it ended (0.0 when none was started)."""
        if self._writing is None:
            return 0.0
        future, start, done = self._writing
        try:
            future.result()
        except Exception:  # the write's error, raised once (an interrupt of the wait is none: it stays tracked, and
            self._writing = None  # the run's clean-up waits again)
            raise
        self._writing = None
        return done[0] - start if done else time.perf_counter() - start

    def load_sharded(self, path: Path, state: dict[str, Any]) -> None:
        """Load what :meth:`save_sharded` wrote, into any number of ranks."""
        configured = _settings(self.optimizer)
        self.strategy.load_sharded(path, self.model, self.optimizer)
        self._load_small_state(state, configured)

    def _small_state(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "skipped_steps": self.skipped_steps,
            "precision": self.strategy.precision_state(),  # the loss scale of 16-mixed
        }

    def _load_small_state(self, state: dict[str, Any], configured: list[dict[str, Any]]) -> None:
        """The scheduler and counters of ``state``, after the optimizer's state: its settings (rate, weight decay,
        betas) are put back to ``configured``, this run's (the same as the checkpoint's unless
        ``trainer.resume_force`` continued with others: the loaded ones would have run silently), and the rates to
        its schedule's at the checkpoint's step (``lr_schedule.continue_at_step``: also after a longer
        ``trainer.total_steps``)."""
        for group, settings in zip(self.optimizer.param_groups, configured):
            group.update(settings)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
            if all("initial_lr" in group for group in self.optimizer.param_groups):
                self.scheduler.base_lrs = [group["initial_lr"] for group in self.optimizer.param_groups]
            lr_schedule.continue_at_step(self.scheduler)
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.strategy.load_precision_state(state.get("precision", {}))


def _shown(value: Any) -> str:
    """``value`` in an error: its type, and the types inside a tuple or list."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__ if value is not None else "None"


def _settings(optimizer: Any) -> list[dict[str, Any]]:
    """Each parameter group's settings as the optimizer was built for this run: everything but its parameters and its
    current rate (the schedule's, set at load: ``initial_lr`` is the configured one)."""
    return [{k: v for k, v in group.items() if k not in ("params", "lr")} for group in optimizer.param_groups]


class ActorWorker(TrainWorker):
    """The policy (and the frozen reference model): log-probs and the policy update."""

    role = "actor"

    def __init__(self, config: Any, module: RLModule, strategy: Any, hook: Any = None,
                 engine_owns_weights: bool = False) -> None:
        super().__init__(config, module, strategy, hook)
        # The rollout engine generates with the actor itself, unless the strategy shards it: then with a full
        # replica (the hybrid engine), refreshed by streaming gathered weights in ``named_weights``. An engine that
        # keeps its own weights (vLLM: ``owns_weights``) needs no replica: it gets the sharded actor (for its config)
        # and the gathered weight stream.
        # A pipeline that generates while the actor trains (trainer.pipeline=one_step_off, async) needs that replica too.
        self.rollout_model = module.actor
        own = strategy.capabilities.sharded or PIPELINES[config.trainer.pipeline].own_rollout_weights
        if own and not engine_owns_weights:
            self.rollout_model = copy.deepcopy(module.actor).requires_grad_(False).to(strategy.device)
        module.actor = self._prepare(module.actor)
        module.actor.train()
        if module.ref is not None:
            module.ref = self._setup(module.ref, "ref")
        module.actor = self.optimize(module.actor, module.configure_optimizers(), "configure_optimizers")

    def loss(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        return self.module.training_step(micro, ctx)

    @remote("dp_score", "concat")
    @torch.no_grad()
    def compute_log_probs(self, batch: B.Batch, role: str = "actor") -> torch.Tensor:
        """Per-token log-probs of the responses under the actor or the reference model (``module.forward_responses``;
        with LoRA and no ``model.ref_path`` the reference is the actor with its adapter disabled)."""
        base = role == "ref" and self.module.ref is None and self.module.reference_is_base()
        model = self.module.actor if role == "actor" or base else self.module.ref
        if model is None:
            raise RuntimeError(f"No {role} model is loaded (does the algorithm need a reference model?)")
        temperature = self.config.rollout.temperature
        with lora.base_model_context(model) if base else contextlib.nullcontext():
            return self._per_row(batch, lambda mb: self.module.forward_responses(model, mb, temperature),
                                 "log_prob" if role == "actor" else "ref_log_prob")

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's weights for the rollout engine: with LoRA the merged weights under the base model's names
        (what an engine holding a plain copy of the model loads), else the strategy's stream of full weights."""
        if lora.is_lora(self.module.actor):
            return lora.merged_weights(self.module.actor)
        return self.strategy.named_weights(self.module.actor)


class CriticWorker(TrainWorker):
    """The value model: per-token values and the clipped value-loss update."""

    role = "critic"

    def __init__(self, config: Any, module: RLModule, strategy: Any, hook: Any = None) -> None:
        super().__init__(config, module, strategy, hook)
        module.critic = self._prepare(module.critic)
        module.critic.train()
        module.critic = self.optimize(module.critic, module.configure_critic_optimizers(), "configure_critic_optimizers")

    def loss(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        return self.module.critic_step(micro, ctx)

    @remote("dp_score", "concat")
    @torch.no_grad()
    def compute_values(self, batch: B.Batch) -> torch.Tensor:
        resp_len = batch[B.RESPONSES].shape[1]
        return self._per_row(batch, lambda mb: response_values(
            self.module.critic, mb[B.INPUT_IDS], mb[B.ATTENTION_MASK], resp_len, remove_padding=self.remove_padding),
            "values")
