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
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any, Optional, get_type_hints

from rlforge.errors import ConfigError

BUILTIN_MODEL = "builtin:tiny-arith"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# a run or experiment folder name: one path component, never "." or ".." (it cannot leave trainer.runs_root)
RUN_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,127}"
RUN_NAME_WHAT = "a folder name of letters, digits and _ . + = @ , - (not starting with . or -), at most 128 characters"


@dataclass(frozen=True)
class Valid:
    """What a config value may be: the field metadata ``valid``, checked by ``rlforge.config.compose`` for every
    section (core, algorithm, components). Bounds: ``ge``/``le`` inclusive, ``gt``/``lt`` strict. ``choices``:
    the allowed strings; ``pattern``: a regular expression the whole string matches, ``what`` says it in words.
    ``None`` is always allowed where the type is Optional; floats must be finite (no NaN or inf) in any case.
    ``why`` is added to the error message."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str = ""
    what: str = ""
    why: str = ""  # appended to the error message

    def describe(self, integer: bool = False) -> str:
        """The rule in words: ``a positive integer``, ``> 0``, ``in (0, 1]``, ``one of a, b``."""
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
        if self.choices:
            return value in self.choices
        if self.pattern:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        return not ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                    or (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def option(default: Any, **valid: Any) -> Any:
    """A config field with its valid values: ``lr: float = option(5e-5, gt=0)  # the description``."""
    return field(default=default, metadata={"valid": Valid(**valid)})


@dataclass
class ModelConfig:
    path: str = BUILTIN_MODEL  # HF folder, or builtin:tiny-arith (the shipped SFT'd tiny model)
    ref_path: Optional[str] = None  # reference model for the KL term; None = same as `path`
    dtype: str = option("float32", choices=("float32", "bfloat16", "float16"))  # float32 | bfloat16 | float16
    trust_remote_code: bool = False  # never on unless you set it
    remove_padding: bool = False  # packed forward passes of actor, reference, critic: no padding computed (GPU; docs/performance.md)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, ~30% slower)
    compile: bool = False  # torch.compile the training and scoring forward passes (not generation; docs/performance.md)


@dataclass
class DataConfig:
    name: str = "arith"  # dataset registry name: arith (built-in, generated offline) | files
    train_files: list[str] = field(default_factory=list)  # jsonl/parquet files (data.name=files)
    val_files: list[str] = field(default_factory=list)  # held-out files for validation (optional)
    train_batch_size: int = option(32, ge=1)  # prompts per step (each sampled rollout.n times)
    max_prompt_length: int = option(64, ge=1)  # in tokens, after the chat template
    filter_overlong_prompts: bool = True  # drop longer prompts (False: fail naming the row)
    shuffle: bool = True  # reshuffle the prompts every epoch (seeded, resumable)


@dataclass
class RolloutConfig:
    name: str = "hf"  # rollout engine registry name
    n: int = option(8, ge=1)  # samples per prompt
    temperature: float = option(1.0, gt=0, why="training samples (greedy samples of a prompt would all be the same; greedy validation is rollout.val_temperature=0)")  # sampling temperature; log-probs are computed at this temperature
    top_p: float = option(1.0, gt=0, le=1)  # nucleus sampling (1.0 = off)
    top_k: int = option(0, ge=0)  # 0 = disabled
    max_new_tokens: int = option(8, ge=1)  # response length limit (EOS ends a response earlier)
    min_new_tokens: int = option(0, ge=0)  # EOS is suppressed before this many tokens (training rollouts only)
    micro_batch_size: int = option(256, ge=1)  # sequences per generate() call
    val_temperature: float = option(0.0, ge=0)  # 0 = greedy validation
    val_n: int = option(1, ge=1)  # samples per validation prompt


@dataclass
class RewardConfig:
    manager: str = "rule"  # reward manager registry name
    fn: Optional[str] = None  # reward function name; None = chosen by each row's data_source
    file: Optional[str] = None  # python file with compute_score(data_source, solution_str, ground_truth, extra_info)
    fn_name: str = option("compute_score", pattern=IDENTIFIER, what="a Python identifier")  # function to load from `file`
    num_workers: int = option(1, ge=1)  # worker processes that evaluate reward functions (a hung one is killed and replaced)
    timeout_s: float = option(10.0, gt=0)  # per-sample CPU-time limit of a reward function call (wall-clock backstop: 10x)
    fallback_score: float = 0.0  # score of a sample whose reward function raised, hung or returned a non-number


