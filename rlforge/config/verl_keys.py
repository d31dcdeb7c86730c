"""verl 0.9.1's PPO-family config keys and their fate in rlforge (the rule kinds: ``verl_rules``).

Every key of verl's default trees (``verl_defaults/*.yaml``) matches one entry here; ``tests/tools/test_verl_keys.py``
walks them all and checks each mapped target against rlforge's schema. Keys computed from several verl keys
(the algorithm, micro-batches, parallel sizes, resume, steps, loggers, validation sampling, DAPO's shaping) are
``Derived``: ``verl_derived`` maps them.
"""

from __future__ import annotations

from rlforge.config.verl_engine import COPY, FSDP_LAYOUT, PROFILING, SEEDS, SPEED, engine_rules
from rlforge.config.verl_rules import (
    HYDRA_CHDIR, HYDRA_ENV, HYDRA_OWN, Checked, Derived, Ignore, Keep, Map, Rule, Table, converts, count, is_, never, off,
    str_list, Unread, critic_path, custom_sampler, gate, top_k,
)

ARO = "actor_rollout_ref"
SCHEDULERS = "megatron learning-rate decay styles other than constant"


def _optim(section: str, target: str) -> dict[str, Rule]:
    """``<section>.optim.*`` of the actor or the critic (FSDP, megatron, veomni and torchtitan variants)."""
    o = f"{section}.optim"
    decaying = gate(f"{o}.lr_decay_style", lambda v: v not in (None, "constant"))
    return {
        f"{o}.optimizer": Keep(is_("AdamW", "adamw", "adam"), "AdamW (megatron's adam decays weights decoupled, as "
                               "AdamW)", "optimizers other than AdamW"),
        f"{o}.name": Keep(is_("AdamW", "adamw"), "AdamW", "optimizers other than AdamW"),
        f"{o}.optimizer_impl": Keep(is_("torch.optim"), "torch.optim.AdamW", "optimizer implementations by path"),
        f"{o}.lr": Map(f"{target}.lr"),
        f"{o}.weight_decay": Derived("weight_decay"),
        f"{o}.lr_warmup_init": Keep(lambda v: not v, "a warm-up from 0", "a warm-up starting above 0 (lr_warmup_init)"),
        f"{o}.clip_grad": Map(f"{target}.grad_clip"),
        f"{o}.betas": Derived("betas"),
        f"{o}.eps": Keep(is_(1e-8), "AdamW's eps 1e-8", "an AdamW eps other than 1e-8"),
        f"{o}.lr_warmup_steps": Derived("warmup"),
        f"{o}.lr_warmup_steps_ratio": Derived("warmup"),
        f"{o}.total_training_steps": Ignore("verl fills it with the run's step count (trainer.total_steps here)"),
        f"{o}.lr_scheduler_type": Derived("schedule"),
        f"{o}.warmup_style": Derived("schedule"),
        f"{o}.min_lr_ratio": Derived("schedule"),
        f"{o}.num_cycles": Derived("schedule"),
        f"{o}.zero_indexed_step": Derived("schedule"),
        f"{o}.lr_min": Derived("schedule"),
        f"{o}.lr_start": Derived("schedule"),
        f"{o}.lr_decay_ratio": Derived("schedule"),
        f"{o}.lr_decay_style": Keep(is_("constant"), "a constant rate after the warm-up", SCHEDULERS),
        f"{o}.decay_type": Unread("read by torchtitan's scheduler only (model_engine=torchtitan: refused)",
                                   gate("model_engine", is_("torchtitan"))),
        f"{o}.weight_decay_incr_style": Keep(is_("constant"), "a constant weight decay", "weight-decay schedules"),
        f"{o}.min_lr*": Unread("read only by a decaying schedule (lr_decay_style)", decaying),
        f"{o}.lr_*": Unread("read only by a decaying or warm-started schedule (lr_decay_style, lr_warmup_init)",
                            lambda get, key: decaying(get, key) or bool(get(f"{o}.lr_warmup_init"))),
        f"{o}.use_checkpoint_opt_param_scheduler": Ignore("megatron's scheduler state in checkpoints"),
        f"{o}.use_precision_aware_optimizer": Ignore(SPEED),
        f"{o}.*_dtype": Keep(lambda v: v in ("fp32", "float32"), "fp32 optimizer state", "low-precision optimizer state"),
        f"{o}.use_layer_wise_distributed_optimizer": Ignore(SPEED),
        f"{o}.muon_*": Unread("read only by the Muon optimizer (optimizer=Muon: refused)",
                              gate(f"{o}.optimizer", lambda v: str(v).lower() == "muon")),
        f"{o}.override_optimizer_config": Keep(off, "no optimizer overrides", "overriding optimizer fields"),
        f"{o}.override_optimizer_config.*offload*": Ignore(f"optimizer offload ({SPEED})"),
        f"{o}.override_optimizer_config.overlap_*": Ignore(SPEED),
        f"{o}.override_optimizer_config.use_precision_aware_optimizer": Ignore(SPEED),
        f"{o}.override_optimizer_config.*": Keep(never, "", "overriding megatron optimizer fields"),
    }


