"""The agentic rollout stage. When ``rollout.agent.loop`` is not ``single_turn``, this built-in plugin replaces
``Stage.ROLLOUT`` of every algorithm's flow by :class:`AgentRolloutStage` (``rlforge_before_flow_compile``) and adds
:class:`AgentRewardStage` after ``Stage.REWARD``. With ``single_turn`` the flow is left as it is (the engines' batch
``generate``, today's fast path). With ``rollout.agent.record_trajectories`` (any loop), :class:`TrajectoryRecordStage`
ends the flow."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS
from rlforge.agent.config import SINGLE_TURN
from rlforge.agent.record import RECORD_FILE, sample_records, write_records
from rlforge.dataflow import RolloutStage, Stage, StepContext
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.sampling import SamplingParams

if TYPE_CHECKING:
    from rlforge.agent.runner import AgentRunner


class RunParts(Protocol):
    """What the agentic rollout needs of a run: a :class:`StepContext`, or the ``Trainer`` for validation (this
    layer of the core does not import the trainer's)."""

    config: Any
    controller: Any
    builder: Any
    module: Any
    flow: Any


class AgentRolloutStage(RolloutStage):
    """``rollout.n`` agent-loop trajectories per prompt (``rollout.agent.loop``), batched into one training batch."""

    name = RolloutStage.name
    requires = RolloutStage.requires
    produces = RolloutStage.produces | {AGENT_REWARDS, B.SOLUTION_TEXT}

    def __init__(self) -> None:
        self.runner: AgentRunner | None = None

    def rollout(self, run: RunParts, batch: B.Batch, params: SamplingParams) -> tuple[B.Batch, dict[str, float]]:
        """``params.n`` trajectories of the run's agent loop per prompt of ``batch``: (the batch, the agent metrics).
        Training steps call it with the rollout's sampling settings, validation with the validation ones, the
        off-policy pipelines from their rollout thread (one call at a time: validation waits for that thread)."""
        backend = getattr(run.controller, "generate_tokens", None)
        if backend is None:
            raise RLForgeError(f"rollout.agent.loop={run.config.rollout.agent.loop} needs token-in/token-out "
                               f"generation, which the controller {type(run.controller).__name__} "
                               f"(trainer.controller) does not provide (generate_tokens).")
        if self.runner is None:
            if run.builder is None:
                raise RLForgeError("The agentic rollout stage needs the run's Builder (StepContext.builder).")
            self.runner = run.builder.agent(run.module.tokenizer)
        return self.runner.rollout(batch, params, backend, run.controller.continuous_batching)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None


class AgentRewardStage(Stage):
    """Adds the trajectories' per-turn, tool and loop rewards (``agent_rewards``) to the reward function's
    ``scores``, ``token_level_scores`` and ``token_level_rewards``."""

    name = "agent_reward"
    requires = frozenset({AGENT_REWARDS, B.TOKEN_LEVEL_SCORES, B.TOKEN_LEVEL_REWARDS})
    produces: frozenset[str] = frozenset()

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        extra = add_agent_rewards(batch)
        ctx.log({"agent/reward/mean": extra.sum(-1).mean().item()})
        return batch


def add_agent_rewards(batch: B.Batch) -> Any:
    """Add the trajectories' rewards (``agent_rewards`` [B, R]) to the reward function's ``scores`` and to the
    token-level columns the batch has (``token_level_scores``, ``token_level_rewards``); returns them."""
    extra = batch[AGENT_REWARDS]
    batch[B.SCORES] = batch[B.SCORES] + extra.sum(-1)
    for key in (B.TOKEN_LEVEL_SCORES, B.TOKEN_LEVEL_REWARDS):
        if key in batch:
            batch[key] = batch[key] + extra
    return extra


VALIDATION_METRICS = ("num_turns/mean", "tool_call_counts/mean", "agent/tool_call_format_ok",
                      "agent/turn_limit_ratio")  # logged by validation as val/<name>


class AgentValidation:
    """The controller as validation sees it in a run with an agent loop: ``generate`` runs the loop with the given
    sampling settings and keeps its metrics (``VALIDATION_METRICS`` as ``val/<name>``) in ``metrics``; ``score``
    scores as a training step does: the reward function's scores plus the trajectories' rewards (an env's return,
    a rubric's reward, tool rewards); everything else is the run's controller."""

    def __init__(self, run: RunParts, stage: AgentRolloutStage) -> None:
        self.run, self.stage = run, stage
        self.metrics: dict[str, float] = {}

    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        out, metrics = self.stage.rollout(self.run, batch, params)
        self.metrics = {f"val/{k}": metrics[k] for k in VALIDATION_METRICS if k in metrics}
        return out

    def score(self, batch: B.Batch) -> B.Batch:
        batch = self.run.controller.score(batch)
        add_agent_rewards(batch)
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run.controller, name)


