"""rlforge.config: composition (defaults < preset < --config file < overrides), validation, batch sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from rlforge.algorithms.grpo import GRPO
from rlforge.config import compose, explain_batch_sizes
from rlforge.config.schema import RLForgeConfig
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.plugin_manager import PluginManager
from rlforge.registry import UnknownComponentError


class PresetAlgo(GRPO):
    """GRPO with a preset that differs from the defaults (for precedence tests)."""

    preset = {"rollout": {"n": 4, "temperature": 0.7}, "actor": {"lr": 1e-3, "weight_decay": 0.1}}


class _PresetPlugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.algorithm.register("preset_algo", PresetAlgo)


@pytest.fixture(scope="module")
def preset_registry():
    pm = PluginManager(autoload=False)
    pm.register(_PresetPlugin(), name="preset-plugin")
    return pm.registry


def _yaml(tmp_path: Path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- defaults and precedence ------------------------------------------------------------------------


def test_defaults_match_the_schema(registry) -> None:
    cfg = compose(registry)
    schema = OmegaConf.structured(RLForgeConfig)
    assert cfg.algorithm.name == "grpo"
    assert cfg.actor.lr == schema.actor.lr == 5e-5
    assert cfg.rollout.n == 8
    assert cfg.rollout.name == "hf"
    assert cfg.data.name == "arith"
    assert cfg.data.train_batch_size == 32
    assert list(cfg.logger.backends) == ["console", "mlflow"]
    assert cfg.trainer.controller == "local"
    # the algorithm section is GRPO's dataclass
    assert cfg.algorithm.norm_adv_by_std is True
    assert cfg.algorithm.epsilon == 1e-6


def test_algo_argument_selects_algorithm(preset_registry) -> None:
    assert compose(preset_registry, "preset_algo").algorithm.name == "preset_algo"
    assert compose(preset_registry, None, None, ["algorithm.name=preset_algo"]).algorithm.name == "preset_algo"


def test_algorithm_name_from_config_file(preset_registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "algorithm:\n  name: preset_algo\n")
    cfg = compose(preset_registry, None, path)
    assert cfg.algorithm.name == "preset_algo"
    assert cfg.rollout.n == 4


def test_preset_overrides_defaults(preset_registry) -> None:
    cfg = compose(preset_registry, "preset_algo")
    assert cfg.rollout.n == 4
    assert cfg.rollout.temperature == 0.7
    assert cfg.actor.lr == 1e-3
    assert cfg.actor.weight_decay == 0.1
    assert cfg.actor.grad_clip == 1.0  # untouched default


def test_precedence_defaults_preset_file_overrides(preset_registry, tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "actor:\n  lr: 2.0e-3\n  weight_decay: 0.2\nrollout:\n  temperature: 0.5\ntrainer:\n  total_steps: 7\n",
    )
    cfg = compose(preset_registry, "preset_algo", path, ["actor.lr=3e-3", "trainer.total_steps=9"])
    assert cfg.actor.lr == 3e-3  # override > file > preset
    assert cfg.trainer.total_steps == 9  # override > file > default
    assert cfg.actor.weight_decay == 0.2  # file > preset
    assert cfg.rollout.temperature == 0.5  # file > preset
    assert cfg.rollout.n == 4  # preset > default
    assert cfg.actor.clip_ratio_c == 3.0  # default


def test_file_overrides_defaults(registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "data:\n  train_batch_size: 16\nactor:\n  ppo_mini_batch_size: 8\n")
    cfg = compose(registry, None, path)
    assert cfg.data.train_batch_size == 16
    assert cfg.actor.ppo_mini_batch_size == 8


def test_overrides_parse_values_as_yaml(registry) -> None:
    cfg = compose(registry, None, None, ["logger.backends=[console]", "actor.use_kl_loss=true", "actor.lr=1e-4"])
    assert list(cfg.logger.backends) == ["console"]
    assert cfg.actor.use_kl_loss is True
    assert cfg.actor.lr == 1e-4


@pytest.mark.parametrize("key", ["model.path", "model.ref_path"])
def test_missing_model_path_fails_at_compose(registry, key: str) -> None:
    with pytest.raises(RLForgeError, match=f"Model path '/nonexistent' does not exist \\({key}\\)"):
        compose(registry, None, None, [f"{key}=/nonexistent"])


def test_missing_reward_file_fails_at_compose(registry) -> None:
    with pytest.raises(ConfigError, match="Reward file not found: nope.py \\(reward.file\\)"):
        compose(registry, None, None, ["reward.file=nope.py"])


def test_empty_config_file_is_allowed(registry, tmp_path: Path) -> None:
    cfg = compose(registry, None, _yaml(tmp_path, ""))
    assert cfg.actor.lr == 5e-5


# --- errors ----------------------------------------------------------------------------------------


def test_unknown_key_names_full_key_and_suggests(registry) -> None:
    with pytest.raises(ConfigError) as info:
        compose(registry, None, None, ["actor.lrr=1e-5"])
    msg = str(info.value)
    assert "'actor.lrr'" in msg
    assert "Did you mean 'actor.lr'?" in msg
    assert "command-line overrides" in msg


def test_unknown_section_suggests_section(registry) -> None:
    with pytest.raises(ConfigError, match=r"Did you mean 'actor'\?"):
        compose(registry, None, None, ["actorr.lr=1e-5"])


def test_unknown_key_in_algorithm_section(registry) -> None:
    with pytest.raises(ConfigError) as info:
        compose(registry, None, None, ["algorithm.epsilonn=0.1"])
    assert "'algorithm.epsilonn'" in str(info.value)
    assert "Did you mean 'algorithm.epsilon'?" in str(info.value)


def test_unknown_key_in_config_file_names_the_file(registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "rollout:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError) as info:
        compose(registry, None, path)
    msg = str(info.value)
    assert "'rollout.temprature'" in msg
    assert path in msg
    assert "Did you mean 'rollout.temperature'?" in msg


def test_wrong_type_names_the_key(registry) -> None:
    with pytest.raises(ConfigError) as info:
        compose(registry, None, None, ["actor.lr=abc"])
    assert "'actor.lr'" in str(info.value)
    assert "abc" in str(info.value)


def test_wrong_type_int_field(registry) -> None:
    with pytest.raises(ConfigError, match=r"'rollout\.n'"):
        compose(registry, None, None, ["rollout.n=many"])


@pytest.mark.parametrize("bad", ["actor.lr", "=1e-5", "actor.lr 1e-5"])
def test_malformed_override(registry, bad: str) -> None:
    with pytest.raises(ConfigError, match="key=value"):
        compose(registry, None, None, [bad])


def test_an_unknown_key_whose_last_part_is_a_key_of_another_section_names_that_key(registry) -> None:
    with pytest.raises(ConfigError, match=r"Unknown config key 'actor.kl_coef' .* 'kl_coef' is a key of another "
                                          r"section: did you mean 'algorithm.kl_coef'\?"):
        compose(registry, None, None, ["actor.kl_coef=0.1"])
    with pytest.raises(ConfigError, match=r"did you mean 'actor.lr' or 'critic.lr'"):
        compose(registry, None, None, ["rollout.lr=0.1"])


def test_missing_config_file(registry, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not found") as info:
        compose(registry, None, missing)
    assert missing in str(info.value)


def test_invalid_yaml_file(registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "actor: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        compose(registry, None, path)


def test_config_file_must_be_a_mapping(registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        compose(registry, None, path)


@pytest.mark.parametrize(
    ("override", "key", "available"),
    [
        ("rollout.name=nope", "rollout.name", "hf"),
        ("strategy.name=nope", "strategy.name", "fabric, fsdp, megatron, single, tp"),
        ("data.name=nope", "data.name", "arith, arith_pairs, arith_tool, files"),
        ("reward.manager=nope", "reward.manager", "generative, model, rule"),
        ("trainer.controller=nope", "trainer.controller", "local"),
        ("logger.backends=[console,nope]", "logger.backends", "console, csv, jsonl, mlflow, swanlab, tensorboard, trackio, wandb"),
    ],
)
def test_unknown_component_lists_available(registry, override: str, key: str, available: str) -> None:
    with pytest.raises(UnknownComponentError) as info:
        compose(registry, None, None, [override])
    msg = str(info.value)
    assert "'nope'" in msg
    assert f"({key})" in msg
    assert f"Available: {available}" in msg


def test_unknown_algorithm(registry) -> None:
    with pytest.raises(UnknownComponentError, match=r"Unknown algorithm 'grpoo'.*Did you mean 'grpo'\?"):
        compose(registry, "grpoo")


def test_unknown_component_error_is_rlforge_error() -> None:
    assert issubclass(UnknownComponentError, RLForgeError)


def test_mini_batch_must_divide_train_batch(registry) -> None:
    with pytest.raises(ConfigError) as info:
        compose(registry, None, None, ["data.train_batch_size=30", "actor.ppo_mini_batch_size=4"])
    msg = str(info.value)
    assert "actor.ppo_mini_batch_size" in msg and "data.train_batch_size" in msg
    assert "30" in msg and "4" in msg


def test_mini_batch_larger_than_train_batch(registry) -> None:
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        compose(registry, None, None, ["data.train_batch_size=12"])  # mini stays 8


def test_micro_batch_must_divide_mini_times_n(registry) -> None:
    with pytest.raises(ConfigError) as info:
        compose(registry, None, None, ["actor.ppo_micro_batch_size=100"])
    msg = str(info.value)
    assert "actor.ppo_micro_batch_size" in msg
    assert "8 prompts x rollout.n=8 = 64 samples" in msg


def test_token_budget_and_micro_batch_size_exclude_each_other(registry) -> None:
    with pytest.raises(ConfigError, match=r"Set one of 'actor.ppo_micro_batch_size' \(8 samples\) and "
                                          r"'actor.max_tokens_per_micro_batch' \(512 tokens\)"):
        compose(registry, None, None, ["actor.ppo_micro_batch_size=8", "actor.max_tokens_per_micro_batch=512"])


def test_token_budget_must_hold_the_longest_sequence(registry) -> None:
    with pytest.raises(ConfigError, match=r"'actor.max_tokens_per_micro_batch' \(50\) must hold the longest sequence: "
                                          r"data.max_prompt_length \+ rollout.max_new_tokens = 72 tokens"):
        compose(registry, None, None, ["actor.max_tokens_per_micro_batch=50"])
    cfg = compose(registry, None, None, ["actor.max_tokens_per_micro_batch=72"])
    assert "micro-batches of at most 72 tokens" in explain_batch_sizes(cfg, RLModule.batch_words())


def test_scoring_passes_are_cut_by_count_or_by_tokens(registry) -> None:
    with pytest.raises(ConfigError, match=r"Set one of 'actor.log_prob.micro_batch_size' \(8 sequences\) and "
                                          r"'actor.log_prob.max_tokens_per_micro_batch' \(512 tokens\)"):
        compose(registry, None, None, ["actor.log_prob.micro_batch_size=8", "actor.log_prob.max_tokens_per_micro_batch=512"])
    with pytest.raises(ConfigError, match=r"'actor.ref_log_prob.max_tokens_per_micro_batch' \(50\) must hold the "
                                          r"longest sequence"):
        compose(registry, None, None, ["actor.ref_log_prob.max_tokens_per_micro_batch=50"])
    cfg = compose(registry, None, None, ["actor.max_tokens_per_micro_batch=512", "actor.log_prob.micro_batch_size=8"])
    assert cfg.actor.log_prob.micro_batch_size == 8  # its own count beside the update's token budget


def test_sampled_validation_takes_its_own_top_p_and_top_k(registry) -> None:
    from rlforge.sampling import SamplingParams

    cfg = compose(registry, None, None, ["rollout.val_temperature=1.0", "rollout.val_top_p=0.7", "rollout.val_top_k=20"])
    params = SamplingParams.from_config(cfg.rollout, validation=True)
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 0.7, 20)
    assert SamplingParams.from_config(cfg.rollout).top_p == 1.0  # the training rollouts keep rollout.top_p


def test_epoch_limit_shortens_the_run_and_keeps_the_schedule(registry) -> None:
    from rlforge.config.batches import apply_total_epochs
    from rlforge.module import schedule_steps

    cfg = compose(registry, None, None, ["trainer.total_steps=20", "trainer.epoch_limit=2", "data.train_batch_size=8"])
    apply_total_epochs(cfg, 50)  # 6 whole batches per epoch: 12 steps
    assert cfg.trainer.total_steps == 12 and cfg.trainer.schedule_steps == 20 and schedule_steps(cfg) == 20
    later = compose(registry, None, None, ["trainer.total_steps=5", "trainer.epoch_limit=2", "data.train_batch_size=8"])
    apply_total_epochs(later, 50)  # total_steps comes first: nothing changes
    assert later.trainer.total_steps == 5 and later.trainer.schedule_steps is None and schedule_steps(later) == 5
    # verl's loop ends at the epoch limit without its last step's validation, unless test_freq names that step
    for every, after in ((5, False), (4, True), (0, False)):
        cut = compose(registry, None, None, ["trainer.total_steps=20", "trainer.epoch_limit=2", "data.train_batch_size=8",
                                             f"trainer.val_every={every}"])
        apply_total_epochs(cut, 50)
        assert cut.trainer.val_at_end is after, every
    assert later.trainer.val_at_end is True  # not cut: the last step validates


def test_total_epochs_sets_the_steps_from_the_rows(registry) -> None:
    from rlforge.config.batches import apply_total_epochs

    cfg = compose(registry, None, None, ["trainer.total_epochs=3", "data.train_batch_size=8"])
    apply_total_epochs(cfg, 50)
    assert cfg.trainer.total_steps == 3 * (50 // 8) and OmegaConf.is_readonly(cfg)
    plain = compose(registry, None, None, ["trainer.total_steps=7"])
    apply_total_epochs(plain, 50)
    assert plain.trainer.total_steps == 7


def test_consistent_batch_sizes_pass(registry) -> None:
    cfg = compose(
        registry, None, None,
        ["data.train_batch_size=12", "actor.ppo_mini_batch_size=6", "rollout.n=2", "actor.ppo_micro_batch_size=4"],
    )
    assert cfg.data.train_batch_size == 12


@pytest.mark.parametrize("key", ["rollout.n", "data.train_batch_size", "trainer.total_steps"])
def test_non_positive_sizes(registry, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"'{key}' must be a positive integer"):
        compose(registry, None, None, [f"{key}=0"])


def test_invalid_loss_agg_mode(registry) -> None:
    with pytest.raises(ConfigError) as info:
        compose(registry, None, None, ["actor.loss_agg_mode=token-median"])
    msg = str(info.value)
    assert "actor.loss_agg_mode" in msg and "token-median" in msg
    for mode in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert mode in msg


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_valid_loss_agg_modes(registry, mode: str) -> None:
    assert compose(registry, None, None, [f"actor.loss_agg_mode={mode}"]).actor.loss_agg_mode == mode


def test_invalid_kl_loss_type(registry) -> None:
    with pytest.raises(ConfigError, match="actor.kl_loss_type"):
        compose(registry, None, None, ["actor.kl_loss_type=k4"])


def test_invalid_dtype_and_top_p(registry) -> None:
    with pytest.raises(ConfigError, match=r"'model.precision' must be one of auto, 32-true"):
        compose(registry, None, None, ["model.precision=float64"])
    with pytest.raises(ConfigError, match="rollout.top_p"):
        compose(registry, None, None, ["rollout.top_p=1.5"])


def test_result_is_read_only(registry) -> None:
    cfg = compose(registry)
    with pytest.raises(ReadonlyConfigError):
        cfg.actor.lr = 1.0
    with pytest.raises(ReadonlyConfigError):
        cfg.algorithm.epsilon = 0.5
    assert cfg.actor.lr == 5e-5


def test_load_config_helper() -> None:
    import rlforge

    cfg = rlforge.load_config(overrides=["trainer.total_steps=3"], plugins=PluginManager(autoload=False))
    assert cfg.trainer.total_steps == 3


def test_one_value_for_a_list_key_is_a_one_item_list(registry, tmp_path: Path) -> None:
    # verl's habit: data.train_files=train.parquet (no brackets)
    (tmp_path / "train.jsonl").write_text("")
    cfg = compose(registry, None, None, ["data.name=files", f"data.train_files={tmp_path}/train.jsonl",
                                         "logger.backends=console", "model.lora.target_modules=q_proj"])
    assert list(cfg.data.train_files) == [f"{tmp_path}/train.jsonl"] and list(cfg.logger.backends) == ["console"]
    assert list(cfg.model.lora.target_modules) == ["q_proj"]


# --- issue 33: configs that resolved silently or with a traceback --------------------------------------------------
def test_an_unresolvable_interpolation_names_the_key_and_the_file(registry, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RLFORGE_TEST_UNSET", raising=False)
    path = _yaml(tmp_path, "trainer:\n  experiment: ${oc.env:RLFORGE_TEST_UNSET}\n")
    with pytest.raises(ConfigError, match=r"Cannot resolve 'trainer.experiment: \$\{oc.env:RLFORGE_TEST_UNSET\}' "
                                          r"\(in .*run.yaml\).*RLFORGE_TEST_UNSET"):
        compose(registry, None, path)
    with pytest.raises(ConfigError, match=r"Cannot resolve 'trainer.project: \$\{trainer.nothing\}' \(in command-line"):
        compose(registry, None, None, ["trainer.project=${trainer.nothing}"])


def test_a_resolvable_interpolation_is_resolved_at_compose_time(registry, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RLFORGE_TEST_SET", "from_env")
    cfg = compose(registry, None, _yaml(tmp_path, "trainer:\n  experiment: ${oc.env:RLFORGE_TEST_SET}\n"
                                                  "  project: p_${trainer.experiment}\n"))
    assert cfg.trainer.experiment == "from_env" and cfg.trainer.project == "p_from_env"
    assert not OmegaConf.is_interpolation(cfg.trainer, "project")


def test_algo_flag_and_a_different_algorithm_name_are_refused(preset_registry, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--algo grpo and algorithm.name=preset_algo \(in command-line overrides\) "
                                          r"name two algorithms"):
        compose(preset_registry, "grpo", None, ["algorithm.name=preset_algo"])
    with pytest.raises(ConfigError, match=r"algorithm.name=preset_algo \(in .*run.yaml\)"):
        compose(preset_registry, "grpo", _yaml(tmp_path, "algorithm:\n  name: preset_algo\n"))
    assert compose(preset_registry, "grpo", None, ["algorithm.name=grpo"]).algorithm.name == "grpo"


def test_a_section_given_twice_in_a_file_is_refused_with_both_lines(registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "trainer:\n  total_steps: 5\nactor:\n  lr: 0.1\ntrainer:\n  seed: 3\n")
    with pytest.raises(ConfigError, match=r"run.yaml gives 'trainer' twice in one section \(line 1 and line 5\)"):
        compose(registry, None, path)
    with pytest.raises(ConfigError, match=r"gives 'lr' twice in one section \(line 2 and line 3\)"):
        compose(registry, None, _yaml(tmp_path, "actor:\n  lr: 0.1\n  lr: 0.2\n", "b.yaml"))


def test_data_files_without_a_data_source_that_reads_them_are_refused(registry) -> None:
    with pytest.raises(ConfigError, match=r"'data.train_files' is set \(/x/train.parquet\) but data.name=arith does "
                                          r"not read it.*data.name=files"):
        compose(registry, None, None, ["data.train_files=[/x/train.parquet]"])


def test_a_value_given_to_a_section_says_how_to_set_it(pm):
    import rlforge

    with pytest.raises(ConfigError, match=r"'data' \(in command-line overrides\) is a section of the config, not a "
                                          r"value: set its keys \(data.name, data.train_files"):
        rlforge.load_config("grpo", ["data=5"], plugins=pm)
    with pytest.raises(ConfigError, match=r"set its keys \(data.reasoning_gym.config.<name>=<value>\), or give a "
                                          r"mapping"):  # a mapping section with no keys of its own
        rlforge.load_config("grpo", ["data.name=reasoning_gym", "data.reasoning_gym.config=5"], plugins=pm)


def test_an_empty_value_for_a_required_key_says_it_needs_one(pm):
    import rlforge

    with pytest.raises(ConfigError, match=r"Invalid value for 'model.path' \(in command-line overrides\): it needs a "
                                          r"value \('model.path=' with nothing after the '=' sets it to null\)"):
        rlforge.load_config("grpo", ["model.path="], plugins=pm)


def test_chat_template_kwargs_may_not_set_apply_chat_templates_own_parameters(registry) -> None:
    compose(registry, overrides=["data.apply_chat_template_kwargs={enable_thinking: false, reasoning_effort: low}"])
    with pytest.raises(ConfigError, match=r"'data.apply_chat_template_kwargs' sets tokenize: a parameter of "
                                          r"apply_chat_template or a name the render itself passes"):
        compose(registry, overrides=["data.apply_chat_template_kwargs={tokenize: false}"])
    with pytest.raises(ConfigError, match=r"sets chat_template.*\(a template of your own: model.chat_template\)"):
        compose(registry, overrides=["data.apply_chat_template_kwargs={chat_template: x}"])
    with pytest.raises(ConfigError, match=r"sets messages"):  # the template's own variable
        compose(registry, overrides=["data.apply_chat_template_kwargs={messages: 1}"])
    with pytest.raises(ConfigError, match=r"'model.chat_template' is not a valid Jinja chat template: unexpected '}' "
                                          r"\(line 1\)"):
        compose(registry, overrides=["model.chat_template='{{ m.content }'"])
    with pytest.raises(ConfigError, match=r"'model.chat_template' is empty: leave it unset \(null\)"):
        compose(registry, overrides=["model.chat_template=''"])
    # transformers' own extensions and tags (loop controls, {% generation %}) are valid
    compose(registry, overrides=["model.chat_template='{% for m in messages %}{% generation %}{{ m.content }}"
                                 "{% endgeneration %}{% break %}{% endfor %}'"])
