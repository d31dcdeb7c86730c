"""verl 0.9.1's engine settings (FSDP, megatron, veomni, torchtitan) of the actor, the reference and the critic, and
the reasons shared by ``verl_keys``' tables: one part of the key table that ``verl_keys.TABLE`` assembles."""

from __future__ import annotations

from rlforge.config import verl_veomni
from rlforge.config.verl_rules import Derived, Ignore, Keep, Map, Rule, Unread, above_one, at_most_one, gate, is_, never, off

SPEED = "speed or memory only: what is computed does not change"
PROFILING = ("verl's profilers (nsys, npu, torch, torch_memory) and their switches: profiling does not change what is "
             "computed; rlforge's own is the profiler plugin (torch.profiler traces of chosen steps: plugins.profiler.steps, "
             "docs/tracking.md), set in rlforge's terms")
SEEDS = "seeds do not carry over between frameworks; rlforge seeds everything with trainer.seed"
FSDP_LAYOUT = f"FSDP sharding and kernel options ({SPEED}); rlforge's fsdp strategy shards with FSDP2"
COPY = "a copy of another key (verl fills it by interpolation)"
CRITIC_MEGATRON = "the reference and critic share the actor's megatron layout"
OPTIMIZER_OFFLOAD = f"optimizer offload: strategy.offload_optimizer, one setting for all models ({SPEED})"
NO_BACKWARD = "the reference model runs forward passes only: nothing to recompute"
NOT_COMPILED = ("not read by verl 0.9.1's engines: its FSDP engine compiles the entropy function with "
                f"fsdp_config.use_torch_compile (default true; {SPEED})")