def _model(section: str, actor: bool) -> dict[str, Rule]:
    """``<section>.model.*`` of the policy or the critic."""
    m = f"{section}.model"
    one = "" if actor else " (one setting for the policy and the critic in rlforge)"
    lora = gate(f"{m}.lora_rank")
    return {
        f"{m}.path": Map("model.path") if actor else Map("critic.path", critic_path),
        f"{m}.hf_config_path": Keep(off, "the config of model.path", "a model config from another folder"),
        f"{m}.tokenizer_path": Keep(off, "the tokenizer of model.path", "a tokenizer from another folder"),
        f"{m}.use_shm": Ignore("models load from disk or the Hugging Face cache"),
        f"{m}.trust_remote_code": Map("model.trust_remote_code") if actor else Ignore(f"model.trust_remote_code{one}"),
        f"{m}.custom_chat_template": Map("model.chat_template") if actor else Keep(
            off, "the policy's chat template (model.chat_template)", "a chat template of the critic's own"),
        f"{m}.external_lib": Keep(off, "no extra import", "importing a module by name: install it as an rlforge plugin"),
        f"{m}.override_config": Keep(off, "the model's own config.json", "overriding the model's config.json fields"),
        f"{m}.override_config.*dropout": Keep(is_(0, 0.0), "the model's config.json dropout: none in Qwen and Llama "
                                              "configs (set the field to 0 in config.json for others)", "dropout overrides"),
        f"{m}.override_config.*pdrop": Keep(is_(0, 0.0), "the model's config.json dropout: none in Qwen and Llama "
                                            "configs (set the field to 0 in config.json for others)", "dropout overrides"),
        f"{m}.override_config.attn_implementation": Ignore(f"attention kernels ({SPEED})"),
        f"{m}.override_config.*": Derived("model_config") if actor else Keep(
            never, "", "overriding the critic's config.json fields (model.config_overrides is the policy's)"),
        f"{m}.enable_gradient_checkpointing": Derived("recompute") if actor else Ignore(
            f"model.gradient_checkpointing{one}; {SPEED}"),
        f"{m}.enable_activation_offload": Ignore(f"activation offload is not in rlforge ({SPEED})"),
        f"{m}.use_remove_padding": Map("model.remove_padding") if actor else Ignore(f"model.remove_padding{one}"),
        f"{m}.lora_rank": Map("model.lora.rank") if actor else Keep(is_(0), "a full critic", "LoRA on the critic"),
        f"{m}.lora_alpha": Map("model.lora.alpha") if actor else Unread("read only with LoRA on the critic", lora),
        f"{m}.target_modules": Map("model.lora.target_modules", str_list) if actor else Unread(
            "read only with LoRA on the critic", lora),
        f"{m}.exclude_modules": Map("model.lora.exclude_modules") if actor else Unread(
            "read only with LoRA on the critic", lora),
        f"{m}.lora_adapter_path": Keep(off, "a fresh adapter", "starting LoRA from a saved adapter"),
        f"{m}.lora.rank": Keep(is_(0), "no megatron LoRA", "LoRA with the megatron strategy"),
        f"{m}.lora.*": Unread("read only by verl's megatron LoRA (model.lora.rank > 0)", gate(f"{m}.lora.rank")),
        f"{m}.use_liger": Ignore(f"Liger kernels are not in rlforge ({SPEED})"),
        f"{m}.use_fused_kernels": Ignore(f"rlforge chunks its log-prob kernels itself ({SPEED})"),
        f"{m}.fused_kernel_options.*": Ignore(SPEED),
        f"{m}.tiled_mlp.*": Ignore(f"tiled MLP is not in rlforge ({SPEED})"),
        f"{m}.mtp.enable": Keep(off, "no multi-token prediction", "multi-token prediction (MTP) heads"),
        f"{m}.mtp.*": Unread("read only with model.mtp.enable (refused where true: MTP heads)", gate(f"{m}.mtp.enable")),
        f"{m}.fsdp_config.*": Ignore(FSDP_LAYOUT),
    }


