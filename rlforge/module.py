"""RLModule: the Lightning-style home of the learning logic.

Algorithms subclass it and register under a name. Users subclass an algorithm and override only what
differs (``compute_advantages``, ``policy_loss``, ...). The public wrapper ``advantages`` enforces the
invariants (columns set, shapes right) and is not meant to be overridden.

The module also owns its data: ``prepare_data`` turns the dataset's rows into examples, ``collate`` makes a
training batch of them, and ``validate`` measures held-out examples. The defaults are RL's (prompts in, generate
and score to validate); an offline algorithm (DPO, a reward model) brings preference pairs instead.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlforge import batch as B
from rlforge import lora, lr_schedule
from rlforge.config.schema import AlgorithmConfig
from rlforge.dataflow import DataFlow, Stage
from rlforge.errors import ConfigError, DataError, NonFiniteError, RLForgeError
from rlforge.lazy import lazy_import
from rlforge.metric_values import as_number, check_numbers

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

    from rlforge import ops
    from rlforge.evaluation import Evaluator
    from rlforge.protocols import Controller
else:
    torch = lazy_import("torch")
    ops = lazy_import("rlforge.ops")

@dataclass
class LossContext:
    """What a micro-batch loss needs to aggregate like the whole mini-batch would.

    ``global_tokens``/``global_seqs`` count valid tokens/sequences of the whole mini-batch (all micro-batches,
    all data-parallel ranks), so the summed micro-batch losses equal the mini-batch loss.
    """

    global_tokens: float
    global_seqs: float
    temperature: float = 1.0
    step: int = 0  # the training step this update belongs to (the driver's, sent with each update call)


def builtin_metric(module: str, name: str, where: str) -> RLForgeError:
    """The error of a ``log`` whose name is one of the metrics rlforge writes for the step (one would hide the other)."""
    return RLForgeError(f"{module}.log({name!r}) in {where}: rlforge writes the metric {name!r} itself in this step, "
                        f"and one value would replace the other. Log yours under a name of its own (e.g. "
                        f"'custom/{name.rsplit('/', 1)[-1]}').")


class RLModule:
    """Base class of every algorithm. Subclass, override the verbs, register with a name.

    Class attributes:
        config_class: the dataclass of the ``algorithm:`` config section.
        preset: config values this algorithm sets over the defaults (a nested dict).
    """

    config_class: ClassVar[type] = AlgorithmConfig
    preset: ClassVar[dict[str, Any]] = {}
    _init_args: tuple[tuple[Any, ...], dict[str, Any]]  # set by __new__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("config")
        if isinstance(given, dict):  # not a DictConfig: attribute access (config.algorithm) would fail deep inside
            raise ConfigError(f"{cls.__name__}(config) takes a composed config, not a dict: rlforge.load_config(name, "
                              f"['key=value', ...]) makes one from the algorithm's registered name (rlforge algos): "
                              f"the defaults, its preset and your overrides, checked.")
        module = super().__new__(cls)
        # the constructor's arguments, which ranks that rebuild it as cls(config) would not get (rank_module_class)
        module._init_args = (args, kwargs)
        return module

    def __init__(self, config: DictConfig) -> None:
        self.config = config
        self.actor: torch.nn.Module | None = None
        self.ref: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None
        self.tokenizer: Any = None
        self.processor: Any = None  # a vision-language model's processor (rlforge.multimodal), else None
        self.step = 0  # the training step being run (set by the Trainer)
        # the models this process loads (None: all the algorithm needs): a rank loads only its role's (``loads``)
        self.roles: Collection[str] | None = None
        self._metrics: dict[str, float] | None = None  # the running step's metrics sink (set by the Trainer)
        self._logged: dict[str, float] = {}  # what log() put there this step (reset by the Trainer at each step)
        self._on_worker = False  # built by a worker process (a Ray or torchrun rank), not the driver
        self._fitting = False  # a Trainer is fitting it: log() outside a step raises rather than drop the value
        self._registry: Any = None  # the run's registries (set by the Builder)
        # what validate generates and scores through (set by the Trainer before each validation: the run's agent
        # loop, if any; None: the given controller's generate and score, single-turn)
        self.evaluator: Evaluator | None = None

    @property
    def registry(self) -> Any:
        """The registries of the run (``rlforge.registry.Registries``), for components an algorithm looks up by name
        (``actor.policy_loss``). The Builder sets them; a module made without one loads the plugins itself, once."""
        if self._registry is None:
            from rlforge.plugin_manager import PluginManager

            self._registry = PluginManager.for_config(self.config).registry
        return self._registry

    @registry.setter
    def registry(self, registry: Any) -> None:
        self._registry = registry

    def log(self, name: str, value: float) -> None:
        """Log a metric, a number or a one-element tensor, for the running step (like ``LightningModule.log``): from
        what a step runs in the driver (``compute_rewards``, ``compute_advantages``, ``on_rollout_end``,
        ``on_train_step_end``, a stage) and from an update (``training_step``, ``policy_loss``, ``critic_step``,
        ``value_loss``), which the worker collects and returns with the update's metrics (rank 0's value under
        several ranks), under every controller. Where no step runs it raises while a Trainer fits the module (as
        Lightning's does in ``configure_optimizers``) and in a worker process: nothing would deliver the value. A
        module used without a Trainer ignores it. A name rlforge writes for the step itself is an error
        (:func:`builtin_metric`), whichever is written first; the module's own names may be logged again."""
        caller = sys._getframe(1).f_code.co_qualname
        if self._metrics is not None:
            if name in self._metrics and name not in self._logged:
                raise builtin_metric(type(self).__name__, name, caller)
            self._metrics[name] = self._logged[name] = float(as_number(name, value, f"self.log in {caller}"))
        elif self._on_worker:
            raise RLForgeError(
                f"{type(self).__name__}.log({name!r}) was called in a worker process outside an update (in {caller}), "
                f"where no metric reaches the loggers. Log from the driver-side methods (compute_rewards, "
                f"compute_advantages, on_train_step_end, flow stages) or inside training_step/policy_loss (collected "
                f"and returned), or return the value in the metrics dict.")
        elif self._fitting:
            raise RLForgeError(
                f"{type(self).__name__}.log({name!r}) was called in {caller}, where no training step runs: no logger "
                f"would get the value (Lightning refuses self.log in configure_optimizers too). Log from what a step "
                f"runs (compute_rewards, compute_advantages, on_rollout_end, on_train_step_end, a stage's ctx.log) or "
                f"an update (training_step, policy_loss), or return the value (validate returns its metrics).")

    def _check_logged(self, metrics: dict[str, float], builtin: Collection[str] = ()) -> None:
        """What log() set this step is still in ``metrics`` (no metric rlforge wrote later in the step replaced it)
        and is none of the ``builtin`` names (metrics rlforge adds to them: it would replace those)."""
        for name, value in self._logged.items():
            kept = metrics.get(name)
            if name in builtin or (kept != value and not (kept != kept and value != value)):  # (NaN == NaN here)
                raise builtin_metric(type(self).__name__, name, "this step")

    # --- data -------------------------------------------------------------------------------------
    def prepare_data(self, rows: list[dict[str, Any]], split: str) -> list[Any]:
        """The examples of ``split`` (``train`` or ``val``) made from the dataset's rows (``data.name``).

        Called once per run with the tokenizer loaded, before any model loads (data mistakes fail fast). The
        Trainer draws ``data.train_batch_size`` training examples per step for :meth:`collate` and gives the
        validation examples to :meth:`validate`. Default: the prompts, chat template applied (``tokenize_rows``).
        """
        from rlforge.data import template_kwargs, tokenize_rows

        from rlforge.agent.config import check_image_rows, check_row_loops

        d = self.config.data
        name = f"{d.name} ({split})"
        check_row_loops(rows, self.config.rollout.agent.loop, name)
        prompts = tokenize_rows(rows, self.tokenizer, d.max_prompt_length, d.filter_overlong_prompts, name,
                                processor=self.processor, image_key=d.image_key, truncation=d.truncation,
                                template=template_kwargs(self.config), continue_final=d.continue_final_message)
        if self.processor is not None:
            from rlforge.multimodal import check_engine

            check_engine(prompts, self.registry.rollout.entry(self.config.rollout.name).capabilities,
                         self.config.rollout.name)
            check_image_rows(prompts, self.registry, self.config.rollout.agent.loop, name)
            if self.needs_critic() and any(p.multi_modal is not None for p in prompts):
                raise DataError(f"{name}: rows with images, but --algo {self.config.algorithm.name} trains a critic "
                                f"(value model), which reads text only: a critic over images is not built yet "
                                f"(docs/multimodal.md). Use a critic-free algorithm (grpo, rloo, reinforce_pp, dapo, ...).")
        return prompts

    def collate(self, examples: list[Any], uids: list[Any]) -> B.Batch:
        """A training batch of ``examples``, whose group ids are ``uids`` (one per example, unique per draw).
        Its columns are the first stage's inputs (``DataFlow.inputs``). Default: left-padded prompts."""
        from rlforge.data import collate

        return collate(examples, self.tokenizer.pad_token_id, uids)

    def validate(self, controller: Controller, examples: list[Any]) -> tuple[dict[str, float], B.Batch | None]:
        """Measure the held-out ``examples``: the ``val/*`` metrics, and the batch whose samples go to
        ``val_samples.jsonl`` (None: no samples). Default: generate from the prompts with the validation sampling
        settings (``rollout.val_*``) and score them through :attr:`evaluator` (``rlforge.evaluation``: the run's
        agent loop and its rewards included): ``val/reward``, ``val/accuracy``."""
        from rlforge.data import collate
        from rlforge.evaluation import Evaluator
        from rlforge.sampling import SamplingParams

        evaluate = self.evaluator or Evaluator(controller.workers.rollout, controller.score)
        batch = collate(examples, self.tokenizer.pad_token_id, list(range(len(examples))))
        batch = evaluate(batch, SamplingParams.from_config(self.config.rollout, validation=True))
        return generation_metrics(batch), batch

    def forward_responses(self, model: torch.nn.Module, micro: B.Batch, temperature: float) -> torch.Tensor:
        """What the log-prob stages store for ``micro`` under ``model`` (``workers.actor.compute_log_probs``), [B, R]
        with 0 at padding: the responses' per-token log-probs at ``temperature``. A module whose model is not a
        causal LM overrides it (a reward model puts its reward on each sequence's last token)."""
        return ops.response_logprobs(model, micro[B.INPUT_IDS], micro[B.ATTENTION_MASK], micro[B.RESPONSES].shape[1],
                                     temperature, remove_padding=self.config.model.remove_padding,
                                     multi_modal=micro.lists.get(B.MULTI_MODAL_INPUTS))[0]

    # --- configuration ----------------------------------------------------------------------------
    @classmethod
    def validate_config(cls, config: DictConfig) -> None:
        """Algorithm-specific checks run at config composition time (before any model loads)."""

    @classmethod
    def batch_words(cls) -> tuple[str, str, str]:
        """How ``rlforge config show`` words a step's data: (what a step does, the unit ``data.train_batch_size``
        counts, what its ``rollout.n`` rows are)."""
        return "samples", "prompts", "responses"

    def flow(self) -> DataFlow:
        """The dataflow of one training step for this algorithm."""
        stages = [Stage.ROLLOUT, Stage.REWARD, Stage.FILTER, Stage.OLD_LOGPROB]
        if self.needs_reference():
            stages.append(Stage.REF_LOGPROB)
        if self.needs_critic():
            stages.append(Stage.VALUES)
        stages.append(Stage.ADVANTAGE)
        if self.needs_critic():
            stages.append(Stage.UPDATE_CRITIC)
        stages += [Stage.UPDATE_ACTOR, Stage.SYNC_WEIGHTS]
        return DataFlow(self.config.algorithm.name, stages)

    def needs_reference(self) -> bool:
        """Whether a frozen reference model is loaded (KL loss or KL in reward)."""
        return bool(self.config.actor.use_kl_loss)

    def needs_critic(self) -> bool:
        """Whether a value model is trained (PPO)."""
        return False

    def worker_roles(self) -> list[str]:
        """The roles (``registry.role``) whose worker groups the dataflow calls (``ctx.workers.<role>``): the actor, and
        the critic when one is trained. An algorithm with a role of its own adds it (PRIME's ``prm``); the controllers
        place every role named here or by the reward manager (docs/plugins.md, "Add a role")."""
        return ["actor", "critic"] if self.needs_critic() else ["actor"]

    def loads(self, model: str) -> bool:
        """Whether this process loads the model ``model`` (``actor``, ``ref``, ``critic``, a role's own): every model
        in the driver of a local run, a rank only its role's (``Role.models``)."""
        return self.roles is None or model in self.roles

    def reference_is_base(self) -> bool:
        """Whether the reference policy is the actor's base model with its LoRA adapter disabled."""
        return lora.enabled(self.config) and not self.config.model.ref_path

    def configure_tokenizer(self) -> None:
        """Load the tokenizer of ``model.path`` (called before the data is prepared), and the processor of a
        vision-language model (``self.processor``, None for a text model); ``model.chat_template`` replaces their
        chat template when set."""
        from rlforge.models import load_tokenizer_and_processor

        self.tokenizer, self.processor = load_tokenizer_and_processor(self.config)

    def configure_model(self) -> None:
        """Load the actor, and the reference and critic models when the algorithm needs them (only those in
        :meth:`loads`: a Ray rank of the critic group loads just the critic)."""
        from rlforge import precision
        from rlforge.models import adapter_folder, load_model, load_value_model

        cfg = self.config.model
        p = precision.for_config(self.config)  # trained models hold p.weights; the frozen reference p.frozen
        if self.tokenizer is None:
            self.configure_tokenizer()
        if self.loads("actor"):
            # a LoRA adapter as model.path: merged for full fine-tuning, else its training goes on (lora.wrap)
            self.actor = load_model(cfg.path, p.weights, trust_remote_code=cfg.trust_remote_code,
                                    with_adapter=not lora.enabled(self.config), overrides=cfg.config_overrides)
            if cfg.freeze_vision_tower:
                from rlforge.multimodal import freeze_vision_tower

                freeze_vision_tower(self.actor)
            if lora.enabled(self.config):
                self.actor = lora.wrap(self.actor, self.config, adapter_folder(cfg.path))
        # with LoRA (and no model.ref_path) the reference is the actor with its adapter off: no second copy
        if self.needs_reference() and self.loads("ref") and not self.reference_is_base():
            self.ref = load_model(cfg.ref_path or cfg.path, p.frozen, trust_remote_code=cfg.trust_remote_code,
                                  key="model.ref_path" if cfg.ref_path else "model.path",
                                  overrides=None if cfg.ref_path else cfg.config_overrides)
            self.ref.requires_grad_(False).eval()
        if self.needs_critic() and self.loads("critic"):
            self.critic = load_value_model(self.config.critic.path or cfg.path, p.weights, cfg.trust_remote_code)

    def configure_optimizers(self) -> tuple[torch.optim.Optimizer, Any]:
        """The actor's AdamW and learning-rate schedule (``actor.*``). Returns (optimizer, scheduler or None)."""
        assert self.actor is not None
        return _adamw(self.actor, self.config.actor, schedule_steps(self.config))

    def configure_critic_optimizers(self) -> tuple[torch.optim.Optimizer, Any]:
        """The critic's AdamW and learning-rate schedule (``critic.*``)."""
        assert self.critic is not None
        return _adamw(self.critic, self.config.critic, schedule_steps(self.config))

    # --- algorithm verbs ------------------------------------------------------------------------
    def compute_rewards(self, batch: B.Batch) -> B.Batch:
        """Final per-token rewards before advantages (e.g. subtract a KL penalty). Default: unchanged."""
        return batch

    def compute_advantages(self, batch: B.Batch) -> B.Batch:
        """Fill ``advantages`` and ``returns`` from ``token_level_rewards`` (and values)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_advantages")  # abstract

    def policy_loss(
        self, batch: B.Batch, log_probs: torch.Tensor, entropy: torch.Tensor | None, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return this micro-batch's share of the mini-batch loss, and metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement policy_loss")  # abstract

    def training_step(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward the actor on one micro-batch and return (loss, metrics)."""
        assert self.actor is not None
        resp_len = micro[B.RESPONSES].shape[1]
        log_probs, entropy = ops.response_logprobs(
            self.actor, micro[B.INPUT_IDS], micro[B.ATTENTION_MASK], resp_len, ctx.temperature, with_entropy=True,
            remove_padding=self.config.model.remove_padding, multi_modal=micro.lists.get(B.MULTI_MODAL_INPUTS),
        )
        return self.policy_loss(micro, log_probs, entropy, ctx)

    def value_loss(
        self, batch: B.Batch, values: torch.Tensor, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return this micro-batch's share of the critic loss, and metrics (algorithms with a critic)."""
        raise NotImplementedError(f"{type(self).__name__} must implement value_loss to use a critic")  # abstract

    def critic_step(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward the critic on one micro-batch and return (loss, metrics)."""
        assert self.critic is not None
        values = ops.response_values(self.critic, micro[B.INPUT_IDS], micro[B.ATTENTION_MASK], micro[B.RESPONSES].shape[1],
                                 remove_padding=self.config.model.remove_padding)
        return self.value_loss(micro, values, ctx)

    # --- state saved in checkpoints -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Extra algorithm state to checkpoint (e.g. an adaptive KL coefficient); plain values only."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # --- module hooks -------------------------------------------------------------------------------
    def on_rollout_end(self, batch: B.Batch) -> None:
        """Called after generation, before rewards."""

    def on_train_step_end(self, metrics: dict[str, float]) -> None:
        """Called after each training step with its metrics."""

    # --- public wrappers (not overridden) ---------------------------------------------------------
    def advantages(self, batch: B.Batch) -> B.Batch:
        """``compute_rewards`` then ``compute_advantages``, checking the columns they must set."""
        name = type(self).__name__
        rewarded = self.compute_rewards(batch)
        if not isinstance(rewarded, B.Batch):
            raise RLForgeError(f"{name}.compute_rewards returned {type(rewarded).__name__}: return the batch it was "
                               f"given (its token_level_rewards changed).")
        out = self.compute_advantages(rewarded)
        if not isinstance(out, B.Batch):
            raise RLForgeError(f"{name}.compute_advantages returned {type(out).__name__}: return the batch it was "
                               f"given, with 'advantages' and 'returns' set (self.set_advantages(batch, (adv, ret))).")
        mask = batch[B.RESPONSE_MASK].bool()
        for col in (B.ADVANTAGES, B.RETURNS):
            if col not in out:
                raise RLForgeError(f"{name}.compute_advantages did not set '{col}'.")
            value = out[col]
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.shape != mask.shape:
                what = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else
                        f"a {type(value).__name__}")
                raise RLForgeError(f"{name}.compute_advantages set '{col}' to {what}: it takes a float tensor of the "
                                   f"response mask's shape {tuple(mask.shape)} (one value per response token).")
            bad = int((~torch.isfinite(value) & mask).sum())
            if bad:
                raise NonFiniteError(f"{name}.compute_advantages set '{col}' to NaN or inf on {bad} response "
                                     f"token(s): from the rewards it read (token_level_rewards, after "
                                     f"rlforge_shape_rewards) or its own arithmetic (a division by a zero std?).")
        return out


def checked_loss(result: Any, name: str) -> tuple[torch.Tensor, dict[str, float]]:
    """A training step's ``(loss, metrics)`` as the update takes it (``name``: whose, for the message): a one-element
    float tensor that depends on the model's parameters, and metrics that are numbers."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise RLForgeError(f"{name} (training_step / policy_loss, or the role's step) returned "
                           f"{type(result).__name__}{f' of {len(result)}' if isinstance(result, tuple) else ''}: "
                           f"return (loss, metrics), the loss a 0-d tensor and metrics a dict of numbers.")
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        what = f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else \
            type(loss).__name__
        raise RLForgeError(f"{name} is {what}: it takes one float (a 0-d tensor: the aggregate over the "
                           f"micro-batch), to run backward on.")
    if not loss.requires_grad:
        raise RLForgeError(f"{name} does not depend on the model's parameters (no gradient: computed from detached "
                           f"tensors, or under torch.no_grad).")
    if not isinstance(metrics, dict):
        raise RLForgeError(f"{name}: its metrics are {type(metrics).__name__}: return a dict of name -> number.")
    check_numbers(metrics, name)
    return loss, metrics


def generation_metrics(batch: B.Batch) -> dict[str, float]:
    """``val/reward`` (mean score), ``val/accuracy`` (mean ``acc``, when the reward manager sets it) and, with several
    data sources, ``val/<source>/accuracy``; plus verl's names (:func:`verl_validation_metrics`)."""
    out = {"val/reward": batch[B.SCORES].mean().item()}
    if B.ACC in batch:
        out["val/accuracy"] = batch[B.ACC].mean().item()
        sources = sorted(set(batch[B.DATA_SOURCE]))
        if len(sources) > 1:
            for src in sources:
                rows = [i for i, s in enumerate(batch[B.DATA_SOURCE]) if s == src]
                out[f"val/{src}/accuracy"] = batch[B.ACC][rows].mean().item()
    return {**out, **verl_validation_metrics(batch)}


def verl_validation_metrics(batch: B.Batch) -> dict[str, float]:
    """verl's validation names: per data source and variable (``reward``, and each numeric key of verl's
    ``reward_extra_info`` that every sample has, ``B.REWARD_EXTRA_INFO``), the mean over prompts of each prompt's mean
    (``mean@N``) and population std (``std@N``) over its N samples. The core variable (``acc`` if there, else
    ``reward``) logs ``mean@N`` as ``val-core/<source>/<var>/mean@N``; the rest goes to ``val-aux/``. As in verl,
    ``acc`` is the reward function's own, or its score where it returned a number (a partial credit of 0.5 counts
    0.5: ``B.ACC``, rlforge's ``val/accuracy``, counts it as wrong). verl's bootstrap ``best@N``/``worst@N``/``maj@N``
    are not computed (``rlforge eval`` reports pass@k)."""
    variables = {"reward": batch[B.SCORES].float()}
    extras = batch.lists.get(B.REWARD_EXTRA_INFO) or []
    for key in sorted(set().union(*extras) - set(variables)):
        values = [row.get(key) for row in extras]
        if all(isinstance(v, float) for v in values):
            variables[key] = torch.tensor(values)
    core = "acc" if "acc" in variables else "reward"
    groups: dict[tuple[str, Any], list[int]] = {}
    for i, (src, uid) in enumerate(zip(batch[B.DATA_SOURCE], batch[B.UID])):
        groups.setdefault((src, uid), []).append(i)
    out: dict[str, float] = {}
    for src in sorted({s for s, _ in groups}):
        prompts = [rows for (s, _), rows in groups.items() if s == src]
        n = max(len(rows) for rows in prompts)
        for name, values in variables.items():
            per_prompt = [values[rows] for rows in prompts]
            section = "val-core" if name == core else "val-aux"
            out[f"{section}/{src}/{name}/mean@{n}"] = torch.stack([v.mean() for v in per_prompt]).mean().item()
            if n > 1:
                stds = [v.std(unbiased=False) for v in per_prompt]
                out[f"val-aux/{src}/{name}/std@{n}"] = torch.stack(stds).mean().item()
    return out


def schedule_steps(config: Any) -> int:
    """The steps a learning-rate schedule spans: ``trainer.schedule_steps``, else ``trainer.total_steps``."""
    return int(config.trainer.schedule_steps or config.trainer.total_steps)


def _adamw(model: torch.nn.Module, section: Any, total_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters (with LoRA: the adapter's only) with ``section``'s learning-rate schedule
    over ``total_steps`` training steps (``rlforge.lr_schedule``)."""
    opt = torch.optim.AdamW(lora.trainable_parameters(model), lr=section.lr, weight_decay=section.weight_decay,
                            betas=(float(section.betas[0]), float(section.betas[1])))
    return opt, lr_schedule.build(opt, section, total_steps)
