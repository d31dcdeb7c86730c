"""verl's reward keys in rlforge's terms, checked against verl 0.9.1's own reading of them: the legacy keys
(reward_model.*, custom_reward_function.*, the old recipes' overlong keys) moving to reward.* as verl's trainers move
them, reward_kwargs, verl's older reward managers, a reward call that raises, the reward worker count. Pure config
work, no models."""

from __future__ import annotations

from rlforge.config import verl
from rlforge.config.verl_launch import prepare
from tests.tools.test_verl_features import GPUS, _fate, _t


def test_legacy_overlong_keys_replace_the_section_and_the_old_recipe_keys_are_unread() -> None:
    dapo = ["--config-name=dapo_trainer", *GPUS, "algorithm.filter_groups.metric=acc", "data.max_response_length=64"]
    legacy = "+reward_model.reward_kwargs"
    t = prepare([*dapo, f"{legacy}.overlong_buffer_cfg.enable=True", f"{legacy}.overlong_buffer_cfg.len=4",
                 f"{legacy}.max_resp_len=64"], refuse=False).translation
    assert t.overrides["algorithm.overlong_buffer"] == 4  # the launch's 4, not the section it replaces
    assert "replaced by reward_model.reward_kwargs" in _fate(t, "reward.reward_kwargs.overlong_buffer_cfg.len").text
    t = prepare([*dapo, "+reward_model.overlong_buffer.enable=True", "+reward_model.overlong_buffer.len=16"],
                refuse=False).translation
    assert _fate(t, "reward_model.overlong_buffer.len").kind == verl.IGNORED
    t = prepare(["--config-name=dapo_trainer", *GPUS, "algorithm.filter_groups.enable=True",
                 "algorithm.filter_groups.metric=acc", "algorithm.filter_groups.max_num_gen_batches=0",
                 "data.gen_batch_size=64", "data.train_batch_size=32"], refuse=False).translation
    assert t.overrides["algorithm.max_gen_batches"] == 1000  # verl's 0: no limit, from both keys
    recipe = ["--config-name=dapo_trainer", *GPUS, "algorithm.filter_groups.enable=True",
              "algorithm.filter_groups.max_num_gen_batches=3", "data.train_batch_size=32"]
    t = prepare([*recipe, "data.gen_batch_size=16"], refuse=False).translation  # fewer prompts per round than a batch
    assert t.overrides["algorithm.max_gen_batches"] == 2  # the 48 prompts of verl's 3 rounds: 2 rounds of 32
    assert "verl draws data.gen_batch_size=16 prompts per round" in _fate(t, "data.gen_batch_size").text
    t = prepare([*recipe, "data.gen_batch_size=8"], refuse=False).translation  # 3 x 8 prompts for 32 groups
    assert "verl's DAPO recipe stops with an error at its first step too" in _fate(
        t, "algorithm.filter_groups.max_num_gen_batches").text
    t = prepare([*recipe, "data.gen_batch_size=96"], refuse=False).translation
    assert t.overrides["algorithm.max_gen_batches"] == 9
    assert _fate(prepare([*recipe, "data.gen_batch_size=32"], refuse=False).translation,
                 "data.gen_batch_size").kind == verl.MAPPED


def test_the_legacy_custom_reward_function_moves_as_a_whole_section() -> None:
    dapo = ["--config-name=dapo_trainer", *GPUS, "algorithm.filter_groups.metric=acc"]
    t = prepare([*dapo, "custom_reward_function.name=other", "reward.custom_reward_function.path=/x.py"],
                refuse=False).translation  # verl: the legacy section (path null) replaces the new one
    assert "reward.file" not in t.overrides and "reward.fn_name" not in t.overrides
    t = prepare([*dapo, "custom_reward_function.path=/x.py"], refuse=False).translation
    assert t.overrides["reward.file"] == "/x.py" and "verl stops" in _fate(t, "reward.custom_reward_function.name").text


