"""Translations of verl keys behind rlforge features, checked against verl 0.9.1's own reading of them: parameter
offload (fsdp_config.param_offload / offload_policy -> strategy.fsdp.offload_params) and overlong prompts
(filter_overlong_prompts=False -> data.truncation=left, the agent loop's cut), the reference's megatron layout (the
actor's), balancing (trainer.balance_batch), model.override_config (model.config_overrides). Pure config work, no
models."""

from __future__ import annotations

import re

import pytest

from rlforge.config import verl
from rlforge.config.verl_launch import prepare
from rlforge.errors import ConfigError

A, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
GPUS = ["trainer.n_gpus_per_node=4", "trainer.total_training_steps=5", "actor_rollout_ref.rollout.name=vllm"]


def _t(*args: str) -> verl.Translation:
    return prepare([*GPUS, *args], refuse=False).translation


def _fate(t: verl.Translation, key: str) -> verl.Fate:
    (fate,) = [f for f in t.fates if f.key == key]
    return fate


def test_param_offload_lists_the_offloaded_roles_and_the_reference_always_offloads() -> None:
    t = _t(f"{A}.fsdp_config.param_offload=True", f"{A}.use_kl_loss=True", f"{REF}.fsdp_config.param_offload=False")
    assert t.overrides["strategy.fsdp.offload_params"] == ["actor", "ref"]
    assert _fate(t, f"{A}.fsdp_config.param_offload").kind == verl.MAPPED
    ref = _fate(t, f"{REF}.fsdp_config.param_offload")  # verl's forward-only reference offloads whatever it says
    assert ref.kind == verl.MAPPED and "does not read it" in ref.text
    # offload_policy is FSDP2's CPUOffloadPolicy: read only with strategy=fsdp2, and then param_offload is not
    t = _t(f"{A}.fsdp_config.offload_policy=True", f"{A}.strategy=fsdp2")
    assert t.overrides["strategy.fsdp.offload_params"] == ["actor"]
    assert "offload_policy=True offloads" in _fate(t, f"{A}.fsdp_config.param_offload").text
    t = _t(f"{A}.fsdp_config.offload_policy=True")  # strategy=fsdp (FSDP1): not read
    assert t.overrides["strategy.fsdp.offload_params"] == []
    assert _fate(t, f"{A}.fsdp_config.offload_policy").kind == verl.IGNORED


def test_param_offload_without_the_fsdp_strategy_is_not_claimed() -> None:
    t = prepare(["trainer.n_gpus_per_node=1", "trainer.total_training_steps=5", f"{A}.fsdp_config.param_offload=True"],
                refuse=False).translation
    assert t.overrides["strategy.name"] == "single" and "strategy.fsdp.offload_params" not in t.overrides
    assert "single strategy (one GPU) keeps parameters on the device" in _fate(t, f"{A}.fsdp_config.param_offload").text
    t = _t(f"{A}.fsdp_config.param_offload=True")  # no KL term: verl builds no reference model
    assert t.overrides["strategy.fsdp.offload_params"] == ["actor"]
    assert _fate(t, f"{REF}.fsdp_config.param_offload").kind == verl.IGNORED


def test_overlong_prompts_are_cut_on_the_left_whatever_data_truncation_says() -> None:
    assert _t().overrides["data.truncation"] == "left"  # verl's default: filter_overlong_prompts=False
    t = _t("data.filter_overlong_prompts=False", "data.truncation=error")
    assert t.overrides["data.truncation"] == "left" and t.overrides["data.filter_overlong_prompts"] is False
    assert "does not read data.truncation=error" in _fate(t, "data.truncation").text
    assert _fate(_t("data.filter_overlong_prompts=False", "data.truncation=left"), "data.truncation").text == ""
    t = _t("data.filter_overlong_prompts=True", "data.truncation=right")  # filtered first, in both
    assert t.overrides["data.truncation"] == "left" and t.overrides["data.filter_overlong_prompts"] is True
    assert "behind data.filter_overlong_prompts" in _fate(t, "data.truncation").text


def test_keys_verl_never_reads_are_mapped_where_their_value_is_what_verl_does() -> None:
    t = _t(f"{A}.grad_clip=1.0", f"{A}.optim.clip_grad=1.0")  # verl's engines clip at optim.clip_grad
    assert t.overrides["actor.grad_clip"] == 1.0 and _fate(t, f"{A}.grad_clip").kind == verl.MAPPED
    t = _t(f"{A}.grad_clip=0.5", f"{A}.optim.clip_grad=1.0")  # verl clips at 1.0 all the same
    assert t.overrides["actor.grad_clip"] == 1.0 and _fate(t, f"{A}.grad_clip").kind == verl.IGNORED
    assert _fate(_t("data.return_raw_chat=True"), "data.return_raw_chat").kind == verl.MAPPED
    assert "not read by verl 0.9.1" in _fate(_t("data.return_raw_chat=False"), "data.return_raw_chat").text


