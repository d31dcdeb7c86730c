"""Launches written for an older verl or a fork of it (issue 27, an adversarial pass on Search-R1, rllm, TinyZero,
simpleRL, Skywork-OR1, verl-tool and RAGEN scripts): keys verl 0.9.1 lacks are refused as verl stops on them, with
verl 0.9.1's key where there is one; none is swallowed by a section's catch-all rule. Also the values verl 0.9.1's own
checks stop on (and those it converts or accepts), and the adversarial passes' findings on what verl reads."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from rlforge.config import verl
from rlforge.config.verl_launch import SFT_ENTRY, prepare
from rlforge.config.verl_stale import FIELDS
from rlforge.errors import ConfigError

ARO = "actor_rollout_ref"
BASE = ["algorithm.adv_estimator=grpo", f"{ARO}.rollout.name=vllm", f"{ARO}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{ARO}.rollout.log_prob_micro_batch_size_per_gpu=8", "data.train_files=/d/train.parquet",
        f"{ARO}.model.path=/m"]


def tr(*overrides: str, **kw) -> verl.Translation:
    return prepare([*BASE, *overrides], refuse=False, **kw).translation


def fate(t: verl.Translation, key: str) -> verl.Fate:
    return next(f for f in t.fates if f.key == key)


def test_a_field_verls_config_class_lacks_is_refused_as_verl_stops_on_it() -> None:
    t = tr(f"+{ARO}.rollout.n_agent=5", f"+{ARO}.rollout.val_temperature=0.6",
           f"+{ARO}.actor.fsdp_config.grad_offload=true", f"+{ARO}.rollout.multi_turn.terminate_on_answer=True")
    n_agent = fate(t, f"{ARO}.rollout.n_agent")
    assert n_agent.kind == verl.REFUSED and "RolloutConfig" in n_agent.text and f"{ARO}.rollout.n " in n_agent.text
    assert f"{ARO}.rollout.val_kwargs.temperature" in fate(t, f"{ARO}.rollout.val_temperature").text
    assert "FSDPEngineConfig" in fate(t, f"{ARO}.actor.fsdp_config.grad_offload").text
    assert "MultiTurnConfig" in fate(t, f"{ARO}.rollout.multi_turn.terminate_on_answer").text
    assert "is not in rlforge" not in n_agent.line()  # verl's own stop, not a missing feature


def test_a_field_of_a_fields_own_config_class_is_checked_too() -> None:
    t = tr(f"+{ARO}.rollout.disaggregation.zzfoo=1", f"+{ARO}.actor.adaptive_entropy.enabled=True")
    assert "DisaggregationConfig" in fate(t, f"{ARO}.rollout.disaggregation.zzfoo").text
    entropy = fate(t, f"{ARO}.actor.adaptive_entropy.enabled").text  # the first missing part is what verl names
    assert "'adaptive_entropy' is not a field of verl 0.9.1's FSDPActorConfig" in entropy


def test_keys_verl_passes_on_or_reads_from_new_entries_are_not_refused() -> None:
    t = tr("+reward.custom_reward_function.reward_kwargs.format_score=0.1", "+algorithm.pf_ppo.zz=1")
    kwargs = fate(t, "reward.custom_reward_function.reward_kwargs.format_score")  # verl passes them to the function
    assert kwargs.kind == verl.IGNORED and "read only with custom_reward_function.path" in kwargs.text
    assert "verl would run without it" in fate(t, "algorithm.pf_ppo.zz").text
    wrong = fate(tr("trainer.n_gpus_per_node=abc"), "trainer.n_gpus_per_node")  # a refusal in the report, not a raise
    assert wrong.kind == verl.REFUSED and wrong.stops and "verl 0.9.1 stops on this value" in wrong.text


def test_fields_verl_has_beyond_its_yaml_defaults_are_not_refused() -> None:
    # FSDPEngineConfig.mixed_precision and RolloutConfig.moe_tensor_parallel_size are fields absent from the YAML
    t = tr(f"+{ARO}.actor.fsdp_config.mixed_precision.param_dtype=bf16", f"+{ARO}.rollout.moe_tensor_parallel_size=2")
    assert not any(f.stops for f in t.fates)
    # below a field that takes any mapping (engine_kwargs.vllm, override_config, reward_kwargs) anything goes
    t = tr(f"+{ARO}.rollout.engine_kwargs.vllm.enforce_eager=true", "+reward.reward_kwargs.anything=1")
    assert not any(f.stops for f in t.fates)


def test_the_shipped_fields_are_verls() -> None:
    pytest.importorskip("verl", reason="verl 0.9.1 is installed by scripts/setup.sh test")
    shipped = json.loads(FIELDS.read_text(encoding="utf-8"))["fields"]
    for target, fields in shipped.items():
        module, _, name = target.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert sorted(f.name for f in dataclasses.fields(cls)) == sorted(fields), target
    rollout = shipped["verl.workers.config.RolloutConfig"]  # a field's own config class: where verl stops too
    assert rollout["disaggregation"].endswith("DisaggregationConfig") and rollout["n"] is None


def test_a_key_verl_never_reads_is_refused_with_its_verl_name() -> None:
    t = tr("+trainer.remove_previous_ckpt=True", "+algorithm.no_think_rl=True", "+data.shuffle_train_dataloader=False")
    assert "max_actor_ckpt_to_keep and trainer.max_critic_ckpt_to_keep (1: only the last" in \
        fate(t, "trainer.remove_previous_ckpt").text
    assert "verl would run without it" in fate(t, "algorithm.no_think_rl").text  # AlgoConfig is never built
    assert "data.shuffle" in fate(t, "data.shuffle_train_dataloader").text


def test_every_unknown_override_is_named_at_once_with_verls_key() -> None:
    with pytest.raises(ConfigError) as err:
        tr(f"{ARO}.rollout.val_temperature=0.6", f"{ARO}.rollout.n_val=8", "trainer.remove_clip=True")
    text = str(err.value)
    assert text.startswith("3 overrides verl 0.9.1 refuses")
    assert f"verl 0.9.1's key for it: {ARO}.rollout.val_kwargs.n" in text
    assert "stops on it, with '+' too," in text  # RolloutConfig: '+' does not help
    assert "+trainer.remove_clip=True" in text  # a plain section: Hydra's own advice


def test_an_own_files_top_level_variables_are_ignored_and_their_values_used(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        "defaults: [ppo_trainer, _self_]\nmodel_path: /tmp/my-model\nmbs: 4\nextra_section: {a: 1}\n"
        "actor_rollout_ref:\n  model: {path: '${model_path}'}\n  actor: {ppo_micro_batch_size_per_gpu: '${mbs}'}\n"
        "  rollout: {name: vllm, log_prob_micro_batch_size_per_gpu: 8}\nalgorithm: {adv_estimator: grpo}\n",
        encoding="utf-8")
    t = prepare([f"--config-path={tmp_path}", "--config-name=mine", "+common.lr=1e-6",
                 f"{ARO}.actor.optim.lr=${{common.lr}}"], refuse=False).translation
    assert fate(t, "model_path").kind == verl.IGNORED and "never reads" in fate(t, "model_path").text
    assert t.overrides["model.path"] == "/tmp/my-model" and t.overrides["actor.ppo_micro_batch_size"] == 4
    assert fate(t, "common.lr").kind == verl.IGNORED and t.overrides["actor.lr"] == 1e-6  # a section of variables
    assert fate(t, "extra_section.a").kind == verl.REFUSED  # a section of one's own that no key uses


def test_a_missing_config_path_falls_back_to_the_shipped_config_and_says_so() -> None:
    t = prepare(["--config-path=/no/such/folder", "--config-name=ppo_trainer", *BASE], refuse=False).translation
    assert "--config-path=/no/such/folder is not a folder here" in t.report()[0]


def test_a_v0_7_sft_launch_given_to_rlforge_verl_sft_is_read_as_v0_7s_config() -> None:
    args = ["data.train_files=/d/t.parquet", "data.prompt_key=extra_info", "data.response_key=extra_info",
            "+data.prompt_dict_keys=[question]", "+data.response_dict_keys=[answer]", "data.micro_batch_size=8",
            "model.partial_pretrain=/m", "trainer.total_epochs=2"]
    t = prepare(args, entry=SFT_ENTRY, refuse=False).translation
    assert t.config == "sft_trainer" and "fsdp_sft_trainer" in t.report()[0]
    assert t.overrides["sft.lr"] == 1e-5 and t.overrides["sft.init"] == "/m"  # v0.7's default lr, not 0.9.1's 1e-3
    t = prepare(["data.train_files=/d/t.parquet", "model.path=/m"], entry=SFT_ENTRY, refuse=False).translation
    assert t.config == "sft_trainer_engine"  # 0.9.1's keys: its own config


def test_a_projects_own_reward_manager_is_refused_on_the_key_that_names_it() -> None:
    own = fate(tr("reward_model.reward_manager=yr"), "reward_model.reward_manager")
    assert own.kind == verl.REFUSED and own.value == "yr" and "main_ppo never reads this legacy key" in own.text
    moved = prepare(["--config-name=dapo_trainer", *BASE, "reward_model.reward_manager=yr"], refuse=False).translation
    assert "does not register" in fate(moved, "reward_model.reward_manager").text  # the DAPO recipe moves it: stops
    verls = tr("reward.reward_manager.name=remote")
    assert fate(verls, "reward.reward_manager.name").line().endswith("is not in rlforge")  # verl has it, rlforge not


def test_no_section_of_verls_config_swallows_a_made_up_key_with_another_keys_reason() -> None:
    """``+SECTION.zzfoo=1`` for every section of verl's ppo_trainer tree (the second adversarial pass's sweep): refused
    (verl stops on it, or never reads it), or a section's entry verl passes on; never a crash."""
    from rlforge.config.verl_tree import default_tree

    sections: list[str] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            sections.append(path)
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else k)

    walk(default_tree("ppo_trainer"), "")
    base = [*BASE, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2",
            f"{ARO}.actor.use_kl_loss=True", f"{ARO}.ref.log_prob_micro_batch_size_per_gpu=8"]
    passed_on = ("engine_kwargs", "override_config", "apply_chat_template_kwargs", "distillation", "trainer.v1",
                 "kw_args", "reward_model.rollout", "reward.reward_model.rollout")
    for section in sections[1:]:
        key = f"{section}.zzfoo"
        f = fate(prepare([*base, f"+{key}=1"], refuse=False).translation, key)
        assert f.kind == verl.REFUSED or any(p in section for p in passed_on), (key, f.kind, f.text)
    assert len(sections) > 100


