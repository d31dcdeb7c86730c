"""The dataflow of one training step as data: an ordered list of stage objects (HybridFlow style).

A :class:`Stage` has a ``name``, the batch columns it ``requires`` and ``produces``, and ``run(ctx, batch)``.
It sees the step through a narrow :class:`StepContext` (the controller, the module, the sampling settings, the
step, the metrics sink, hook calls), never the Trainer. The built-in stages are ``Stage.ROLLOUT``,
``Stage.REWARD``, ... ; a user stage is a ``Stage`` subclass or any callable ``batch -> batch`` (optionally
with ``requires``/``produces``/``stage_name`` attributes). ``DataFlow.compile()`` checks, before any model
is loaded, that every stage's inputs come from the loader or an earlier stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Union

from rlforge import batch as B
from rlforge.errors import RLForgeError
from rlforge.evaluation import SCORED_AT, score_with
from rlforge.metric_values import as_number
from rlforge.plugin_manager import implementers
from rlforge.weight_sync import add_sync_metrics

if TYPE_CHECKING:
    from rlforge.protocols import Controller
    from rlforge.sampling import SamplingParams

LOADER_COLUMNS = frozenset({B.PROMPTS, B.PROMPT_MASK, B.UID, B.RAW_PROMPT, B.DATA_SOURCE, B.GROUND_TRUTH,
                            B.EXTRA_INFO})
# what a batch of preference data brings (``rlforge.preferences.collate_preferences``): completions in the rollout layout
PAIR_COLUMNS = LOADER_COLUMNS | {B.RESPONSES, B.RESPONSE_MASK, B.INPUT_IDS, B.ATTENTION_MASK, B.LABEL, B.MARGIN}


class Workers:
    """The worker groups of a run by role (``controller.workers``, ``StepContext.workers``), each called with its
    worker class's declared methods: ``workers.actor.compute_log_probs(batch, "ref")``,
    ``workers.critic.update(batch, step)``, a plugin's ``workers.prm``; ``role in workers``. ``workers.rollout`` is
    the group whose ranks own the rollout engines (``generate``, ``generate_tokens``): the Ray controller's rollout
    group, else the actor's (``engines``). A role the run did not place is an error naming it and why."""

    def __init__(self, groups: dict[str, Any], engines: Any = None) -> None:
        self._groups = groups
        self._engines = engines

    def __getattr__(self, role: str) -> Any:
        groups = self.__dict__.get("_groups", {})
        if role in groups:
            return groups[role]
        if role == "rollout" and self.__dict__.get("_engines") is not None:
            return self._engines
        raise RLForgeError(f"No '{role}' worker group in this run (placed: {', '.join(groups) or 'none'}): a role is "
                           f"placed when the algorithm's worker_roles() or the reward manager's worker_roles() name it "
                           f"(the critic when the algorithm's needs_critic() is True).")

    def __contains__(self, role: object) -> bool:
        return role in self._groups

    def __iter__(self) -> Any:
        return iter(self._groups.values())