def test_custom_reward_function_reward_kwargs_become_reward_fn_kwargs() -> None:
    new, old = "reward.custom_reward_function", "custom_reward_function"
    t = _t(f"{new}.path=/x.py", f"+{new}.reward_kwargs.format_score=0.1", f"+{new}.reward_kwargs.opts.n=2")
    assert t.overrides["reward.fn_kwargs"] == {"format_score": 0.1, "opts": {"n": 2}}  # verl binds them to the function
    assert _fate(t, f"{new}.reward_kwargs.opts.n").kind == verl.MAPPED
    t = _t(f"+{new}.reward_kwargs.format_score=0.1")  # no custom function: verl never reads them
    assert "reward.fn_kwargs" not in t.overrides
    assert "read only with custom_reward_function.path" in _fate(t, f"{new}.reward_kwargs.format_score").text
    # main_ppo: rlforge moves a legacy key over the new section's and says verl leaves it unread; the kwargs go with
    # the function: the legacy section's replace the new one's where it gives the path, else key by key
    t = _t(f"{old}.path=/x.py", f"+{old}.reward_kwargs.a=1", f"+{new}.reward_kwargs.a=0", f"+{new}.reward_kwargs.b=2")
    assert t.overrides["reward.fn_kwargs"] == {"a": 1}
    assert "main_ppo leaves this legacy key unread" in _fate(t, f"{old}.reward_kwargs.a").text
    assert "go with it" in _fate(t, f"{new}.reward_kwargs.b").text
    t = _t(f"{new}.path=/x.py", f"+{old}.reward_kwargs.a=1", f"+{new}.reward_kwargs.a=0", f"+{new}.reward_kwargs.b=2")
    assert t.overrides["reward.fn_kwargs"] == {"a": 1, "b": 2}
    # the DAPO recipe moves the legacy section whole: the new section's kwargs are gone
    dapo = ["--config-name=dapo_trainer", *GPUS, "algorithm.filter_groups.metric=acc"]
    t = prepare([*dapo, f"{old}.path=/x.py", f"{old}.name=f", f"+{old}.reward_kwargs.a=1", f"+{new}.reward_kwargs.b=2"],
                refuse=False).translation
    assert t.overrides["reward.fn_kwargs"] == {"a": 1}
    assert _fate(t, f"{new}.reward_kwargs.b").kind == verl.IGNORED


def test_verl_s_older_reward_managers_are_named_as_verl_s() -> None:
    """prime and batch are verl's own (still in 0.9.1's verl/workers/reward_manager), not a project's: refused, with
    what they do and what rlforge has for prime's parallel scoring."""
    for key in ("reward_model.reward_manager", "reward.reward_manager.name"):
        t = _t(f"{key}=prime")
        assert _fate(t, key).kind == verl.REFUSED
        text = _fate(t, key).text
        assert text.startswith("verl's older 'prime' reward manager (verl/workers/reward_manager/prime.py") and \
            "reward.num_workers" in text and "own project" not in text
    assert "own project" in _fate(_t("reward_model.reward_manager=re_call"), "reward_model.reward_manager").text


def test_a_reward_call_that_raises_stops_a_verl_launch_as_in_verl() -> None:
    """verl's reward managers let a reward function's exception end the run; rlforge's default would score the sample
    reward.fallback_score, so the translation sets reward.max_error_share=0 and says so."""
    t = _t()
    assert t.overrides["reward.max_error_share"] == 0.0
    assert "a reward call that raises stops the run, as in verl" in _fate(t, "reward.reward_manager.name").text


def test_verls_gdpo_reward_manager_is_the_rule_manager_that_tells_the_function_the_experiment() -> None:
    """verl 0.9.1's gdpo reward manager is its naive one with extra_info['experiment_name'] set (its example's rlla.py
    reads it to pick the chat format); helper-81 found the launch refused."""
    t = _t("reward.reward_manager.name=gdpo", "trainer.experiment_name=qwen3 8b")
    assert t.overrides["reward.manager"] == "rule" and t.overrides["reward.max_error_share"] == 0.0
    assert t.overrides["reward.extra_info"] == {"experiment_name": "qwen3 8b"}  # as given: not the folder name
    assert t.overrides["trainer.experiment"] == "qwen3_8b"
    assert "reward.extra_info={'experiment_name': 'qwen3 8b'}" in _fate(t, "reward.reward_manager.name").text
    assert "reward.extra_info" not in _t("reward.reward_manager.name=naive").overrides


def test_a_reward_worker_count_the_launch_sets_is_rlforge_s_and_verl_s_default_is_not() -> None:
    """verl's reward.num_workers (and the legacy reward_model.num_workers) count the processes that score; its
    default of 8 is verl's sizing, which rlforge does not copy."""
    assert _t("reward.num_workers=4").overrides["reward.num_workers"] == 4
    assert _t("reward_model.num_workers=2").overrides["reward.num_workers"] == 2
    default = _t()
    assert "reward.num_workers" not in default.overrides
    assert _fate(default, "reward.num_workers").kind == verl.IGNORED
