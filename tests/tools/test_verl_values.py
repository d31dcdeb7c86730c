"""verl's values in rlforge's terms: keys read where the feature that reads them is on (gamma/lam, overlong_buffer,
use_dynamic_bsz, the KL coefficients), loggers, resume, epochs and step counts, schedules, the project name, and the
values verl runs that rlforge's ranges take (a learning rate of 0, a negative entropy coefficient)."""

from __future__ import annotations

import re

import pytest

from rlforge.config import compose, verl
from rlforge.config.verl_launch import SFT_ENTRY, prepare
from rlforge.errors import ConfigError
from tests.tools.test_from_verl import ARO, BASE, fate, tr


def test_gamma_and_lam_go_where_the_estimator_reads_them() -> None:
    ppo = tr("algorithm.adv_estimator=gae", "algorithm.gamma=0.99", "algorithm.lam=0.95")
    assert ppo.algorithm == "ppo" and ppo.overrides["algorithm.gamma"] == 0.99 and ppo.overrides["algorithm.lam"] == 0.95
    grpo = tr("algorithm.gamma=0.99")
    assert "algorithm.gamma" not in grpo.overrides and fate(grpo, "algorithm.gamma").kind == verl.IGNORED
    assert "not read by verl's grpo estimator" in fate(grpo, "algorithm.gamma").text


def test_overlong_buffer_len_is_read_only_when_enabled() -> None:
    dapo = "dapo_trainer"
    off = tr("reward.reward_kwargs.overlong_buffer_cfg.len=512", name=dapo)
    assert off.overrides["algorithm.overlong_buffer"] == 0
    on = tr("reward.reward_kwargs.overlong_buffer_cfg.len=512", "reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0", name=dapo)
    assert on.overrides["algorithm.overlong_buffer"] == 512 and on.overrides["algorithm.overlong_penalty"] == 1.0
    naive = tr("+reward.reward_kwargs.overlong_buffer_cfg.enable=True", "+reward.reward_kwargs.overlong_buffer_cfg.len=9")
    assert "algorithm.overlong_buffer" not in naive.overrides  # verl's naive manager never reads them
    assert "dapo reward manager" in fate(naive, "reward.reward_kwargs.overlong_buffer_cfg.len").text


@pytest.mark.parametrize("dynamic", [False, True])
def test_use_dynamic_bsz_picks_the_count_or_the_token_key(dynamic: bool) -> None:
    t = tr(f"{ARO}.actor.use_dynamic_bsz={dynamic}", f"{ARO}.actor.ppo_max_token_len_per_gpu=4096",
           "algorithm.adv_estimator=gae", "critic.ppo_max_token_len_per_gpu=8192", "critic.ppo_micro_batch_size_per_gpu=2")
    o = t.overrides
    if dynamic:
        assert o["actor.max_tokens_per_micro_batch"] == 4096 and "actor.ppo_micro_batch_size" not in o
        assert o["critic.max_tokens_per_micro_batch"] == 8192 and "critic.ppo_micro_batch_size" not in o
    else:
        assert o["actor.ppo_micro_batch_size"] == 4 and "actor.max_tokens_per_micro_batch" not in o
        assert o["critic.ppo_micro_batch_size"] == 2 and "critic.max_tokens_per_micro_batch" not in o
        assert "read only with use_dynamic_bsz=True" in fate(t, f"{ARO}.actor.ppo_max_token_len_per_gpu").text


def test_loggers_map_to_rlforge_backends() -> None:
    assert tr("trainer.logger=[console,swanlab,trackio]").overrides["logger.backends"] == ["console", "swanlab", "trackio"]
    assert tr("trainer.logger=[console,tensorboard]").overrides["logger.backends"] == ["console", "tensorboard"]
    files = tr("trainer.logger=[console,file]")
    assert files.overrides["logger.backends"] == ["console", "jsonl"] and "metrics.jsonl" in fate(files, "trainer.logger").text
    t = tr("trainer.logger=[console,clearml]")
    assert "logger.backends" not in t.overrides and fate(t, "trainer.logger").kind == verl.REFUSED


