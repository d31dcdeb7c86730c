"""verl's engine keys checked against verl 0.9.1's own reading of them: activation recomputation (FSDP reads
model.enable_gradient_checkpointing, megatron only override_transformer_config.recompute_*), megatron's dtype, its
pipeline and context sizes, the entropy's chunking and checkpointing, use_torch_compile (read by no engine), the
reference's strategy, rollout.mode, the inference servers' data/expert parallelism, rollout.engine_kwargs (passed to
vLLM after the rollout keys), AdamW's betas (FSDP only), and SFT's ignore_input_ids_mismatch. Pure config work,
no models."""

from __future__ import annotations

from rlforge.config import verl
from rlforge.config.verl_launch import SFT_ENTRY, prepare

ARO = "actor_rollout_ref"
A, REF, R = f"{ARO}.actor", f"{ARO}.ref", f"{ARO}.rollout"
GPUS = ["trainer.n_gpus_per_node=4", "trainer.total_training_steps=5", f"{R}.name=vllm"]
MEGATRON = ["--config-name=ppo_megatron_trainer", f"{A}.megatron.tensor_model_parallel_size=2"]
TC = f"{A}.megatron.override_transformer_config"


def _t(*args: str) -> verl.Translation:
    return prepare([*GPUS, *args], refuse=False).translation


def _fate(t: verl.Translation, key: str) -> verl.Fate:
    (fate,) = [f for f in t.fates if f.key == key]
    return fate


def test_megatron_recomputes_as_its_transformer_config_says_not_as_enable_gradient_checkpointing() -> None:
    t = _t(*MEGATRON, f"{ARO}.model.enable_gradient_checkpointing=True")  # verl's megatron: recompute_granularity null
    assert t.overrides["model.gradient_checkpointing"] is False
    assert _fate(t, f"{ARO}.model.enable_gradient_checkpointing").kind == verl.IGNORED
    t = _t(*MEGATRON, f"{TC}.recompute_granularity=full", f"{TC}.recompute_method=uniform", f"{TC}.recompute_num_layers=1")
    assert t.overrides["model.gradient_checkpointing"] is True  # rlforge's megatron: full, uniform, 1 layer
    assert all(_fate(t, f"{TC}.recompute_{k}").kind == verl.MAPPED for k in ("granularity", "method", "num_layers"))
    t = _t(*MEGATRON, f"{TC}.recompute_granularity=full", f"{TC}.recompute_method=block", f"{TC}.recompute_num_layers=4")
    assert t.overrides["model.gradient_checkpointing"] is True
    assert "verl block over 4 layers" in _fate(t, f"{TC}.recompute_granularity").text
    assert _fate(t, f"{TC}.recompute_method").kind == verl.IGNORED
    t = _t(*MEGATRON, f"{TC}.recompute_granularity=selective")
    assert t.overrides["model.gradient_checkpointing"] is False
    assert _fate(t, f"{TC}.recompute_granularity").kind == verl.IGNORED
    t = _t(f"{ARO}.model.enable_gradient_checkpointing=False")  # FSDP reads it
    assert t.overrides["model.gradient_checkpointing"] is False
    assert _fate(t, f"{ARO}.model.enable_gradient_checkpointing").kind == verl.MAPPED


def test_megatron_dtype_is_the_precision_and_pipeline_and_context_sizes_are_each_refused() -> None:
    assert _t(*MEGATRON, f"{A}.megatron.dtype=float16").overrides["model.precision"] == "16-mixed"
    t = _t(*MEGATRON)
    assert t.overrides["model.precision"] == "bf16-mixed" and _fate(t, f"{A}.megatron.dtype").kind == verl.MAPPED
    t = _t(*MEGATRON, "trainer.n_gpus_per_node=8", f"{A}.megatron.pipeline_model_parallel_size=2",
           f"{A}.megatron.context_parallel_size=2")
    refused = {f.key for f in t.refused}
    assert {f"{A}.megatron.pipeline_model_parallel_size", f"{A}.megatron.context_parallel_size"} <= refused


def test_fsdp_computes_in_mixed_precision_param_dtype_and_never_reads_fsdp_config_dtype() -> None:
    """verl 0.9.1's FSDP engine autocasts to mixed_precision.param_dtype (bf16 unless set, none when fp32)."""
    assert _t().overrides["model.precision"] == "bf16-mixed"
    mp = f"+{A}.fsdp_config.mixed_precision"
    assert _t(f"{mp}.param_dtype=fp32").overrides["model.precision"] == "32-true"
    assert _t(f"{mp}.param_dtype=fp16").overrides["model.precision"] == "16-mixed"
    t = _t(f"{A}.fsdp_config.dtype=float16")  # read by no FSDP code: still bf16
    assert t.overrides["model.precision"] == "bf16-mixed" and _fate(t, f"{A}.fsdp_config.dtype").kind == verl.IGNORED


