"""verl's SFT trainer configs (0.9.1's ``verl.trainer.sft_trainer`` and v0.7's ``verl.trainer.fsdp_sft_trainer``) in
rlforge's ``sft`` section (docs/sft.md), with the same three fates as the PPO tables (``verl_rules``)."""

from __future__ import annotations

from typing import Any

from rlforge.config.verl_rules import Derived, Ignore, Keep, Map, Rule, Table, at_most_one, is_, non_negative, off

SPEED = "speed or memory only: what is computed does not change"
SCHEDULE = ("rlforge's SFT schedule is a linear warm-up then a cosine decay to 10% of sft.lr; other schedules are "
            "learning-rate schedules it does not have")
RULES: dict[str, Rule] = {
    "*._target_": Ignore("verl's structured-config class path"),
    "data.train_files": Derived("sft_files"), "data.val_files": Derived("sft_files"),
    "data.prompt_key": Derived("sft_columns"), "data.prompt_dict_keys": Derived("sft_columns"),
    "data.response_key": Derived("sft_columns"), "data.response_dict_keys": Derived("sft_columns"),
    "data.multiturn.enable": Derived("sft_columns"),
    "data.messages_key": Map("sft.messages_key"), "data.multiturn.messages_key": Map("sft.messages_key"),
    "data.tools_key": Map("sft.tools_key"), "data.multiturn.tools_key": Map("sft.tools_key"),
    "data.*enable_thinking*": Ignore("verl's enable_thinking column is not read (docs/sft.md)"),
    "data.max_length": Map("sft.max_length"),
    "data.truncation": Keep(is_("error", "left", "right"), "sft.truncation", "middle truncation"),
    "data.train_batch_size": Map("sft.batch_size"),
    "data.micro_batch_size_per_gpu": Map("sft.micro_batch_size"),
    "data.micro_batch_size": Ignore("deprecated in verl: micro_batch_size_per_gpu is read"),
    "data.use_dynamic_bsz": Ignore("token-budget micro-batches; rlforge's SFT splits by sft.micro_batch_size "
                                   "(gradient accumulation)"),
    "data.max_token_len_per_gpu": Ignore("read only with token-budget micro-batches (see data.use_dynamic_bsz)"),
    "data.train_max_samples": Keep(lambda v: v is None or v < 0, "every row", "using only the first N rows"),
    "data.val_max_samples": Keep(lambda v: v is None or v < 0, "every row", "using only the first N rows"),
    "data.custom_cls.*": Keep(off, "rlforge's SFT rows", "a dataset class by path"),
    "data.apply_chat_template_kwargs": Keep(off, "the chat template's defaults", "chat-template keyword arguments", 32),
    "data.chat_template": Keep(off, "the tokenizer's chat template", "custom chat templates", 32),
    "data.*": Ignore(f"how verl's dataset pads, balances and loads rows ({SPEED})"),
    "model.path": Map("sft.init"), "model.partial_pretrain": Map("sft.init"),
    "model.trust_remote_code": Map("model.trust_remote_code"),
    "model.enable_gradient_checkpointing": Ignore(f"activation recomputation ({SPEED})"),
    "model.lora_rank": Keep(is_(0), "full fine-tuning", "LoRA in rlforge's SFT"),
    "model.lora.rank": Keep(is_(0), "full fine-tuning", "LoRA in rlforge's SFT"),
    "model.custom_chat_template": Keep(off, "the tokenizer's chat template", "custom chat templates", 32),
    "model.override_config": Keep(off, "the model's config.json", "overriding config.json fields"),
    "model.mtp.enable": Keep(off, "no multi-token prediction", "multi-token prediction (MTP) heads"),
    "model.strategy": Ignore("the Lightning strategy is sft.strategy"),
    "model.fsdp_config.*": Ignore(SPEED), "model.*": Ignore(f"read only by verl's model engine ({SPEED})"),
    "engine.ulysses_sequence_parallel_size": Keep(at_most_one, "no sequence parallelism", "Ulysses sequence parallelism",
                                                  28),
    "ulysses_sequence_parallel_size": Keep(at_most_one, "no sequence parallelism", "Ulysses sequence parallelism", 28),
    "use_remove_padding": Ignore(SPEED),
    "engine.*": Ignore(f"FSDP engine options ({SPEED})"),
    "optim.lr": Map("sft.lr"), "optim.weight_decay": Map("sft.weight_decay"), "optim.clip_grad": Map("sft.grad_clip"),
    "optim.betas": Keep(lambda v: list(v or []) == [0.9, 0.999], "AdamW's betas (0.9, 0.999)",
                        "AdamW betas other than (0.9, 0.999)"),
    "optim.optimizer": Keep(is_("AdamW", "adamw"), "AdamW", "optimizers other than AdamW"),
    "optim.lr_scheduler_type": Keep(is_("cosine"), "a cosine decay", SCHEDULE, 32),
    "optim.lr_scheduler": Keep(is_("cosine"), "a cosine decay", SCHEDULE, 32),
    "optim.min_lr_ratio": Keep(is_(0.1), "a decay to 10% of the peak", SCHEDULE, 32),
    "optim.lr_warmup_steps_ratio": Derived("sft_warmup"), "optim.lr_warmup_steps": Derived("sft_warmup"),
    "optim.*": Ignore("read only by other optimizers or schedules"),
    "trainer.total_training_steps": Derived("sft_steps"), "trainer.total_epochs": Derived("sft_steps"),
    "trainer.save_freq": Map("sft.save_every", non_negative), "trainer.test_freq": Map("sft.val_every", non_negative),
    "trainer.resume_mode": Derived("sft_resume"), "trainer.resume_from_path": Derived("sft_resume"),
    "trainer.default_local_dir": Map("sft.output_dir"), "trainer.seed": Map("sft.seed"),
    "trainer.logger": Derived("sft_loggers"),
    "trainer.n_gpus_per_node": Map("sft.devices"), "trainer.nnodes": Map("sft.num_nodes"),
    "trainer.device": Keep(is_("cuda", "cpu"), "sft.accelerator", "devices other than cuda and cpu"),
    "trainer.default_hdfs_dir": Keep(off, "local checkpoints", "copying checkpoints to HDFS"),
    "trainer.*": Ignore("names, checkpoint counts and profiling of verl's SFT trainer"),
    "checkpoint.*": Ignore("checkpoints hold the whole Lightning state"),
    "profiler.*": Ignore("profiling is not configured through the config"),
}
TABLE = Table(RULES)
SFT_LOGGERS = {"mlflow": "mlflow", "tensorboard": "tensorboard"}