def test_resume_mode_and_resume_from_path() -> None:
    assert tr("trainer.resume_mode=disable", "trainer.resume_from_path=''").overrides["trainer.resume"] == "never"
    assert tr("trainer.resume_mode=auto").overrides["trainer.resume"] == "auto"
    assert tr("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ck/global_step_5").overrides[
        "trainer.resume"] == "/ck/global_step_5"
    for mode in ("resume_path", "foo"):  # verl stops on both: rlforge refuses them so, not as a missing feature
        refused = fate(tr(f"trainer.resume_mode={mode}"), "trainer.resume_mode")
        assert refused.kind == verl.REFUSED and refused.stops and "verl 0.9.1 stops on it too" in refused.text
    deleted = fate(tr(f"~{ARO}.actor.optim.lr"), f"{ARO}.actor.optim.lr")  # verl: the class's default (1e-3)
    assert deleted.kind == verl.REFUSED and "a deleted key" in deleted.text


def test_total_epochs_and_the_warmup_ratio_are_rlforge_keys() -> None:
    t = prepare([*BASE[:-1], "data.train_files=/missing.parquet", "trainer.total_epochs=3",
                 f"{ARO}.actor.optim.lr_warmup_steps_ratio=0.5"]).translation  # no rows needed: the trainer counts them
    o = t.overrides
    assert o["trainer.total_epochs"] == 3 and "trainer.total_steps" not in o
    assert o["actor.warmup_steps"] == 0 and o["actor.warmup_ratio"] == 0.5
    dapo = prepare(["--config-name=dapo_trainer", *BASE[:-1], "trainer.total_epochs=2",
                    "algorithm.filter_groups.enable=True"], refuse=False).translation
    assert "dynamic sampling verl's DAPO recipe stops" in fate(dapo, "trainer.total_epochs").text  # stated


def test_schedules_map_to_transformers_schedules() -> None:
    o = f"{ARO}.actor.optim"
    cos = tr(f"{o}.lr_scheduler_type=cosine", f"{o}.min_lr_ratio=0.1", f"{o}.num_cycles=0.5").overrides
    assert cos["actor.lr_scheduler"] == "cosine" and cos["actor.min_lr_ratio"] == 0.1 and cos["actor.num_cycles"] == 0.5
    style = tr(f"{o}.warmup_style=cosine", f"{o}.lr_scheduler_type=constant")  # the deprecated key wins, as in verl
    assert style.overrides["actor.lr_scheduler"] == "cosine" and style.overrides["actor.min_lr_ratio"] == 0.0
    assert fate(style, f"{o}.lr_scheduler_type").kind == verl.IGNORED
    assert fate(tr(f"{o}.lr_scheduler_type=cosine", f"{o}.zero_indexed_step=False"), f"{o}.zero_indexed_step").kind \
        == verl.REFUSED
    assert fate(tr(f"{o}.min_lr_ratio=0.2"), f"{o}.min_lr_ratio").kind == verl.IGNORED  # constant: not read


@pytest.mark.parametrize("coef,switch", [(f"{ARO}.actor.kl_loss_coef", f"{ARO}.actor.use_kl_loss"),
                                         ("algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward")])
def test_kl_coefficients_are_read_only_with_their_term_on(coef: str, switch: str) -> None:
    off = tr(f"{coef}=-0.1")  # verl reads (and checks) nothing of it without the term: neither does rlforge
    unread = fate(off, coef)
    assert unread.kind == verl.IGNORED and unread.unread
    assert f"read only with {switch.removeprefix(f'{ARO}.actor.')}=True" in unread.text
    assert not any(f.target and f.key == coef for f in off.fates)
    on = tr(f"{coef}=0.05", f"{switch}=True")
    assert fate(on, coef).kind == verl.MAPPED and 0.05 in on.overrides.values()


def test_a_whole_step_count_written_as_a_float_is_that_count() -> None:
    steps = tr("trainer.total_training_steps=2.0").overrides["trainer.total_steps"]
    assert steps == 2 and type(steps) is int  # verl compares with 2.0 and stops after step 2
    assert tr("trainer.total_training_steps=2.5").overrides["trainer.total_steps"] == 2.5  # rlforge's schema refuses it