class StepContext:
    """What a stage may use: the components of the run and the step's state. One per training step.

    :param metrics: the step's metrics sink: stages (and ``RLModule.log``) add ``name -> float`` here; it is
        what the loggers receive (one route for every metric).
    :param draw: a callable returning the next ``data.train_batch_size`` training prompts (the data cursor
        advances), for stages that need more prompts (dynamic sampling).
    :param builder: the run's :class:`rlforge.build.Builder`, for stages that build components of their own (the
        agentic rollout stage builds the agent loop and its tools on first use).
    """

    def __init__(self, *, config: Any, controller: Controller, module: Any, hook: Any, step: int,
                 sampling: SamplingParams, flow: DataFlow, draw: Callable[[], B.Batch], hook_trainer: Any = None,
                 builder: Any = None) -> None:
        self.config = config
        self.builder = builder
        self.controller = controller
        self.module = module
        self.step = step
        self.sampling = sampling
        self.flow = flow
        self.metrics: dict[str, float] = {}
        self._hook = hook
        self._draw = draw
        self._hook_trainer = hook_trainer  # passed as the hooks' ``trainer`` argument (kept for compatibility)
        self._nested: list[float] = []  # seconds of the stages run inside the running ones (ctx.run within run)
        self._running: list[Stage] = []  # the stages running, innermost last (who called ctx.log)

    @property
    def workers(self) -> Any:
        """The run's worker groups by role (``controller.workers``, :class:`Workers`): ``ctx.workers.actor.compute_log_probs(batch,
        "ref")``, a plugin role's ``ctx.workers.prm.update(batch, ctx.step)``."""
        return self.controller.workers

    def call_hook(self, name: str, **kwargs: Any) -> Any:
        """Fire hook ``rlforge_<name>`` with these keyword arguments (plus ``trainer``)."""
        return getattr(self._hook, f"rlforge_{name}")(trainer=self._hook_trainer, **kwargs)

    def hook_batch(self, name: str, batch: B.Batch) -> B.Batch | None:
        """Fire hook ``rlforge_<name>`` with ``batch``; its result, None (keep ``batch``) or a batch of at least one
        row, else an error naming the hook's plugins."""
        out = self.call_hook(name, batch=batch)
        if out is None:
            return None
        who = f"rlforge_{name} (implemented by {implementers(self._hook, name)})"
        if not isinstance(out, B.Batch):
            raise RLForgeError(f"{who} returned {type(out).__name__}: return the batch it was given (changed, or "
                               f"fewer rows: batch.select(rows)), or None to keep it.")
        if not len(out):
            raise RLForgeError(f"{who} returned a batch of 0 rows: nothing would be trained on. Keep at least one "
                               f"group, or return None to keep the batch (algorithm.filter_groups draws more prompts "
                               f"until enough groups remain).")
        return out

    def log(self, metrics: dict[str, float]) -> None:
        """Add ``metrics`` (name -> number or one-element tensor) to the step's; a value that is not a number is an
        error naming its key and the stage that logged it."""
        who = f"ctx.log in {stage_label(self._running[-1])}" if self._running else "ctx.log outside a stage"
        if not isinstance(metrics, Mapping):
            raise RLForgeError(f"{who}: ctx.log takes a dict of name -> number, got {type(metrics).__name__}.")
        for key, value in metrics.items():
            self.metrics[key] = as_number(key, value, who)

    def draw(self) -> B.Batch:
        """The next ``data.train_batch_size`` training prompts (the data cursor advances)."""
        return self._draw()

    @property
    def data_parallel_size(self) -> int:
        """The data-parallel ranks that share each trained batch (sharded models run collectives on equal shares, so
        a stage that chooses the trained rows keeps their number a multiple of it); 1 for a stage run without the
        run's builder (by itself, as in a test)."""
        if self.builder is None:
            return 1
        return int(self.builder.capabilities("strategy").data_parallel_size(self.config))

    def run(self, stage: Stage, batch: B.Batch) -> B.Batch:
        """Run one stage with its hooks, adding its own seconds to ``timing_s/<stage.timing_name>`` (a stage that
        runs others, like dynamic sampling, is charged without theirs: each second is counted once)."""
        self.call_hook("stage_start", stage=stage.name, batch=batch)
        t0 = time.perf_counter()
        self._nested.append(0.0)
        self._running.append(stage)
        try:
            batch = self.flow.checked(stage, stage.run(self, batch))
        finally:
            inner = self._nested.pop()
            self._running.pop()
        seconds = time.perf_counter() - t0
        if self._nested:
            self._nested[-1] += seconds
        key = f"timing_s/{stage.timing_name or stage.name}"
        self.metrics[key] = self.metrics.get(key, 0.0) + seconds - inner
        self.call_hook("stage_end", stage=stage.name, batch=batch, seconds=seconds)
        return batch

    def regenerate(self, before: Stage) -> B.Batch:
        """New prompts through every stage of the flow that comes before ``before`` (e.g. rollout and reward)."""
        batch = self.draw()
        for stage in self.flow.stages:
            if stage is before:
                return batch
            batch = self.run(stage, batch)
        raise RLForgeError(f"Stage '{before.name}' is not in dataflow '{self.flow.name}': {self.flow.names()}")


