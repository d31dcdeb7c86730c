"""The core config schema: one dataclass per section. Field comments are the documentation.

Only the core's own keys live here. Each component adds its options beside its code (its ``config=``
dataclass at registration, see ``rlforge.registry``): ``rollout.hf.*``, ``strategy.fsdp.*``, ``data.arith.*``,
``ray.*``, ``plugins.<name>.*``; the algorithm's ``config_class`` is the ``algorithm`` section.
``schema.build`` assembles the full schema from the registries (compose.py).

Defaults are the built-in default run (`rlforge fit --algo grpo` with no other arguments).
Algorithm presets, ``--config FILE`` and CLI ``key=value`` overrides are merged on top (see compose.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass, replace
from typing import Any, Optional, get_type_hints

from omegaconf import ListConfig, OmegaConf

from rlforge.agent.config import AgentConfig
from rlforge.errors import ConfigError
from rlforge.lora import LoraConfig
from rlforge.lr_schedule import LR_SCHEDULERS
from rlforge.pipeline import PIPELINE_NAMES
from rlforge.precision import PRECISIONS


def plain(value: Any) -> Any:
    """A config value (an OmegaConf node or not) as plain Python containers, interpolations resolved."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


BUILTIN_MODEL = "builtin:tiny-arith"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# a run or experiment folder name: one path component, never "." or ".." (it cannot leave trainer.runs_root)
RUN_NAME_CHARS = "A-Za-z0-9_.+=@,-"  # the characters of one (a regex character class's contents)
RUN_NAME = rf"[A-Za-z0-9_][{RUN_NAME_CHARS}]{{0,127}}"
RUN_NAME_WHAT = "a folder name of letters, digits and _ . + = @ , - (not starting with . or -), at most 128 characters"


@dataclass(frozen=True)
class Valid:
    """What a config value may be: the field metadata ``valid``, checked by ``rlforge.config.compose`` for every
    section (core, algorithm, components). Bounds: ``ge``/``le`` inclusive, ``gt``/``lt`` strict. ``choices``:
    the allowed strings; ``pattern``: a regular expression the whole string matches, ``what`` says it in words.
    ``None`` is always allowed where the type is Optional; floats must be finite (no NaN or inf) in any case.
    ``length``: a list of that many items, each within the bounds. ``why`` is added to the error message."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str = ""
    what: str = ""
    why: str = ""  # appended to the error message
    length: int = 0  # > 0: the value is a list of this many items, each checked against the bounds

    def describe(self, integer: bool = False) -> str:
        """The rule in words: ``a positive integer``, ``> 0``, ``in (0, 1]``, ``one of a, b``, ``2 numbers, each in
        [0, 1)``."""
        if self.length:
            return f"{self.length} numbers, each {replace(self, length=0).describe()}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.pattern:
            return self.what or f"a string matching {self.pattern}"
        low = (self.gt, "(", ">") if self.gt is not None else (self.ge, "[", ">=") if self.ge is not None else None
        high = (self.lt, ")", "<") if self.lt is not None else (self.le, "]", "<=") if self.le is not None else None
        if integer and low and low[0] == 1 and low[2] == ">=" and not high:
            return "a positive integer"
        kind = "an integer " if integer else ""
        if low and high:
            return f"{kind}in {low[1]}{_num(low[0])}, {_num(high[0])}{high[1]}"
        bound = low or high
        return f"{kind}{bound[2]} {_num(bound[0])}" if bound else "any value"

    def allows(self, value: Any) -> bool:
        if self.length:
            items = list(value) if isinstance(value, (list, tuple, ListConfig)) else []
            return len(items) == self.length and all(replace(self, length=0).allows(v) for v in items)
        if self.choices:
            return value in self.choices
        if self.pattern:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        return not ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                    or (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def option(default: Any, **valid: Any) -> Any:
    """A config field with its valid values: ``lr: float = option(5e-5, ge=0)  # the description`` (a list default
    is copied for each config)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"valid": Valid(**valid)})
    return field(default=default, metadata={"valid": Valid(**valid)})