@pytest.mark.parametrize("value,shown", [("null", "null"), ("''", "empty")])
def test_a_null_project_name_becomes_rlforge_s_default_and_says_so(value: str, shown: str) -> None:
    t = tr(f"trainer.project_name={value}")
    assert t.overrides["trainer.project"] == "rlforge"
    assert f"{shown}: rlforge's default project name" in fate(t, "trainer.project_name").text
    named = tr("trainer.project_name=demo")
    assert named.overrides["trainer.project"] == "demo" and not fate(named, "trainer.project_name").text
    sft = prepare(["data.train_files=/x.parquet", "model.path=/m", f"trainer.project_name={value}"], SFT_ENTRY,
                  refuse=False).translation
    assert sft.overrides["trainer.project"] == "rlforge" and "rlforge's default project name" in fate(
        sft, "trainer.project_name").text


def test_values_verl_runs_that_rlforge_s_ranges_take(registry) -> None:
    t = tr(f"{ARO}.actor.optim.lr=0", f"{ARO}.actor.entropy_coeff=-0.01")  # no update; entropy minimization
    assert t.overrides["actor.lr"] == 0 and t.overrides["actor.entropy_coeff"] == -0.01
    cfg = compose(registry, "ppo", None, ["actor.lr=0", "critic.lr=0", "actor.entropy_coeff=-0.01"])
    assert cfg.actor.lr == 0 and cfg.critic.lr == 0 and cfg.actor.entropy_coeff == -0.01


def test_hydra_s_now_resolves_and_hydra_s_runtime_values_are_a_clear_error() -> None:
    from datetime import datetime

    t = tr("trainer.experiment_name=run_${now:%Y}")  # verl's own keys interpolate it (rollout.trace.experiment_name)
    assert t.overrides["trainer.experiment"] == f"run_{datetime.now():%Y}"
    with pytest.raises(ConfigError, match=r"Cannot resolve 'trainer.default_local_dir: \$\{hydra:runtime.cwd\}/ck'"
                                          r".*runtime config of a running Hydra app.*write the value"):
        tr("trainer.default_local_dir=${hydra:runtime.cwd}/ck")


@pytest.mark.parametrize(("overrides", "cycle"), [
    ([f"{ARO}.rollout.n=${{{ARO}.actor.rollout_n}}"],  # verl's actor.rollout_n refers back to rollout.n
     f"{ARO}.rollout.n: ${{{ARO}.actor.rollout_n}} -> {ARO}.actor.rollout_n: ${{oc.select:{ARO}.rollout.n,1}} -> "
     f"back to {ARO}.rollout.n"),
    (["trainer.total_epochs=${trainer.total_epochs}"], "trainer.total_epochs: ${trainer.total_epochs} -> back to"),
    (["trainer.experiment_name=${now:%H}_${trainer.project_name}", "trainer.project_name=${trainer.experiment_name}"],
     "trainer.project_name: ${trainer.experiment_name} -> trainer.experiment_name: ${now:%H}_${trainer.project_name} "
     "-> back to trainer.project_name"),  # beside a form only OmegaConf resolves
])
def test_an_interpolation_cycle_names_every_key_in_it(overrides: list[str], cycle: str) -> None:
    """The launch's own key is in the message, not only the key of verl's defaults that refers back to it."""
    with pytest.raises(ConfigError, match=re.escape(f"its interpolations form a cycle, {cycle}")):
        tr(*overrides)


