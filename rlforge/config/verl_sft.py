"""verl's SFT trainer configs (0.9.1's ``verl.trainer.sft_trainer`` and v0.7's ``verl.trainer.fsdp_sft_trainer``) in
rlforge's ``sft`` section (docs/sft.md), with the same three fates as the PPO tables (``verl_rules``)."""

from __future__ import annotations

from typing import Any

from rlforge.config import verl_training as T
from rlforge.config.verl_derived import chat_template
from rlforge.config.verl_rules import (
    HYDRA_CHDIR, HYDRA_ENV, HYDRA_OWN, RESUME_PATH, Derived, Ignore, Keep, Map, Rule, Table, float_list, is_, off,
    integral, project_name, str_list, Unread,
)
from rlforge.lr_schedule import LR_SCHEDULERS

SPEED = "speed or memory only: what is computed does not change"
TORCHRUN = ("not read by verl 0.9.1's SFT entry, which takes its devices from torchrun (--nproc_per_node, --nnodes; not "
            "in the launch's overrides): set sft.devices and sft.num_nodes")
RULES: dict[str, Rule] = {
    "*._target_": Ignore("verl's structured-config class path"),
    "hydra.job.env_set.*": HYDRA_ENV, "hydra.job.chdir": HYDRA_CHDIR, "hydra.*": HYDRA_OWN,
    "data.train_files": Derived("sft_files"), "data.val_files": Derived("sft_files"),
    "data.prompt_key": Derived("sft_columns"), "data.prompt_dict_keys": Derived("sft_columns"),
    "data.response_key": Derived("sft_columns"), "data.response_dict_keys": Derived("sft_columns"),
    "data.multiturn.enable": Derived("sft_columns"),
    "data.messages_key": Map("sft.messages_key"), "data.multiturn.messages_key": Derived("sft_multiturn_keys"),
    "data.tools_key": Map("sft.tools_key"), "data.multiturn.tools_key": Derived("sft_multiturn_keys"),
    "data.enable_thinking_key": Derived("sft_thinking"), "data.enable_thinking_default": Derived("sft_thinking"),
    "data.multiturn.enable_thinking_key": Derived("sft_thinking"),
    "data.max_length": Map("sft.max_length"),
    "data.truncation": Keep(is_("error", "left", "right"), "sft.truncation", "middle truncation"),
    "data.train_batch_size": Map("sft.batch_size"),
    "data.micro_batch_size_per_gpu": Map("sft.micro_batch_size"),
    "data.micro_batch_size": Unread("deprecated in verl: micro_batch_size_per_gpu is read"),
    "data.use_dynamic_bsz": Ignore("token-budget micro-batches; rlforge's SFT splits by sft.micro_batch_size "
                                   "(gradient accumulation)"),
    "data.max_token_len_per_gpu": Ignore("read only with token-budget micro-batches (see data.use_dynamic_bsz)"),
    "data.train_max_samples": Keep(lambda v: v is None or v < 0, "every row", "using only the first N rows"),
    "data.val_max_samples": Keep(lambda v: v is None or v < 0, "every row", "using only the first N rows"),
    "data.custom_cls.*": Keep(off, "rlforge's SFT rows", "a dataset class by path"),
    "data.apply_chat_template_kwargs": Derived("chat_template"),
    "data.apply_chat_template_kwargs.*": Derived("chat_template"),
    "data.chat_template": Derived("sft_chat_template"),
    "data.ignore_input_ids_mismatch": Keep(off, "no row trained as verl's per-message concatenation (where verl's check "
                                           "fails and it stops, rlforge trains each assistant turn against its own "
                                           "history: docs/sft.md)", "training the per-message concatenation where it differs "
                                           "from the conversation's rendering (docs/sft.md: rlforge trains each "
                                           "assistant turn against its own history instead)"),
    "data.*": Ignore(f"how verl's dataset pads, balances and loads rows ({SPEED})"),
    "model.path": Map("sft.init"), "model.partial_pretrain": Map("sft.init"),
    "model.trust_remote_code": Map("model.trust_remote_code"),
    "model.enable_gradient_checkpointing": Ignore(f"activation recomputation ({SPEED})"),
    "model.lora_rank": Map("model.lora.rank"), "model.lora_alpha": Map("model.lora.alpha"),
    "model.target_modules": Map("model.lora.target_modules", str_list),
    "model.exclude_modules": Map("model.lora.exclude_modules"),
    "model.lora_adapter_path": Keep(off, "a fresh adapter", "starting LoRA from a saved adapter"),
    "model.lora.*": Ignore("verl's megatron engine's LoRA settings: its FSDP engine, the one rlforge's SFT translates, "
                           "reads model.lora_rank (rlforge's model.lora.rank)"),
    "model.custom_chat_template": Map("model.chat_template"),
    "model.override_config": Keep(off, "the model's config.json", "overriding config.json fields"),
    "model.mtp.enable": Keep(off, "no multi-token prediction", "multi-token prediction (MTP) heads"),
    "model.strategy": Ignore("the Lightning strategy is sft.strategy"),
    "model.fsdp_config.*": Ignore(SPEED), "model.*": Ignore(f"read only by verl's model engine ({SPEED})"),
    "engine.ulysses_sequence_parallel_size": Map("sft.sequence_parallel_size"),
    "ulysses_sequence_parallel_size": Map("sft.sequence_parallel_size"),
    "use_remove_padding": Ignore(SPEED),
    "engine.*": Ignore(f"FSDP engine options ({SPEED})"),
    "optim.lr": Map("sft.lr"), "optim.weight_decay": Map("sft.weight_decay"), "optim.clip_grad": Map("sft.grad_clip"),
    "optim.betas": Map("sft.betas", float_list),
    "optim.optimizer": Keep(is_("AdamW", "adamw"), "AdamW", "optimizers other than AdamW"),
    **{f"optim.{k}": Derived("sft_schedule") for k in (
        "lr_scheduler", "lr_scheduler_type", "warmup_style", "min_lr_ratio", "num_cycles", "zero_indexed_step")},
    "optim.lr_warmup_steps_ratio": Derived("sft_warmup"), "optim.lr_warmup_steps": Derived("sft_warmup"),
    "optim.total_training_steps": Unread("verl's SFT trainer overwrites it with the run's step count"),
    "optim.*": Ignore("read only by other optimizers or schedules"),
    "trainer.total_training_steps": Derived("sft_steps"), "trainer.total_epochs": Derived("sft_steps"),
    "trainer.save_freq": Derived("sft_freq"), "trainer.test_freq": Derived("sft_freq"),
    "trainer.project_name": Derived("sft_loggers"),
    "trainer.experiment_name": Map("sft.run_name"),  # verl: the run's name in wandb and mlflow (utils/tracking.py)
    "trainer.resume_mode": Derived("sft_resume"), "trainer.resume_from_path": Derived("sft_resume"),
    "trainer.default_local_dir": Map("sft.output_dir"), "trainer.seed": Map("sft.seed"),
    "trainer.logger": Derived("sft_loggers"),
    # verl 0.9.1's SFT entry (sft_trainer.py) takes its ranks from torchrun's --nproc_per_node/--nnodes, which the
    # launch's overrides do not carry; only its Ray entry (sft_trainer_ray.py) reads these
    "trainer.n_gpus_per_node": Unread(TORCHRUN), "trainer.nnodes": Unread(TORCHRUN),
    "trainer.device": Keep(is_("cuda", "cpu"), "sft.accelerator", "devices other than cuda and cpu"),
    "trainer.default_hdfs_dir": Keep(off, "local checkpoints", "copying checkpoints to HDFS"),
    "trainer.*": Ignore("names, checkpoint counts and profiling of verl's SFT trainer"),
    "checkpoint.*": Ignore("checkpoints hold the whole Lightning state"),
    "profiler.*": Ignore("profiling is not configured through the config"),
}
TABLE = Table(RULES)
SFT_LOGGERS = {"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}


def sft_files(c: Any) -> None:
    # verl's SFT measures a validation loss only: no greedy accuracy (rlforge's is on data.name's task, the built-in
    # arithmetic one here, which says nothing about the launch's data)
    c.set("sft.val_accuracy", False)
    for key, target in (("data.train_files", "sft.train_file"), ("data.val_files", "sft.val_file")):
        from rlforge.config.verl_rules import file_list

        files = file_list(c.get(key))
        if len(files) > 1:
            c.refuse(key, f"several SFT files ({len(files)}; {target} takes one)")
        else:
            c.map(key, target, files[0] if files else None)


def sft_multiturn_keys(c: Any) -> None:
    """``data.multiturn.messages_key``/``tools_key``: v0.7's fsdp_sft_trainer gives its multi-turn dataset the data
    section, which reads ``data.messages_key``/``tools_key`` (default messages, tools): the multiturn ones are
    unread."""
    for key in c.owned:
        leaf = key.rsplit(".", 1)[1]
        if c.trainer == "fsdp_sft":
            c.unread(key, f"not read by verl's v0.7 multi-turn dataset (it reads data.{leaf}, default "
                          f"{leaf.removesuffix('_key')})")
        else:
            c.map(key, f"sft.{leaf}", c.get(key))


def sft_chat_template(c: Any) -> None:
    """``data.chat_template``: v0.7's fsdp_sft_trainer stops on any value; 0.9.1's SFT trainer never reads it."""
    key = "data.chat_template"
    pointer = "a template of your own is model.custom_chat_template, rlforge's model.chat_template"
    if c.get(key) is None:
        c.same(key, "the model's chat template")
    elif c.trainer == "fsdp_sft":
        c.refuse(key, f"data.chat_template (verl's fsdp_sft_trainer stops on it too: 'Apply Chat template from "
                      f"config is not supported yet'; {pointer})")
    else:
        c.unread(key, f"not read by verl 0.9.1's SFT trainer; {pointer}")


def sft_thinking(c: Any) -> None:
    """verl's multi-turn SFT dataset: a row's enable_thinking column, else the default, over the template's kwargs;
    its single-turn SFTDataset (v0.7, data.multiturn.enable=false) reads no such column."""
    if c.has("data.multiturn.enable") and not c.get("data.multiturn.enable"):
        c.set("sft.enable_thinking_key", "")
        for key in c.owned:
            c.unread(key, "read only by verl's multi-turn SFT dataset (data.multiturn.enable=false: its single-turn "
                          "SFTDataset renders every row without it)")
        return
    if c.trainer == "fsdp_sft":  # v0.7's MultiTurnSFTDataset gets the data section: data.enable_thinking_key
        c.unread("data.multiturn.enable_thinking_key", "not read by verl's v0.7 multi-turn dataset (it reads "
                 "data.enable_thinking_key, default enable_thinking)")
        c.set("sft.enable_thinking_key", c.get("data.enable_thinking_key", "enable_thinking"))
    if c.has("data.enable_thinking_key"):
        c.map("data.enable_thinking_key", "sft.enable_thinking_key", c.get("data.enable_thinking_key") or "")
    if not c.has("data.enable_thinking_default"):
        return
    default = c.get("data.enable_thinking_default")
    if isinstance(default, str) and default.lower() in ("none", "null", ""):
        c.map("data.enable_thinking_default", "sft.enable_thinking_default", None,
              f"verl 0.9.1 passes its '{default}' on as a string, so that rows without the column render with "
              f"enable_thinking=True (bool('{default}')), over data.apply_chat_template_kwargs; rlforge reads it as "
              f"unset: the kwargs decide")
    elif isinstance(default, str):
        c.refuse("data.enable_thinking_default", f"a string enable_thinking_default ({default!r}: verl renders such "
                 f"rows with bool({default!r}) = True; give true or false)")
    else:
        c.map("data.enable_thinking_default", "sft.enable_thinking_default", None if default is None else bool(default))


def sft_columns(c: Any) -> None:
    """verl's prompt_key + prompt_dict_keys is rlforge's dotted path; multiturn.enable is sft.format=messages."""
    multi = c.get("data.multiturn.enable")
    if c.has("data.multiturn.enable"):
        c.map("data.multiturn.enable", "sft.format", "messages" if multi else "prompt_response")
    elif not c.has("data.prompt_key"):
        c.set("sft.format", "messages")  # 0.9.1's SFT trainer reads conversations only
    for side in ("prompt", "response"):
        key, sub = c.get(f"data.{side}_key"), c.get(f"data.{side}_dict_keys")
        if not c.has(f"data.{side}_key"):
            continue
        if sub and len(sub) > 1:
            c.refuse(f"data.{side}_dict_keys", f"several nested {side} fields ({sub})")
        path = f"{key}.{sub[0]}" if sub else key
        c.map(f"data.{side}_key", f"sft.{side}_key", path)
        c.same(f"data.{side}_dict_keys", f"the dotted path sft.{side}_key={path}")


def sft_warmup(c: Any) -> None:
    """lr_warmup_steps when > 0, else lr_warmup_steps_ratio x the run's steps (v0.7's trainer reads only the ratio)."""
    steps, ratio = c.get("optim.lr_warmup_steps"), float(c.get("optim.lr_warmup_steps_ratio") or 0.0)
    if c.has("optim.lr_scheduler"):
        c.unread("optim.lr_warmup_steps", "not read by verl v0.7's SFT trainer (it reads lr_warmup_steps_ratio)")
        c.set("sft.warmup_steps", 0)
    elif steps is not None and steps > 0:
        c.map("optim.lr_warmup_steps", "sft.warmup_steps", steps)
        c.unread("optim.lr_warmup_steps_ratio", "not read: lr_warmup_steps is set")
        return
    else:
        c.map("optim.lr_warmup_steps", "sft.warmup_steps", 0, "<= 0: the ratio applies")
    c.map("optim.lr_warmup_steps_ratio", "sft.warmup_ratio", ratio)


def sft_schedule(c: Any) -> None:
    """The schedule of verl's SFT trainers: v0.7's ``optim.lr_scheduler`` (cosine to 0, or wsd), or the 0.9.1
    engine's (FSDP: lr_scheduler_type constant or cosine, as in RL)."""
    if not c.has("optim.lr_scheduler"):
        T.fsdp_schedule(c, "optim", "sft")
        return
    kind = c.get("optim.lr_scheduler")
    if kind == "cosine":
        c.map("optim.lr_scheduler", "sft.lr_scheduler", "cosine", "verl v0.7's cosine decays to 0")
        c.set("sft.min_lr_ratio", 0.0)
        c.set("sft.num_cycles", 0.5)
    else:
        c.refuse("optim.lr_scheduler", f"the '{kind}' schedule in rlforge's SFT (sft.lr_scheduler: "
                 f"{', '.join(LR_SCHEDULERS)})")
    for key in ("optim.lr_scheduler_type", "optim.warmup_style", "optim.min_lr_ratio", "optim.num_cycles",
                "optim.zero_indexed_step"):
        c.unread(key, "not read by verl v0.7's SFT trainer (optim.lr_scheduler picks its schedule)")


def sft_steps(c: Any) -> None:
    total, epochs = c.get("trainer.total_training_steps"), c.get("trainer.total_epochs")
    if not isinstance(epochs, int) or isinstance(epochs, bool):  # its epoch loop: range(start_epoch, total_epochs)
        c.stop("trainer.total_epochs", "verl's SFT trainer loops over range(total_epochs) and stops on a value that is "
                                       "not a whole number")
    if total is not None:
        c.map("trainer.total_training_steps", "sft.steps", integral(total))
        c.map("trainer.total_epochs", "sft.epoch_limit", epochs, "verl's SFT loop also ends after total_epochs passes "
              "over the data, its schedule still spanning total_training_steps")
        return
    c.unread("trainer.total_training_steps", "null: verl counts total_epochs")
    c.map("trainer.total_epochs", "sft.epochs", epochs)


def sft_freq(c: Any) -> None:
    """``save_freq`` / ``test_freq``: steps, or ``after_each_epoch``; verl's SFT loop takes the step modulo each one, so
    0 and null stop it; a negative one saves and validates at the last step only."""
    for key, target in (("trainer.save_freq", "sft.save_every"), ("trainer.test_freq", "sft.val_every")):
        value = c.get(key)
        if value == "after_each_epoch":
            c.refuse(key, f"saving or validating after each epoch ({key}=after_each_epoch; rlforge's {target} counts "
                          f"steps: give the steps per epoch)")
        elif value is None or isinstance(value, (str, bool)) or value == 0:
            c.stop(key, f"verl's SFT trainer takes the step modulo it (global_step % {key.split('.')[1]}) and stops "
                        f"on 0 or a value that is not a number")
        elif not float(value).is_integer():
            c.refuse(key, f"a fractional step interval ({key}={value})")
        else:
            c.map(key, target, max(0, int(value)))


def sft_resume(c: Any) -> None:
    mode, path = c.get("trainer.resume_mode"), c.get("trainer.resume_from_path")
    if mode in ("resume_path", "auto") and path:  # verl's SFT checkpoint handler reads the path under auto too
        c.same("trainer.resume_mode", "resume from trainer.resume_from_path" + (
            " (verl's SFT trainer reads it under resume_mode=auto too)" if mode == "auto" else ""))
        c.map("trainer.resume_from_path", "sft.resume", path, RESUME_PATH)
        return
    if mode in ("auto", "disable"):
        c.map("trainer.resume_mode", "sft.resume", "auto" if mode == "auto" else "never")
    else:
        c.stop("trainer.resume_mode", f"resume_mode={mode}" + (" without resume_from_path" if mode == "resume_path"
                                                                 else "") + ": verl 0.9.1 stops on it too")
    c.unread("trainer.resume_from_path", "read only with resume_mode=resume_path or auto")


def sft_loggers(c: Any) -> None:
    """``trainer.logger``: rlforge SFT's loggers (``sft.loggers``); ``trainer.project_name``: ``trainer.project``, the
    mlflow experiment (null or empty: rlforge's default name, said so)."""
    project_name(c, "the mlflow experiment of rlforge's SFT")
    value = c.get("trainer.logger")
    names = [value] if isinstance(value, str) else list(value or [])
    unknown = [n for n in names if n not in SFT_LOGGERS and n != "console"]
    if unknown:
        c.refuse("trainer.logger", f"the {', '.join(unknown)} logger in rlforge's SFT (sft.loggers: "
                 f"{', '.join(SFT_LOGGERS)})", 32 if {"swanlab", "trackio"} & set(unknown) else None)
    else:
        c.map("trainer.logger", "sft.loggers", [SFT_LOGGERS[n] for n in names if n in SFT_LOGGERS],
              "console: Lightning's progress bar (sft.progress)")


DERIVED = {"sft_files": sft_files, "sft_columns": sft_columns, "sft_warmup": sft_warmup, "sft_schedule": sft_schedule,
           "sft_steps": sft_steps, "sft_resume": sft_resume, "sft_loggers": sft_loggers, "chat_template": chat_template,
           "sft_thinking": sft_thinking, "sft_chat_template": sft_chat_template,
           "sft_multiturn_keys": sft_multiturn_keys, "sft_freq": sft_freq}
ORDER = ("sft_files", "sft_columns", "sft_steps", "sft_warmup", "sft_schedule", "sft_resume", "sft_loggers",
         "chat_template", "sft_thinking", "sft_chat_template", "sft_multiturn_keys", "sft_freq")
