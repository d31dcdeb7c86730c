"""The agentic rollout stage. When ``rollout.agent.loop`` is not ``single_turn``, this built-in plugin replaces
``Stage.ROLLOUT`` of every algorithm's flow by :class:`AgentRolloutStage` (``rlforge_before_flow_compile``) and adds
:class:`AgentRewardStage` after ``Stage.REWARD``. With ``single_turn`` the flow is left as it is (the engines' batch
``generate``, today's fast path). With ``rollout.agent.record_trajectories`` (any loop), :class:`TrajectoryRecordStage`
ends the flow."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS, add_agent_rewards
from rlforge.agent.config import SINGLE_TURN
from rlforge.agent.engine import engines_held
from rlforge.agent.record import RECORD_FILE, sample_records, write_records
from rlforge.dataflow import DataFlow, RolloutStage, Stage, StepContext
from rlforge.errors import ConfigError, RLForgeError
from rlforge.evaluation import Evaluator
from rlforge.hookspecs import hookimpl
from rlforge.protocols import Controller, TokenGenerator
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
    step: int


class AgentRolloutStage(RolloutStage):
    """``rollout.n`` agent-loop trajectories per prompt (``rollout.agent.loop``), batched into one training batch."""

    name = RolloutStage.name
    requires = RolloutStage.requires
    produces = RolloutStage.produces | {AGENT_REWARDS, B.SOLUTION_TEXT, B.NUM_TURNS, B.STOP_REASON}

    def __init__(self) -> None:
        self.runner: AgentRunner | None = None

    def rollout(self, run: RunParts, batch: B.Batch, params: SamplingParams) -> tuple[B.Batch, dict[str, float]]:
        """``params.n`` trajectories of the run's agent loop per prompt of ``batch``: (the batch, the agent metrics).
        Training steps call it with the rollout's sampling settings, the off-policy pipelines from their rollout
        thread, validation through the run's :func:`evaluator` with the validation settings (one call at a time:
        validation waits for the rollout thread)."""
        controller: Controller = run.controller
        engines = controller.workers.rollout
        if not isinstance(engines, TokenGenerator):
            raise RLForgeError(f"rollout.agent.loop={run.config.rollout.agent.loop} needs token-in/token-out "
                               f"generation, which the rollout workers of the controller "
                               f"{type(run.controller).__name__} (trainer.controller) do not provide "
                               f"(generate_tokens).")
        if self.runner is None:
            if run.builder is None:
                raise RLForgeError("The agentic rollout stage needs the run's Builder (StepContext.builder).")
            self.runner = run.builder.agent(run.module.tokenizer, run.module.processor)
        with engines_held(engines):  # awake for the whole rollout, not per call
            return self.runner.rollout(batch, params, engines.generate_tokens, controller.continuous_batching,
                                       getattr(controller, "submit_tokens", None))

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


def evaluator(run: RunParts) -> Evaluator:
    """The run's evaluator (``rlforge.evaluation``, what validation generates and scores through): the controller's
    generation and scoring, through the flow's own agentic rollout stage when it has one."""
    stage = agent_stage(run.flow)
    agent = None if stage is None else functools.partial(stage.rollout, run)
    return Evaluator(run.controller.workers.rollout, run.controller.score, agent, step=run.step)


def agent_stage(flow: DataFlow) -> AgentRolloutStage | None:
    """The flow's agentic rollout stage: its rollout stage, or the one the off-policy pipelines run ahead."""
    for stage in flow.stages:
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
    for stage in trainer.flow.stages:
        if isinstance(stage, TrajectoryRecordStage):
            stage.path = Path(trainer.run_dir) / RECORD_FILE


def close_stages(trainer: Any) -> None:
    """Stop what the agent stages of the trainer's flow hold (tool threads, servers)."""
    stage = agent_stage(trainer.flow)
    if stage is not None:
        stage.close()


@hookimpl
def rlforge_fit_end(trainer: Any) -> None:
    close_stages(trainer)


@hookimpl
def rlforge_exception(trainer: Any) -> None:
    close_stages(trainer)