@dataclass
class AlgorithmConfig:
    """Base of every algorithm's section; each algorithm's ``config_class`` adds its own fields."""

    name: str = "grpo"  # algorithm registry name (set by --algo)


@dataclass
class ActorConfig:
    lr: float = option(5e-5, gt=0)  # AdamW learning rate of the actor
    weight_decay: float = option(0.0, ge=0)  # AdamW weight decay
    warmup_steps: int = option(0, ge=0)  # linear learning-rate warm-up, in training steps
    grad_clip: float = option(1.0, ge=0)  # max global gradient norm (0 = no clipping, norm still logged)
    ppo_epochs: int = option(1, ge=1)  # passes over each rollout batch
    ppo_mini_batch_size: int = option(8, ge=1)  # prompts per optimizer step (x rollout.n samples)
    ppo_micro_batch_size: Optional[int] = option(None, ge=1)  # samples per forward/backward (gradient accumulation); None = whole mini-batch
    max_tokens_per_micro_batch: int = option(0, ge=0)  # > 0: micro-batches by token budget (per rank) instead of ppo_micro_batch_size
    clip_ratio_low: float = option(0.2, ge=0, lt=1)  # ratio clipped below at 1 - clip_ratio_low
    clip_ratio_high: float = option(0.2, ge=0)  # ratio clipped above at 1 + clip_ratio_high (DAPO clip-higher: raise it)
    clip_ratio_c: float = option(3.0, gt=1)  # dual-clip bound, applied where the advantage is negative
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    reuse_rollout_log_probs: Optional[bool] = None  # old log-probs = the engine's: None = if they are the actor's (hf), True = always, False = recompute
    entropy_coeff: float = option(0.0, ge=0)  # entropy bonus weight (the loss subtracts coeff x entropy)
    use_kl_loss: bool = False  # add a KL(actor || reference) term to the loss (loads a reference model)
    kl_loss_coef: float = option(0.001, ge=0)  # weight of the KL loss
    kl_loss_type: str = "low_var_kl"  # k1 | k2 | k3 (= low_var_kl) | abs | mse | kl, or any of them with "+"


@dataclass
class CriticConfig:
    """The value model, used by algorithms with a critic (PPO)."""

    path: Optional[str] = None  # value model init; None = model.path's body with a fresh scalar head
    lr: float = option(1e-4, gt=0)  # AdamW learning rate of the critic
    weight_decay: float = option(0.0, ge=0)  # AdamW weight decay
    warmup_steps: int = option(0, ge=0)  # linear learning-rate warm-up, in training steps
    grad_clip: float = option(1.0, ge=0)  # max global gradient norm
    ppo_epochs: int = option(1, ge=1)  # passes over each rollout batch
    ppo_mini_batch_size: int = option(8, ge=1)  # prompts per optimizer step (x rollout.n samples)
    ppo_micro_batch_size: Optional[int] = option(None, ge=1)  # samples per forward/backward; None = whole mini-batch
    max_tokens_per_micro_batch: int = option(0, ge=0)  # > 0: micro-batches by token budget (per rank), as actor's
    cliprange_value: float = option(0.5, gt=0)  # values clipped to old +- cliprange_value in the loss
    loss_agg_mode: str = "token-mean"  # as actor.loss_agg_mode


@dataclass
class StrategyConfig:
    name: str = "single"  # strategy registry name: single (one device) | fsdp (FSDP2, one process per rank)
    device: str = option("auto", pattern=r"auto|[a-z]+(:\d+)?", what="auto, cpu, cuda or cuda:N")  # auto | cpu | cuda | cuda:N
    num_processes: int = option(1, ge=1)  # data-parallel ranks; > 1 needs strategy.name=fsdp and trainer.controller=ray
    checkpoint: str = option("full", choices=("full", "sharded"))  # full (gathered; any rank count resumes) | sharded (torch.distributed.checkpoint)
    offload_optimizer: bool = False  # optimizer state in CPU memory between updates (frees GPU memory for rollout)