@dataclass
class ModelConfig:
    path: str = BUILTIN_MODEL  # HF folder, or builtin:tiny-arith (the shipped SFT'd tiny model)
    ref_path: Optional[str] = None  # reference model for the KL term; None = same as `path`
    precision: str = option("auto", choices=PRECISIONS)  # auto (bf16-mixed on CUDA, 32-true on CPU) | 32-true | bf16-mixed | 16-mixed | bf16-true (docs/models.md)
    trust_remote_code: bool = False  # never on unless you set it
    chat_template: Optional[str] = None  # a Jinja chat template in place of the model's own (its tokenizer's and processor's), e.g. one that writes tool schemas where the model's does not; saved with checkpoints (verl's model.custom_chat_template)
    remove_padding: bool = False  # packed forward passes of actor, reference, critic: no padding computed (GPU; docs/performance.md)
    shared_prefix: bool = True  # padded forward passes (log-probs, values, updates) run each distinct prompt of a micro-batch once, its responses on its KV cache; off where it does not apply (docs/models.md)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, ~30% slower)
    compile: bool = False  # torch.compile the training and scoring forward passes (not generation; docs/performance.md)
    compile_backend: str = "inductor"  # torch.compile's backend with model.compile: inductor (generates kernels) | aot_eager (graph capture and AOT autograd, no codegen: quick to compile) | any in torch._dynamo.list_backends()
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters (rank 0 = off; docs/models.md)
    freeze_vision_tower: bool = False  # vision-language models: no gradients for the vision encoder (docs/multimodal.md)
    config_overrides: dict[str, Any] = field(default_factory=dict)  # fields of the policy's config.json set when it loads (actor, reference, vllm engine, the context check; not the critic), e.g. {max_position_embeddings: 32768} (verl's model.override_config); a field the config lacks is an error


