"""The contracts of pluggable components, defined once. Each registry kind names its Protocol
(``rlforge.registry.Registries.SPECS``); the built-in components are checked against them by the type checker
(``tests/typing/protocols_check.py``, run by ``mypy`` in the test suite) and at build time (``rlforge.build``).

Factories (the objects registered) are called by ``rlforge.build.Builder`` with the signatures documented on
each Protocol. A component may also define ``validate_config(config, registry)`` (a static or class method):
it runs when the config is composed, before any model loads, if the config selects the component.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rlforge.agent.types import ParsedTurn, Sample, ToolResult, Trajectory
from rlforge.batch import Batch
from rlforge.capabilities import StrategyCapabilities
from rlforge.lazy import lazy_import
from rlforge.sampling import Generation, SamplingParams

from rlforge.weight_sync import SyncStats

if TYPE_CHECKING:
    import torch
else:  # loaded when a hint is resolved (typing.get_type_hints), not when the contracts are imported
    torch = lazy_import("torch")


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates ``n`` samples per prompt. Registered under ``rollout``; built as ``factory(config, model,
    tokenizer)`` where ``model`` is the actor (or its replica) that the engine must follow.

    Agent loops (``rollout.agent.loop``) need token-in/token-out requests: an engine that declares ``token_io``
    provides them with ``generate_tokens`` (:class:`TokenGenerator`); for one without it, rlforge builds the requests
    on ``generate`` (``rlforge.agent.engine.tokens_via_generate``)."""

    # What it can do is declared on its class as ``capabilities = RolloutCapabilities(...)`` (rlforge.capabilities:
    # owns_weights, logprobs_match_actor, supports_images, token_io, continuous_batching, lora_adapters; all False when
    # not declared) and read from its registry entry.
    supports_sleep: bool

    def generate(self, batch: Batch, params: SamplingParams) -> Batch:
        """Return a batch with ``len(batch) * params.n`` rows (each prompt repeated n times in place, lists
        repeated too) and the columns responses, input_ids, attention_mask, response_mask, rollout_log_probs."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load new weights (name, tensor) in place; return the bytes moved. The built-in engines hand them to their
        weight-sync backend (``weight_sync``, a :class:`WeightSync` the Builder sets as ``rollout.weight_sync``
        picks)."""

    def shutdown(self) -> None: ...


class WeightSync(Protocol):
    """How weights reach one rollout engine (verl's checkpoint engine). Registered under ``weight_sync`` (base class
    ``rlforge.weight_sync.WeightSync``, which declares the engine it serves); selected by ``rollout.weight_sync``; built
    as ``factory(config, engine)``."""

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Give the engine these weights; return the bytes moved."""

    def close(self) -> None: ...


@runtime_checkable
class TokenGenerator(Protocol):
    """The token-in/token-out request API of a rollout engine (and of a controller, for its engines). An engine with
    ``continuous_batching`` may also offer ``submit_tokens(prompt_ids, params, multi_modal) ->
    concurrent.futures.Future[Generation]`` (one request, not waited for: ``rlforge.agent.engine.Submit``), which an
    agent rollout in the engine's process awaits on its event loop instead of a thread per blocking call."""

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams],
                        multi_modal: list[dict[str, Any] | None] | None = None) -> list[Generation]:
        """One completion per prompt (``params[i]`` for ``prompts[i]``; ``n`` is ignored); each ends at a stop token
        or after ``max_new_tokens``. Many agent loops' requests arrive here together, batched in waves. An engine
        that declares ``supports_images`` also takes ``multi_modal=``: each prompt's vision inputs
        (``B.MULTI_MODAL_INPUTS``' dicts, None for a text prompt), given only when a prompt has images."""


@runtime_checkable
class RewardManager(Protocol):
    """Scores a batch. Registered under ``reward_manager``; built as ``factory(config, tokenizer, registry)``.
    May define a static ``check_data_sources(config, registry, data_sources)`` that refuses data it cannot score
    (called on every dataset before any model loads; ``data_sources`` maps each ``data_source`` value to where its
    first row is, ``train.jsonl, row 3``, for its errors), and a static ``check_function(config)`` that refuses a reward
    function the config names that it could not call (``rlforge verl --print`` runs it)."""

    def score(self, batch: Batch) -> Batch:
        """Set ``scores`` [B], ``token_level_scores`` [B, R] (and ``acc`` [B]); metrics it measured go to
        ``batch.meta['metrics']`` (the reward stage moves them into the step's metrics)."""

    def close(self) -> None:
        """Stop the processes, threads or servers it started (``pass`` when it starts none); called once, when the
        run, ``rlforge eval`` or the SFT check ends."""


class RewardFunction(Protocol):
    """verl's contract: ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict``.
    Registered under ``reward_fn``; keyword-only parameters are filled from its config section."""

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any: ...