MEGATRON = ["--config-name=ppo_megatron_trainer", "algorithm.adv_estimator=grpo", f"{A}.use_kl_loss=True",
            f"{A}.megatron.tensor_model_parallel_size=2"]


def test_the_reference_megatron_layout_is_the_actors_or_refused_truthfully() -> None:
    t = _t(*MEGATRON, f"{REF}.megatron.tensor_model_parallel_size=2", f"{REF}.megatron.pipeline_model_parallel_size=1")
    assert t.overrides["strategy.megatron.tensor_parallel_size"] == 2 and not t.refused
    assert _fate(t, f"{REF}.megatron.tensor_model_parallel_size").kind == verl.MAPPED
    smaller = _fate(_t(*MEGATRON, f"{REF}.megatron.tensor_model_parallel_size=1"), f"{REF}.megatron.tensor_model_parallel_size")
    assert smaller.kind == verl.MAPPED and "less memory per GPU" in smaller.text
    t = _t(*MEGATRON, f"{REF}.megatron.tensor_model_parallel_size=4", f"{REF}.megatron.pipeline_model_parallel_size=2")
    assert {f.key.rsplit(".", 1)[1] for f in t.refused} == {"tensor_model_parallel_size", "pipeline_model_parallel_size"}
    assert "pipeline parallelism for the reference model" in _fate(t, f"{REF}.megatron.pipeline_model_parallel_size").text
    no_kl = _t(*MEGATRON[:2], f"{REF}.megatron.tensor_model_parallel_size=4")  # verl builds no reference model
    assert _fate(no_kl, f"{REF}.megatron.tensor_model_parallel_size").kind == verl.IGNORED


def test_balance_batch_is_rlforges() -> None:
    assert _t().overrides["trainer.balance_batch"] is True  # verl's default
    assert _t("trainer.balance_batch=False").overrides["trainer.balance_batch"] is False


def test_megatron_optimizer_offload_is_rlforges_and_parameters_stay_on_the_device() -> None:
    t = _t(*MEGATRON, f"{A}.megatron.optimizer_offload=True", f"{A}.megatron.param_offload=True")
    assert t.overrides["strategy.offload_optimizer"] is True  # the worker moves the state, whatever the strategy
    assert "keeps parameters on the device" in _fate(t, f"{A}.megatron.param_offload").text


def test_image_rows_keep_verls_column_and_say_vllm_has_not_run_with_images() -> None:
    t = _t("data.image_key=pics", f"{A}.freeze_vision_tower=True", "data.image_patch_size=16")
    assert t.overrides["data.image_key"] == "pics" and t.overrides["model.freeze_vision_tower"] is True
    refused = {f.key: f.text for f in t.refused}
    assert "data.image_patch_size" in refused and "actor_rollout_ref.rollout.name" not in refused
    engine = _fate(t, "actor_rollout_ref.rollout.name")  # image rows on vllm: mapped, saying it has not run yet
    assert t.overrides["rollout.name"] == "vllm" and "have not run yet" in engine.text
    hf = prepare(["trainer.n_gpus_per_node=4", "trainer.total_training_steps=5", "actor_rollout_ref.rollout.name=hf",
                  "data.image_key=images"], refuse=False).translation
    assert not hf.refused and hf.overrides["rollout.name"] == "hf"


def test_total_epochs_still_bounds_a_run_of_total_training_steps() -> None:
    """verl's loop ends after total_epochs passes even when total_training_steps is set (its schedule spans those)."""
    t = _t("trainer.total_epochs=2")  # GPUS sets total_training_steps=5
    assert t.overrides["trainer.total_steps"] == 5 and t.overrides["trainer.epoch_limit"] == 2
    t = prepare(["trainer.n_gpus_per_node=4", "trainer.total_epochs=3"], refuse=False).translation
    assert t.overrides["trainer.total_epochs"] == 3 and "trainer.epoch_limit" not in t.overrides