ACTOR = f"{ARO}.actor"


def kl_loss(target: str) -> Map:
    """A key verl reads only with the KL loss on (its losses.py, under use_kl_loss): off, unread and unchecked."""
    return Map(target, read_if=gate(f"{ACTOR}.use_kl_loss"), unread="read only with use_kl_loss=True")


def kl_reward(target: str) -> Map:
    """A key verl reads only with the KL penalty in the reward on (its KL controller and apply_kl_penalty)."""
    return Map(target, read_if=gate("algorithm.use_kl_in_reward"),
               unread="read only with algorithm.use_kl_in_reward=True (verl before that key, e.g. in TinyZero's "
                      "scripts, applied the KL penalty to the reward whenever use_kl_loss was off; 0.9.1 does not)")


ACTOR_RULES: dict[str, Rule] = {
    **_optim(ACTOR, "actor"), **_model(f"{ARO}", actor=True), **engine_rules(ACTOR, "actor"),
    f"{ACTOR}.ppo_mini_batch_size": Map("actor.ppo_mini_batch_size"),
    f"{ACTOR}.ppo_micro_batch_size": Derived("micro_batches"),
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": Derived("micro_batches"),
    f"{ACTOR}.use_dynamic_bsz": Derived("micro_batches"),
    f"{ACTOR}.ppo_max_token_len_per_gpu": Derived("micro_batches"),
    f"{ACTOR}.ppo_epochs": Map("actor.ppo_epochs"),
    f"{ACTOR}.clip_ratio": Derived("clip"),
    f"{ACTOR}.clip_ratio_low": Derived("clip"),
    f"{ACTOR}.clip_ratio_high": Derived("clip"),
    f"{ACTOR}.clip_ratio_c": Map("actor.clip_ratio_c"),
    f"{ACTOR}.tau_pos": Map("actor.sapo.tau_pos"),
    f"{ACTOR}.tau_neg": Map("actor.sapo.tau_neg"),
    f"{ACTOR}.freeze_vision_tower": Map("model.freeze_vision_tower"),
    f"{ACTOR}.policy_loss.loss_mode": Derived("algorithm"),
    f"{ACTOR}.policy_loss.clip_cov_ratio": Map("actor.clip_cov.ratio"),
    f"{ACTOR}.policy_loss.clip_cov_lb": Map("actor.clip_cov.lb"),
    f"{ACTOR}.policy_loss.clip_cov_ub": Map("actor.clip_cov.ub"),
    f"{ACTOR}.policy_loss.kl_cov_ratio": Map("actor.kl_cov.ratio"),
    f"{ACTOR}.policy_loss.ppo_kl_coef": Map("actor.kl_cov.coef"),
    f"{ACTOR}.policy_loss.dro_beta": Map("actor.dro.beta"),
    f"{ACTOR}.sppo_eta": Map("actor.sppo.eta"),
    f"{ACTOR}.policy_loss.*": Unread("not read by verl 0.9.1's losses (they read the actor's own keys, e.g. "
                                     "actor.tau_pos)"),
    f"{ACTOR}.loss_agg_mode": Map("actor.loss_agg_mode"),
    f"{ACTOR}.loss_scale_factor": Derived("loss_scale"),
    f"{ACTOR}.entropy_coeff": Map("actor.entropy_coeff"),
    f"{ACTOR}.calculate_entropy": Ignore("rlforge always logs actor/entropy"),
    f"{ACTOR}.calculate_sum_pi_squared": Ignore("the optimal_token_baseline estimators' input; rlforge's otb "
                                                "computes it itself"),
    f"{ACTOR}.use_kl_loss": Map("actor.use_kl_loss"),
    f"{ACTOR}.kl_loss_coef": kl_loss("actor.kl_loss_coef"),
    f"{ACTOR}.kl_loss_type": kl_loss("actor.kl_loss_type"),
    f"{ACTOR}.use_prefix_grouper": Ignore(f"{SPEED}; rlforge's model.shared_prefix does the same"),
    f"{ACTOR}.shuffle": Keep(off, "mini-batches in order", "shuffled mini-batches"),
    f"{ACTOR}.data_loader_seed": Ignore(SEEDS),
    f"{ACTOR}.use_fused_kernels": Ignore(COPY),
    f"{ACTOR}.use_remove_padding": Ignore(COPY),
    f"{ACTOR}.grad_clip": Derived("grad_clip"),
    f"{ACTOR}.use_rollout_log_probs": Unread("not read by verl 0.9.1 (a field of its actor config no code reads); "
                                             "the engine's log-probs as the old ones: algorithm.rollout_correction."
                                             "bypass_mode"),
}