@dataclass
class DataConfig:
    name: str = "arith"  # dataset registry name: arith (built-in, generated offline) | files
    train_files: list[str] = field(default_factory=list)  # jsonl/parquet files (data.name=files)
    val_files: list[str] = field(default_factory=list)  # held-out files for validation (optional)
    train_batch_size: int = option(32, ge=1)  # prompts per step (each sampled rollout.n times)
    max_prompt_length: int = option(64, ge=1)  # in tokens, after the chat template
    filter_overlong_prompts: bool = True  # drop longer prompts (False: data.truncation decides)
    truncation: str = option("error", choices=("error", "left", "right", "middle"))  # a prompt over max_prompt_length with filter_overlong_prompts=false: error (naming the row) | left (keep its last max_prompt_length tokens: what verl 0.9.1's agent loop does) | right (keep the first) | middle (the first half and the last half); a row with images is never cut (an error)
    shuffle: bool = True  # reshuffle the prompts every epoch (seeded, resumable)
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of every chat-template render of a prompt: the data loader (training, validation, eval, generate) and the agent loops' turns, e.g. {enable_thinking: false} (verl's data.apply_chat_template_kwargs), the vision processor's and rlforge sft's (its rows' enable_thinking column over it: sft.enable_thinking_key)
    image_key: str = "images"  # the column of a row's images (verl's data.image_key; docs/multimodal.md)
    continue_final_message: bool = False  # a prompt whose last message is the assistant's (a prefill such as '<think>') is left open for the model to continue, as TRL's continue_final_message; false: that message is closed and a new assistant turn opened (verl)


@dataclass
class RolloutConfig:
    name: str = "hf"  # rollout engine registry name
    n: int = option(8, ge=1)  # samples per prompt
    temperature: float = option(1.0, gt=0, why="training samples (greedy samples of a prompt would all be the same; greedy validation is rollout.val_temperature=0)")  # sampling temperature; log-probs are computed at this temperature
    top_p: float = option(1.0, gt=0, le=1)  # nucleus sampling (1.0 = off)
    top_k: int = option(0, ge=0)  # 0 = disabled
    max_new_tokens: int = option(8, ge=1)  # response length limit (EOS ends a response earlier)
    min_new_tokens: int = option(0, ge=0)  # EOS is suppressed before this many tokens (training rollouts only)
    ignore_eos: bool = False  # responses run to max_new_tokens: the stop tokens are sampled and trained as any token (verl's rollout.ignore_eos); single-turn rollouts only
    micro_batch_size: int = option(256, ge=1)  # sequences per generate() call
    weight_sync: str = "auto"  # weight-sync backend registry name: auto (the engine's best that runs here) | memory (hf) | files (vllm) | vllm_native (vllm on CUDA: IPC); docs/rollout.md
    val_temperature: float = option(0.0, ge=0)  # 0 = greedy validation (val_top_p/val_top_k unused); min_new_tokens is not applied there (verl's val_kwargs defaults)
    val_top_p: float = option(1.0, gt=0, le=1)  # nucleus sampling of sampled validation (val_temperature > 0; 1.0 = off)
    val_top_k: int = option(0, ge=0)  # top-k of sampled validation (val_temperature > 0; 0 = off)
    val_n: int = option(1, ge=1)  # samples per validation prompt
    agent: AgentConfig = field(default_factory=AgentConfig)  # multi-turn rollouts: agent loop, tools, limits


@dataclass
class RewardConfig:
    manager: str = "rule"  # reward manager registry name
    fn: Optional[str] = None  # reward function name; None = chosen by each row's data_source
    file: Optional[str] = None  # python file with compute_score(data_source, solution_str, ground_truth, extra_info)
    fn_name: str = option("compute_score", pattern=IDENTIFIER, what="a Python identifier")  # function to load from `file`
    fn_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments passed to `file`'s function on every call besides the four of the contract, e.g. {format_score: 0.1} (verl's custom_reward_function.reward_kwargs; mappings and lists arrive as OmegaConf containers, as in verl); each must be a parameter of the function (or it takes **kwargs)
    num_workers: int = option(1, ge=1)  # worker processes that evaluate reward functions (a hung one is killed and replaced)
    extra_info: dict[str, Any] = field(default_factory=dict)  # keys set in every row's extra_info before the reward function reads it (rule manager), over the row's own top-level keys (a row whose extra_info is not a mapping is passed as it is), e.g. {experiment_name: qwen3_8b} as verl's gdpo reward manager sets it (rlforge verl sets it for reward_manager.name=gdpo)
    timeout_s: float = option(10.0, gt=0)  # per-sample CPU-time limit of a reward function call (wall-clock backstop: 10x)
    fallback_score: float = option(0.0, ge=-3.4028234663852886e38, le=3.4028234663852886e38, why="the float32 range of the reward tensor")  # score of a sample whose reward function raised, hung or returned a non-number
    max_error_share: float = option(1.0, ge=0, le=1)  # the run stops on a batch whose share of failed reward calls (errors and timeouts) reaches this; 1 = only when every call failed, 0 = at the first failed call (as verl's reward managers; rlforge verl sets it)


@dataclass
class AlgorithmConfig:
    """Base of every algorithm's section; each algorithm's ``config_class`` adds its own fields."""

    name: str = "grpo"  # algorithm registry name (set by --algo)


@dataclass
class ScoringConfig:
    """Micro-batches of a forward-only pass (old or reference log-probs, values). Memory and speed only: the values
    computed do not change. Unset keys follow the role's update (``ppo_micro_batch_size``, ``max_tokens_per_micro_batch``)."""

    micro_batch_size: Optional[int] = option(None, ge=1)  # sequences per forward pass on one rank; None = as the update
    max_tokens_per_micro_batch: Optional[int] = option(None, ge=0)  # > 0: micro-batches of at most this many real tokens on one rank (by length); 0 = by micro_batch_size; None = as the update