def sft_files(c: Any) -> None:
    for key, target in (("data.train_files", "sft.train_file"), ("data.val_files", "sft.val_file")):
        from rlforge.config.verl_rules import file_list

        files = file_list(c.get(key))
        if len(files) > 1:
            c.refuse(key, f"several SFT files ({len(files)}; {target} takes one)")
        else:
            c.map(key, target, files[0] if files else None)


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
    steps, ratio = c.get("optim.lr_warmup_steps"), c.get("optim.lr_warmup_steps_ratio") or 0.0
    if steps is not None and steps > 0:
        c.map("optim.lr_warmup_steps", "sft.warmup_steps", steps)
        c.ignore("optim.lr_warmup_steps_ratio", "not read: lr_warmup_steps is set")
    else:
        c.ignore("optim.lr_warmup_steps", "<= 0: verl uses lr_warmup_steps_ratio")
        c.later("optim.lr_warmup_steps_ratio", "sft.warmup_steps", lambda total, r=float(ratio): int(r * total),
                "lr_warmup_steps_ratio x the run's steps")


def sft_steps(c: Any) -> None:
    total = c.get("trainer.total_training_steps")
    if total is not None:
        c.map("trainer.total_training_steps", "sft.steps", total)
        c.ignore("trainer.total_epochs", "not read: trainer.total_training_steps is set")
        c.total_steps = int(total)
        return
    c.ignore("trainer.total_training_steps", "null: verl counts total_epochs")
    c.epochs("trainer.total_epochs", int(c.get("trainer.total_epochs")), target="sft.steps")


def sft_resume(c: Any) -> None:
    mode, path = c.get("trainer.resume_mode"), c.get("trainer.resume_from_path")
    if mode == "resume_path" and path:
        c.same("trainer.resume_mode", "resume from trainer.resume_from_path")
        c.map("trainer.resume_from_path", "sft.resume", path)
        return
    if mode in ("auto", "disable"):
        c.map("trainer.resume_mode", "sft.resume", "auto" if mode == "auto" else "never")
    else:
        c.refuse("trainer.resume_mode", f"resume_mode={mode}")
    c.ignore("trainer.resume_from_path", "read only with resume_mode=resume_path")


def sft_loggers(c: Any) -> None:
    value = c.get("trainer.logger")
    names = [value] if isinstance(value, str) else list(value or [])
    unknown = [n for n in names if n not in SFT_LOGGERS and n != "console"]
    if unknown:
        c.refuse("trainer.logger", f"the {', '.join(unknown)} logger in rlforge's SFT (sft.loggers: mlflow, "
                 "tensorboard)", 32 if {"swanlab", "trackio"} & set(unknown) else None)
    else:
        c.map("trainer.logger", "sft.loggers", [SFT_LOGGERS[n] for n in names if n in SFT_LOGGERS],
              "console: Lightning's progress bar (sft.progress)")


DERIVED = {"sft_files": sft_files, "sft_columns": sft_columns, "sft_warmup": sft_warmup, "sft_steps": sft_steps,
           "sft_resume": sft_resume, "sft_loggers": sft_loggers}
ORDER = ("sft_files", "sft_columns", "sft_steps", "sft_warmup", "sft_resume", "sft_loggers")