REF = f"{ARO}.ref"
REF_RULES: dict[str, Rule] = {
    **engine_rules(REF, "ref"),
    f"{REF}.log_prob_*": Derived("scoring"),
    f"{REF}.optim.*": Unread("the reference model is never trained"),
}

ROLLOUT = f"{ARO}.rollout"
ENGINE = "engine tuning (throughput and memory only); rlforge sizes its engine itself"
ROLLOUT_RULES: dict[str, Rule] = {
    f"{ROLLOUT}.name": Derived("rollout_engine"),
    f"{ROLLOUT}.mode": Derived("rollout_engine"),
    f"{ROLLOUT}.nnodes": Ignore("the engine shares the trainer's devices (ray.rollout_workers for its own)"),
    f"{ROLLOUT}.n_gpus_per_node": Ignore(COPY),
    f"{ROLLOUT}.n": Map("rollout.n"),
    f"{ROLLOUT}.temperature": Map("rollout.temperature"),
    f"{ROLLOUT}.top_k": Map("rollout.top_k", top_k),
    f"{ROLLOUT}.top_p": Map("rollout.top_p"),
    f"{ROLLOUT}.do_sample": Unread("not read by verl 0.9.1: its agent loop samples training rollouts at rollout."
                                   "temperature/top_p/top_k (only the legacy HFRollout, not in its rollout registry, "
                                   "reads it)"),
    f"{ROLLOUT}.full_determinism": Ignore("deterministic engine kernels (reproducibility, not results)"),
    f"{ROLLOUT}.seed": Ignore(SEEDS),
    f"{ROLLOUT}.prompt_length": Derived("lengths"),
    f"{ROLLOUT}.response_length": Derived("lengths"),
    f"{ROLLOUT}.dtype": Derived("rollout_engine"),
    f"{ROLLOUT}.gpu_memory_utilization": Derived("rollout_engine"),
    f"{ROLLOUT}.enforce_eager": Derived("rollout_engine"),
    f"{ROLLOUT}.tensor_model_parallel_size": Derived("rollout_engine"),
    f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes": Derived("rollout_engine"),
    f"{ROLLOUT}.max_num_seqs": Derived("rollout_engine"),
    f"{ROLLOUT}.max_num_batched_tokens": Derived("rollout_engine"),
    f"{ROLLOUT}.max_model_len": Derived("rollout_engine"),
    f"{ROLLOUT}.data_parallel_size": Derived("rollout_engine"),
    f"{ROLLOUT}.expert_parallel_size": Derived("rollout_engine"),
    f"{ROLLOUT}.enable_chunked_prefill": Derived("rollout_engine"),
    f"{ROLLOUT}.enable_prefix_caching": Derived("rollout_engine"),
    f"{ROLLOUT}.free_cache_engine": Derived("rollout_engine"),
    f"{ROLLOUT}.checkpoint_engine.*": Ignore("weights are synced to the engine in buckets"),
    f"{ROLLOUT}.ignore_eos": Map("rollout.ignore_eos"),
    f"{ROLLOUT}.logprobs_mode": Keep(is_("processed_logprobs"), "log-probs at the sampling temperature",
                                     "raw (unprocessed) engine log-probs"),
    f"{ROLLOUT}.over_sample_rate": Keep(off, "every rollout waited for", "over-sampling and dropping slow rollouts"),
    f"{ROLLOUT}.router_config_path": Keep(off, "rlforge's own routing", "external rollout routers"),
    f"{ROLLOUT}.quantization": Keep(off, "unquantized rollouts", "quantized (fp8) rollouts"),
    f"{ROLLOUT}.quantization_config_file": Keep(off, "unquantized rollouts", "quantized (fp8) rollouts"),
    f"{ROLLOUT}.enable_rollout_routing_replay": Keep(off, "no routing replay", "MoE routing replay"),
    f"{ROLLOUT}.disaggregation.enabled": Keep(off, "one engine per replica", "prefill/decode disaggregation"),
    f"{ROLLOUT}.disaggregation.*": Unread("read only with disaggregation.enabled",
                                          gate(f"{ROLLOUT}.disaggregation.enabled")),
    f"{ROLLOUT}.val_kwargs.*": Derived("validation"),
    f"{ROLLOUT}.multi_turn.*": Derived("multi_turn"),
    f"{ROLLOUT}.agent.default_agent_loop": Derived("multi_turn"),
    f"{ROLLOUT}.agent.agent_loop_config_path": Derived("multi_turn"),
    f"{ROLLOUT}.agent.custom_async_server.*": Keep(off, "rlforge's engines", "custom async rollout servers"),
    f"{ROLLOUT}.agent.*": Ignore("agent loops run concurrently in the driver"),
    f"{ROLLOUT}.calculate_log_probs": Derived("rollout_log_probs"),
    f"{ROLLOUT}.log_prob_*": Derived("scoring"),
    f"{ROLLOUT}.trace.*": Ignore("tracing is not configured through the config"),
    f"{ROLLOUT}.prometheus.*": Ignore("no Prometheus export"),
    f"{ROLLOUT}.profiler.*": Ignore(PROFILING),
    f"{ROLLOUT}.mtp": Ignore(COPY),
    f"{ROLLOUT}.qat": Ignore(COPY),
    f"{ROLLOUT}.engine_kwargs.*": Derived("rollout_engine"),
    f"{ROLLOUT}.cudagraph_capture_sizes": Derived("rollout_engine"),
    f"{ROLLOUT}.*": Ignore(ENGINE),
}

