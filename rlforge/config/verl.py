"""verl's config keys in rlforge's terms: the table behind ``rlforge config from-verl`` and behind the hint a
verl-style key gets on the command line (``data.max_response_length=...`` -> ``rollout.max_new_tokens``).

Each verl key (dotted, as in verl's ``ppo_trainer.yaml``) either maps to an rlforge key (possibly with a
value conversion), is ignored with a reason (it has no effect here: infrastructure that rlforge handles by
itself), or cannot be mapped (a feature rlforge does not have); the translation reports every key in one of
these three groups. docs/migration-from-verl.md has the same table for readers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

Convert = Callable[[Any], Any]

DOC = "docs/migration-from-verl.md"
ARO = "actor_rollout_ref"


def _same(value: Any) -> Any:
    return value


def _non_negative(value: Any) -> Any:
    """verl's -1 / None for "off" or "every" -> rlforge's 0."""
    return 0 if value is None or value < 0 else value


def _top_k(value: Any) -> Any:
    return 0 if value is None or value <= 0 else value


def _backends(value: Any) -> Any:
    known = {"console", "mlflow", "tensorboard", "wandb"}
    return [b for b in (value if isinstance(value, (list, tuple)) else [value]) if b in known] or ["console"]


def _resume(value: Any) -> Any:
    return {"auto": "auto", "disable": "never"}.get(value, value)


# verl's adv_estimator -> rlforge's algorithm (the algorithm name carries its estimator)
ESTIMATORS = {
    "gae": "ppo", "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp",
    "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "remax": "remax", "opo": "opo", "gpg": "gpg",
}

# verl key -> (rlforge key, conversion)
MAPPED: dict[str, tuple[str, Convert]] = {
    "data.train_files": ("data.train_files", lambda v: [v] if isinstance(v, str) else list(v)),
    "data.val_files": ("data.val_files", lambda v: [v] if isinstance(v, str) else list(v)),
    "data.max_prompt_length": ("data.max_prompt_length", _same),
    "data.max_response_length": ("rollout.max_new_tokens", _same),
    "data.train_batch_size": ("data.train_batch_size", _same),
    "data.shuffle": ("data.shuffle", _same),
    "data.filter_overlong_prompts": ("data.filter_overlong_prompts", _same),
    f"{ARO}.model.path": ("model.path", _same),
    f"{ARO}.model.trust_remote_code": ("model.trust_remote_code", _same),
    f"{ARO}.model.enable_gradient_checkpointing": ("model.gradient_checkpointing", _same),
    f"{ARO}.model.use_remove_padding": ("model.remove_padding", _same),
    f"{ARO}.actor.optim.lr": ("actor.lr", _same),
    f"{ARO}.actor.optim.weight_decay": ("actor.weight_decay", _same),
    f"{ARO}.actor.optim.lr_warmup_steps": ("actor.warmup_steps", _non_negative),
    f"{ARO}.actor.optim.clip_grad": ("actor.grad_clip", _same),
    f"{ARO}.actor.grad_clip": ("actor.grad_clip", _same),
    f"{ARO}.actor.ppo_mini_batch_size": ("actor.ppo_mini_batch_size", _same),
    f"{ARO}.actor.ppo_micro_batch_size_per_gpu": ("actor.ppo_micro_batch_size", _same),
    f"{ARO}.actor.ppo_epochs": ("actor.ppo_epochs", _same),
    f"{ARO}.actor.clip_ratio_low": ("actor.clip_ratio_low", _same),
    f"{ARO}.actor.clip_ratio_high": ("actor.clip_ratio_high", _same),
    f"{ARO}.actor.clip_ratio_c": ("actor.clip_ratio_c", _same),
    f"{ARO}.actor.loss_agg_mode": ("actor.loss_agg_mode", _same),
    f"{ARO}.actor.entropy_coeff": ("actor.entropy_coeff", _same),
    f"{ARO}.actor.use_kl_loss": ("actor.use_kl_loss", _same),
    f"{ARO}.actor.kl_loss_coef": ("actor.kl_loss_coef", _same),
    f"{ARO}.actor.kl_loss_type": ("actor.kl_loss_type", _same),
    f"{ARO}.actor.ppo_max_token_len_per_gpu": ("actor.max_tokens_per_micro_batch", _same),  # with use_dynamic_bsz
    f"{ARO}.actor.fsdp_config.optimizer_offload": ("strategy.offload_optimizer", _same),
    f"{ARO}.rollout.name": ("rollout.name", _same),  # vllm, hf (sglang: no engine here, refused by name)
    f"{ARO}.rollout.n": ("rollout.n", _same),
    f"{ARO}.rollout.temperature": ("rollout.temperature", _same),
    f"{ARO}.rollout.top_p": ("rollout.top_p", _same),
    f"{ARO}.rollout.top_k": ("rollout.top_k", _top_k),
    f"{ARO}.rollout.dtype": ("rollout.vllm.dtype", _same),
    f"{ARO}.rollout.gpu_memory_utilization": ("rollout.vllm.gpu_memory_utilization", _same),
    f"{ARO}.rollout.enforce_eager": ("rollout.vllm.enforce_eager", _same),
    f"{ARO}.rollout.val_kwargs.temperature": ("rollout.val_temperature", _same),
    f"{ARO}.rollout.val_kwargs.n": ("rollout.val_n", _same),
    "critic.optim.lr": ("critic.lr", _same),
    "critic.optim.weight_decay": ("critic.weight_decay", _same),
    "critic.optim.lr_warmup_steps": ("critic.warmup_steps", _non_negative),
    "critic.optim.clip_grad": ("critic.grad_clip", _same),
    "critic.grad_clip": ("critic.grad_clip", _same),
    "critic.model.path": ("critic.path", _same),
    "critic.ppo_mini_batch_size": ("critic.ppo_mini_batch_size", _same),
    "critic.ppo_micro_batch_size_per_gpu": ("critic.ppo_micro_batch_size", _same),
    "critic.ppo_epochs": ("critic.ppo_epochs", _same),
    "critic.cliprange_value": ("critic.cliprange_value", _same),
    "critic.loss_agg_mode": ("critic.loss_agg_mode", _same),
    "critic.ppo_max_token_len_per_gpu": ("critic.max_tokens_per_micro_batch", _same),
    "algorithm.gamma": ("algorithm.gamma", _same),
    "algorithm.lam": ("algorithm.lam", _same),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.norm_adv_by_std", _same),
    "algorithm.use_kl_in_reward": ("algorithm.use_kl_in_reward", _same),
    "algorithm.kl_penalty": ("algorithm.kl_penalty", _same),
    "algorithm.kl_ctrl.type": ("algorithm.kl_ctrl", _same),
    "algorithm.kl_ctrl.kl_coef": ("algorithm.kl_coef", _same),
    "algorithm.kl_ctrl.horizon": ("algorithm.kl_horizon", _same),
    "algorithm.kl_ctrl.target_kl": ("algorithm.kl_target", _same),
    "algorithm.rollout_correction.rollout_is": ("algorithm.rollout_is", _same),
    "algorithm.rollout_correction.rollout_is_threshold": ("algorithm.rollout_is_threshold", str),
    "algorithm.rollout_correction.rollout_is_batch_normalize": ("algorithm.rollout_is_batch_normalize", _same),
    "algorithm.rollout_correction.rollout_rs": ("algorithm.rollout_rs", _same),
    "algorithm.rollout_correction.rollout_rs_threshold": ("algorithm.rollout_rs_threshold",
                                                          lambda v: None if v is None else str(v)),
    "algorithm.filter_groups.enable": ("algorithm.filter_groups", _same),  # DAPO recipe
    "algorithm.filter_groups.max_num_gen_batches": ("algorithm.max_gen_batches", _non_negative),
    "reward_model.overlong_buffer.len": ("algorithm.overlong_buffer", _same),  # DAPO recipe
    "reward_model.overlong_buffer.penalty_factor": ("algorithm.overlong_penalty", _same),
    "reward_model.enable": ("reward.manager", lambda v: "model" if v else "rule"),  # a learned reward model
    "reward_model.model.path": ("reward.model.path", _same),
    "reward_model.micro_batch_size_per_gpu": ("reward.model.batch_size", _same),
    "reward_model.model.trust_remote_code": ("reward.model.trust_remote_code", _same),
    "custom_reward_function.path": ("reward.file", _same),
    "custom_reward_function.name": ("reward.fn_name", _same),
    "trainer.total_training_steps": ("trainer.total_steps", _same),
    "trainer.project_name": ("trainer.project", _same),
    "trainer.experiment_name": ("trainer.experiment", _same),
    "trainer.logger": ("logger.backends", _backends),
    "trainer.save_freq": ("trainer.save_every", _non_negative),
    "trainer.test_freq": ("trainer.val_every", _non_negative),
    "trainer.val_before_train": ("trainer.val_before_train", _same),
    "trainer.default_local_dir": ("trainer.runs_root", _same),
    "trainer.critic_warmup": ("trainer.critic_warmup", _same),
    "trainer.resume_mode": ("trainer.resume", _resume),
    "trainer.resume_from_path": ("trainer.resume", _same),
    "trainer.max_actor_ckpt_to_keep": ("trainer.keep_last_n", _non_negative),
}

# keys with no effect in rlforge, by prefix (the first match wins): why they need no counterpart
IGNORED: dict[str, str] = {
    "hydra": "Hydra's own settings",
    "ray_kwargs": "Ray starts from the ray.* section",
    "global_profiler": "profiling is not configured through the config",
    "transfer_queue": "no transfer queue",
    f"{ARO}.hybrid_engine": "the hybrid engine is always on",
    f"{ARO}.nccl_timeout": "NCCL set-up is the fsdp strategy's",
    f"{ARO}.actor.strategy": "the strategy is strategy.name (one for all roles)",
    f"{ARO}.ref.": "the reference model follows the actor's settings (model.ref_path for another model)",
    f"{ARO}.actor.checkpoint": "checkpoints always hold model, optimizer and trainer state",
    f"{ARO}.actor.profiler": "profiling is not configured through the config",
    f"{ARO}.actor.use_dynamic_bsz": "micro-batches are cut by tokens when actor.max_tokens_per_micro_batch > 0",
    f"{ARO}.actor.rollout_n": "derived from rollout.n",
    f"{ARO}.actor.use_torch_compile": "model.compile (off by default; verl compiles only some kernels)",
    f"{ARO}.actor.fsdp_config.": "FSDP2 settings are chosen by the fsdp strategy",
    f"{ARO}.rollout.log_prob_": "old log-probs use the actor's micro-batches",
    f"{ARO}.rollout.mode": "rlforge's engines run in the trainer's workers",
    f"{ARO}.rollout.calculate_log_probs": "every engine reports its log-probs",
    f"{ARO}.rollout.prompt_length": "data.max_prompt_length",
    f"{ARO}.rollout.response_length": "data.max_response_length -> rollout.max_new_tokens",
    f"{ARO}.rollout.free_cache_engine": "the engine's memory is released between phases where it can be",
    f"{ARO}.rollout.load_format": "the engine starts from model.path and receives the actor's weights",
    f"{ARO}.rollout.do_sample": "sampling follows rollout.temperature (0 = greedy)",
    f"{ARO}.rollout.val_kwargs.do_sample": "validation sampling follows rollout.val_temperature (0 = greedy)",
    f"{ARO}.rollout.disable_log_stats": "engine statistics are not logged",
    f"{ARO}.rollout.trace": "tracing is not configured through the config",
    f"{ARO}.rollout.prometheus": "no Prometheus export",
    f"{ARO}.rollout.max_num_batched_tokens": "sized by the vllm engine from the run's lengths",
    f"{ARO}.rollout.max_num_seqs": "rollout.micro_batch_size",
    f"{ARO}.rollout.max_model_len": "data.max_prompt_length + rollout.max_new_tokens",
    f"{ARO}.rollout.enable_chunked_prefill": "chosen by the vllm engine",
    f"{ARO}.rollout.enable_prefix_caching": "chosen by the vllm engine",
    f"{ARO}.rollout.checkpoint_engine": "weights are synced in buckets by the engine (rollout.vllm.weight_bucket_mb)",
    f"{ARO}.rollout.agent.num_workers": "agent loops run concurrently in the driver",
    f"{ARO}.model.use_shm": "models load from disk or the Hugging Face cache",
    f"{ARO}.model.use_fused_kernels": "the log-prob kernels are chunked by rlforge itself",
    f"{ARO}.model.use_liger": "no Liger kernels",
    f"{ARO}.model.override_config": "edit the model's config.json",
    f"{ARO}.model.external_lib": "install and import it as an rlforge plugin",
    "critic.strategy": "the strategy is strategy.name",
    "critic.model.fsdp_config": "FSDP2 settings are chosen by the fsdp strategy",
    "critic.model.tokenizer_path": "the critic uses the policy's tokenizer",
    "critic.model.trust_remote_code": "model.trust_remote_code",
    "critic.model.external_lib": "install and import it as an rlforge plugin",
    "critic.model.enable_gradient_checkpointing": "model.gradient_checkpointing (one setting for all models)",
    "critic.model.use_remove_padding": "model.remove_padding (one setting for all models)",
    "critic.rollout_n": "derived from rollout.n",
    "critic.checkpoint": "checkpoints always hold the critic",
    "critic.forward_": "value passes use the critic's micro-batches",
    "critic.use_dynamic_bsz": "micro-batches are cut by tokens when critic.max_tokens_per_micro_batch > 0",
    "critic.shuffle": "mini-batches are taken in order, as verl's default",
    "critic.data_loader_seed": "trainer.seed",
    "critic.enable": "the algorithm decides (ppo has a critic)",
    "data.tokenizer": "the tokenizer of model.path",
    "data.use_shm": "data loads from disk",
    "data.prompt_key": "rows use the 'prompt' column",
    "data.reward_fn_key": "rows use the 'data_source' column",
    "data.return_": "internal to verl's dataset class",
    "data.dataloader_num_workers": "prompts are tokenized once at start-up",
    "data.val_batch_size": "validation runs in batches of rollout.micro_batch_size",
    "data.truncation": "overlong prompts are dropped (data.filter_overlong_prompts) or refused",
    "data.filter_overlong_prompts_workers": "filtering runs once at start-up",
    "data.validation_shuffle": "validation keeps the file's order",
    "data.apply_chat_template_kwargs": "the chat template is the tokenizer's",
    "algorithm.adv_estimator": "the algorithm (--algo) carries its estimator",
    "algorithm.rollout_correction.bypass_mode": "actor.reuse_rollout_log_probs",
    "trainer.balance_batch": "token-budget micro-batches are balanced over ranks",
    "reward_model.reward_manager": "the rule reward scores each sample (verl's naive manager); DAPO's overlong "
                                   "shaping is algorithm.overlong_buffer",
    "reward_model.model.input_tokenizer": "the reward model's own tokenizer (responses re-templated when it differs)",
    "trainer.default_hdfs_dir": "no HDFS upload",
    "trainer.del_local_ckpt_after_load": "trainer.keep_last_n",
    "trainer.ray_wait_register_center_timeout": "ray.placement_timeout_s",
    "trainer.use_legacy_worker_impl": "one worker implementation",
    "trainer.esi_redundant_time": "no ESI",
    "trainer.log_val_generations": "every validation answer goes to val_samples.jsonl",
    "trainer.rollout_data_dir": "samples.jsonl holds trainer.samples_to_save samples per step",
    "trainer.validation_data_dir": "val_samples.jsonl in the run folder",
    "trainer.device": "strategy.device (auto picks cuda when there is one)",
    "trainer.nnodes": "strategy.num_processes = nnodes x n_gpus_per_node (with trainer.controller=ray)",
    "trainer.n_gpus_per_node": "strategy.num_processes = nnodes x n_gpus_per_node (with trainer.controller=ray)",
    "trainer.max_critic_ckpt_to_keep": "trainer.keep_last_n",
}
IGNORED_LEAVES = ("_target_",)  # verl's structured-config class paths
# verl keys with no rlforge counterpart that users often set: what to do instead
NOT_MAPPED: dict[str, str] = {
    "trainer.total_epochs": "rlforge counts steps: set trainer.total_steps (epochs x rows / data.train_batch_size)",
    f"{ARO}.model.lora_rank": "LoRA is not available yet",
    f"{ARO}.rollout.tensor_model_parallel_size": "each rank's engine runs with tensor parallel size 1",
    f"{ARO}.actor.optim.lr_warmup_steps_ratio": "set actor.warmup_steps (ratio x total steps)",
    f"{ARO}.actor.ppo_micro_batch_size": "set actor.ppo_micro_batch_size per rank (verl's _per_gpu value)",
    f"{ARO}.actor.fsdp_config.param_offload": "parameters stay on the device; strategy.offload_optimizer moves the "
                                              "optimizer state",
}


@dataclass
class Translation:
    """The result of :func:`translate`: the rlforge overrides, and what became of every verl key."""

    algorithm: str = "grpo"
    overrides: dict[str, Any] = field(default_factory=dict)
    mapped: list[tuple[str, str, Any]] = field(default_factory=list)  # (verl key, rlforge key, value)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (verl key, why)
    unmapped: list[tuple[str, Any, str]] = field(default_factory=list)  # (verl key, value, what to do)

    def nested(self) -> dict[str, Any]:
        """The overrides as a nested mapping (a YAML config for ``--config``), with ``algorithm.name``."""
        out: dict[str, Any] = {"algorithm": {"name": self.algorithm}}
        for key, value in self.overrides.items():
            node = out
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out


def flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` -> ``("a.b", 1)``; an empty mapping is a leaf."""
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from flatten(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1], tree


