"""Configs that compose but would not do what they say: the warnings composing gives (options nothing reads,
settings that change nothing or look like another trainer's)."""

from __future__ import annotations

from rlforge.config import compose


def test_options_of_a_component_the_run_does_not_use_are_warned_about(registry, caplog) -> None:
    """``ray.*`` under the local controller, ``rollout.vllm.*`` with the hf engine: nothing reads them. Options of the
    components in use, of reward functions a row's data_source picks, and values at their defaults are not warned."""
    with caplog.at_level("WARNING", logger="rlforge"):
        compose(registry, "grpo", None, ["ray.num_cpus=2", "ray.rollout_workers=1", "rollout.vllm.enforce_eager=true",
                                         "rollout.hf.compile=true", "ray.placement_strategy=PACK"])
    lines = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert sorted(lines) == [
        "ray.num_cpus, ray.rollout_workers: not read, an option of trainer.controller=ray; this run's "
        "trainer.controller is local.",
        "rollout.vllm.enforce_eager: not read, an option of rollout.name=vllm; this run's rollout.name is hf.",
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlforge"):
        compose(registry, "grpo", None, ["trainer.controller=ray", "ray.num_cpus=2", "reward.code.sandbox_memory_mb=256"])
        assert not [r for r in caplog.records if "not read" in r.getMessage()]
        compose(registry, "grpo", None, ["reward.fn=arith", "reward.code.sandbox_memory_mb=256"])
    (line,) = [r.getMessage() for r in caplog.records if "not read" in r.getMessage()]
    assert line.startswith("reward.code.sandbox_memory_mb: not read, an option of reward.fn=code; this run's reward.fn is arith")


def test_an_adaptive_kl_controller_without_a_kl_in_the_reward_is_warned_about(registry, caplog) -> None:
    with caplog.at_level("WARNING", logger="rlforge"):
        compose(registry, "grpo", None, ["algorithm.kl_ctrl=adaptive", "actor.use_kl_loss=true"])
        compose(registry, "grpo", None, ["algorithm.kl_ctrl=adaptive", "algorithm.use_kl_in_reward=true"])
    (line,) = [r.getMessage() for r in caplog.records if "kl_ctrl" in r.getMessage()]
    assert "algorithm.use_kl_in_reward=false leaves out: nothing adapts" in line


def test_a_group_baseline_algorithm_with_one_sample_per_prompt_is_warned_about(registry, caplog) -> None:
    with caplog.at_level("WARNING", logger="rlforge"):
        for algo in ("grpo", "rloo", "reinforce_pp_baseline", "dapo"):
            compose(registry, algo, None, ["rollout.n=1"])
        compose(registry, "ppo", None, ["rollout.n=1"])
        compose(registry, "grpo", None, ["rollout.n=2"])
    lines = [r.getMessage() for r in caplog.records if "rollout.n=1 with --algo" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == [f"rollout.n=1 with --algo {a}" for a in
                                                     ("grpo", "rloo", "reinforce_pp_baseline", "dapo")]


def test_a_large_advantage_epsilon_is_warned_about(registry, caplog) -> None:
    """TRL's epsilon is the clip range; rlforge's algorithm.epsilon is added to the std (1e-6)."""
    with caplog.at_level("WARNING", logger="rlforge"):
        compose(registry, "grpo", None, ["algorithm.epsilon=0.2"])
        compose(registry, "grpo", None, ["algorithm.epsilon=1e-4"])
    (line,) = [r.getMessage() for r in caplog.records if "algorithm.epsilon" in r.getMessage()]
    assert line.startswith("algorithm.epsilon=0.2 is added to the std") and "actor.clip_ratio_low" in line


def test_a_key_given_twice_and_a_data_file_listed_twice_are_warned_about(registry, caplog, tmp_path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "What is 1+1?", "data_source": "arith", "reward_model": {"ground_truth": "2"}}\n')
    with caplog.at_level("WARNING", logger="rlforge"):
        cfg = compose(registry, "grpo", None, ["actor.lr=1e-5", "actor.lr=2e-5", "rollout.n=4", "rollout.n=4",
                                               "data.name=files", f"data.train_files=[{rows},{rows}]"])
    assert cfg.actor.lr == 2e-5
    messages = [r.getMessage() for r in caplog.records]
    assert "Override 'actor.lr' is given twice (1e-5, then 2e-5): the last, 2e-5, is used." in messages
    assert not [m for m in messages if "'rollout.n' is given twice" in m]  # the same value twice changes nothing
    assert f"'data.train_files' lists {rows} 2 times: its rows are read that many times" in "".join(messages)