CRITIC_RULES: dict[str, Rule] = {
    **_optim("critic", "critic"), **_model("critic", actor=False), **engine_rules("critic", "critic"),
    "critic.enable": Derived("algorithm"),
    "critic.ppo_mini_batch_size": Map("critic.ppo_mini_batch_size"),
    "critic.ppo_micro_batch_size": Derived("micro_batches"),
    "critic.ppo_micro_batch_size_per_gpu": Derived("micro_batches"),
    "critic.use_dynamic_bsz": Derived("micro_batches"),
    "critic.ppo_max_token_len_per_gpu": Derived("micro_batches"),
    "critic.forward_*": Derived("scoring"),
    "critic.ppo_epochs": Map("critic.ppo_epochs"),
    "critic.shuffle": Keep(off, "mini-batches in order", "shuffled mini-batches"),
    "critic.data_loader_seed": Ignore(SEEDS),
    "critic.cliprange_value": Map("critic.cliprange_value"),
    "critic.loss_agg_mode": Map("critic.loss_agg_mode"),
    "critic.loss_scale_factor": Derived("loss_scale"),
    "critic.grad_clip": Derived("grad_clip"),
}

ALGORITHM_RULES: dict[str, Rule] = {
    "algorithm.adv_estimator": Derived("algorithm"),
    "algorithm.gamma": Derived("algorithm"),
    "algorithm.lam": Derived("algorithm"),
    "algorithm.norm_adv_by_std_in_grpo": Derived("algorithm"),
    "algorithm.use_kl_in_reward": Map("algorithm.use_kl_in_reward"),
    "algorithm.kl_penalty": kl_reward("algorithm.kl_penalty"),
    "algorithm.kl_ctrl.type": kl_reward("algorithm.kl_ctrl"),
    "algorithm.kl_ctrl.kl_coef": kl_reward("algorithm.kl_coef"),
    "algorithm.kl_ctrl.horizon": kl_reward("algorithm.kl_horizon"),
    "algorithm.kl_ctrl.target_kl": kl_reward("algorithm.kl_target"),
    "algorithm.filter_groups.*": Derived("filter_groups"),
    "algorithm.use_pf_ppo": Derived("algorithm"),
    "algorithm.pf_ppo.*": Derived("algorithm"),
    "algorithm.gdpo_reward_keys": Map("algorithm.reward_keys", str_list),
    "algorithm.gdpo_reward_weights": Map("algorithm.reward_weights"),
    "algorithm.rollout_correction.bypass_mode": Derived("algorithm"),
    "algorithm.rollout_correction.loss_type": Ignore(
        "read only by the bypass loss, which no verl 0.9.1 trainer runs: apply_bypass_mode sets loss_mode=bypass_mode "
        "on the driver's config after the workers built their loss"),
    "algorithm.rollout_correction.*": Derived("rollout_correction"),
}