def test_log_val_generations_is_rlforges_and_states_where_verl_shows_a_table() -> None:
    t = _t("trainer.log_val_generations=10", "trainer.logger=[console,mlflow]")
    assert t.overrides["trainer.log_val_generations"] == 10 and _fate(t, "trainer.log_val_generations").text == ""
    wandb = _fate(_t("trainer.log_val_generations=10", "trainer.logger=[console,wandb]"), "trainer.log_val_generations")
    assert wandb.kind == verl.MAPPED and wandb.text == ""  # verl's table, as rlforge's wandb logger shows it
    swan = _fate(_t("trainer.log_val_generations=10", "trainer.logger=[swanlab]"), "trainer.log_val_generations")
    assert "verl shows them in swanlab as a table" in swan.text


def test_chat_template_kwargs_are_rlforges() -> None:
    t = _t("+data.apply_chat_template_kwargs.enable_thinking=False")
    assert t.overrides["data.apply_chat_template_kwargs"] == {"enable_thinking": False} and not t.refused


def test_calculate_log_probs_is_what_rlforges_engines_do() -> None:
    on = _fate(_t("actor_rollout_ref.rollout.calculate_log_probs=True"), "actor_rollout_ref.rollout.calculate_log_probs")
    assert on.kind == verl.MAPPED and "training/rollout_probs_diff_*" in on.text
    off = _fate(_t("actor_rollout_ref.rollout.calculate_log_probs=False"), "actor_rollout_ref.rollout.calculate_log_probs")
    assert off.kind == verl.IGNORED


def test_fsdp_size_over_all_gpus_is_rlforges_layout() -> None:
    assert _fate(_t(f"{A}.fsdp_config.fsdp_size=-1"), f"{A}.fsdp_config.fsdp_size").kind == verl.MAPPED
    assert _fate(_t(f"{A}.fsdp_config.fsdp_size=4"), f"{A}.fsdp_config.fsdp_size").kind == verl.MAPPED  # 4 GPUs
    hsdp = _fate(_t(f"{A}.fsdp_config.fsdp_size=2"), f"{A}.fsdp_config.fsdp_size")
    assert hsdp.kind == verl.IGNORED and "HSDP" in hsdp.text
    one_gpu = prepare(["trainer.n_gpus_per_node=1", "trainer.total_training_steps=5",
                       f"{A}.fsdp_config.reshard_after_forward=True"], refuse=False).translation
    assert _fate(one_gpu, f"{A}.fsdp_config.reshard_after_forward").text == "one GPU: nothing to shard"
    assert _fate(_t(f"{A}.fsdp_config.reshard_after_forward=True"), f"{A}.fsdp_config.reshard_after_forward").kind \
        == verl.MAPPED


def test_verl_sft_wandb_logger_and_run_name_are_rlforge_sfts() -> None:  # the logger itself: tests/test_sft.py
    from rlforge.config.verl_launch import SFT_ENTRY

    t = prepare(["data.train_files=/d/train.parquet", "model.path=/m", "trainer.logger=[console,wandb]"],
                entry=SFT_ENTRY, refuse=False).translation
    assert t.overrides["sft.loggers"] == ["wandb"] and _fate(t, "trainer.logger").kind == verl.MAPPED
    assert t.overrides["sft.run_name"] == "test"  # verl 0.9.1's default trainer.experiment_name: the run's name
    named = prepare(["data.train_files=/d/train.parquet", "model.path=/m", "trainer.experiment_name=qwen-sft-1"],
                    entry=SFT_ENTRY, refuse=False).translation
    assert named.overrides["sft.run_name"] == "qwen-sft-1" and _fate(named, "trainer.experiment_name").kind == verl.MAPPED


def test_model_override_config_is_model_config_overrides_and_its_model_config_entry_wins() -> None:
    m = "actor_rollout_ref.model"
    oc = f"+{m}.override_config"
    t = _t(f"{oc}.max_position_embeddings=32768", f"{oc}.attention_dropout=0.0")
    assert t.overrides["model.config_overrides"] == {"max_position_embeddings": 32768} and not t.refused
    assert "hf_overrides" in _fate(t, f"{m}.override_config.max_position_embeddings").text  # stated: vLLM too
    t = _t(f"{oc}.model_config.max_position_embeddings=10240", f"{oc}.rope_theta=5")  # verl: model_config alone
    assert t.overrides["model.config_overrides"] == {"max_position_embeddings": 10240}
    assert _fate(t, f"{m}.override_config.rope_theta").kind == verl.IGNORED