@pytest.mark.parametrize(("override", "takes"), [
    ("trainer.v1.sampler.max_off_policy_strategy=bogus", "'drop' or 'wait'"),
    ("trainer.v1.sampler.max_off_policy_threshold=-3", "a positive integer or null"),
    ("trainer.v1.sampler.max_off_policy_threshold=1.5", "a positive integer or null"),
    ("skip.rollout.action=random", "'cache' or 'repeat'"),
    ("skip.async_rollout.steps=[1,a]", "a list of integers"),
    ("skip.rollout.steps=[true]", "a list of integers"),
    ("skip.rollout.dump_dir=null", "a string"),
    ("skip.rollout.enable=null", "true or false"),  # SkipManagerConfig asserts a bool: not the feature's refusal
    ("skip.rollout_tq.enable=maybe", "true or false"),
])
def test_a_value_verl_checks_though_it_does_not_use_it_stops_as_verl_stops(override: str, takes: str) -> None:
    """main_ppo's v1 replay buffer checks its staleness bound in sync mode, and SkipManagerConfig its fields with
    skipping off: a value they reject stops verl, so it is refused (helper-39's re-test)."""
    key = override.split("=", 1)[0]
    refused = fate(tr(override), key)
    assert refused.kind == verl.REFUSED and refused.stops and takes in refused.text
    good = {"max_off_policy_strategy": "wait", "max_off_policy_threshold": "2", "action": "repeat", "steps": "[1,2]",
            "dump_dir": "/tmp/d", "enable": "false"}
    kept = fate(tr(f"{key}={good[key.rsplit('.', 1)[1]]}"), key)
    assert kept.kind == (verl.MAPPED if key.endswith("enable") else verl.IGNORED) and not kept.unread
    dapo = fate(tr("--config-name=dapo_trainer", override), key)  # the DAPO recipe's trainer has no v1 sampler
    assert dapo.kind == (verl.IGNORED if "sampler" in key else verl.REFUSED)