DATA_RULES: dict[str, Rule] = {
    "data.train_files": Derived("data"),
    "data.val_files": Derived("data"),
    "data.tokenizer": Keep(off, "the tokenizer of model.path", "a tokenizer from another folder"),
    "data.use_shm": Ignore("data loads from disk"),
    "data.train_max_samples": Keep(lambda v: v is None or v < 0, "every row", "using only the first N rows"),
    "data.val_max_samples": Keep(lambda v: v is None or v < 0, "every row", "using only the first N rows"),
    "data.prompt_key": Keep(is_("prompt"), "the 'prompt' column", "a prompt column other than 'prompt'"),
    "data.reward_fn_key": Keep(is_("data_source"), "the 'data_source' column", "a source column other than "
                                                                               "'data_source'"),
    "data.max_prompt_length": Map("data.max_prompt_length"),
    "data.max_response_length": Map("rollout.max_new_tokens"),
    "data.train_batch_size": Map("data.train_batch_size"),
    "data.gen_batch_size": Derived("filter_groups"),
    "data.val_batch_size": Checked(f"validation runs in batches of rollout.micro_batch_size ({SPEED})",
                                   count(1, none=True), "a positive integer or null (torch's DataLoader)"),
    "data.tool_config_path": Ignore(COPY),
    "data.function_tool_path": Ignore(COPY),
    "data.return_raw_chat": Derived("data"),
    "data.return_*": Unread("not read by verl 0.9.1: its dataset hands every row's chat messages to the agent loop, "
                            "which applies the chat template"),
    "data.shuffle": Map("data.shuffle"),
    "data.seed": Ignore(SEEDS),
    "data.dataloader_num_workers": Checked("prompts are tokenized once at start-up", count(0),
                                           "an integer of 0 or more (torch's DataLoader)"),
    "data.validation_shuffle": Ignore("the order of validation prompts does not change its metrics"),
    "data.filter_overlong_prompts": Derived("data"),
    "data.filter_overlong_prompts_workers": Ignore("filtering runs once at start-up"),
    "data.truncation": Derived("lengths"),
    "data.image_key": Derived("multimodal"),
    "data.video_key": Derived("multimodal"),
    "data.audio_key": Derived("multimodal"),
    "data.image_patch_size": Derived("multimodal"),
    "data.mm_processor_kwargs": Derived("multimodal"),
    "data.trust_remote_code": Ignore("the tokenizer follows model.trust_remote_code"),
    "data.custom_cls.path": Derived("data"),
    "data.custom_cls.name": Derived("data"),
    "data.apply_chat_template_kwargs": Derived("chat_template"),
    "data.apply_chat_template_kwargs.*": Derived("chat_template"),
}