def test_verl_sft_chat_template_keys_are_rlforge_sfts() -> None:  # what they do: tests/test_sft_multiturn.py
    from rlforge.config.verl_launch import SFT_ENTRY

    base = ["data.train_files=/d/train.parquet", "model.path=/m"]
    t = prepare([*base, "model.custom_chat_template='{{ messages }}'", "+data.apply_chat_template_kwargs.effort=low",
                 "data.enable_thinking_key=think", "data.enable_thinking_default=false", "+data.chat_template=x"],
                entry=SFT_ENTRY, refuse=False).translation
    assert not t.refused
    assert t.overrides["model.chat_template"] == "{{ messages }}"
    assert t.overrides["data.apply_chat_template_kwargs"] == {"effort": "low"}
    assert t.overrides["sft.enable_thinking_key"] == "think" and t.overrides["sft.enable_thinking_default"] is False
    assert _fate(t, "data.chat_template").kind == verl.IGNORED  # 0.9.1 never reads it; v0.7 stops on it
    assert "model.chat_template" in _fate(t, "data.chat_template").text
    # verl 0.9.1's default 'none' is a string, bool('none') is True: rlforge reads it as unset and says so
    t = prepare(base, entry=SFT_ENTRY, refuse=False).translation
    assert t.overrides["sft.enable_thinking_default"] is None
    assert t.overrides["sft.enable_thinking_key"] == "enable_thinking"
    assert "bool('none')" in _fate(t, "data.enable_thinking_default").text
    t = prepare([*base, "data.enable_thinking_default=maybe"], entry=SFT_ENTRY, refuse=False).translation
    assert _fate(t, "data.enable_thinking_default").kind == verl.REFUSED


def test_what_verl_0_9_1s_main_ppo_reads_differs_from_its_dapo_recipe_trainer() -> None:
    """Found by reading verl 0.9.1's v1 trainer (main_ppo's default): legacy reward keys unread, the replay buffer's
    dynamic sampling (metric 'reward', no round limit), bypass mode without its legacy loss."""
    legacy = ["reward_model.reward_manager=dapo", "custom_reward_function.path=/r.py"]
    main = _t(*legacy)
    assert main.overrides["reward.file"] == "/r.py"  # honoured, and the difference stated
    assert "its main_ppo leaves this legacy key unread" in _fate(main, "custom_reward_function.path").text
    dapo = prepare(["--config-name=dapo_trainer", *GPUS, *legacy], refuse=False).translation
    assert _fate(dapo, "custom_reward_function.path").text == "moved to reward.custom_reward_function.path, as verl " \
                                                              "moves it"
    f = "algorithm.filter_groups"
    t = _t(f"{f}.enable=True", f"{f}.max_num_gen_batches=10", "data.gen_batch_size=1536", "data.train_batch_size=512")
    assert t.overrides["algorithm.filter_metric"] == "reward" and not t.refused  # verl's default metric
    assert t.overrides["algorithm.max_gen_batches"] == 1000
    assert "ignores it" in _fate(t, f"{f}.max_num_gen_batches").text
    assert _fate(t, "data.gen_batch_size").kind == verl.IGNORED
    t = _t(f"{f}.enable=True", f"{f}.metric=seq_reward")
    assert "looks 'seq_reward' up in the reward function's extra info" in _fate(t, f"{f}.metric").text
    rc = "algorithm.rollout_correction"
    t = _t(f"{rc}.bypass_mode=True", f"{rc}.rollout_is=token", f"{rc}.loss_type=reinforce")
    assert t.overrides["actor.reuse_rollout_log_probs"] is True and "algorithm.rollout_is" not in t.overrides
    assert _fate(t, f"{rc}.rollout_is").kind == _fate(t, f"{rc}.loss_type").kind == verl.IGNORED
    t = _t("actor_rollout_ref.rollout.calculate_log_probs=False", f"{rc}.rollout_is=token")
    assert "algorithm.rollout_is" not in t.overrides and "only with the engine's log-probs" in _fate(
        t, f"{rc}.rollout_is").text
    t = _t(f"{rc}.rollout_is=token", f"{rc}.rollout_is_threshold=null")  # verl computes no IS weights then
    assert t.overrides["algorithm.rollout_is"] is None and not t.refused