def test_a_value_the_run_would_stop_on_is_refused_in_the_report(capsys, tmp_path) -> None:
    """rollout.n=abc maps to rollout.n, which rlforge's schema (and verl's int field) refuses: the report's first line
    counts it and its line says why, at from-verl (where the data files need not exist) and at rlforge verl --print."""
    from rlforge.cli import main

    launch = ["algorithm.adv_estimator=grpo", f"{ARO}.rollout.name=hf", "data.train_files=/nowhere/train.parquet"]
    assert main(["config", "from-verl", *launch]) == 0  # the files are the run machine's: not checked here
    capsys.readouterr()
    assert main(["config", "from-verl", *launch, f"{ARO}.rollout.n=abc"]) == 2
    err = capsys.readouterr().err
    assert "0 mapped" not in err and ", 1 refused," in err.splitlines()[0]
    assert f"REFUSED     {ARO}.rollout.n = 'abc': a run would stop on this value: Invalid value for 'rollout.n'" in err
    assert "a run of it would stop on their values" in err
    out = tmp_path / "o.yaml"
    assert main(["config", "from-verl", *launch, f"{ARO}.rollout.n=0", "--out", str(out)]) == 2
    assert ", 1 refused," in capsys.readouterr().out and "must be a positive integer, got 0" in out.read_text()
    assert main(["verl", "--print", *launch[:2], f"{ARO}.rollout.n=0"]) == 2
    assert ", 1 refused," in capsys.readouterr().out.splitlines()[0]