@dataclass
class TrainerConfig:
    total_steps: int = option(200, ge=1)  # training steps (one rollout batch each)
    seed: int = option(1, ge=0, le=2**32 - 1)  # seeds torch, python and the data order
    controller: str = "local"  # controller registry name: local (in-process) | ray (Ray actors)
    critic_warmup: int = option(0, ge=0)  # first steps in which only the critic is trained (the actor waits)
    project: str = option("rlforge", pattern=r"\S.*", what="a non-empty name")  # mlflow experiment name
    experiment: str = option("default", pattern=RUN_NAME, what=RUN_NAME_WHAT)  # run folders go to <runs_root>/<experiment>/<timestamp>
    runs_root: str = option("rlforge_runs", pattern=r".+", what="a folder")  # root folder of all runs
    run_dir: Optional[str] = None  # explicit run folder; None = <runs_root>/<experiment>/<timestamp>
    resume: str = "never"  # never | auto (the newest run of the experiment, docs/reliability.md) | a checkpoint or run folder
    save_every: int = option(50, ge=0)  # steps; a final checkpoint is always written
    keep_last_n: int = option(2, ge=0)  # checkpoints kept (0 = keep all)
    val_every: int = option(50, ge=0)  # steps; 0 = only at the end (and before training if val_before_train)
    val_before_train: bool = True  # validate once before the first step
    max_nonfinite_steps: int = option(5, ge=1)  # stop after this many optimizer steps in a row with a NaN/Inf gradient
    resume_force: bool = False  # resume even if the config or the training data changed since the checkpoint (warns)
    samples_to_save: int = option(8, ge=0)  # generated samples written per step to samples.jsonl
    progress: bool = True  # live progress bar


@dataclass
class LoggerConfig:
    backends: list[str] = field(default_factory=lambda: ["console", "mlflow"])  # logger registry names


@dataclass
class PluginsConfig:
    disable: list[str] = field(default_factory=list)  # plugin names to block (see `rlforge plugins list`)


@dataclass
class SFTConfig:
    train_file: Optional[str] = None  # jsonl/parquet rows with `prompt` (chat messages) and `response`; None = data.name
    output_dir: str = "sft_out"  # where the fine-tuned model and tokenizer are saved
    steps: int = 400  # optimizer steps
    batch_size: int = 64  # examples per step
    lr: float = 1e-3  # peak learning rate (linear warm-up, cosine decay to 10%)
    warmup_steps: int = 20  # warm-up steps
    init: str = "tiny-arith"  # model to start from: an HF folder, or tiny-arith = fresh random tiny Llama
    seed: int = 0  # seeds initialisation and example order


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
    registered component's section inserted where its kind puts it (``registry.config_sections()``)."""
    by_parent: dict[str, list[tuple[str, type, str]]] = {}
    for path, (cls, entry) in registry.config_sections().items():
        parent, _, leaf = path.rpartition(".")
        if not leaf.isidentifier():
            raise ConfigError(f"Component '{entry.name}' (plugin '{entry.plugin}') cannot own config section "
                              f"'{path}': '{leaf}' is not a valid key name.")
        by_parent.setdefault(parent, []).append((leaf, cls, entry.plugin))
    root_fields = {f.name for f in fields(RLForgeConfig)}
    extra_root = [("algorithm", algorithm_config, field(default_factory=algorithm_config))]
    for parent, leaves in sorted(by_parent.items()):
        if parent and parent not in root_fields:
            raise ConfigError(f"Config section '{parent}' does not exist (components of plugin "
                              f"'{leaves[0][2]}' put their options there).")
        base = _SECTIONS.get(parent)
        owned = {f.name for f in fields(base)} if base else set(root_fields)
        clash = [leaf for leaf, _, _ in leaves if leaf in owned]
        if clash:
            where = f"{parent}.{clash[0]}" if parent else clash[0]
            raise ConfigError(f"Plugin '{dict((l, p) for l, _, p in leaves)[clash[0]]}' declares config section "
                              f"'{where}', which is a core key. Rename the component.")
        new = [(leaf, cls, field(default_factory=cls)) for leaf, cls, _ in sorted(leaves, key=lambda x: x[0])]
        if not parent:
            extra_root += new
            continue
        assert base is not None
        section = make_dataclass(base.__name__, new, bases=(base,))
        section.__doc__ = base.__doc__
        extra_root.append((parent, section, field(default_factory=section)))
    return make_dataclass("RLForgeConfig", extra_root, bases=(RLForgeConfig,))


_SECTIONS: dict[str, type] = {
    name: t for name, t in get_type_hints(RLForgeConfig).items() if isinstance(t, type) and is_dataclass(t)
}