@dataclass
class ActorConfig:
    lr: float = option(5e-5, ge=0)  # AdamW learning rate of the actor (0: the weights do not change, e.g. to check a setup, as verl and torch allow)
    weight_decay: float = option(0.0, ge=0)  # AdamW weight decay
    betas: list[float] = option([0.9, 0.999], ge=0, lt=1, length=2)  # AdamW's (beta1, beta2) (verl's optim.betas)
    warmup_steps: int = option(0, ge=0)  # linear learning-rate warm-up from 0, in training steps
    warmup_ratio: float = option(0.0, ge=0, le=1)  # where warmup_steps is 0: a warm-up of int(warmup_ratio x trainer.schedule_steps, else total_steps) steps
    lr_scheduler: str = option("constant", choices=tuple(LR_SCHEDULERS))  # after the warm-up: constant | cosine (down to min_lr_ratio x lr) | linear (down to 0); transformers' get_scheduler, one step per training step
    min_lr_ratio: float = option(0.0, ge=0, le=1)  # lr_scheduler=cosine: the rate at the end of the run, as a share of lr
    num_cycles: float = option(0.5, gt=0)  # lr_scheduler=cosine: cosine waves over the run after the warm-up (0.5 = one half-wave down)
    grad_clip: float = option(1.0, ge=0)  # max global gradient norm (0 = no clipping, norm still logged)
    ppo_epochs: int = option(1, ge=1)  # passes over each rollout batch
    ppo_mini_batch_size: int = option(8, ge=1)  # prompts per optimizer step (x rollout.n samples)
    ppo_micro_batch_size: Optional[int] = option(None, ge=1)  # samples per forward/backward (gradient accumulation); None = whole mini-batch
    max_tokens_per_micro_batch: int = option(0, ge=0)  # > 0: micro-batches by token budget (per rank) instead of ppo_micro_batch_size
    log_prob: ScoringConfig = field(default_factory=ScoringConfig)  # micro-batches of the old log-prob pass (memory and speed only)
    ref_log_prob: ScoringConfig = field(default_factory=ScoringConfig)  # micro-batches of the reference model's log-prob pass (memory and speed only)
    clip_ratio_low: float = option(0.2, ge=0)  # ratio clipped below at 1 - clip_ratio_low (1 or more: never)
    clip_ratio_high: float = option(0.2, ge=0)  # ratio clipped above at 1 + clip_ratio_high (DAPO clip-higher: raise it)
    clip_ratio_c: float = option(3.0, gt=1)  # dual-clip bound, applied where the advantage is negative
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    policy_loss: str = "vanilla"  # policy loss registry name (verl's policy_loss.loss_mode): vanilla (PPO clip) | cispo | sapo | gspo | ... (docs/algorithms/policy_losses.md); options at actor.<name>.*
    reuse_rollout_log_probs: Optional[bool] = None  # old log-probs = the engine's: None = if they are the actor's (hf), True = always, False = recompute
    entropy_coeff: float = option(0.0)  # entropy bonus weight (the loss subtracts coeff x entropy; negative: entropy minimization, as verl allows)
    use_kl_loss: bool = False  # add a KL(actor || reference) term to the loss (loads a reference model)
    kl_loss_coef: float = option(0.001, ge=0)  # weight of the KL loss
    kl_loss_type: str = "low_var_kl"  # k1 | k2 | k3 (= low_var_kl) | abs | mse | kl, or any of them with "+"