def test_a_launch_without_training_or_validation_files_stops_as_verl_stops() -> None:
    """verl 0.9.1 builds both datasets in every launch (RLHFDataset: null is a TypeError, [] an empty concatenation);
    a dataset class of the launch's own may read no files."""
    for override, split in (("data.val_files=null", "validation"), ("data.val_files=[]", "validation"),
                            ("data.train_files=null", "training")):
        refused = fate(tr(override), override.split("=")[0])
        assert refused.kind == verl.REFUSED and refused.stops and f"builds its {split} dataset" in refused.text
    assert "test_freq=-1" in fate(tr("data.val_files=null"), "data.val_files").text
    own = fate(tr("data.val_files=null", "data.custom_cls.path=/x/ds.py", "data.custom_cls.name=DS"), "data.val_files")
    assert own.kind == verl.MAPPED


@pytest.mark.parametrize("override", ["skip.rollout.dump_dir=5", "skip.rollout.steps=['1']",
                                      "trainer.v1.sampler.max_off_policy_threshold=true"])
def test_a_value_verl_converts_or_accepts_is_not_refused(override: str) -> None:
    """OmegaConf converts a value for a structured config's field before verl's check (5 -> '5', '1' -> 1), and True
    passes verl's isinstance(int) check of the staleness bound: verl runs these (helper-40)."""
    kept = fate(tr(override), override.split("=", 1)[0])
    assert kept.kind == verl.IGNORED, kept