class Dataset(Protocol):
    """``factory(config, split) -> list of verl-style rows`` (split is ``train`` or ``val``). Registered under
    ``dataset``."""

    def __call__(self, config: Any, split: str) -> list[dict[str, Any]]: ...


@runtime_checkable
class Strategy(Protocol):
    """Places models on devices and owns the optimizer step, gradient clipping, state dicts and the sharded
    checkpoint layout. Registered under ``strategy``; built as ``factory(config)``.
    ``rlforge.strategy.BaseStrategy`` implements everything but device placement and the collectives."""

    device: torch.device
    world_size: int
    rank: int
    capabilities: StrategyCapabilities  # sharded, shares_prompts (rlforge.capabilities)

    @property
    def sequence_parallel_size(self) -> int: ...  # ranks that share each packed micro-batch (1: none)

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def setup_model_for(self, model: torch.nn.Module, role: str) -> torch.nn.Module: ...

    def setup_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
                        ) -> tuple[torch.nn.Module, torch.optim.Optimizer]: ...

    def autocast(self) -> Any:
        """A context manager for forward passes (autocast in a mixed ``model.precision``)."""

    def backward(self, loss: torch.Tensor) -> None: ...

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None: ...

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float: ...

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def skip_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def precision_state(self) -> dict[str, Any]: ...

    def load_precision_state(self, state: dict[str, Any]) -> None: ...

    def all_reduce_sum(self, value: float) -> float: ...

    def all_reduce_max(self, value: float) -> float: ...

    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]: ...

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]: ...

    def load_model_state_dict(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None: ...

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...

    def load_optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None: ...

    def save_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None: ...

    def load_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None: ...


@runtime_checkable
class Controller(Protocol):
    """A placement of the run's roles on ranks: its worker groups (``workers``), the rollout engines' weights and the
    workers' checkpoint state. Registered under ``controller``; built as ``factory(builder, module)``
    (``rlforge.build.Builder``) with the module's tokenizer loaded. The stages call the worker groups' declared
    methods themselves (``ctx.workers.actor.compute_log_probs(batch, "ref")``, ``ctx.workers.critic.update(batch,
    ctx.step)``); the controller runs none of those operations."""

    logprobs_match_actor: bool
    continuous_batching: bool  # agent requests go to its generate_tokens at once (the engine's capability), not in waves

    @property
    def workers(self) -> Any:
        """The worker groups by role (``rlforge.dataflow.Workers``): workers.actor, workers.prm, ..., and
        workers.rollout, the group that owns the rollout engines (``generate``, ``generate_tokens``: the
        token-in/token-out requests of agent loops, :class:`TokenGenerator`)."""

    def score(self, batch: Batch) -> Batch: ...

    def sync_weights(self) -> SyncStats:
        """Give the rollout engines the actor's weights (the actor ranks' engines, or a rollout group's: the
        placement decides); what that moved (bytes) and took (seconds)."""

    def state_dict(self, staging: Path, background: bool = False) -> dict[str, Any]:
        """The workers' state for a checkpoint (``staging``: a folder for sharded state, moved into the
        checkpoint by ``rlforge.checkpoint.save``). The trained actor weights are in ``module.actor`` where the driver
        trains it, else written to ``rlforge.checkpoint.staged_actor(staging)`` (a plain HF folder), except with
        ``background`` (``strategy.checkpoint=async``): then the shards are still being written."""

    def finish_checkpoint(self) -> float:
        """Wait for the shards a ``background`` :meth:`state_dict` is writing; the seconds the write took."""

    def load_state_dict(self, state: dict[str, Any], folder: Path) -> None:
        """Restore :meth:`state_dict`'s result from the checkpoint ``folder``, the actor's weights included (its
        ``actor/``, or the shards)."""

    def shutdown(self) -> None: ...


@runtime_checkable
class WeightSnapshots(Protocol):
    """What a controller offers to give its rollout engines weights later than they were taken
    (``trainer.pipeline=one_step_off|async``, which run only on controllers that have it: ``local``, and ``ray`` with
    ``ray.rollout_workers >= 1``). The pipelines call ``snapshot_weights`` from the trainer's thread and
    ``load_weights`` from their rollout thread, while the trainer's thread goes on training."""

    def snapshot_weights(self) -> Any:
        """A copy of the weights ``sync_weights`` would give the engines now, opaque to the caller: ``local``, a list
        of (name, tensor) clones; ``ray``, a reference to one copy in the object store. It is freed when the caller
        drops it."""

    def load_weights(self, snapshot: Any) -> SyncStats:
        """Give the engines a :meth:`snapshot_weights` copy; the bytes moved and the seconds taken."""


@runtime_checkable
class Logger(Protocol):
    """Receives metrics. Registered under ``logger``; built as ``factory(config, run_dir)``. A logger that declares
    ``capabilities = LoggerCapabilities(shows_generations=True)`` (rlforge.capabilities) defines
    ``log_generations(rows, step)``, which shows ``trainer.log_val_generations``' rows ({input, output, score}) its own
    way (wandb: a table; tensorboard: text); every logger gets their file through ``log_artifact``. One that declares
    ``LoggerCapabilities(marks_outcome=True)`` defines ``close_as(outcome)``, called instead of ``close()`` with how
    the run ended: "finished", "failed" or "killed" (Ctrl-C, SIGTERM)."""

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: str) -> None: ...

    def close(self) -> None: ...