class Stage:
    """One step of the dataflow. Subclass it and implement ``run``; set ``name``, ``requires``, ``produces``.

    The built-in stages are class attributes: ``Stage.ROLLOUT``, ``Stage.REWARD``, ``Stage.FILTER``,
    ``Stage.OLD_LOGPROB``, ``Stage.REF_LOGPROB``, ``Stage.VALUES``, ``Stage.ADVANTAGE``, ``Stage.UPDATE_CRITIC``,
    ``Stage.UPDATE_ACTOR``, ``Stage.SYNC_WEIGHTS``.
    """

    name: str = ""
    requires: frozenset[str] = frozenset()
    produces: frozenset[str] = frozenset()
    timing_name: str = ""  # the name in ``timing_s/<name>`` (default: ``name``); built-ins use verl's
    uses_engine: bool = False  # generates (ctx.workers.rollout.generate, ctx.regenerate): pipelines check it

    ROLLOUT: ClassVar[Stage]
    REWARD: ClassVar[Stage]
    FILTER: ClassVar[Stage]
    OLD_LOGPROB: ClassVar[Stage]
    REF_LOGPROB: ClassVar[Stage]
    VALUES: ClassVar[Stage]
    ADVANTAGE: ClassVar[Stage]
    UPDATE_CRITIC: ClassVar[Stage]
    UPDATE_ACTOR: ClassVar[Stage]
    SYNC_WEIGHTS: ClassVar[Stage]

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        raise NotImplementedError(f"{type(self).__name__}.run")  # abstract

    def __repr__(self) -> str:
        return f"<stage {self.name}>"


class FunctionStage(Stage):
    """A plain callable ``batch -> batch`` as a stage (its ``requires``/``produces``/``stage_name`` attributes)."""

    def __init__(self, fn: Callable[[B.Batch], B.Batch]) -> None:
        self.fn = fn
        self.name = getattr(fn, "stage_name", None) or getattr(fn, "__name__", type(fn).__name__)
        self.requires = frozenset(getattr(fn, "requires", ()))
        self.produces = frozenset(getattr(fn, "produces", ()))

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        return self.fn(batch)


StageLike = Union[Stage, Callable[[B.Batch], B.Batch]]


def stage_label(stage: Stage) -> str:
    """How a message names ``stage``: its name and its code (its class, or a callable stage's function)."""
    code = stage.fn if isinstance(stage, FunctionStage) else type(stage)
    return f"stage '{stage.name}' ({getattr(code, '__qualname__', type(code).__name__)})"


def as_stage(item: StageLike) -> Stage:
    if isinstance(item, Stage):
        return item
    if callable(item):
        return FunctionStage(item)
    raise RLForgeError(f"A dataflow stage must be a Stage or a callable batch -> batch, got {item!r}.")