REWARD_RULES: dict[str, Rule] = {
    "reward.num_workers": Derived("reward"),
    "reward.custom_reward_function.*": Derived("reward"),
    "reward.reward_manager.*": Derived("reward"),
    "reward.reward_kwargs.*": Derived("overlong"),
    "reward.reward_model.enable": Derived("reward"),
    "reward.reward_model.model_path": Derived("reward"),
    "reward.reward_model.rollout.*": Ignore("read only with a generative reward model served by an engine"),
    "reward.reward_model.*": Ignore("the reward model runs beside the actor (reward.model.device)"),
    "reward.sandbox_fusion.url": Keep(off, "rlforge's own sandbox (reward.code.*)", "SandboxFusion servers"),
    "reward.sandbox_fusion.*": Unread("read only with reward.sandbox_fusion.url (refused where set)",
                                      gate("reward.sandbox_fusion.url")),
    # verl's legacy reward section, moved into reward.* as verl's migrate_legacy_reward_impl moves it
    "reward_model.reward_kwargs.*": Derived("overlong"),
    "reward_model.overlong_buffer.*": Unread("not read by verl 0.9.1: the DAPO recipe's earlier keys (verl moves "
                                             "reward_model.reward_kwargs only); its overlong shaping is "
                                             "reward.reward_kwargs.overlong_buffer_cfg"),
    "reward_model.rollout.*": Ignore("read only with a generative reward model served by an engine"),
    "reward_model.*": Derived("reward"),
    "custom_reward_function.*": Derived("reward"),
    "sandbox_fusion.url": Keep(off, "rlforge's own sandbox (reward.code.*)", "SandboxFusion servers"),
    "sandbox_fusion.*": Unread("read only with sandbox_fusion.url (refused where set)", gate("sandbox_fusion.url")),
}

TRAINER_RULES: dict[str, Rule] = {
    "trainer.balance_batch": Map("trainer.balance_batch"),
    "trainer.total_epochs": Derived("steps"),
    "trainer.total_training_steps": Derived("steps"),
    "trainer.project_name": Derived("experiment"), "trainer.experiment_name": Derived("experiment"),
    "trainer.logger": Derived("loggers"),
    "trainer.log_val_generations": Derived("loggers"),
    "trainer.rollout_data_dir": Ignore("samples.jsonl in the run folder (trainer.samples_to_save per step)"),
    "trainer.validation_data_dir": Ignore("val_samples.jsonl in the run folder"),
    "trainer.nnodes": Derived("parallel"),
    "trainer.n_gpus_per_node": Derived("parallel"),
    "trainer.device": Derived("parallel"),
    "trainer.save_freq": Derived("save_freq"),
    "trainer.esi_redundant_time": Ignore("no ESI (elastic instance) expiry handling"),
    "trainer.resume_mode": Derived("resume"),
    "trainer.resume_from_path": Derived("resume"),
    "trainer.default_local_dir": Derived("resume"),
    "trainer.checkpoint_callback_class": Keep(off, "no callback", "checkpoint callbacks by class path "
                                                                  "(rlforge_save_checkpoint hook in a plugin)"),
    "trainer.val_before_train": Map("trainer.val_before_train"),
    "trainer.val_only": Derived("val_only"),
    "trainer.test_freq": Derived("val_freq"),
    # verl updates the actor once critic_warmup <= its step (counted from 1): critic_warmup - 1 critic-only steps
    "trainer.critic_warmup": Map("trainer.critic_warmup", lambda v: max(int(v or 0) - 1, 0),
                                 "the same steps: verl's critic_warmup=N updates the actor from its step N on"),
    "trainer.default_hdfs_dir": Keep(off, "local checkpoints", "copying checkpoints to HDFS"),
    "trainer.del_local_ckpt_after_load": Keep(off, "checkpoints kept", "deleting checkpoints after loading them"),
    "trainer.max_actor_ckpt_to_keep": Derived("checkpoints"),
    "trainer.max_critic_ckpt_to_keep": Derived("checkpoints"),
    "trainer.ray_wait_register_center_timeout": Ignore("Ray start-up timeout (ray.placement_timeout_s)"),
    "trainer.use_v1": Derived("main_ppo_trainer"), "trainer.v1.trainer_mode": Derived("main_ppo_trainer"),
    "trainer.v1.sync.parameter_sync_step": Derived("main_ppo_trainer"),
    "trainer.use_legacy_worker_impl": Keep(is_("disable"), "verl 0.9.1's engine workers (its only ones; an earlier "
                                           "verl's key, unread by 0.9.1)", "verl's legacy workers (not in 0.9.1)"),
    # the sampler (replay buffer) of verl's v1 trainer, which main_ppo runs in sync mode too
    "trainer.v1.sampler.custom_sampler.*": Derived("main_ppo_trainer"),
    "trainer.v1.sampler.sampler_kwargs": Unread("arguments for a custom sampler (custom_sampler: refused where set)",
                                                lambda get, _: custom_sampler(get)),
    "trainer.v1.sampler.sync_refill_failed_groups": Keep(off, "a group that fails to generate is not refilled",
                                                         "refilling failed groups within the step"),
    "trainer.v1.sampler.max_off_policy_*": Derived("main_ppo_trainer"),
    "trainer.v1.*": Unread("read only by verl's v1 asynchronous modes (trainer.v1.trainer_mode other than sync)",
                           gate("trainer.v1.trainer_mode", lambda m: m not in (None, "sync"))),
}