class GenerationsLogger(Logger, Protocol):
    """A :class:`Logger` that declares ``LoggerCapabilities(shows_generations=True)``."""

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """Show ``trainer.log_val_generations``' rows ({input, output, score}) of the validation at ``step``."""


# --- agentic rollouts (rollout.agent.*, docs/agentic.md) ----------------------------------------------------


@runtime_checkable
class AgentLoop(Protocol):
    """Owns one trajectory at a time (many run concurrently). Registered under ``agent_loop``; built once per run as
    ``factory(config, context)`` (:class:`rlforge.agent.AgentContext`: tokenizer, tools, parser, interaction).
    Subclass :class:`rlforge.agent.AgentLoop`. A loop that cannot run rows with images says why in a class
    attribute ``refuses_images`` (a str; such data is refused when it loads)."""

    async def run(self, sample: Sample, engine: Any) -> Trajectory:
        """Generate through ``engine`` (``await engine.generate(prompt_ids, ...)``), call tools or an interaction,
        and return the trajectory (token ids, response mask, log-probs, rewards, metrics)."""


@runtime_checkable
class Tool(Protocol):
    """A function the model may call. Registered under ``tool`` (the registered name is the function's name);
    built once per run as ``factory(config)``; options at ``rollout.agent.<name>``. Subclass
    :class:`rlforge.agent.Tool`, which adds per-trajectory state (``create``/``release``): a tool that does not
    subclass it has none (``execute`` gets ``state=None``)."""

    name: str

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema ``{"type": "function", "function": {name, description, parameters}}``."""

    def execute(self, arguments: dict[str, Any], state: Any) -> str | ToolResult | Any:
        """The tool's reply as text (or a ToolResult with a reward and the images it shows); may be ``async``."""


@runtime_checkable
class ToolParser(Protocol):
    """Reads tool calls from a model turn's text. Registered under ``tool_parser``; built as ``factory(config)``."""

    def parse(self, text: str) -> ParsedTurn:
        """The turn's plain content, its well-formed calls and one message per malformed call."""


@runtime_checkable
class Interaction(Protocol):
    """A simulated user or environment, one instance per trajectory. Registered under ``interaction``; built as
    ``factory(config)``; options at ``rollout.agent.<name>``. Both methods may be ``async``."""

    def reset(self, sample: Sample) -> str | dict[str, Any] | None | Any:
        """The first message of the user (None: the prompt alone opens the conversation); a message dict
        ``{"content", "images"}`` shows images to a vision-language model."""

    def step(self, message: str) -> tuple[str | dict[str, Any], float, bool] | Any:
        """React to the model's message: ``(reply, reward, done)``; the reply as text or a message dict."""


@dataclass
class PolicyLossInputs:
    """What a policy loss (``actor.policy_loss``) gets for one micro-batch. Shapes ``[B, R]`` (sequences x response
    tokens); ``mask`` is 1 on the tokens that count."""

    log_prob: torch.Tensor  # the actor's log-probs of the sampled tokens (carries the gradient)
    old_log_prob: torch.Tensor  # the policy that generated (the proximal policy of the ratio)
    advantages: torch.Tensor
    mask: torch.Tensor  # the response mask, in the log-probs' dtype
    config: Any  # the composed config: actor.* and the loss's own section actor.<name>
    rollout_is_weights: torch.Tensor | None = None  # rollout-correction weights, when a stage computed them
    rollout_log_prob: torch.Tensor | None = None  # the engine's log-probs, when the batch has them


@dataclass
class PolicyLossOutput:
    """A policy loss's result: the per-token loss to aggregate and its metrics."""

    loss: torch.Tensor  # [B, R], 0 on masked positions
    stats: dict[str, torch.Tensor]  # metric name -> [B, R]; logged as its mean over the valid tokens
    mask: torch.Tensor | None = None  # the mask to aggregate with when the loss changed it (rejection); None = inputs.mask
    agg_mode: str | None = None  # the aggregation this loss always uses; None = actor.loss_agg_mode


class PolicyLoss(Protocol):
    """The policy-gradient term of the actor's loss. Registered under ``policy_loss`` (the object is called, not
    built); selected by ``actor.policy_loss``; options at ``actor.<name>``. Called in the process that trains the
    actor, once per micro-batch; may define ``validate_config(config, registry)``."""

    def __call__(self, inputs: PolicyLossInputs, /) -> PolicyLossOutput: ...