def test_megatron_grad_offload_is_what_rlforge_does_its_gradients_are_freed_after_each_update() -> None:
    t = _t(*MEGATRON, f"{A}.megatron.grad_offload=True")  # a verl 0.9.0 key (0.9.1's param_offload releases them)
    assert _fate(t, f"{A}.megatron.grad_offload").kind == verl.MAPPED and not t.refused
    assert _fate(_t(*MEGATRON, f"{A}.megatron.grad_offload=False"), f"{A}.megatron.grad_offload").kind == verl.IGNORED
    assert _fate(_t(*MEGATRON, f"{REF}.megatron.grad_offload=True"), f"{REF}.megatron.grad_offload").kind == verl.IGNORED


def test_entropy_chunking_and_checkpointing_as_the_engine_reads_them() -> None:
    t = _t(f"{A}.entropy_from_logits_with_chunking=True")  # the actor's key fills fsdp_config's by interpolation
    assert _fate(t, f"{A}.entropy_from_logits_with_chunking").kind == verl.MAPPED
    assert _fate(_t(f"{A}.entropy_from_logits_with_chunking=False"),
                 f"{A}.entropy_from_logits_with_chunking").kind == verl.IGNORED
    t = _t(f"{A}.entropy_from_logits_with_chunking=True", f"{A}.fsdp_config.entropy_from_logits_with_chunking=False")
    assert "not read: verl's FSDP engine reads" in _fate(t, f"{A}.entropy_from_logits_with_chunking").text
    t = _t(f"{A}.entropy_checkpointing=True")  # entropy_coeff=0: the update computes no entropy
    assert "not reached" in _fate(t, f"{A}.entropy_checkpointing").text
    t = _t(f"{A}.entropy_checkpointing=True", f"{A}.entropy_coeff=0.001")
    assert _fate(t, f"{A}.entropy_checkpointing").kind == verl.MAPPED
    kl = f"{A}.use_kl_loss=True"  # a reference model of its own; without a KL term verl builds none
    assert "computes no entropy" in _fate(_t(kl, f"{REF}.entropy_from_logits_with_chunking=True"),
                                          f"{REF}.entropy_from_logits_with_chunking").text
    assert _fate(_t(f"{REF}.entropy_from_logits_with_chunking=True"), f"{REF}.entropy_from_logits_with_chunking").unread


def test_use_torch_compile_is_read_by_no_engine_and_the_reference_strategy_is_the_actors() -> None:
    t = _t(f"{A}.use_torch_compile=False", f"{A}.strategy=fsdp2", f"{REF}.strategy=fsdp2", f"{A}.use_kl_loss=True")
    assert "not read by verl 0.9.1's engines" in _fate(t, f"{A}.use_torch_compile").text
    assert _fate(t, f"{REF}.strategy").kind == verl.MAPPED
    t = _t(f"{A}.strategy=fsdp2", f"{REF}.strategy=fsdp2")  # no KL term: verl builds no reference model
    assert _fate(t, f"{REF}.strategy").kind == verl.IGNORED


def test_rollout_mode_and_the_servers_parallelism() -> None:
    assert _fate(_t(f"{R}.mode=sync"), f"{R}.mode").kind == verl.REFUSED  # verl 0.9.1 raises on it too
    async_ = _fate(_t(f"{R}.mode=async"), f"{R}.mode")  # vllm: rlforge's engine is vLLM's AsyncLLM too
    assert async_.kind == verl.MAPPED and "AsyncLLM" in async_.text
    assert _fate(_t(f"{R}.name=sglang", f"{R}.mode=async"), f"{R}.mode").kind == verl.IGNORED
    t = _t(f"{R}.data_parallel_size=1", f"{R}.expert_parallel_size=1")
    assert _fate(t, f"{R}.data_parallel_size").kind == _fate(t, f"{R}.expert_parallel_size").kind == verl.MAPPED
    assert _fate(_t(f"{R}.expert_parallel_size=8"), f"{R}.expert_parallel_size").kind == verl.IGNORED
    t = _t(f"{R}.name=sglang", f"{R}.gpu_memory_utilization=0.7")  # sglang reads it (mem_fraction_static)
    assert "read by verl's sglang engine" in _fate(t, f"{R}.gpu_memory_utilization").text