def test_every_stopping_value_is_refused_and_the_run_machine_s_files_are_not_checked(capsys) -> None:
    """helper-50's findings: all bad values at once (not only the first), beside a refused feature, in the SFT
    trainer's launches too, wrong types found while keys are read together; and without --out none of the paths a
    run reads (reward model, tool config, checkpoint to resume) is looked for on this machine."""
    from rlforge.cli import main

    base = ["algorithm.adv_estimator=grpo", f"{ARO}.rollout.name=vllm", "data.train_files=/x/train.parquet"]
    for paths in (["reward_model.enable=True", "reward_model.model.path=/run/machine/rm"],
                  [f"{ARO}.rollout.multi_turn.enable=true", f"{ARO}.rollout.multi_turn.tool_config_path=/run/m/t.yaml"],
                  ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/run/m/ckpt/global_step_10"]):
        assert main(["config", "from-verl", *base, *paths]) == 0, paths
    capsys.readouterr()
    assert main(["config", "from-verl", *base, f"{ARO}.rollout.n=0", f"{ARO}.actor.optim.lr=-1",
                 "trainer.total_epochs=0", "trainer.logger=[console,clearml]", "trainer.test_freq=abc"]) == 2
    err = capsys.readouterr().err
    assert ", 5 refused," in err.splitlines()[0]
    for key in (f"{ARO}.rollout.n = 0", f"{ARO}.actor.optim.lr = -1", "trainer.total_epochs = 0",
                "trainer.logger = ", "trainer.test_freq = 'abc': verl 0.9.1 stops on this value too"):
        assert f"REFUSED     {key}" in err, key
    assert main(["config", "from-verl", *base, "data.train_batch_size=100"]) == 2  # the divisibility of two values:
    assert "REFUSED     data.train_batch_size = 100: a run would stop" in capsys.readouterr().err  # the launch's key
    critic = fate(tr("algorithm.adv_estimator=gae", "critic.model.path=null"), "critic.model.path")
    assert critic.kind == verl.REFUSED and "verl's critic loads its model from this path" in critic.text
    assert fate(tr(f"{ARO}.rollout.top_k=-2"), f"{ARO}.rollout.top_k").kind == verl.REFUSED  # vLLM refuses it
    assert tr(f"{ARO}.rollout.top_k=-1").overrides["rollout.top_k"] == 0  # off, as 0
    for n in ("0", "2.5"):  # greedy validation generates once, but verl repeats the batch val_kwargs.n times
        assert fate(tr(f"{ARO}.rollout.val_kwargs.n={n}"), f"{ARO}.rollout.val_kwargs.n").kind == verl.REFUSED
    assert main(["config", "from-verl", "--sft", "data.train_files=/x/t.parquet", "model.path=builtin:tiny-arith",
                 "optim.lr=-1", "data.max_length=abc"]) == 2
    err = capsys.readouterr().err
    assert "REFUSED     optim.lr = -1: a run would stop on this value: 'sft.lr' must be >= 0" in err
    assert "REFUSED     data.max_length = 'abc'" in err


def test_helper_50_s_leftovers_are_refused_on_the_launch_s_own_key(capsys) -> None:
    """Values that went through keys read together, or keys rlforge ignores but verl checks, are refused on the key
    the launch set, with no other key blamed."""
    from rlforge.cli import main

    wrong = tr("trainer.nnodes=abc")  # read by several rules: only the key itself is refused
    assert [f.key for f in wrong.refused] == ["trainer.nnodes"] and "positive integer" in wrong.refused[0].text
    for override in ("trainer.nnodes=0", "trainer.nnodes=-1", "trainer.n_gpus_per_node=0"):
        t = tr(override)
        assert [f.key for f in t.refused] == [override.split("=")[0]], override
        assert "it takes a positive integer" in t.refused[0].text and "strategy.num_processes" not in t.overrides
    f = "algorithm.filter_groups"  # the bad string, not the good count read after it
    dapo = tr(f"{f}.enable=True", f"{f}.metric=acc", f"{f}.max_num_gen_batches=2", "data.gen_batch_size=4",
              "data.train_batch_size=abc", name="dapo_trainer")
    assert [f.key for f in dapo.refused] == ["data.train_batch_size"] and "data.train_batch_size" not in dapo.overrides
    assert "verl 0.9.1 stops on this value too (unsupported operand" in dapo.refused[0].text
    for override in ("trainer.nnodes=1.5", "trainer.n_gpus_per_node=2.5"):  # not truncated to a count
        assert [f.key for f in tr(override).refused] == [override.split("=")[0]], override
    mapping = tr("data.max_prompt_length={a:1}")
    assert [f.key for f in mapping.refused] == ["data.max_prompt_length.a"]
    assert "a mapping given for data.max_prompt_length, which verl's config holds as one value" in mapping.refused[0].text
    nan = tr("data.max_response_length=nan")  # rollout.response_length's default follows it: not a second length
    assert fate(nan, f"{ARO}.rollout.response_length").kind == verl.MAPPED
    for override in ("data.val_batch_size=0", "data.dataloader_num_workers=-1", "trainer.default_local_dir=null"):
        assert fate(tr(override), override.split("=")[0]).kind == verl.REFUSED, override
    for override in ("data.val_batch_size=null", "data.dataloader_num_workers=0"):
        assert fate(tr(override), override.split("=")[0]).kind == verl.IGNORED, override
    assert fate(tr("trainer.default_local_dir=null", "trainer.resume_mode=disable"),
                "trainer.default_local_dir").kind == verl.MAPPED  # neither looked in nor saved to
    base = ["algorithm.adv_estimator=grpo", f"{ARO}.rollout.name=vllm"]
    for key, value in ((f"{ARO}.rollout.gpu_memory_utilization", "2"),
                       (f"{ARO}.rollout.tensor_model_parallel_size", "0")):
        assert main(["config", "from-verl", *base, f"{key}={value}"]) == 2  # the vllm engine's own ranges
        assert f"REFUSED     {key} = {value}: a run would stop on this value" in capsys.readouterr().err
    # refused, its place taken by rlforge's default, which disagrees with a verl default: no stop of the launch's
    assert main(["config", "from-verl", *base, "data.train_batch_size=abc"]) == 2
    assert "would stop here" not in capsys.readouterr().err
    lora = [*base, f"{ARO}.model.lora_rank=8", "trainer.n_gpus_per_node=2"]  # checks that read no file run too
    assert main(["config", "from-verl", *lora]) == 2
    assert "would stop here: LoRA (model.lora.rank=8) runs on one device so far" in capsys.readouterr().err
    assert main(["verl", "--print", *base, "trainer.device=npu", "--", "trainer.total_steps=abc"]) == 2
    err = capsys.readouterr().err  # a key refused, and a stop on rlforge's own key after --: both said
    assert "the run would stop here" in err and "trainer.total_steps" in err


def test_a_stop_no_verl_key_s_value_explains_still_shows_the_translation(capsys, monkeypatch) -> None:
    import rlforge.tools.verl_cli as verl_cli
    from rlforge.cli import main

    def stops(*args: object, **kwargs: object) -> None:
        raise ConfigError("'trainer.pipeline' cannot run with this layout.")  # about a key no verl key was mapped to

    monkeypatch.setattr(verl_cli, "_compose", stops)
    assert main(["config", "from-verl", "algorithm.adv_estimator=grpo", f"{ARO}.rollout.name=hf"]) == 2
    captured = capsys.readouterr()
    assert "algorithm:" in captured.out and ", 0 refused," in captured.err  # the translation and its report
    assert "a run of it would stop here: 'trainer.pipeline' cannot run with this layout." in captured.err


@pytest.mark.parametrize("override", [f"{ARO}.actor.use_kl_loss=no", "algorithm.use_kl_in_reward=off",
                                      "algorithm.norm_adv_by_std_in_grpo='False'", "data.shuffle=no",
                                      "critic.enable='False'", f"{ARO}.actor.shuffle=no", "distillation.enabled=no"])
def test_a_word_for_a_true_false_switch_is_an_error_not_read_two_ways(override: str) -> None:
    # Hydra reads only true/false as booleans: verl's code takes 'no' as true, rlforge's schema would take it as false
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"A string for a true/false switch of verl's config: .*{re.escape(key)}="
                                          r".*write true or false"):
        tr(override)
    with pytest.raises(ConfigError, match=r"critic.use_dynamic_bsz='no'"):  # a switch whose default interpolates
        tr("algorithm.adv_estimator=gae", "critic.use_dynamic_bsz=no")
    assert fate(tr("skip.rollout.enable=no"), "skip.rollout.enable").kind == verl.MAPPED  # verl converts that one
    assert fate(tr("trainer.use_v1=1"), "trainer.use_v1").kind == verl.MAPPED  # main_ppo tests it as given