def _ignored(key: str) -> str | None:
    if key.rsplit(".", 1)[-1] in IGNORED_LEAVES:
        return "verl's structured-config class path"
    for prefix, why in IGNORED.items():  # "a.b" covers a.b and a.b.*; "a.b_" and "a.b." are raw prefixes
        if key == prefix or key.startswith(prefix if prefix.endswith((".", "_")) else prefix + "."):
            return why
    return None


def translate(verl: dict[str, Any]) -> Translation:
    """Translate a verl PPO/GRPO config (nested, as loaded from its YAML) into rlforge overrides."""
    flat = dict(flatten(verl))
    out = Translation()
    estimator = flat.get("algorithm.adv_estimator")
    if estimator is not None:
        if estimator not in ESTIMATORS:
            out.unmapped.append(("algorithm.adv_estimator", estimator,
                                 f"no such algorithm here; --algo one of {', '.join(sorted(set(ESTIMATORS.values())))}"))
        else:
            out.algorithm = ESTIMATORS[estimator]
    loss_mode = flat.get(f"{ARO}.actor.policy_loss.loss_mode")
    if loss_mode in ("gspo", "gpg"):
        out.algorithm = loss_mode
    if out.algorithm == "grpo" and flat.get("algorithm.norm_adv_by_std_in_grpo") is False and \
            flat.get(f"{ARO}.actor.loss_agg_mode") == "seq-mean-token-sum-norm":
        out.algorithm = "dr_grpo"
    if flat.get("data.train_files") is not None:
        out.overrides["data.name"] = "files"
    clip = flat.get(f"{ARO}.actor.clip_ratio")
    for verl_key, value in flat.items():
        if verl_key == f"{ARO}.actor.clip_ratio":  # verl's symmetric default for the two bounds
            for side in ("low", "high"):
                if f"{ARO}.actor.clip_ratio_{side}" not in flat:
                    _map(out, verl_key, f"actor.clip_ratio_{side}", clip)
            continue
        if verl_key in (f"{ARO}.actor.policy_loss.loss_mode",) and value in ("gspo", "gpg", "vanilla"):
            out.ignored.append((verl_key, f"the algorithm ({out.algorithm}) carries its policy loss"))
            continue
        if verl_key in MAPPED:
            target, convert = MAPPED[verl_key]
            if value is None and target not in ("algorithm.rollout_is", "algorithm.rollout_rs",
                                                "algorithm.rollout_rs_threshold"):
                out.ignored.append((verl_key, "null: rlforge's default applies"))
                continue
            _map(out, verl_key, target, convert(value))
            continue
        why = _ignored(verl_key)
        if why is not None:
            out.ignored.append((verl_key, why))
        elif verl_key != "algorithm.adv_estimator" or estimator in ESTIMATORS:
            out.unmapped.append((verl_key, value, NOT_MAPPED.get(verl_key, "no counterpart in rlforge")))
    _processes(flat, out)
    return out