class DataFlow:
    """An ordered, editable list of stages; ``compile()`` validates it.

    :param inputs: the columns the batch has before the first stage: the loader's prompt columns by default; an
        offline algorithm's batches (``RLModule.collate``) bring more, e.g. responses (``PAIR_COLUMNS``).
    """

    def __init__(self, name: str, stages: Iterable[StageLike], inputs: Iterable[str] = LOADER_COLUMNS) -> None:
        self.name = name
        self.stages: list[Stage] = [as_stage(s) for s in stages]
        self.inputs = frozenset(inputs)
        # by stage (id): the columns it produces that a later stage requires -> the first such stage (compile)
        self._promised: dict[int, dict[str, str]] = {}

    def _index(self, anchor: StageLike | str) -> int:
        for i, stage in enumerate(self.stages):
            if stage is anchor or stage.name == anchor or (isinstance(stage, FunctionStage) and stage.fn is anchor):
                return i
        label = anchor if isinstance(anchor, str) else getattr(anchor, "name", anchor)
        raise RLForgeError(f"Stage '{label}' is not in dataflow '{self.name}': {self.names()}")

    def insert_after(self, anchor: StageLike | str, item: StageLike) -> DataFlow:
        self.stages.insert(self._index(anchor) + 1, as_stage(item))
        return self

    def insert_before(self, anchor: StageLike | str, item: StageLike) -> DataFlow:
        self.stages.insert(self._index(anchor), as_stage(item))
        return self

    def remove(self, anchor: StageLike | str) -> DataFlow:
        del self.stages[self._index(anchor)]
        return self

    def replace(self, anchor: StageLike | str, item: StageLike) -> DataFlow:
        self.stages[self._index(anchor)] = as_stage(item)
        return self

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def __contains__(self, item: StageLike | str) -> bool:
        try:
            self._index(item)
        except RLForgeError:
            return False
        return True

    def compile(self) -> DataFlow:
        """Check that stage names are unique and every stage's inputs come from ``inputs`` or an earlier stage."""
        names = self.names()
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise RLForgeError(f"Dataflow '{self.name}' has two stages named '{dupes[0]}': {' -> '.join(names)}")
        have = set(self.inputs)
        for stage in self.stages:
            missing = stage.requires - have
            if missing:
                raise RLForgeError(
                    f"Dataflow '{self.name}': stage '{stage.name}' needs {sorted(missing)}, which no earlier "
                    f"stage produces. Order: {' -> '.join(names)}"
                )
            have |= stage.produces
        self._promised = {}
        for i, stage in enumerate(self.stages):
            needed = {col: later.name for later in reversed(self.stages[i + 1:]) for col in later.requires}
            self._promised[id(stage)] = {col: needed[col] for col in stage.produces if col in needed}
        return self

    def checked(self, stage: Stage, out: Any) -> B.Batch:
        """``out``, what ``stage`` returned, once it is a batch that holds the columns of its ``produces`` that a later
        stage requires (the promise :meth:`compile` ordered the flow on); else an error naming the stage and its
        code."""
        if not isinstance(out, B.Batch):
            raise RLForgeError(f"Dataflow '{self.name}': {stage_label(stage)} returned "
                               f"{'None' if out is None else type(out).__name__}: a stage's run returns the batch "
                               f"(changed in place, or a new one).")
        missing = sorted((col, later) for col, later in self._promised.get(id(stage), {}).items() if col not in out)
        if missing:
            named = ", ".join(f"'{col}' (stage '{later}' requires it)" for col, later in missing)
            raise RLForgeError(f"Dataflow '{self.name}': {stage_label(stage)} did not set {named}, which its produces "
                               f"declares: set it in its run, or take it out of produces.")
        return out

    def __repr__(self) -> str:
        return f"DataFlow({self.name!r}, {' -> '.join(self.names())})"


# --- the built-in stages -----------------------------------------------------------------------------


def _stage(name: str, requires: set[str], produces: set[str], timing: str = "") -> Callable[[type[Stage]], type[Stage]]:
    def deco(cls: type[Stage]) -> type[Stage]:
        cls.name, cls.requires, cls.produces = name, frozenset(requires), frozenset(produces)
        cls.timing_name = timing
        return cls
    return deco


# the built-in stages' timings use verl's names: timing_s/gen, old_log_prob, ref, values, adv, update_critic,
# update_actor, update_weights (and the trainer adds step, testing, save_checkpoint)
@_stage("rollout", {B.PROMPTS, B.PROMPT_MASK, B.UID},
        {B.RESPONSES, B.INPUT_IDS, B.ATTENTION_MASK, B.RESPONSE_MASK, B.ROLLOUT_LOG_PROBS}, "gen")