def test_the_v1_keys_say_when_verl_reads_them() -> None:
    """An asynchronous trainer_mode (refused) reads the v1 keys; main_ppo_v0 (use_v1=False, refused) builds no replay
    buffer and checks no staleness bound."""
    mode = tr("trainer.v1.trainer_mode=colocate_async")
    assert "sync here" not in fate(mode, "trainer.v1.colocate_async.num_warmup_batches").text
    v0 = fate(tr("trainer.use_v1=False", "trainer.v1.sampler.max_off_policy_threshold=0"),
              "trainer.v1.sampler.max_off_policy_threshold")
    assert v0.kind == verl.IGNORED and v0.unread


def test_dapo_overlong_shaping_stops_where_verl_s_manager_stops() -> None:
    """verl's dapo reward manager asserts max_resp_len set, len > 0 and max_resp_len >= len, and reads penalty_factor
    and log when it scores (helper-40's F1)."""
    kw = "+reward.reward_kwargs"
    on = ["reward.reward_manager.name=dapo", f"{kw}.overlong_buffer_cfg.enable=True", f"{kw}.overlong_buffer_cfg.len=8",
          f"{kw}.overlong_buffer_cfg.penalty_factor=1.0", f"{kw}.overlong_buffer_cfg.log=False",
          f"{kw}.max_resp_len=32", "data.max_response_length=32"]
    assert not tr(*on).refused
    lacking = tr(*[o for o in on if "penalty_factor" not in o and "max_resp_len" not in o])
    enable = fate(lacking, "reward.reward_kwargs.overlong_buffer_cfg.enable")
    assert enable.stops and "without penalty_factor, max_resp_len" in enable.text
    zero = fate(tr(*on, f"{kw[1:]}.overlong_buffer_cfg.len=0"), "reward.reward_kwargs.overlong_buffer_cfg.len")
    assert zero.stops and "asserts it is positive" in zero.text
    longer = fate(tr(*on[:-2], f"{kw}.max_resp_len=4", "data.max_response_length=4"),
                  "reward.reward_kwargs.overlong_buffer_cfg.len")
    assert longer.stops and "max_resp_len >= len" in longer.text
    recipe = tr("--config-name=dapo_trainer", "reward.reward_manager.name=dapo",
                "reward.reward_kwargs.overlong_buffer_cfg.enable=True")  # its defaults: len 0, max_resp_len null
    assert fate(recipe, "reward.reward_kwargs.max_resp_len").stops


def test_an_experiment_name_verl_takes_becomes_a_folder_name() -> None:
    spaced = fate(tr("trainer.experiment_name='a b'"), "trainer.experiment_name")
    assert spaced.kind == verl.MAPPED and spaced.mapped_value == "a_b" and "becomes 'a_b'" in spaced.text
    assert fate(tr("trainer.experiment_name=null"), "trainer.experiment_name").mapped_value == "default"
    assert fate(tr("trainer.experiment_name=run-1"), "trainer.experiment_name").text == ""


def test_offload_on_one_gpu_is_read_by_verl_and_ignored_here() -> None:
    """verl's FSDP engine reads fsdp_config.param_offload at any GPU count (helper-40's F5): on one GPU rlforge keeps
    the parameters on the device, ignored (memory only), not 'unread'."""
    t = tr("trainer.n_gpus_per_node=1", f"{ARO}.actor.fsdp_config.param_offload=True")
    offload = fate(t, f"{ARO}.actor.fsdp_config.param_offload")
    assert offload.kind == verl.IGNORED and not offload.unread and "memory only" in offload.text