def test_the_fully_async_and_one_step_off_trainers_keep_the_configured_loss_in_bypass_mode() -> None:
    """verl's SeparateRayPPOTrainer (under both) calls apply_bypass_mode, which sets policy_loss.loss_mode=bypass_mode
    on the driver's config only, after the Ray workers built their loss from theirs (engine_workers.py): the configured
    loss runs on the engine's log-probs, without IS weights (skipped in bypass mode), as under main_ppo;
    trainer.use_v1 is read by main_ppo alone."""
    rc = "algorithm.rollout_correction"
    bypass = [f"{rc}.bypass_mode=True", f"{rc}.rollout_is=token", f"{rc}.rollout_is_threshold=2.0",
              f"{rc}.loss_type=reinforce", f"{A}.policy_loss.loss_mode=gspo"]
    for name in ("fully_async_ppo_trainer", "one_step_off_ppo_trainer"):
        t = prepare([f"--config-name={name}", *GPUS, *bypass], refuse=False).translation
        assert t.overrides["actor.policy_loss"] == "gspo" and t.overrides["actor.reuse_rollout_log_probs"] is True
        assert "algorithm.rollout_is" not in t.overrides and _fate(t, f"{rc}.loss_type").kind == verl.IGNORED
        assert "verl's " + name.split("_ppo")[0].replace("_", "-") in _fate(t, f"{rc}.bypass_mode").text
        assert not [f for f in t.refused if not f.key.startswith("async_training.")]  # fully-async's staleness
    t = prepare(["--config-name=one_step_off_ppo_trainer", *GPUS, "algorithm.filter_groups.enable=True"],
                refuse=False).translation  # dynamic sampling is main_ppo's and the DAPO recipe's only
    assert t.overrides["trainer.pipeline"] == "one_step_off"  # its own entry point: rlforge's pipeline option
    assert t.overrides["algorithm.filter_groups"] is False and "train every group" in _fate(
        t, "algorithm.filter_groups.enable").text
    main = _t(*bypass)
    assert main.overrides["actor.policy_loss"] == "gspo" and main.overrides["actor.reuse_rollout_log_probs"] is True
    dapo = prepare(["--config-name=dapo_trainer", *GPUS, "trainer.use_v1=False"], refuse=False).translation
    assert _fate(dapo, "trainer.use_v1").kind == verl.IGNORED and not dapo.refused  # main_dapo never reads it
    assert _fate(_t("trainer.use_v1=False"), "trainer.use_v1").kind == verl.REFUSED


def test_verl_keys_whose_meaning_needed_a_closer_look() -> None:
    t = _t("algorithm.adv_estimator=gae", "trainer.critic_warmup=20")
    assert t.overrides["trainer.critic_warmup"] == 19  # verl updates the actor from its step 20 (counted from 1)
    assert _fate(_t("trainer.val_only=True", "trainer.val_before_train=False"), "trainer.val_only").kind == verl.IGNORED
    assert _fate(_t(f"+{A}.use_rollout_log_probs=True"), f"{A}.use_rollout_log_probs").kind == verl.IGNORED
    t = _t("algorithm.adv_estimator=gdpo", "algorithm.norm_adv_by_std_in_grpo=False")
    assert "always divides by the std" in _fate(t, "algorithm.norm_adv_by_std_in_grpo").text
    assert "algorithm.norm_adv_by_std" not in t.overrides
    t = _t("model_engine=megatron", f"{A}.optim.weight_decay=0.1", f"{A}.optim.lr_warmup_init=1e-7")
    assert "does not decay biases" in _fate(t, f"{A}.optim.weight_decay").text
    assert _fate(t, f"{A}.optim.lr_warmup_init").kind == verl.REFUSED
    t = _t(f"{A}.loss_agg_mode=seq-mean-token-sum-norm")
    assert "longest response of each micro-batch" in _fate(t, f"{A}.loss_scale_factor").text
    assert _fate(_t(f"{A}.loss_agg_mode=seq-mean-token-sum-norm", f"{A}.loss_scale_factor=512"),
                 f"{A}.loss_scale_factor").text == ""
    assert _fate(_t("reward.reward_manager.name=prime"), "reward.reward_manager.name").kind == verl.REFUSED  # as verl
    assert _fate(_t("trainer.use_v1=False"), "trainer.use_v1").kind == verl.REFUSED


def test_chat_template_kwargs_stay_nested_and_sft_template_keys_follow_the_trainer() -> None:
    from rlforge.config.verl_launch import SFT_ENTRY

    t = _t("+data.apply_chat_template_kwargs.x.y=1", "+data.apply_chat_template_kwargs.enable_thinking=False")
    assert t.overrides["data.apply_chat_template_kwargs"] == {"x": {"y": 1}, "enable_thinking": False}
    assert _fate(_t("data.apply_chat_template_kwargs=5"), "data.apply_chat_template_kwargs").kind == verl.REFUSED
    v07 = ["--config-name=sft_trainer", "data.train_files=/d.parquet", "model.partial_pretrain=/m"]
    t = prepare([*v07, "data.multiturn.enable=false"], entry=SFT_ENTRY, refuse=False).translation
    assert t.overrides["sft.enable_thinking_key"] == ""  # verl's single-turn SFTDataset reads no such column
    t = prepare([*v07, "data.multiturn.enable=true", "data.chat_template=abc"], entry=SFT_ENTRY,
                refuse=False).translation
    assert t.overrides["sft.enable_thinking_key"] == "enable_thinking"
    assert _fate(t, "data.chat_template").kind == verl.REFUSED  # v0.7's fsdp_sft_trainer stops on it too