class RolloutStage(Stage):
    """Generate ``rollout.n`` samples per prompt. A rollout stage of another kind (the agent loops') overrides
    :meth:`rollout`; a pipeline that generates ahead (``trainer.pipeline``) overrides :meth:`generate`."""

    uses_engine = True

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        ctx.call_hook("rollout_start", batch=batch)
        batch, metrics = self.generate(ctx, batch)
        ctx.log(metrics)
        ctx.module.on_rollout_end(batch)
        ctx.call_hook("rollout_end", batch=batch)
        return batch

    def generate(self, ctx: StepContext, batch: B.Batch) -> tuple[B.Batch, dict[str, float]]:
        """The generated batch this step trains on, and the rollout's metrics: :meth:`rollout` of the step's
        prompts now."""
        return self.rollout(ctx, batch, ctx.sampling)

    def rollout(self, run: Any, batch: B.Batch, params: SamplingParams) -> tuple[B.Batch, dict[str, float]]:
        """``params.n`` samples per prompt of ``batch`` by the engine's current weights, and the rollout's metrics.
        ``run`` is a :class:`StepContext` (or the ``Trainer``, for validation): only its ``config``, ``controller``,
        ``builder``, ``module`` and ``flow`` are read, so the off-policy pipelines can call it from their rollout
        thread."""
        return run.controller.workers.rollout.generate(batch, params), {}

    @property
    def source(self) -> RolloutStage:
        """The stage whose :meth:`rollout` generates (itself; the off-policy pipelines' stage names the one it
        replaced)."""
        return self


@_stage("reward", {B.RESPONSES, B.RESPONSE_MASK}, {B.SCORES, B.TOKEN_LEVEL_SCORES, B.TOKEN_LEVEL_REWARDS})
class RewardStage(Stage):
    """Score the responses; ``rlforge_shape_rewards`` may reshape the token rewards."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch = score_with(ctx.controller.score, batch, {SCORED_AT: ctx.step - 1})  # the updates made before it
        ctx.log(batch.meta.pop("metrics", {}))  # what the reward manager measured
        batch[B.TOKEN_LEVEL_REWARDS] = batch[B.TOKEN_LEVEL_SCORES]
        shaped = ctx.hook_batch("shape_rewards", batch)
        batch = shaped if shaped is not None else batch
        ctx.log(batch.meta.pop("metrics", {}))
        ctx.call_hook("reward_end", batch=batch)
        return batch


@_stage("filter", {B.TOKEN_LEVEL_REWARDS, B.UID}, set())
class FilterStage(Stage):
    """``rlforge_filter_groups`` may return a smaller batch (e.g. drop groups)."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        filtered = ctx.hook_batch("filter_groups", batch)
        return filtered if filtered is not None else batch


@_stage("old_logprob", {B.INPUT_IDS, B.ATTENTION_MASK}, {B.OLD_LOG_PROBS}, "old_log_prob")
class OldLogProbStage(Stage):
    """Log-probs of the policy that generated: the engine's own when they match the actor's recomputation
    (``actor.reuse_rollout_log_probs``, default: when the engine says so), else a forward pass."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        reuse = ctx.config.actor.reuse_rollout_log_probs
        if reuse is None:
            reuse = ctx.controller.logprobs_match_actor
        if reuse:
            batch[B.OLD_LOG_PROBS] = batch[B.ROLLOUT_LOG_PROBS]
        else:
            batch[B.OLD_LOG_PROBS] = ctx.workers.actor.compute_log_probs(batch, "actor")
            if B.ROLLOUT_LOG_PROBS in batch:
                ctx.metrics.update(rollout_probs_diff(batch[B.ROLLOUT_LOG_PROBS], batch[B.OLD_LOG_PROBS],
                                                      batch[B.RESPONSE_MASK]))
        return batch


def rollout_probs_diff(rollout: Any, actor: Any, mask: Any) -> dict[str, float]:
    """How far the engine's token probabilities are from the actor's recomputation, under verl's names:
    ``training/rollout_probs_diff_{max,mean,std}`` of |p_actor - p_rollout| over the response tokens, their Pearson
    correlation ``training/rollout_actor_probs_pearson_corr`` and ``..._valid`` (0 without response tokens)."""
    import torch

    keep = mask.bool()
    if not keep.any():
        return {"training/rollout_probs_diff_valid": 0.0}
    p_actor, p_rollout = torch.exp(actor.float())[keep], torch.exp(rollout.float())[keep]
    diff = (p_actor - p_rollout).abs()
    return {"training/rollout_probs_diff_valid": 1.0, "training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_probs_diff_mean": float(diff.mean()), "training/rollout_probs_diff_std": float(diff.std()),
            "training/rollout_actor_probs_pearson_corr": float(torch.corrcoef(torch.stack([p_actor, p_rollout]))[0, 1])}


@_stage("ref_logprob", {B.INPUT_IDS, B.ATTENTION_MASK}, {B.REF_LOG_PROBS}, "ref")
class RefLogProbStage(Stage):
    """Log-probs of the frozen reference model."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch[B.REF_LOG_PROBS] = ctx.workers.actor.compute_log_probs(batch, "ref")
        return batch