def test_sft_ignore_input_ids_mismatch_is_refused_rlforge_trains_each_turn_instead() -> None:
    base = ["data.train_files=/d/train.parquet", "model.path=/m"]
    t = prepare([*base, "data.ignore_input_ids_mismatch=True"], entry=SFT_ENTRY, refuse=False).translation
    assert _fate(t, "data.ignore_input_ids_mismatch").kind == verl.REFUSED
    t = prepare(base, entry=SFT_ENTRY, refuse=False).translation
    assert _fate(t, "data.ignore_input_ids_mismatch").kind == verl.MAPPED


def test_vllm_engine_kwargs_pass_through_after_the_rollout_keys_and_other_engines_are_theirs() -> None:
    ek = f"+{R}.engine_kwargs"
    t = _t(f"{ek}.vllm.async_scheduling=True", f"{ek}.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY",
           f"{R}.cudagraph_capture_sizes=[1,2]", f"{R}.max_model_len=2048", f"{ek}.vllm.max_model_len=4096",
           f"{ek}.vllm.swap_space=null", f"{ek}.sglang.attention_backend=triton")
    assert t.overrides["rollout.vllm.engine_kwargs"] == {  # verl: rollout.cudagraph_capture_sizes is set last
        "async_scheduling": True, "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY",
                                                         "cudagraph_capture_sizes": [1, 2]}}
    assert t.overrides["rollout.vllm.max_model_len"] == 4096  # engine_kwargs' entry wins over rollout.max_model_len
    assert "engine_kwargs.vllm.max_model_len after it" in _fate(t, f"{R}.max_model_len").text
    assert _fate(t, f"{R}.engine_kwargs.vllm.swap_space").kind == verl.MAPPED  # verl drops null entries; so does rlforge
    assert "swap_space" not in t.overrides["rollout.vllm.engine_kwargs"]
    assert "read only by verl's sglang server" in _fate(t, f"{R}.engine_kwargs.sglang.attention_backend").text
    sglang = _t(f"{R}.name=sglang", f"{ek}.sglang.attention_backend=triton", f"{ek}.vllm.async_scheduling=True")
    assert "the sglang rollout engine" in _fate(sglang, f"{R}.engine_kwargs.sglang.attention_backend").text
    assert _fate(sglang, f"{R}.engine_kwargs.vllm.async_scheduling").kind == verl.IGNORED
    assert "rollout.vllm.engine_kwargs" not in sglang.overrides


def test_adamw_betas_are_read_by_the_fsdp_engine_and_not_by_megatrons_adam() -> None:
    t = _t(f"{A}.optim.betas=[0.9,0.95]")
    assert t.overrides["actor.betas"] == [0.9, 0.95] and _fate(t, f"{A}.optim.betas").kind == verl.MAPPED
    t = _t(*MEGATRON, f"{A}.optim.betas=[0.9,0.98]")  # verl's megatron Adam: megatron's (0.9, 0.999)
    assert "actor.betas" not in t.overrides and _fate(t, f"{A}.optim.betas").kind == verl.IGNORED
    assert "not read by verl's megatron engine" in _fate(t, f"{A}.optim.betas").text and not t.refused
    assert _fate(_t(*MEGATRON), f"{A}.optim.betas").kind == verl.MAPPED  # the default asks for megatron's own


def test_megatron_transformer_config_fields_that_change_nothing_computed_are_not_refused() -> None:
    t = _t(*MEGATRON, f"+{TC}.sequence_parallel=True", f"+{TC}.persist_layer_norm=True", f"+{TC}.normalization=RMSNorm",
           f"+{TC}.attention_dropout=0.0", f"+{TC}.deallocate_pipeline_outputs=True")
    assert not t.refused and _fate(t, f"{TC}.normalization").kind == verl.MAPPED  # rlforge's models: RMSNorm
    assert _fate(t, f"{TC}.sequence_parallel").kind == verl.IGNORED
    t = _t(*MEGATRON, f"+{TC}.normalization=LayerNorm", f"+{TC}.hidden_dropout=0.1", f"+{TC}.fp8=hybrid",
           f"+{TC}.fp8_recipe=blockwise")
    refused = {f.key for f in t.refused if f.key.startswith(TC)}  # (the reference's copies of them too)
    assert refused == {f"{TC}.normalization", f"{TC}.hidden_dropout", f"{TC}.fp8"}