def test_v0_7_sft_reads_data_enable_thinking_key_and_a_critic_may_normalize_alone() -> None:
    from rlforge.config.verl_launch import SFT_ENTRY

    v07 = ["--config-name=sft_trainer", "data.train_files=/d.parquet", "model.partial_pretrain=/m",
           "data.multiturn.enable=true"]
    t = prepare([*v07, "+data.enable_thinking_key=think"], entry=SFT_ENTRY, refuse=False).translation
    assert t.overrides["sft.enable_thinking_key"] == "think"  # v0.7's dataset gets the data section
    assert _fate(t, "data.multiturn.enable_thinking_key").kind == verl.IGNORED
    t = prepare([*v07, "data.multiturn.messages_key=conv", "+data.messages_key=chat"], entry=SFT_ENTRY,
                refuse=False).translation
    assert t.overrides["sft.messages_key"] == "chat" and _fate(t, "data.multiturn.messages_key").kind == verl.IGNORED
    t = _t("algorithm.adv_estimator=gae", "critic.loss_agg_mode=seq-mean-token-sum-norm", "critic.loss_scale_factor=64")
    assert t.overrides["algorithm.norm_length"] == 64 and not t.refused  # the actor's loss does not read it



def test_a_config_file_of_ones_own_on_dapo_trainer_runs_as_the_dapo_recipe(tmp_path) -> None:
    (tmp_path / "my_dapo.yaml").write_text("defaults:\n  - dapo_trainer\n  - _self_\n")
    f = "algorithm.filter_groups"
    args = [*GPUS, f"{f}.enable=True", f"{f}.metric=acc", f"{f}.max_num_gen_batches=10"]
    t = prepare([f"--config-path={tmp_path}", "--config-name=my_dapo", *args], refuse=False).translation
    assert t.overrides["algorithm.max_gen_batches"] == 10  # the recipe's rounds, not main_ppo's "no limit"


def test_hydra_s_own_settings_are_checked_against_hydra_s_config_and_ignored() -> None:
    """hydra.run.dir, hydra.job.chdir, hydra/job_logging=disabled (a group choice): verl's Hydra takes them, and they
    configure Hydra, not the job; a key Hydra lacks is refused as Hydra refuses it."""
    t = _t("hydra.run.dir=/tmp/out", "hydra.job.chdir=False", "hydra/job_logging=disabled", "hydra.output_subdir=null")
    for key in ("hydra.run.dir", "hydra.job_logging", "hydra.output_subdir"):
        assert _fate(t, key).kind == verl.IGNORED and "Hydra's own settings" in _fate(t, key).text, key
    assert not t.refused and _fate(t, "hydra.job.chdir").kind == verl.MAPPED  # the launch's folder, as verl's
    chdir = _fate(_t("hydra.job.chdir=True"), "hydra.job.chdir")  # verl's job would run in Hydra's output folder
    assert chdir.kind == verl.REFUSED and "relative paths would point there" in chdir.text
    # Hydra composes them, so what verl's Hydra refuses is refused with its reason
    for given, reason in [("hydra.no_such=1", "Could not override 'hydra.no_such'"),
                          ("+hydra.run.dir=/tmp/x", "An item is already at 'hydra.run.dir'"),
                          ("~hydra.run.dir", "Error merging override ~hydra.run.dir"),
                          ("hydra/job_logging=nonexistent", "Could not find 'hydra/job_logging/nonexistent'"),
                          ("hydra.job.chdir=maybe", "Error merging override hydra.job.chdir=maybe")]:
        with pytest.raises(ConfigError, match=re.escape(reason) + r".*verl 0.9.1's Hydra refuses it too"):
            _t(given)