@_stage("values", {B.INPUT_IDS, B.ATTENTION_MASK}, {B.VALUES})
class ValuesStage(Stage):
    """Per-token values of the critic."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch[B.VALUES] = ctx.workers.critic.compute_values(batch)
        return batch


@_stage("advantage", {B.TOKEN_LEVEL_REWARDS, B.RESPONSE_MASK}, {B.ADVANTAGES, B.RETURNS}, "adv")
class AdvantageStage(Stage):
    """The module's rewards and advantages (``RLModule.advantages``)."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        batch = ctx.module.advantages(batch)
        ctx.call_hook("advantage_end", batch=batch)
        return batch


@_stage("update_critic", {B.VALUES, B.RETURNS}, set())
class UpdateCriticStage(Stage):
    """The critic's update."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        ctx.log(ctx.workers.critic.update(batch, ctx.step))
        return batch


@_stage("update_actor", {B.OLD_LOG_PROBS, B.ADVANTAGES, B.RESPONSE_MASK}, set())
class UpdateActorStage(Stage):
    """The policy update (after ``trainer.critic_warmup`` steps)."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        if ctx.step <= ctx.config.trainer.critic_warmup:  # the critic learns first; the policy waits
            return batch
        ctx.call_hook("update_start", batch=batch)
        metrics = ctx.workers.actor.update(batch, ctx.step)
        ctx.log(metrics)
        ctx.call_hook("update_end", batch=batch, metrics=metrics)
        return batch


@_stage("sync_weights", set(), set(), "update_weights")
class SyncWeightsStage(Stage):
    """The rollout engine gets the actor's new weights (``weight_sync/bytes``, ``weight_sync/seconds``)."""

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        stats = ctx.controller.sync_weights()
        add_sync_metrics(ctx.metrics, stats.metrics())
        ctx.call_hook("weight_sync_end", seconds=stats.seconds)
        return batch


Stage.ROLLOUT = RolloutStage()
Stage.REWARD = RewardStage()
Stage.FILTER = FilterStage()
Stage.OLD_LOGPROB = OldLogProbStage()
Stage.REF_LOGPROB = RefLogProbStage()
Stage.VALUES = ValuesStage()
Stage.ADVANTAGE = AdvantageStage()
Stage.UPDATE_CRITIC = UpdateCriticStage()
Stage.UPDATE_ACTOR = UpdateActorStage()
Stage.SYNC_WEIGHTS = SyncWeightsStage()
BUILTIN_STAGES: tuple[Stage, ...] = (
    Stage.ROLLOUT, Stage.REWARD, Stage.FILTER, Stage.OLD_LOGPROB, Stage.REF_LOGPROB, Stage.VALUES, Stage.ADVANTAGE,
    Stage.UPDATE_CRITIC, Stage.UPDATE_ACTOR, Stage.SYNC_WEIGHTS,
)