def validation_controller(run: RunParts) -> Any:
    """What ``RLModule.validate`` gets as its controller: an :class:`AgentValidation` when the run's flow has the
    agentic rollout stage, else the run's controller."""
    stage = agent_stage(run.flow)
    return run.controller if stage is None else AgentValidation(run, stage)


def agent_stage(flow: Any) -> AgentRolloutStage | None:
    """The flow's agentic rollout stage: its rollout stage, or the one the off-policy pipelines run ahead."""
    for stage in getattr(flow, "stages", ()):
        if isinstance(stage, RolloutStage) and isinstance(stage.source, AgentRolloutStage):
            return stage.source
    return None


class TrajectoryRecordStage(Stage):
    """The last stage of a run with ``rollout.agent.record_trajectories``: appends one record per trained sample to
    ``<run>/trajectories.jsonl`` (``rlforge.agent.record``; the Trainer sets ``path`` when the fit starts)."""

    name = "record_trajectories"
    requires = frozenset({B.PROMPTS, B.PROMPT_MASK, B.RESPONSES, B.RESPONSE_MASK, B.ATTENTION_MASK})
    produces: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.path: Path | None = None

    def run(self, ctx: StepContext, batch: B.Batch) -> B.Batch:
        if self.path is None:
            raise RLForgeError("rollout.agent.record_trajectories: the record stage has no run folder to write to "
                               "(the Trainer sets it when fit starts: rlforge_fit_start).")
        write_records(self.path, sample_records(batch, ctx.module.tokenizer, ctx.step))
        return batch


@hookimpl
def rlforge_before_flow_compile(flow: Any, config: Any) -> None:
    record = config.rollout.agent.record_trajectories
    if record and Stage.ROLLOUT not in flow:
        raise ConfigError(f"rollout.agent.record_trajectories=true records generated samples, and dataflow "
                          f"'{flow.name}' has no rollout stage ({' -> '.join(flow.names())}): an offline algorithm "
                          "trains on fixed data. Set rollout.agent.record_trajectories=false.")
    if config.rollout.agent.loop != SINGLE_TURN and Stage.ROLLOUT in flow:
        flow.replace(Stage.ROLLOUT, AgentRolloutStage())
        if Stage.REWARD in flow:
            flow.insert_after(Stage.REWARD, AgentRewardStage())
    if record:
        flow.insert_after(flow.stages[-1], TrajectoryRecordStage())


@hookimpl
def rlforge_fit_start(trainer: Any) -> None:
    """The record stage writes into the run's folder."""
    for stage in getattr(getattr(trainer, "flow", None), "stages", ()):
        if isinstance(stage, TrajectoryRecordStage):
            stage.path = Path(trainer.run_dir) / RECORD_FILE


def close_stages(trainer: Any) -> None:
    """Stop what the agent stages of the trainer's flow hold (tool threads, servers)."""
    stage = agent_stage(getattr(trainer, "flow", None))
    if stage is not None:
        stage.close()


@hookimpl
def rlforge_fit_end(trainer: Any) -> None:
    close_stages(trainer)


@hookimpl
def rlforge_exception(trainer: Any) -> None:
    close_stages(trainer)