@dataclass
class CriticConfig:
    """The value model, used by algorithms with a critic (PPO)."""

    path: Optional[str] = None  # value model init; None = model.path's body with a fresh scalar head
    lr: float = option(1e-4, ge=0)  # AdamW learning rate of the critic
    weight_decay: float = option(0.0, ge=0)  # AdamW weight decay
    betas: list[float] = option([0.9, 0.999], ge=0, lt=1, length=2)  # AdamW's (beta1, beta2)
    warmup_steps: int = option(0, ge=0)  # linear learning-rate warm-up from 0, in training steps
    warmup_ratio: float = option(0.0, ge=0, le=1)  # where warmup_steps is 0: a warm-up of int(warmup_ratio x trainer.schedule_steps, else total_steps) steps
    lr_scheduler: str = option("constant", choices=tuple(LR_SCHEDULERS))  # after the warm-up: constant | cosine | linear, as actor.lr_scheduler
    min_lr_ratio: float = option(0.0, ge=0, le=1)  # lr_scheduler=cosine: the rate at the end of the run, as a share of lr
    num_cycles: float = option(0.5, gt=0)  # lr_scheduler=cosine: cosine waves over the run after the warm-up
    grad_clip: float = option(1.0, ge=0)  # max global gradient norm
    ppo_epochs: int = option(1, ge=1)  # passes over each rollout batch
    ppo_mini_batch_size: int = option(8, ge=1)  # prompts per optimizer step (x rollout.n samples)
    ppo_micro_batch_size: Optional[int] = option(None, ge=1)  # samples per forward/backward; None = whole mini-batch
    max_tokens_per_micro_batch: int = option(0, ge=0)  # > 0: micro-batches by token budget (per rank), as actor's
    values: ScoringConfig = field(default_factory=ScoringConfig)  # micro-batches of the value pass before the update (memory and speed only)
    cliprange_value: float = option(0.5, gt=0)  # values clipped to old +- cliprange_value in the loss
    loss_agg_mode: str = "token-mean"  # as actor.loss_agg_mode


@dataclass
class StrategyConfig:
    name: str = "single"  # strategy registry name: single (one device) | fsdp (FSDP2, one process per rank) | tp (tensor parallel) | megatron (megatron-core, GPU) | fabric (Lightning Fabric: DDP, DeepSpeed) | a plugin's (docs/distributed.md)
    device: str = option("auto", pattern=r"auto|[a-z]+(:\d+)?", what="auto, cpu, cuda or cuda:N")  # auto | cpu | cuda | cuda:N
    num_processes: int = option(1, ge=1)  # processes (ranks) that hold the model; > 1 needs a sharded strategy (fsdp, tp, megatron, fabric) and trainer.controller=ray or torchrun (docs/distributed.md)
    checkpoint: str = option("full", choices=("full", "sharded", "async"))  # full (gathered; any rank count resumes) | sharded (torch.distributed.checkpoint) | async (sharded, written in the background while training goes on; actor/ only in the run's last checkpoint and on rlforge export; docs/reliability.md)
    offload_optimizer: bool = False  # optimizer state in CPU memory between updates (frees GPU memory for rollout)
    keep_freed_memory: bool = True  # CPU device: the allocator keeps freed tensor memory for reuse instead of returning it to the OS and faulting it in every step (glibc; RSS stays at its peak; docs/performance.md)


