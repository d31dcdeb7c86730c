"""verl drop-in (issue 27): a verl launch composes over verl 0.9.1's defaults with Hydra's rules, and every key gets
one fate with verl's meaning. One test per case the issue lists (gamma/lam, overlong_buffer.enable, use_dynamic_bsz,
loggers, resume, epochs, val_only, val_kwargs, megatron and the data-parallel size), plus the CLI paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge.cli import main
from rlforge.config import verl, verl_hydra, verl_tree
from rlforge.config.verl_launch import PPO_ENTRY, SFT_ENTRY, beneath, prepare
from rlforge.errors import ConfigError

VERL_YAML = Path(__file__).parent / "data" / "verl_grpo_gsm8k.yaml"
ARO = "actor_rollout_ref"
BASE = ["algorithm.adv_estimator=grpo", f"{ARO}.rollout.name=vllm", f"{ARO}.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=10"]


def tr(*overrides: str, name: str = "ppo_trainer") -> verl.Translation:
    return prepare([f"--config-name={name}", *BASE, *overrides], refuse=False).translation


def fate(t: verl.Translation, key: str) -> verl.Fate:
    return next(f for f in t.fates if f.key == key)


def test_defaults_come_from_verl_0_9_1() -> None:
    o = tr().overrides  # a sparse launch: every key it leaves out means what it means in verl
    assert o["actor.weight_decay"] == 0.01 and o["trainer.resume"] == "auto" and o["model.gradient_checkpointing"]
    assert o["model.remove_padding"] is True and o["data.train_batch_size"] == 1024 and o["rollout.n"] == 1
    assert o["logger.backends"] == ["console", "wandb"] and o["trainer.run_dir"] == "checkpoints/verl_examples/gsm8k"


def test_hydra_override_grammar() -> None:
    t = tr("+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4", "++trainer.project_name=p",
           "trainer.experiment_name=e_${trainer.project_name}", "~trainer.v1.sampler.sampler_kwargs",
           "data.train_files=['/a.parquet','/b.parquet']")
    assert t.overrides["trainer.experiment"] == "e_p" and t.overrides["data.train_files"] == ["/a.parquet", "/b.parquet"]
    with pytest.raises(ConfigError, match=r"'trainer.nope' is not a key of verl's config.*\+trainer.nope=1"):
        tr("trainer.nope=1")
    with pytest.raises(ConfigError, match=r"'trainer.save_freq' is already in verl's config; set it without '\+'"):
        tr("+trainer.save_freq=3")
    with pytest.raises(ConfigError, match="is a sweep"):
        tr("trainer.save_freq=1,2")
    # a mapping: '+' merges it into the section, new keys included; without '+' only into keys that exist (Hydra's
    # rules on verl's struct-mode config, checked against hydra.compose on verl's own config directory)
    t = tr("+data.apply_chat_template_kwargs={enable_thinking:false}", "algorithm.filter_groups={enable:true}")
    assert t.overrides["data.apply_chat_template_kwargs"] == {"enable_thinking": False}
    assert t.overrides["algorithm.filter_groups"] is True
    with pytest.raises(ConfigError, match=r"'data.apply_chat_template_kwargs.enable_thinking' is not a key of verl's "
                                          r"config.*\+data.apply_chat_template_kwargs="):
        tr("data.apply_chat_template_kwargs={enable_thinking:false}")


def test_scoring_passes_get_their_own_micro_batches() -> None:
    r, ref = f"{ARO}.rollout", f"{ARO}.ref"
    o = tr(f"{r}.log_prob_micro_batch_size_per_gpu=8", f"{ref}.log_prob_use_dynamic_bsz=True",
           f"{ref}.log_prob_max_token_len_per_gpu=4096", f"{ARO}.actor.use_kl_loss=True").overrides  # a reference
    assert o["actor.log_prob.micro_batch_size"] == 8 and o["actor.log_prob.max_tokens_per_micro_batch"] == 0
    assert o["actor.ref_log_prob.max_tokens_per_micro_batch"] == 4096
    ppo = tr("algorithm.adv_estimator=gae", "critic.use_dynamic_bsz=True", "critic.ppo_max_token_len_per_gpu=2048",
             "critic.forward_max_token_len_per_gpu=8192").overrides
    assert ppo["critic.max_tokens_per_micro_batch"] == 2048 and ppo["critic.values.max_tokens_per_micro_batch"] == 8192
    t = tr("algorithm.adv_estimator=gae", "critic.forward_micro_batch_size=64", "trainer.n_gpus_per_node=8")
    assert t.overrides["critic.values.micro_batch_size"] == 8  # a global count / the data-parallel size


def test_deprecated_global_micro_batch_counts_are_refused_where_verl_0_9_1_stops() -> None:
    """verl 0.9.1 no longer divides the global micro-batch counts: its workers assert the actor's per-GPU keys, and its
    config classes raise where both are set (the critic's per-GPU key copies the global one by interpolation)."""
    a, r, ref = f"{ARO}.actor", f"{ARO}.rollout", f"{ARO}.ref"
    alone = tr(f"{a}.ppo_micro_batch_size_per_gpu=null", f"{a}.ppo_micro_batch_size=64", "trainer.n_gpus_per_node=8")
    line = fate(alone, f"{a}.ppo_micro_batch_size").line()
    assert line.startswith("REFUSED") and f"set {a}.ppo_micro_batch_size_per_gpu=8 (64 / 8" in line
    assert "is not in rlforge" not in line  # verl's own stop, not a missing feature
    both = tr(f"{r}.log_prob_micro_batch_size=64", f"{r}.log_prob_micro_batch_size_per_gpu=4")
    assert "You have set both" in fate(both, f"{r}.log_prob_micro_batch_size").text
    critic = tr("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size=64", "trainer.n_gpus_per_node=8")
    text = fate(critic, "critic.ppo_micro_batch_size").text
    assert "copies it" in text and "set only critic.ppo_micro_batch_size_per_gpu (now 64; the global 64 / 8" in text
    assert fate(tr(f"{r}.log_prob_micro_batch_size=64"), f"{r}.log_prob_micro_batch_size").kind == verl.REFUSED


def test_vllm_engine_knobs_pass_through() -> None:
    r = f"{ARO}.rollout"
    o = tr(f"{r}.max_num_seqs=128", f"{r}.max_num_batched_tokens=4096", f"{r}.enable_chunked_prefill=False",
           f"{r}.free_cache_engine=False", f"{r}.max_model_len=2048").overrides
    assert o["rollout.vllm.max_num_seqs"] == 128 and o["rollout.vllm.max_num_batched_tokens"] == 4096
    assert o["rollout.vllm.enable_chunked_prefill"] is False and o["rollout.vllm.sleep"] is False
    assert o["rollout.vllm.max_model_len"] == 2048 and o["rollout.vllm.enable_prefix_caching"] is True
    assert "rollout.vllm.max_num_seqs" not in tr(f"{r}.name=hf", f"{r}.max_num_seqs=128").overrides


def test_dynamic_sampling_metrics() -> None:
    f, dapo = "algorithm.filter_groups", "dapo_trainer"
    on = (f"{f}.enable=True", "reward.reward_manager.name=dapo", "reward.reward_kwargs.overlong_buffer_cfg.enable=True")
    assert tr(*on, f"{f}.metric=acc", name=dapo).overrides["algorithm.filter_metric"] == "acc"
    assert tr(*on, f"{f}.metric=seq_reward", name=dapo).overrides["algorithm.filter_metric"] == "reward"
    assert tr(*on, f"{f}.metric=score", name=dapo).overrides["algorithm.filter_metric"] == "score"
    kl = tr(*on, f"{f}.metric=seq_final_reward", "algorithm.use_kl_in_reward=True", name=dapo)
    assert fate(kl, f"{f}.metric").kind == verl.REFUSED and "KL-penalized" in fate(kl, f"{f}.metric").text


def test_val_only_runs_eval_and_val_kwargs_sample_for_validation() -> None:
    """verl 0.9.1's agent loop samples validation at val_kwargs.temperature/top_p/top_k whatever do_sample says
    (agent_loop.py, AgentLoopWorker.generate_sequences); temperature 0 is greedy."""
    assert tr("trainer.val_only=True").command == "eval"
    v = f"{ARO}.rollout.val_kwargs"
    sampled = tr(f"{v}.temperature=0.6")
    assert sampled.overrides["rollout.val_temperature"] == 0.6  # do_sample=False (the default) samples all the same
    assert fate(sampled, f"{v}.do_sample").kind == verl.IGNORED
    same = tr(f"{v}.do_sample=True", f"{v}.temperature=0.6", f"{v}.n=4")
    assert same.overrides["rollout.val_temperature"] == 0.6 and same.overrides["rollout.val_n"] == 4
    top = tr(f"{v}.top_p=0.7", f"{v}.top_k=-1").overrides
    assert top["rollout.val_top_p"] == 0.7 and top["rollout.val_top_k"] == 0
    assert tr().overrides["rollout.val_temperature"] == 0.0  # verl's default: greedy
    refused = tr(f"{v}.do_sample=True", f"{ARO}.rollout.temperature=0")  # verl's validate_config asserts
    assert fate(refused, f"{v}.do_sample").kind == verl.REFUSED and "verl 0.9.1's validate_config" in fate(
        refused, f"{v}.do_sample").text
    copies = tr(f"{v}.n=30")  # greedy: 30 copies of one answer
    assert copies.overrides["rollout.val_n"] == 1 and "mean@1" in fate(copies, f"{v}.n").text


def test_megatron_config_maps_tp_and_counts_data_parallel_ranks_as_verl() -> None:
    m = f"{ARO}.actor.megatron"
    t = tr(f"{m}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=8", f"{ARO}.actor.ppo_micro_batch_size=64",
           f"~{ARO}.actor.ppo_micro_batch_size_per_gpu", name="ppo_megatron_trainer")
    o = t.overrides
    assert o["strategy.name"] == "megatron" and o["strategy.megatron.tensor_parallel_size"] == 2
    assert o["strategy.num_processes"] == 8 and o["trainer.controller"] == "ray" and o["strategy.checkpoint"] == "sharded"
    # verl 0.9.1 stops on the deprecated global count; the per-GPU value it asks for instead: / (GPUs / TP)
    assert "ppo_micro_batch_size_per_gpu=16 (64 / 4 data-parallel ranks" in t.refused[0].text
    pp = tr(f"{m}.pipeline_model_parallel_size=2", name="ppo_megatron_trainer")
    assert any("pipeline parallelism" in f.text for f in pp.refused)
    assert tr("model_engine=megatron").overrides["strategy.name"] == "megatron"  # the config-group choice


def test_ulysses_maps_to_one_sequence_parallel_size_and_divides_the_data_parallel_size() -> None:
    a, sp = f"{ARO}.actor", "ulysses_sequence_parallel_size"
    gpus = ["trainer.n_gpus_per_node=8", f"{ARO}.model.use_remove_padding=True"]
    t = tr(f"{a}.{sp}=4", *gpus)
    assert t.overrides["strategy.fsdp.sequence_parallel_size"] == 4 and not t.refused
    per_gpu = tr(f"{a}.{sp}=4", f"{a}.ppo_micro_batch_size_per_gpu=null", f"{a}.ppo_micro_batch_size=64", *gpus)
    assert "ppo_micro_batch_size_per_gpu=32 (64 / 2 data-parallel ranks" in per_gpu.refused[0].text  # GPUs / SP
    engine = tr(f"{a}.fsdp_config.{sp}=2", *gpus)  # verl's FSDP engine key, read where the actor's own is 1
    assert engine.overrides["strategy.fsdp.sequence_parallel_size"] == 2
    assert fate(engine, f"{a}.{sp}").kind == verl.IGNORED
    kl = tr(f"{a}.{sp}=2", f"{a}.use_kl_loss=True", *gpus)  # the reference follows the actor (verl's interpolation)
    assert not kl.refused and fate(kl, f"{ARO}.ref.{sp}").kind == verl.MAPPED
    ppo = ["algorithm.adv_estimator=gae", f"{a}.{sp}=2", *gpus]
    smaller = tr(*ppo)  # the critic's 1: the same values with the actor's 2
    assert not smaller.refused and "less memory" in fate(smaller, f"critic.fsdp.{sp}").text
    larger = tr(*ppo, f"critic.{sp}=4")
    assert [f.key for f in larger.refused] == [f"critic.{sp}"]
    assert "critic (4) than for the actor (2" in larger.refused[0].text
    assert "on 3 GPUs" in fate(tr(f"{a}.{sp}=2", "trainer.n_gpus_per_node=3"), f"{a}.{sp}").text


def test_refusals_name_the_feature_and_claim_no_open_work() -> None:
    """The issues that once listed these features are resolved: a refusal names the missing feature, and no issue."""
    video = fate(tr("data.video_key=videos"), "data.video_key").line()
    estimator = fate(tr("algorithm.adv_estimator=grpo_passk"), "algorithm.adv_estimator").line()
    assert video.startswith("REFUSED     data.video_key = 'videos': rows with videos") and "issue" not in video
    assert "grpo_passk" in estimator and "issue" not in estimator


def test_new_losses_and_estimators_map_to_the_policy_loss_registry() -> None:
    t = tr(f"{ARO}.actor.policy_loss.loss_mode=clip_cov", f"{ARO}.actor.policy_loss.clip_cov_ratio=0.001")
    assert t.overrides["actor.policy_loss"] == "clip_cov" and t.overrides["actor.clip_cov.ratio"] == 0.001
    pf = tr("algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=True", "algorithm.pf_ppo.weight_pow=3.0")
    assert pf.algorithm == "pf_ppo" and pf.overrides["algorithm.weight_pow"] == 3.0
    by = tr("algorithm.rollout_correction.bypass_mode=True", "algorithm.rollout_correction.loss_type=reinforce")
    # verl 0.9.1's main_ppo (v1): the engine's log-probs as the old ones, no correction, the loss as configured; its
    # legacy trainer's bypass loss (rlforge's actor.policy_loss=bypass_mode) is not what main_ppo runs
    assert by.overrides["actor.reuse_rollout_log_probs"] is True and by.overrides["actor.policy_loss"] == "vanilla"
    assert "actor.bypass_mode.loss_type" not in by.overrides
    assert tr("algorithm.adv_estimator=optimal_token_baseline").algorithm == "otb"


def test_lora_megatron_tp_multi_turn_and_rewards_are_not_falsely_refused() -> None:
    t = tr(f"{ARO}.model.lora_rank=8", f"{ARO}.model.lora_alpha=16", f"{ARO}.rollout.agent.default_agent_loop=tool_agent",
           f"{ARO}.rollout.multi_turn.max_assistant_turns=3", "reward.reward_manager.name=dapo",
           f"{ARO}.actor.optim.lr_warmup_steps=5", "trainer.val_only=False", "critic.optim.lr_warmup_steps_ratio=0.1")
    o = t.overrides
    assert o["model.lora.rank"] == 8 and o["rollout.agent.loop"] == "tool_agent" and o["rollout.agent.max_turns"] == 3
    assert o["reward.manager"] == "rule" and o["actor.warmup_steps"] == 5 and not t.refused
    off = fate(t, f"{ARO}.actor.fsdp_config.param_offload")  # False: the actor is not among the offloaded models
    assert off.target == "strategy.fsdp.offload_params" and "actor" not in off.mapped_value


@pytest.mark.parametrize(("assistant", "user", "turns"), [(None, 8, 9), (5, 8, 5), (5, 2, 3), (5, None, 5),
                                                          (None, None, 512)])  # no limit: the 512-token budget
def test_max_user_turns_caps_the_model_turns_as_verls_tool_loop_does(assistant, user, turns) -> None:
    """verl's tool loop stops after max_assistant_turns model turns or once max_user_turns tool replies were given
    (checked after each model turn): rollout.agent.max_turns = min(assistant, user + 1)."""
    m = f"{ARO}.rollout.multi_turn"
    t = tr(f"{ARO}.rollout.agent.default_agent_loop=tool_agent", *([f"{m}.max_assistant_turns={assistant}"] if assistant else []),
           *([f"{m}.max_user_turns={user}"] if user else []))
    assert t.overrides["rollout.agent.max_turns"] == turns and not t.refused


def test_the_agent_loop_is_verl_s_default_agent_loop_not_multi_turn_enable() -> None:
    """verl 0.9.1 runs each row's agent_name, else agent.default_agent_loop; multi_turn.enable only goes into the
    batch's meta_info, and the tool files load whatever the loop."""
    m = f"{ARO}.rollout.multi_turn"
    t = tr(f"{m}.enable=True", f"{m}.max_assistant_turns=3")
    assert t.overrides["rollout.agent.loop"] == "single_turn" and "rollout.agent.max_turns" not in t.overrides
    assert fate(t, f"{m}.enable").kind == verl.IGNORED and fate(t, f"{m}.max_assistant_turns").kind == verl.IGNORED
    t = tr(f"{ARO}.rollout.agent.default_agent_loop=tool_agent", f"{m}.function_tool_path=tools.py")  # no enable
    assert t.overrides["rollout.agent.loop"] == "tool_agent" and not t.refused
    assert t.overrides["rollout.agent.function_tool_path"] == "tools.py"
    t = tr(f"{ARO}.rollout.agent.default_agent_loop=tool_agent", f"{m}.tool_response_truncate_side=both")
    assert t.overrides["rollout.agent.tool_output_truncate_side"] == "middle"  # verl's tool loop: any other value


def test_legacy_reward_model_placement_is_moved_and_ignored_as_verl_moves_it() -> None:
    """verl's migrate_legacy_reward_impl moves reward_model.enable_resource_pool/n_gpus_per_node/nnodes to
    reward.reward_model.*, which only place verl's reward model: ignored, not refused."""
    t = tr("reward_model.enable_resource_pool=True", "reward_model.n_gpus_per_node=8", "reward_model.nnodes=1")
    for leaf in ("enable_resource_pool", "n_gpus_per_node", "nnodes"):
        f = fate(t, f"reward_model.{leaf}")
        assert f.kind == verl.IGNORED and f"moved to reward.reward_model.{leaf}" in f.text, f
    assert not t.refused


def test_a_complete_hydra_config_translates_without_a_traceback(tmp_path: Path) -> None:
    """What a verl run leaves in .hydra/config.yaml: the whole tree, ${oc.select:...} interpolations included."""
    import shutil

    path = tmp_path / "config.yaml"
    text = (verl_tree.DEFAULTS / "ppo_megatron_trainer.yaml").read_text()
    path.write_text(text.replace("name: ???", "name: vllm"))
    t = verl.translate(verl_hydra.compose_file(str(path))[2])
    assert t.overrides["strategy.name"] == "megatron" and t.algorithm == "ppo"
    shutil.copy(VERL_YAML, tmp_path / "sparse.yaml")
    assert verl.translate(verl_hydra.compose_file(str(tmp_path / "sparse.yaml"))[2]).overrides["rollout.n"] == 2


@pytest.mark.parametrize("override,needle", [
    ("data.max_response_length=64", "'data.max_response_length' is verl's key; rlforge's is 'rollout.max_new_tokens'"),
    (f"{ARO}.actor.optim.lr=1e-6", "rlforge's is 'actor.lr'"),
    (f"{ARO}.rollout.log_prob_micro_batch_size_per_gpu=8", "rlforge's is actor.log_prob.micro_batch_size"),
    (f"{ARO}.actor.fsdp_config.param_offload=True", "rlforge's is strategy.fsdp.offload_params"),
    (f"{ARO}.actor.ulysses_sequence_parallel_size=2", "rlforge's is strategy.fsdp.sequence_parallel_size"),
    (f"{ARO}.rollout.engine_kwargs.vllm.async_scheduling=true", "rlforge's is rollout.vllm.engine_kwargs.async_scheduling"),
    (f"{ARO}.model.override_config.max_position_embeddings=4096",
     "rlforge's is model.config_overrides.max_position_embeddings"),
])
def test_verl_keys_typed_at_fit_get_the_rlforge_spelling(override: str, needle: str, capsys) -> None:
    assert main(["fit", override]) == 2
    err = capsys.readouterr().err
    assert needle in err and "docs/migration-from-verl.md" in err


def test_hydra_prefixes_at_fit_get_a_hint(capsys) -> None:
    assert main(["fit", "+actor.lr=1e-5"]) == 2
    assert "rlforge verl" in capsys.readouterr().err


def test_from_verl_prints_the_translation_and_rlforge_verl_refuses_with_every_missing_feature(capsys) -> None:
    assert main(["config", "from-verl", *BASE, "trainer.logger=[console,clearml]"]) == 2  # shown, and refused
    captured = capsys.readouterr()
    assert "trainer:" in captured.out and "REFUSED     trainer.logger" in captured.err
    assert "1 key(s) of this verl launch are REFUSED" in captured.err
    assert main(["config", "from-verl", *BASE]) == 0
    assert main(["verl", "--print", *BASE]) == 2  # shown, then composed as the run would: verl's default data path
    assert "the run would stop here: Data file not found: " in capsys.readouterr().err
    assert main(["verl", "--print", *BASE, "trainer.logger=[console,clearml]"]) == 2  # as config from-verl
    assert "REFUSED     trainer.logger" in capsys.readouterr().out
    assert main(["verl", *BASE, "trainer.logger=[console,clearml]", f"{ARO}.actor.ulysses_sequence_parallel_size=2",
                 "algorithm.adv_estimator=gae", "critic.ulysses_sequence_parallel_size=4"]) == 2
    err = capsys.readouterr().err
    # the critic's size above the actor's, and the logger
    assert "2 key(s) rlforge cannot run as asked" in err and "critic (4) than for the actor (2" in err and "clearml" in err


def test_from_verl_takes_verl_s_own_options_and_the_sft_trainer(capsys, tmp_path) -> None:
    """--config-name/--config-path (verl's syntax, not argparse's) and --sft, as rlforge verl takes them."""
    assert main(["config", "from-verl", "--config-name=ppo_megatron_trainer", *BASE,
                 f"{ARO}.actor.megatron.tensor_model_parallel_size=2"]) == 0
    assert "megatron:" in capsys.readouterr().out
    out = tmp_path / "sft.yaml"
    assert main(["config", "from-verl", "--sft", "data.train_files=chat.jsonl", "model.path=builtin:tiny-arith",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"rlforge sft --config {out}" in printed and "# mapped" not in printed  # the whole report is in the file
    assert "train_file: chat.jsonl" in out.read_text() and "val_accuracy: false" in out.read_text()
    assert "# mapped      data.train_files" in out.read_text()


@pytest.mark.parametrize("value", ["-1", "nan"])  # nan: not equal to itself, still the verl key's own value
def test_a_value_rlforge_refuses_at_rlforge_verl_names_the_verl_key_it_came_from(capsys, value: str) -> None:
    assert main(["verl", *BASE, f"{ARO}.actor.optim.lr={value}", "trainer.device=cpu"]) == 2
    err = capsys.readouterr().err
    assert "'actor.lr'" in err and f"(from verl's {ARO}.actor.optim.lr={value}" in err, err[-2000:]


def test_rlforge_keys_after_a_double_dash_go_on_top_of_the_translation(capsys, monkeypatch, tmp_path) -> None:
    import rlforge.sft
    import rlforge.trainer

    seen = {}

    class Trainer:  # what `rlforge verl` would train, captured
        def __init__(self, cfg, plugins=None):
            seen["fit"] = cfg

        def fit(self):
            return {}

    monkeypatch.setattr(rlforge.sft, "run_sft", lambda cfg, pm: seen.setdefault("sft", cfg))
    monkeypatch.setattr(rlforge.trainer, "Trainer", Trainer)
    assert main(["verl", "--sft", "data.train_files=chat.jsonl", "model.path=builtin:tiny-arith", "--",
                 "sft.devices=2"]) == 0
    assert seen["sft"].sft.devices == 2 and seen["sft"].sft.train_file == "chat.jsonl"
    data = Path(__file__).parent / "data"
    files = [f"data.train_files={data / 'gsm8k_train.jsonl'}", f"data.val_files={data / 'verl_gsm8k_test.jsonl'}",
             f"{ARO}.model.path=builtin:tiny-arith", "data.max_prompt_length=128", "data.max_response_length=64"]
    assert main(["verl", *BASE, *files, "trainer.device=cpu", "--", "rollout.name=hf", "actor.lr=3e-6"]) == 0
    assert seen["fit"].rollout.name == "hf" and seen["fit"].actor.lr == 3e-6
    assert main(["verl", "--print", *BASE, *files, "trainer.device=cpu", "--", "rollout.name=hf"]) == 0
    assert "then rlforge's keys: rollout.name=hf" in capsys.readouterr().out
    assert main(["verl", "--print", *BASE, *files, "trainer.device=cpu", "--", "rollout.nme=hf"]) == 2  # checked too
    err = capsys.readouterr().err
    assert "would stop here: Unknown config key 'rollout.nme'" in err and "from verl's" not in err
    ours = "data.apply_chat_template_kwargs.tokenize=true"
    assert main(["verl", *BASE, *files, "trainer.device=cpu", "--", ours]) == 2
    assert "from verl's" not in capsys.readouterr().err  # a key below the section given after --: the user's own
    assert main(["verl", "--print", "--sft", "data.train_files=/nowhere.parquet", "model.path=builtin:tiny-arith"]) == 2
    assert "would stop here: Data file not found: /nowhere.parquet (sft.train_file)" in capsys.readouterr().err
    assert main(["verl", *BASE, "trainer.device=cpu", "--", f"{ARO}.actor.optim.lr=1e-5"]) == 2  # verl's spelling
    assert "is verl's key; rlforge's is 'actor.lr'" in capsys.readouterr().err
    assert main(["verl", *BASE, "trainer.device=cpu", "--", "actor.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert "'actor.lr'" in err and "from verl's" not in err  # the bad value is the user's, not the launch's
    reward = tmp_path / "reward.py"  # the custom reward function is checked before any data is read
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, format_score=0.0):\n"
                      "    return 1.0\n")
    custom = [f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"]
    assert main(["verl", "--print", *BASE, *files, "trainer.device=cpu", *custom,
                 "+custom_reward_function.reward_kwargs.format_score=0.1", "--", "rollout.name=hf"]) == 0
    assert main(["verl", "--print", *BASE, *files, "trainer.device=cpu", *custom,
                 "+custom_reward_function.reward_kwargs.fmt=0.1", "--", "rollout.name=hf"]) == 2
    err = capsys.readouterr().err
    assert "would stop here: reward.fn_kwargs.fmt:" in err and "takes: format_score" in err
    assert "(from verl's custom_reward_function.reward_kwargs.fmt=0.1)" in err
    assert main(["verl", "--print", *BASE, *files, "--", "sft.steps=2"]) == 2  # an RL launch never reads sft.*
    assert "rlforge fit does not read sft.steps: rlforge sft's key(s)" in capsys.readouterr().err
    assert main(["verl", "--print", *BASE, *files, f"custom_reward_function.path={tmp_path / 'none.py'}"]) == 2
    assert (f"REFUSED     custom_reward_function.path = '{tmp_path / 'none.py'}': a run would stop on this value: "
            f"Reward file not found") in capsys.readouterr().out  # the launch's key, not the legacy null one
    out = tmp_path / "rlforge.yaml"  # config from-verl --out checks it as well, once the file is written
    assert main(["config", "from-verl", *BASE, *files, *custom, "+custom_reward_function.reward_kwargs.fmt=0.1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "a run of it would stop here: reward.fn_kwargs.fmt:" in err and "takes: format_score" in err and out.is_file()
    assert main(["config", "from-verl", *BASE, *files, *custom, "--out", str(out)]) == 0


def test_a_complete_config_is_read_as_the_trainer_that_wrote_it(tmp_path: Path, capsys) -> None:
    """A run's .hydra/config.yaml: the trainer comes from hydra.yaml beside it (hydra.job.config_name), else from the
    sections only some trainers have (fully-async, one-step-off, SFT); a DAPO recipe's config without its hydra.yaml
    reads as main_ppo's, and the report says so."""
    def run_dir(name: str, config_name: str | None) -> Path:
        d = tmp_path / name / ".hydra"
        d.mkdir(parents=True)
        (d / "config.yaml").write_text((verl_tree.DEFAULTS / f"{name}.yaml").read_text().replace("name: ???",
                                                                                              "name: vllm"))
        if config_name:
            (d / "hydra.yaml").write_text(f"hydra:\n  run:\n    dir: outputs\n  job:\n    name: main\n"
                                          f"    config_name: {config_name}\n")
        return d / "config.yaml"

    name, how, _ = verl_hydra.compose_file(str(run_dir("dapo_trainer", "dapo_trainer")))
    assert name == "dapo_trainer" and "hydra.job.config_name" in how
    assert verl_hydra.compose_file(str(run_dir("ppo_trainer", None)))[:2][0] == "ppo_trainer"
    assert verl_hydra.compose_file(str(run_dir("fully_async_ppo_trainer", None)))[0] == "fully_async_ppo_trainer"
    assert verl_hydra.compose_file(str(run_dir("one_step_off_ppo_trainer", None)))[0] == "one_step_off_ppo_trainer"
    assert verl_hydra.compose_file(str(run_dir("sft_trainer_engine", None)))[0] == "sft_trainer_engine"
    assert verl_hydra.compose_file(str(run_dir("sft_trainer", None)))[0] == "sft_trainer"
    assert main(["config", "from-verl", str(tmp_path / "dapo_trainer" / ".hydra" / "config.yaml")]) == 0
    assert "read as verl's dapo_trainer (hydra.job.config_name in " in capsys.readouterr().err
    assert main(["config", "from-verl", str(tmp_path / "sft_trainer_engine" / ".hydra" / "config.yaml")]) == 0
    assert "rlforge sft; read as verl's sft_trainer_engine (its sections" in capsys.readouterr().err
    dapo = tmp_path / "dapo_trainer" / ".hydra"
    (dapo / "hydra.yaml").write_text("hydra:\n  job:\n    config_name: my_own\n")  # a config of one's own
    name, how, _ = verl_hydra.compose_file(str(dapo / "config.yaml"))
    assert name == "ppo_trainer" and "names 'my_own', a config of its own" in how
    for broken in ("", "- a\n", "hydra:\n  job: {}\n", "hydra: [\n"):  # not what a verl run writes: said, not guessed
        (dapo / "hydra.yaml").write_text(broken)
        with pytest.raises(ConfigError, match=r"hydra.yaml (has no hydra.job.config_name|is not YAML)"):
            verl_hydra.compose_file(str(dapo / "config.yaml"))
    # verl-recipe's own recipe/dapo/config/dapo_trainer.yaml builds on ppo_trainer: its name says main_dapo runs it
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "dapo_trainer.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\ndata:\n  gen_batch_size: 64\n")
    launch = verl_hydra.parse_args([f"--config-path={recipe}", "--config-name=dapo_trainer"])
    assert verl_hydra.base_config(launch) == "dapo_trainer"
    assert verl_hydra.compose_file(str(recipe / "dapo_trainer.yaml"))[:2] == ("dapo_trainer", "its file name")


def test_a_step_count_after_the_double_dash_wins_over_the_launch_s_epochs(capsys) -> None:
    """-- trainer.total_steps=2 on a launch that counts total_epochs trains 2 steps: the epochs become a limit (verl's
    total_training_steps beside total_epochs), and rlforge says so; the SFT trainer's epochs likewise yield."""
    prepared = prepare([*BASE[:-1], "trainer.total_epochs=15"], PPO_ENTRY, refuse=False)  # no total_training_steps
    assert prepared.config.trainer.total_epochs == 15
    layer, notes = beneath(prepared, ["trainer.total_steps=2"])
    assert layer.trainer.total_epochs is None and layer.trainer.epoch_limit == 15
    assert notes == ["trainer.total_steps given after --: the translated trainer.total_epochs=15 becomes "
                     "trainer.epoch_limit=15 (the run stops there if that comes first), as verl's total_training_steps "
                     "beside total_epochs"]
    assert prepared.config.trainer.total_epochs == 15  # the translation itself is left as it is
    assert beneath(prepared, ["trainer.total_steps=2", "trainer.total_epochs=3"])[1] == []  # both given: as given
    assert beneath(prepared, ["actor.lr=1e-5"])[1] == []
    sft = prepare(["data.train_files=chat.jsonl", "model.path=builtin:tiny-arith", "trainer.total_epochs=4"], SFT_ENTRY,
                  refuse=False)
    layer, notes = beneath(sft, ["sft.steps=2"])
    assert layer.sft.epochs is None and layer.sft.epoch_limit == 4
    assert notes[0].startswith("sft.steps given after --: the translated sft.epochs=4 becomes sft.epoch_limit=4")
    assert beneath(sft, ["sft.steps=2", "sft.epoch_limit=1"])[1] == [
        "sft.steps given after --: the translated sft.epochs=4 is dropped: sft.epoch_limit is given after -- too"]
    # verl's SFT loop also ends after total_epochs where total_training_steps is set: a limit, not "not read"
    both = prepare(["data.train_files=chat.jsonl", "model.path=builtin:tiny-arith", "trainer.total_epochs=2",
                    "trainer.total_training_steps=12"], SFT_ENTRY, refuse=False)
    assert both.config.sft.steps == 12 and both.config.sft.epoch_limit == 2 and "epochs" not in both.config.sft
    layer, notes = beneath(both, ["sft.epochs=3"])  # your epochs set the run: the translated limit goes
    assert layer.sft.epoch_limit is None and notes == [
        "sft.epochs given after --: the translated sft.epoch_limit=2 is dropped (your epochs set the run)"]


def test_the_report_lists_the_launch_s_own_keys_before_verl_s_defaults() -> None:
    """A launch sets 30-80 keys of verl's ~900: its own come first, so a refusal or an unread key of the launch is not
    buried among the defaults; a key the launch sets that verl does not read says what verl reads instead."""
    t = prepare([*BASE, f"{ARO}.actor.clip_ratio=0.3"], PPO_ENTRY, refuse=False).translation
    lines = t.report()
    at = lines.index(f"-- the launch's own keys ({len(BASE) + 1}):")
    rest = next(i for i, line in enumerate(lines) if line.startswith("-- verl's defaults, the keys the launch leaves"))
    assert at == 1 and rest == at + len(BASE) + 2
    own = lines[at + 1:rest]
    assert any(line.startswith(f"unread      {ARO}.actor.clip_ratio: not read: verl 0.9.1 clips at clip_ratio_low=0.2 "
                               f"and clip_ratio_high=0.2 (its config's defaults") for line in own), own
    assert not any(f"{ARO}.actor.clip_ratio_low" in line for line in own)  # a default, listed with the defaults


def test_a_cuda_device_on_a_machine_without_one_stops_before_the_run(monkeypatch) -> None:
    """verl's default trainer.device=cuda: `rlforge verl --print` says the run would stop, as the strategy would; a
    Ray cluster one joins (ray.address) may hold the GPUs its driver lacks."""
    import torch

    from rlforge import load_config
    from rlforge.config.checks import check_cuda_present

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"strategy.device='cuda' \(verl: trainer.device\) but this machine has no"):
        check_cuda_present(load_config("grpo", ["strategy.device=cuda"]))
    check_cuda_present(load_config("grpo", ["strategy.device=cpu"]))
    check_cuda_present(load_config("grpo", ["strategy.device=cuda", "trainer.controller=ray", "ray.address=auto"]))