def test_an_estimator_verl_does_not_have_is_not_called_verl_s() -> None:
    """verl 0.9.1 stops on an adv_estimator its registry lacks (ZeroSearch's 'reinforce'); grpo_passk is verl's and not
    rlforge's; an older verl's fsdp_config.grad_offload is named as dropped."""
    t = _t("algorithm.adv_estimator=reinforce")
    fate = _fate(t, "algorithm.adv_estimator")
    assert fate.kind == verl.REFUSED and fate.stops and fate.text.startswith("not an advantage estimator of verl 0.9.1")
    assert t.report()[0].startswith("no algorithm (algorithm.adv_estimator is refused); ")  # not the default's grpo
    fate = _fate(_t("algorithm.adv_estimator=grpo_passk"), "algorithm.adv_estimator")
    assert fate.kind == verl.REFUSED and not fate.stops and fate.text.startswith("verl's adv_estimator=grpo_passk")
    with pytest.raises(ConfigError, match=r"verl 0.9.1's key for it: none: verl 0.9.1 dropped gradient offload"):
        _t(f"{A}.fsdp_config.grad_offload=False")


def test_test_freq_off_means_no_validation_after_training_either() -> None:
    """verl validates every test_freq steps and after the last where test_freq > 0, never where it is <= 0."""
    off = _t("trainer.test_freq=-1")
    assert off.overrides["trainer.val_every"] == 0 and off.overrides["trainer.val_at_end"] is False
    on = _t("trainer.test_freq=5")
    assert on.overrides["trainer.val_every"] == 5 and on.overrides["trainer.val_at_end"] is True
    null = _fate(_t("trainer.test_freq=null"), "trainer.test_freq")  # verl: TypeError after the first step
    assert null.kind == verl.REFUSED and null.stops and "trainer.test_freq=-1 means no validation" in null.text


def test_hydra_s_own_settings_are_ignored_by_the_sft_entry_too_and_a_config_file_s_keys_are_the_launch_s(
        tmp_path) -> None:
    t = prepare(["data.train_files=chat.jsonl", "model.path=builtin:tiny-arith", "hydra.run.dir=/tmp/out"],
                "verl.trainer.sft_trainer", refuse=False).translation
    assert _fate(t, "hydra.run.dir").kind == verl.IGNORED and not t.refused
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\nactor_rollout_ref:\n  actor:\n"
                                        "    clip_ratio_high: 0.28\n")
    lines = _t(f"--config-path={tmp_path}", "--config-name=mine").report()
    own = lines[lines.index(next(x for x in lines if x.startswith("-- the launch's own keys"))):
                lines.index(next(x for x in lines if x.startswith("-- verl's defaults")))]
    assert any(x.startswith(f"mapped      {A}.clip_ratio_high -> actor.clip_ratio_high = 0.28") for x in own), own


def test_an_unknown_config_name_beside_a_config_path_that_is_no_folder_says_so(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"does not know verl's config 'my_trainer'.* --config-path=\S+ is not a "
                                          r"folder here, so no my_trainer.yaml of the launch's own was found there"):
        prepare([f"--config-path={tmp_path / 'absent'}", "--config-name=my_trainer", *GPUS], refuse=False)


def test_a_recipe_config_rlforge_has_as_an_algorithm_names_it(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"does not know verl's config 'prime_trainer'.* verl-recipe's PRIME trainer "
                                          r"has its counterpart in `rlforge fit --algo prime` \(docs/algorithms/prime"):
        prepare([f"--config-path={tmp_path / 'absent'}", "--config-name=prime_trainer", *GPUS], refuse=False)


def test_an_unknown_policy_loss_stops_as_in_verl_and_lists_the_losses() -> None:
    fate = _fate(_t(f"{A}.policy_loss.loss_mode=bogus"), f"{A}.policy_loss.loss_mode")
    assert fate.kind == verl.REFUSED and fate.stops
    assert "not a policy loss of verl 0.9.1, which stops on it" in fate.text and "vanilla, gspo, gpg" in fate.text


def test_keys_verl_does_not_read_in_the_launch_are_marked_apart_from_infrastructure() -> None:
    """An ignored key is 'unread' where verl 0.9.1 does not read it in that launch either (a feature left off, a role
    without a model, a field no code reads); a key verl reads that changes only speed or memory is not."""
    t = _t(f"{A}.use_dynamic_bsz=True", f"{A}.ppo_max_token_len_per_gpu=4096", f"{A}.ppo_micro_batch_size_per_gpu=2",
           f"{REF}.fsdp_config.param_offload=True", f"{A}.use_torch_compile=False",
           f"{A}.fsdp_config.forward_prefetch=True", "global_profiler.tool=nsys")
    unread = {f.key for f in t.fates if f.unread}
    assert {f"{A}.ppo_micro_batch_size_per_gpu", f"{REF}.fsdp_config.param_offload",  # no KL: no reference model
            f"{A}.use_torch_compile"} <= unread
    for key in (f"{A}.fsdp_config.forward_prefetch", "global_profiler.tool"):  # read by verl: speed, profiling
        assert _fate(t, key).kind == verl.IGNORED and key not in unread
    assert all(f.kind == verl.IGNORED for f in t.fates if f.unread)
    assert f"({len(unread)} of them 'unread': not read by verl 0.9.1 either;" in t.report()[0]
    assert any(line.startswith(f"unread      {A}.use_torch_compile: ") for line in t.report())