@dataclass
class TrainerConfig:
    total_steps: int = option(200, ge=1)  # training steps (one rollout batch each)
    total_epochs: Optional[int] = option(None, ge=1)  # set: the run's steps are total_epochs x (training examples left after data.filter_overlong_prompts // data.train_batch_size), counted when the data is loaded, in place of total_steps (verl's count)
    epoch_limit: Optional[int] = option(None, ge=1)  # set: the run also stops once it has trained epoch_limit x (training examples // data.train_batch_size) steps, if that comes before total_steps: total_steps becomes that count, schedule_steps keeps the old one, and the run validates after that step only where val_every names it (verl's total_epochs next to total_training_steps)
    schedule_steps: Optional[int] = option(None, ge=1)  # the learning-rate schedules (and warmup_ratio) span this many steps; None = total_steps
    seed: int = option(1, ge=0, le=2**32 - 1)  # seeds torch, python and the data order
    controller: str = "local"  # controller registry name: local (in-process) | ray (Ray actors) | torchrun (one process per rank, started by torchrun)
    pipeline: str = option("sync", choices=PIPELINE_NAMES)  # sync (generate, then train) | one_step_off (the next batch is generated by the previous weights while this step trains) | async (a rollout thread generates trainer.max_staleness batches ahead) | partial (at most trainer.partial_tokens per response per step, the rest continued in the next steps); docs/pipelines.md
    max_staleness: Optional[int] = option(None, ge=1)  # async: batches generated ahead of the trainer, the most updates a trained sample lags (step k trains on version max(0, k-1-S)); None = 2. Only with trainer.pipeline=async (one_step_off is 1)
    partial_tokens: Optional[int] = option(None, ge=1)  # partial: tokens each step decodes per response at most; a response not ended continues in the next step, its group trained once all its responses end (Kimi k1.5's partial rollouts); None = rollout.max_new_tokens // 4. Only with trainer.pipeline=partial
    critic_warmup: int = option(0, ge=0)  # first steps in which only the critic is trained (the actor waits)
    balance_batch: Optional[bool] = None  # spread real tokens evenly over the data-parallel ranks: each rank's share of every log-prob/value pass and of every mini-batch has equal rows and similar token sums (verl's trainer.balance_batch; what is computed does not change); None = only with token budgets (<role>.max_tokens_per_micro_batch > 0)
    project: str = option("rlforge", pattern=r"\S.*", what="a non-empty name")  # mlflow experiment name
    experiment: str = option("default", pattern=RUN_NAME, what=RUN_NAME_WHAT)  # run folders go to <runs_root>/<experiment>/<timestamp>
    runs_root: str = option("rlforge_runs", pattern=r".+", what="a folder")  # root folder of all runs
    run_dir: Optional[str] = None  # explicit run folder: new, empty, or a run's (continued with trainer.resume=auto); a folder with other files is refused; None = <runs_root>/<experiment>/<timestamp>
    resume: str = "never"  # never | auto (the newest run of the experiment, docs/reliability.md) | a checkpoint or run folder
    save_every: int = option(50, ge=0)  # steps; a final checkpoint is always written
    keep_last_n: int = option(2, ge=0)  # checkpoints kept (0 = keep all)
    val_every: int = option(50, ge=0)  # steps; 0 = only at the end (and before training if val_before_train)
    val_before_train: bool = True  # validate once before the first step
    val_at_end: bool = True  # validate once after the last step (the summary's accuracy after); false: not (verl's test_freq <= 0)
    max_nonfinite_steps: int = option(5, ge=1)  # stop after this many optimizer steps in a row with a NaN/Inf gradient
    resume_force: bool = False  # resume even if the config or the training data changed since the checkpoint (warns)
    samples_to_save: int = option(8, ge=0)  # generated samples written per step to samples.jsonl
    log_val_generations: int = option(0, ge=0)  # after each validation, this many of its generations (verl's pick: sorted by prompt, shuffled with seed 42), {input, output, score} each, written to <run>/val_generations/val_step<N>.json and handed to every logger (mlflow stores the file; wandb shows verl's table val/generations, tensorboard its text); 0 = none (every answer is in val_samples.jsonl either way)
    progress: bool = True  # live progress bar


@dataclass
class LoggerConfig:
    backends: list[str] = field(default_factory=lambda: ["console", "mlflow"])  # logger registry names


@dataclass
class PluginsConfig:
    disable: list[str] = field(default_factory=list)  # plugin names to block (see `rlforge plugins list`)
    modules: list[str] = field(default_factory=list)  # plugin modules to load for this run besides entry points: module names or .py files (-p on the command line; docs/plugins.md)