def test_helper_41s_findings() -> None:
    """trainer.v1.sync.parameter_sync_step is read in sync mode (k rounds of generate-and-update per step); skip's
    enable converts as OmegaConf converts a bool ('no' is False); a fractional overlong ramp is positive for verl (it
    computes with it) and a missing feature here; a null project name is the loggers' default."""
    k = fate(tr("+trainer.v1.sync.parameter_sync_step=4"), "trainer.v1.sync.parameter_sync_step")
    assert k.kind == verl.REFUSED and not k.stops and "several rounds of generate-and-update" in k.text
    assert fate(tr("+trainer.v1.sync.parameter_sync_step=1"), "trainer.v1.sync.parameter_sync_step").kind == verl.MAPPED
    assert fate(tr("skip.rollout.enable=no"), "skip.rollout.enable").kind == verl.MAPPED
    assert fate(tr("skip.rollout.enable=yes"), "skip.rollout.enable").kind == verl.REFUSED
    kw = "+reward.reward_kwargs"
    ramp = fate(tr("reward.reward_manager.name=dapo", f"{kw}.overlong_buffer_cfg.enable=True",
                   f"{kw}.overlong_buffer_cfg.len=8.5", f"{kw}.overlong_buffer_cfg.penalty_factor=1.0",
                   f"{kw}.overlong_buffer_cfg.log=False", f"{kw}.max_resp_len=32", "data.max_response_length=32"),
                "reward.reward_kwargs.overlong_buffer_cfg.len")
    assert ramp.kind == verl.REFUSED and not ramp.stops and "fractional" in ramp.text
    assert tr("trainer.project_name=null").overrides["trainer.project"] == "rlforge"


def test_helper_43s_findings() -> None:
    """Frequencies and epochs of a type or value verl stops on are refused so (save_freq=after_each_epoch was a
    TypeError traceback in the translation); fractional epochs or intervals, which verl runs, are a missing feature
    (total_epochs=1.5 became 1 epoch without a word); parameter_sync_step=True is 1 for verl."""
    for override in ("trainer.save_freq=after_each_epoch", "trainer.save_freq=null",
                     "+trainer.v1.sync.parameter_sync_step=1.0"):
        key = override.lstrip("+").split("=")[0]
        stop = fate(tr(override), key)
        assert stop.kind == verl.REFUSED and stop.stops, override
    for override in ("trainer.total_epochs=1.5", "trainer.save_freq=2.5"):
        missing = fate(tr(override), override.split("=")[0])
        assert missing.kind == verl.REFUSED and not missing.stops, override
    assert fate(tr("+trainer.v1.sync.parameter_sync_step=true"), "trainer.v1.sync.parameter_sync_step").kind == verl.MAPPED
    assert tr("trainer.total_epochs=2.0").overrides["trainer.total_epochs"] == 2

    def sft(override: str) -> verl.Translation:
        return prepare(["data.train_files=chat.parquet", "model.path=builtin:tiny-arith", override], SFT_ENTRY,
                       refuse=False).translation

    for override, stops in (("trainer.test_freq=0", True), ("trainer.save_freq=null", True),
                            ("trainer.total_epochs=1.5", True), ("trainer.test_freq=after_each_epoch", False)):
        refused = fate(sft(override), override.split("=")[0])
        assert refused.kind == verl.REFUSED and refused.stops is stops, override
    assert sft("trainer.test_freq=-1").overrides["sft.val_every"] == 0


def test_a_string_where_verl_s_optimizer_takes_a_number_stops_as_verl_stops() -> None:
    """verl's optimizer config is built with Hydra's instantiate (``_target_``), which keeps a string ('3e-6', or an
    ${oc.env:...} interpolation's result), and AdamW stops on it; rlforge would convert it (helper-43's A3)."""
    quoted = fate(tr("actor_rollout_ref.actor.optim.lr='3e-6'"), "actor_rollout_ref.actor.optim.lr")
    assert quoted.kind == verl.REFUSED and quoted.stops and "oc.decode" in quoted.text
    assert tr("actor_rollout_ref.actor.optim.lr=3e-6").overrides["actor.lr"] == 3e-6