def _map(out: Translation, verl_key: str, target: str, value: Any) -> None:
    out.overrides[target] = value
    out.mapped.append((verl_key, target, value))


def _processes(flat: dict[str, Any], out: Translation) -> None:
    """verl's node/GPU counts -> data-parallel ranks under the Ray controller."""
    nodes, gpus = flat.get("trainer.nnodes"), flat.get("trainer.n_gpus_per_node")
    if isinstance(nodes, int) and isinstance(gpus, int) and nodes * gpus > 1:
        out.overrides.update({"strategy.num_processes": nodes * gpus, "strategy.name": "fsdp",
                              "trainer.controller": "ray"})
        out.mapped.append(("trainer.nnodes x trainer.n_gpus_per_node", "strategy.num_processes", nodes * gpus))


def hint(key: str) -> str:
    """The extra sentence for an unknown config key that is verl's (empty when it is not)."""
    if key in MAPPED:
        return f" '{key}' is verl's key; rlforge's is '{MAPPED[key][0]}' (see {DOC})."
    if key in NOT_MAPPED:
        return f" '{key}' is verl's key: {NOT_MAPPED[key]} (see {DOC})."
    if _ignored(key) is not None or key.startswith((f"{ARO}.", "custom_reward_function.", "reward_model.")):
        return f" '{key}' is a verl key: translate a verl config with 'rlforge config from-verl FILE' (see {DOC})."
    return ""