@dataclass
class SFTConfig:
    """``rlforge sft``: supervised fine-tuning on Lightning (docs/sft.md)."""

    train_file: Optional[str] = None  # .jsonl/.json/.parquet SFT rows (prompt/response or messages); None = data.name's rows, ground truth as response
    val_file: Optional[str] = None  # rows in the same formats for the validation loss (val/loss); None = none
    format: str = "auto"  # auto (by the row's columns: messages, completion, text, else prompt/response) | prompt_response | prompt_completion | messages | text
    prompt_key: str = "prompt"  # prompt column (chat messages or a string); dots reach nested fields: extra_info.question
    response_key: str = "response"  # response column (a string); dots reach nested fields: extra_info.answer
    completion_key: str = "completion"  # TRL's completion column: a string after a string prompt, or assistant messages after a conversational prompt
    text_key: str = "text"  # TRL's language-modelling column: plain text, trained on every token
    messages_key: str = "messages"  # conversation column (multi-turn chat; loss on assistant turns)
    tools_key: str = "tools"  # column of tool schemas given to the chat template (rows without it: none)
    enable_thinking_key: str = "enable_thinking"  # column whose value (true/false; null: not set) is the chat template's enable_thinking for that row, over data.apply_chat_template_kwargs (verl's data.enable_thinking_key); "" = not read
    enable_thinking_default: Optional[bool] = None  # enable_thinking for rows without that column (null: data.apply_chat_template_kwargs decides; verl's data.enable_thinking_default)
    max_length: int = 1024  # tokens per example (prompt + response, or the whole conversation)
    truncation: str = "error"  # longer examples: error (names the row) | left | right (cut that end) | drop
    steps: int = 400  # optimizer steps
    epochs: Optional[int] = option(None, ge=1)  # set: steps = epochs x (training examples // batch_size), counted after sft.truncation drops rows, in place of sft.steps (verl's total_epochs)
    epoch_limit: Optional[int] = option(None, ge=1)  # set: the run also stops once it has trained epoch_limit x (training examples // batch_size) steps, if that comes before sft.steps; the learning-rate schedule still spans sft.steps (verl's total_epochs beside total_training_steps)
    batch_size: int = 64  # examples per optimizer step, over all devices
    micro_batch_size: Optional[int] = None  # examples per forward/backward on one device (one data-parallel group with sequence_parallel_size > 1); None = batch_size / data-parallel groups
    sequence_parallel_size: int = option(1, ge=1)  # Ulysses sequence parallelism: devices that share each micro-batch, each holding a slice of its packed tokens (verl's ulysses_sequence_parallel_size); must divide the devices, which form devices / sequence_parallel_size data-parallel groups
    lr: float = option(1e-3, ge=0)  # peak learning rate (after the warm-up; see lr_scheduler)
    warmup_steps: int = 20  # linear warm-up from 0, in optimizer steps
    warmup_ratio: float = option(0.0, ge=0, le=1)  # where warmup_steps is 0: a warm-up of int(warmup_ratio x sft.steps) steps
    lr_scheduler: str = option("cosine", choices=tuple(LR_SCHEDULERS))  # after the warm-up: cosine (down to min_lr_ratio x lr) | constant | linear (down to 0); transformers' get_scheduler
    min_lr_ratio: float = option(0.1, ge=0, le=1)  # lr_scheduler=cosine: the rate at the last step, as a share of lr
    num_cycles: float = option(0.5, gt=0)  # lr_scheduler=cosine: cosine waves after the warm-up (0.5 = one half-wave down)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's (beta1, beta2)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global gradient norm (0 = no clipping)
    init: str = "tiny-arith"  # model to start from: an HF folder, builtin:NAME, or tiny-arith = fresh random tiny Llama
    seed: int = 0  # seeds initialisation and example order
    sampling: str = "epoch"  # epoch (each example once per epoch, reshuffled) | random (each step draws its batch at random)
    accelerator: str = "auto"  # auto | cpu | gpu
    devices: Any = "auto"  # auto | number of devices | list of device ids
    num_nodes: int = 1  # machines (with strategy ddp or fsdp)
    strategy: str = "auto"  # auto | ddp | fsdp (GPU) | deepspeed | ... (Lightning strategy names)
    output_dir: str = "sft_out"  # the fine-tuned model and tokenizer; checkpoints/ and logs inside
    output_dtype: str = option("auto", choices=("auto", "float32", "bfloat16", "float16"))  # the saved model's floating weights: auto = each weight's dtype in sft.init (float32 for the fresh tiny model), as rlforge export writes; warns where that rounds most of the training away
    loggers: list[str] = field(default_factory=lambda: ["mlflow"])  # mlflow (sqlite store in output_dir) | tensorboard | wandb (pip install wandb)
    run_name: Optional[str] = None  # the run's name in mlflow and wandb (verl's trainer.experiment_name); None = sft/<output_dir's folder name>
    log_every: int = 10  # steps between logged metrics
    progress: bool = True  # Lightning's progress bar
    save_every: int = 100  # steps between checkpoints in output_dir/checkpoints (the newest kept; 0 = none)
    resume: str = "never"  # never | auto (output_dir/checkpoints/last.ckpt if present) | path of a .ckpt
    resume_force: bool = False  # resume even if the config (other than the length of the run, logging, checkpoint and validation cadence, locations) or the training data changed since the checkpoint; warns, and the run goes on with the current values (docs/sft.md)
    val_every: int = 0  # steps between validation losses on sft.val_file; 0 = once, at the end
    val_accuracy: bool = True  # greedy accuracy on data.name's validation split at the end (needs its reward function)