def test_a_key_gated_by_a_refused_feature_is_read_where_the_launch_turns_it_on() -> None:
    """verl reads mtp.* with mtp.enable, the pipeline-split keys with PP > 1, recompute_modules with selective
    recomputation: there they are not 'unread' (the launch is refused for the feature, or they change speed only);
    uneven pipeline stages change the model at any pipeline size, so they are refused."""
    m = "actor_rollout_ref.model"
    off = _t(f"{m}.mtp.detach_encoder=True")
    on = _t(f"{m}.mtp.enable=True", f"{m}.mtp.detach_encoder=True")
    assert _fate(off, f"{m}.mtp.detach_encoder").unread and not _fate(on, f"{m}.mtp.detach_encoder").unread
    mg = f"{A}.megatron.override_transformer_config"
    stages = _fate(_t("model_engine=megatron", f"+{mg}.num_layers_in_first_pipeline_stage=5"),
                   f"{mg}.num_layers_in_first_pipeline_stage")
    assert stages.kind == verl.REFUSED and "uneven pipeline stages" in stages.text
    r = f"{A}.megatron.override_transformer_config"
    sel = _t("model_engine=megatron", f"+{r}.recompute_granularity=selective", f"+{r}.recompute_modules=[core_attn]")
    assert not _fate(sel, f"{r}.recompute_modules").unread


def test_gen_batch_size_without_dynamic_sampling_is_verl_s_prompts_per_step() -> None:
    """verl's data loader draws data.gen_batch_size prompts a step where no groups are filtered."""
    same = _fate(_t("data.train_batch_size=32", "+data.gen_batch_size=32"), "data.gen_batch_size")
    assert same.kind == verl.MAPPED
    assert _fate(_t("+data.gen_batch_size=0"), "data.gen_batch_size").unread  # verl reads 0 as null
    chunks = _fate(_t("data.train_batch_size=32", "+data.gen_batch_size=8"), "data.gen_batch_size")  # main_ppo
    assert chunks.kind == verl.MAPPED and "8 at a time" in chunks.text
    odd = _fate(_t("data.train_batch_size=32", "+data.gen_batch_size=96"), "data.gen_batch_size")
    assert odd.kind == verl.REFUSED and odd.stops and "positive multiple of gen_batch_size" in odd.text
    dapo = prepare(["--config-name=dapo_trainer", *GPUS, "data.train_batch_size=32", "data.gen_batch_size=96"],
                   refuse=False).translation  # the recipe's loader draws gen_batch_size prompts a step
    other = _fate(dapo, "data.gen_batch_size")
    assert other.kind == verl.REFUSED and "set data.train_batch_size to it" in other.text


def test_the_v1_trainers_sampler_keys_are_read_in_sync_mode() -> None:
    """main_ppo's v1 trainer builds its replay buffer in sync mode too: a custom sampler class or refilling failed
    groups is a feature rlforge lacks, not a key of the asynchronous modes."""
    s = "trainer.v1.sampler"
    t = _t(f"{s}.custom_sampler.path=/x/sampler.py", f"{s}.custom_sampler.name=Mine", f"{s}.sync_refill_failed_groups=True")
    for key in (f"{s}.custom_sampler.path", f"{s}.sync_refill_failed_groups"):
        assert _fate(t, key).kind == verl.REFUSED, key
    default = _t()
    assert _fate(default, f"{s}.custom_sampler.path").kind == verl.MAPPED
    half = _fate(_t(f"{s}.custom_sampler.path=/x/sampler.py"), f"{s}.custom_sampler.path")  # verl needs both
    assert half.kind == verl.IGNORED and half.unread and "both" in half.text
    assert _fate(default, "trainer.v1.separate_async.parameter_sync_step").unread  # trainer_mode=sync


def test_hydra_s_env_set_is_refused_not_dropped() -> None:
    """verl's Hydra sets hydra.job.env_set for the job; rlforge does not, so it says so instead of ignoring it."""
    fate = _fate(_t("+hydra.job.env_set.FOO=bar"), "hydra.job.env_set.FOO")
    assert fate.kind == verl.REFUSED and "export them before the command" in fate.text