def test_the_reference_model_s_micro_batch_keys_are_unread_without_a_kl_term() -> None:
    keys = (f"{ARO}.ref.log_prob_micro_batch_size_per_gpu", f"{ARO}.ref.log_prob_use_dynamic_bsz")
    off = tr(f"{keys[0]}=2")
    assert all(fate(off, k).unread for k in keys) and "actor.ref_log_prob.micro_batch_size" not in off.overrides
    on = tr(f"{keys[0]}=2", f"{ARO}.actor.use_kl_loss=True")
    assert on.overrides["actor.ref_log_prob.micro_batch_size"] == 2


def test_a_misspelled_key_gets_the_key_it_nearly_spells() -> None:
    with pytest.raises(ConfigError, match=r"'trainer.projct_name' is not a key.*Did you mean 'trainer.project_name'\?$"):
        tr("trainer.projct_name=x")
    with pytest.raises(ConfigError, match=r"To add a key, prefix it with '\+': \+trainer.brand_new=3"):
        tr("trainer.brand_new=3")
    with pytest.raises(ConfigError, match=r"cannot delete 'trainer.projct_name'.*Did you mean 'trainer.project_name'"):
        tr("~trainer.projct_name")
    added = fate(tr("+trainer.projct_name=x"), "trainer.projct_name")  # added with '+': refused, and the key named
    assert added.kind == verl.REFUSED and "did you mean 'trainer.project_name'?" in added.text
    field = fate(tr(f"++{ARO}.actor.kl_los_coef=0.1"), f"{ARO}.actor.kl_los_coef")  # a config class's missing field
    assert f"did you mean '{ARO}.actor.kl_loss_coef'?" in field.text


def test_a_deleted_key_verl_does_not_read_there_is_unread_not_refused() -> None:
    coef = f"{ARO}.actor.kl_loss_coef"
    off = fate(tr(f"~{coef}"), coef)  # no KL term: verl never looks for it, so no class default stands in
    assert off.kind == verl.IGNORED and off.unread and "a deleted key" in off.text
    ref = f"{ARO}.ref.log_prob_micro_batch_size_per_gpu"
    assert fate(tr(f"~{ref}"), ref).unread
    on = fate(tr(f"~{coef}", f"{ARO}.actor.use_kl_loss=True"), coef)
    assert on.kind == verl.REFUSED and "a deleted key" in on.text


def test_a_config_file_s_word_for_a_switch_is_the_same_error(tmp_path) -> None:
    from rlforge.config.verl_launch import prepare_file

    own = tmp_path / "ppo.yaml"
    own.write_text('actor_rollout_ref:\n  actor:\n    use_kl_loss: "off"\n')
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.use_kl_loss='off'.*write true or false"):
        prepare_file(str(own))