@dataclass
class RLForgeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: Any = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


def build(registry: Any, algorithm_config: type) -> type:
    """The full schema: :class:`RLForgeConfig` with the ``algorithm`` section of ``algorithm_config`` and every
    registered component's section inserted where its kind puts it (``registry.config_sections()``), at any depth
    of the core sections (``rollout.vllm``, ``rollout.agent.calculator``)."""
    by_parent: dict[str, list[tuple[str, type, str]]] = {}
    for path, (cls, entry) in registry.config_sections().items():
        parent, _, leaf = path.rpartition(".")
        if not leaf.isidentifier():
            raise ConfigError(f"Component '{entry.name}' (plugin '{entry.plugin}') cannot own config section "
                              f"'{path}': '{leaf}' is not a valid key name.")
        if parent and parent not in _SECTIONS:
            raise ConfigError(f"Config section '{parent}' does not exist (components of plugin "
                              f"'{entry.plugin}' put their options there).")
        by_parent.setdefault(parent, []).append((leaf, cls, entry.plugin))
    algorithm = ("algorithm", algorithm_config, field(default_factory=algorithm_config))
    return _extend(RLForgeConfig, "", by_parent, [algorithm])


def _extend(base: type, path: str, by_parent: dict[str, list[tuple[str, type, str]]],
            extra: list[tuple[str, type, Any]] | None = None) -> type:
    """``base`` (the core section at ``path``) with the component sections placed under it, and its nested core
    sections extended the same way; ``base`` itself when nothing is added."""
    new = list(extra or [])
    for f in fields(base):
        sub = f"{path}.{f.name}" if path else f.name
        if sub in _SECTIONS and any(p == sub or p.startswith(sub + ".") for p in by_parent):
            section = _extend(_SECTIONS[sub], sub, by_parent)
            new.append((f.name, section, field(default_factory=section)))
    leaves = by_parent.get(path, [])
    owned = {f.name for f in fields(base)}
    clash = [(leaf, plugin) for leaf, _, plugin in leaves if leaf in owned]
    if clash:
        where = f"{path}.{clash[0][0]}" if path else clash[0][0]
        raise ConfigError(f"Plugin '{clash[0][1]}' declares config section '{where}', which is a core key. "
                          f"Rename the component.")
    new += [(leaf, cls, field(default_factory=cls)) for leaf, cls, _ in sorted(leaves, key=lambda x: x[0])]
    if not new:
        return base
    section = make_dataclass(base.__name__, new, bases=(base,))
    section.__doc__ = base.__doc__
    return section


def _core_sections(cls: type, path: str = "") -> dict[str, type]:
    """Every core section below ``cls``, by dotted path (``rollout``, ``rollout.agent``, ...)."""
    out: dict[str, type] = {}
    for name, t in get_type_hints(cls).items():
        if isinstance(t, type) and is_dataclass(t):
            sub = f"{path}.{name}" if path else name
            out[sub] = t
            out.update(_core_sections(t, sub))
    return out


_SECTIONS: dict[str, type] = _core_sections(RLForgeConfig)