def engine_rules(section: str, role: str) -> dict[str, Rule]:
    """FSDP / megatron / veomni / torchtitan engine settings of the actor, the reference or the critic."""
    f, mg = f"{section}.fsdp_config", f"{section}.megatron"
    sp = Derived("sequence_parallel")
    pipeline = gate(f"{mg}.pipeline_model_parallel_size", above_one)
    entropy: Rule = Derived("entropy") if role == "actor" else Unread(
        "the reference model computes no entropy (verl asks it for log-probs only)" if role == "ref"
        else "the critic computes no entropy")
    recompute: Rule = (Derived("recompute") if role == "actor" else Ignore(NO_BACKWARD) if role == "ref" else
                       Ignore(f"activation recomputation ({SPEED}); model.gradient_checkpointing (one setting for the "
                              "policy and the critic in rlforge)"))
    rules: dict[str, Rule] = {
        f"{f}.param_offload": Derived("offload") if role != "critic" else Unread("not read: verl's critic reads critic.fsdp"),
        f"{f}.offload_policy": Derived("offload") if role != "critic" else Unread("not read: verl's critic reads critic.fsdp"),
        f"{f}.optimizer_offload": Map("strategy.offload_optimizer") if role == "actor" else (
            Unread("the reference model has no optimizer") if role == "ref" else Ignore(OPTIMIZER_OFFLOAD)),
        f"{f}.model_dtype": Derived("precision") if role == "actor" else Ignore("follows the actor's precision"),
        f"{f}.dtype": Derived("precision") if role == "actor" else Ignore("follows the actor's precision"),
        f"{f}.mixed_precision.*": Derived("precision") if role == "actor" else Ignore("follows the actor's precision"),
        f"{f}.ulysses_sequence_parallel_size": sp,
        f"{f}.seed": Ignore(SEEDS),
        f"{f}.qat.enable": Keep(off, "no quantization-aware training", "quantization-aware training (QAT)"),
        f"{f}.qat.*": Unread("read only with qat.enable", gate(f"{f}.qat.enable")),
        f"{f}.strategy": Derived("parallel") if role == "actor" else Ignore("the strategy is one for all roles"),
        f"{f}.forward_only": Ignore("internal: set for forward-only roles"),
        f"{f}.entropy_*": entropy,
        f"{f}.fsdp_size": Derived("offload") if role != "critic" else Unread("not read: verl's critic reads critic.fsdp"),
        f"{f}.reshard_after_forward": Derived("offload") if role != "critic" else Unread(
            "not read: verl's critic reads critic.fsdp"),
        f"{f}.*": Ignore(FSDP_LAYOUT),
        f"{section}.fsdp.ulysses_sequence_parallel_size": sp,
        f"{section}.fsdp.*": Ignore(FSDP_LAYOUT),
        f"{mg}.tensor_model_parallel_size": Derived("parallel") if role != "critic" else Ignore(CRITIC_MEGATRON),
        f"{mg}.pipeline_model_parallel_size": Derived("parallel") if role != "critic" else Ignore(CRITIC_MEGATRON),
        f"{mg}.context_parallel_size": Derived("parallel") if role != "critic" else Ignore(CRITIC_MEGATRON),
        f"{mg}.virtual_pipeline_model_parallel_size": Keep(at_most_one, "no virtual pipeline stages",
                                                            "virtual pipeline parallelism (megatron)"),
        f"{mg}.expert_model_parallel_size": Keep(at_most_one, "no expert parallelism", "expert parallelism (MoE)"),
        f"{mg}.expert_tensor_parallel_size": Keep(at_most_one, "no expert tensor parallelism", "expert parallelism (MoE)"),
        f"{mg}.dynamic_context_parallel": Keep(off, "no context parallelism", "dynamic context parallelism (megatron)"),
        f"{mg}.use_dist_checkpointing": Keep(off, "weights from model.path (Hugging Face)",
                                             "initial weights from a megatron dist-checkpoint"),
        f"{mg}.dist_checkpointing_path": Keep(off, "weights from model.path (Hugging Face)",
                                              "initial weights from a megatron dist-checkpoint"),
        f"{mg}.use_megatron_fsdp": Keep(off, "megatron's data parallelism", "megatron FSDP"),
        f"{mg}.router_replay.mode": Keep(is_("disabled"), "no router replay", "MoE router replay"),
        f"{mg}.qat.enable": Keep(off, "no quantization-aware training", "quantization-aware training (QAT)"),
        f"{mg}.override_mcore_model_config": Keep(off, "rlforge's GPTModel settings", "overriding megatron model fields"),
        f"{mg}.override_transformer_config": Ignore(COPY),
        f"{mg}.override_transformer_config.recompute_*": recompute,
        f"{mg}.override_transformer_config.*fusion": Ignore(f"kernel fusion ({SPEED})"),
        f"{mg}.override_transformer_config.use_fused_*": Ignore(f"fused kernels ({SPEED})"),
        f"{mg}.override_transformer_config.attention_backend": Ignore(f"attention kernels ({SPEED})"),
        f"{mg}.override_transformer_config.use_flash_attn": Ignore(f"attention kernels ({SPEED})"),
        # megatron builds uneven first/last stages from these at any pipeline size (one alone is its error)
        f"{mg}.override_transformer_config.num_layers_in_*_pipeline_stage": Keep(
            is_(None), "even pipeline stages", "uneven pipeline stages (num_layers_in_first/last_pipeline_stage)"),
        f"{mg}.override_transformer_config.account_for_*_in_pipeline_split": Unread(
            "read only with pipeline parallelism (refused where > 1)", pipeline),
        f"{mg}.override_transformer_config.sequence_parallel": Ignore(
            f"megatron's sequence parallelism inside a tensor-parallel group ({SPEED})"),
        f"{mg}.override_transformer_config.persist_layer_norm": Ignore(f"layer-norm kernels ({SPEED})"),
        f"{mg}.override_transformer_config.deallocate_pipeline_outputs": Unread(
            "read only with pipeline parallelism (refused where > 1)", pipeline),
        f"{mg}.override_transformer_config.swiglu": Keep(is_(True), "SwiGLU, as rlforge's megatron models (Llama, "
                                                         "Qwen2) have", "an MLP other than SwiGLU (megatron)"),
        f"{mg}.override_transformer_config.normalization": Keep(is_("RMSNorm"), "RMSNorm, as rlforge's megatron models "
                                                                "(Llama, Qwen2) have", "a normalization other than RMSNorm"),
        f"{mg}.override_transformer_config.*_dropout": Keep(is_(0, 0.0), "no dropout (rlforge's megatron models have "
                                                            "none: the RL losses assume none)", "dropout (megatron)"),
        f"{mg}.override_transformer_config.fp8": Keep(off, "no fp8", "fp8 training (megatron)"),
        f"{mg}.override_transformer_config.fp8_*": Unread("read only with fp8 (refused where set)",
                                                          gate(f"{mg}.override_transformer_config.fp8")),
        f"{mg}.override_transformer_config.context_parallel_size": Keep(at_most_one, "no context parallelism",
                                                                        "context parallelism (megatron)"),
        f"{mg}.override_transformer_config.context_parallel_algo": Unread(
            "read only with context parallelism (refused where > 1)",
            lambda get, key: above_one(get(f"{mg}.context_parallel_size"))
            or above_one(get(f"{mg}.override_transformer_config.context_parallel_size"))),
        f"{mg}.override_transformer_config.moe_*": Keep(never, "", "MoE models in rlforge's megatron strategy"),
        f"{mg}.override_transformer_config.*": Keep(never, "", "overriding megatron TransformerConfig fields"),
        f"{mg}.optimizer_offload": Map("strategy.offload_optimizer") if role == "actor" else (
            Unread("the reference model has no optimizer") if role == "ref" else Ignore(OPTIMIZER_OFFLOAD)),
        f"{mg}.param_offload": Ignore(f"rlforge's megatron strategy keeps parameters on the device ({SPEED})"),
        f"{mg}.grad_offload": Derived("grad_offload"),
        f"{mg}.seed": Ignore(SEEDS),
        f"{mg}.dtype": Derived("precision") if role == "actor" else Ignore("follows the actor's precision"),
        f"{mg}.entropy_*": entropy,
        f"{mg}.*": Ignore(f"megatron engine options ({SPEED}): offload, distributed optimizer, checkpoint format, "
                          "padding, weight conversion (rlforge converts Hugging Face weights itself)"),
        **verl_veomni.engine_rules(section, role, sp, entropy, Map("strategy.offload_optimizer") if role == "actor"
                                   else Unread("the reference model has no optimizer") if role == "ref"
                                   else Ignore(OPTIMIZER_OFFLOAD)),
        f"{section}.torchtitan.*": Unread("read only by verl's torchtitan engine (model_engine=torchtitan: refused)",
                                          gate("model_engine", is_("torchtitan"))),
        f"{section}.profiler.*": Ignore(PROFILING),
        f"{section}.checkpoint.*": Ignore("checkpoints always hold model, optimizer and trainer state"),
        f"{section}.ulysses_sequence_parallel_size": sp,
        f"{section}.strategy": Derived("parallel") if role != "critic" else Ignore("the strategy is one for all roles"),
        f"{section}.use_torch_compile": Unread(NOT_COMPILED, gate("model_engine", is_("torchtitan", "automodel"))),
        f"{section}.entropy_*": entropy,
        f"{section}.pad_to_length*": Ignore(SPEED),
        f"{section}.rollout_n": Ignore(COPY),
        f"{section}.qat.enable": Keep(off, "no quantization-aware training", "quantization-aware training (QAT)"),
        f"{section}.qat.*": Unread("read only with qat.enable", gate(f"{section}.qat.enable")),
        f"{section}.nccl_timeout": Ignore("NCCL set-up"),
    }
    if role == "critic":  # the critic's engine section (verl 0.9.1 reads critic.fsdp, not critic.model.fsdp_config)
        rules.update({"critic.fsdp.param_offload": Derived("offload"), "critic.fsdp.offload_policy": Derived("offload"),
                      "critic.fsdp.fsdp_size": Derived("offload"), "critic.fsdp.reshard_after_forward": Derived("offload"),
                      "critic.fsdp.optimizer_offload": Ignore(OPTIMIZER_OFFLOAD)})
    return rules