SKIP = "used only with skip.*.enable (refused where true)"
OTHER_RULES: dict[str, Rule] = {
    "model_engine": Derived("parallel"),
    "hydra.job.env_set.*": HYDRA_ENV, "hydra.job.chdir": HYDRA_CHDIR, "hydra.*": HYDRA_OWN,
    "ray_kwargs.*": Ignore("Ray's start-up options (rlforge starts Ray from ray.*: address, num_cpus)"),
    "global_profiler.*": Ignore(PROFILING),
    "transfer_queue.*": Ignore("verl's TransferQueue data plane (rlforge passes batches in memory or by Ray)"),
    "skip.*.enable": Keep(converts(bool, lambda v: not v), "rollouts generated every step", "dumping and replaying rollouts (skip.*)",
                          converts(bool), "true or false"),
    "skip.*.action": Checked(SKIP, converts(str, is_("cache", "repeat")), "'cache' or 'repeat'"),
    "skip.*.steps": Checked(SKIP, converts(list[int]), "a list of integers"),
    "skip.*.dump_dir": Checked(SKIP, converts(str), "a string (not null)"),
    "skip.*": Ignore(SKIP),
    "distillation.*": Derived("distillation"),
    "async_training.*": Keep(never, "", "verl's fully-async trainer (its staleness is a share of samples; rlforge's "
                                        "trainer.pipeline=async bounds it in whole updates, docs/pipelines.md)"),
    "rollout.*": Ignore("the separate rollout pool of verl's off-policy trainers (rlforge's engine shares the "
                        "trainer's devices; ray.rollout_workers for workers of its own)"),
    f"{ARO}.hybrid_engine": Ignore("the hybrid engine is always on"),
    f"{ARO}.nccl_timeout": Ignore("NCCL set-up"),
    f"{ARO}.model.*": Ignore("read only by verl's engine for this model (see the model keys above)"),
    "*._target_": Ignore("verl's structured-config class path"),
    "_target_": Ignore("verl's structured-config class path"),
}

TABLE = Table({"*._target_": OTHER_RULES["*._target_"]}, ACTOR_RULES, REF_RULES, ROLLOUT_RULES, CRITIC_RULES, ALGORITHM_RULES, DATA_RULES, REWARD_RULES,
              TRAINER_RULES, OTHER_RULES)
