"""verl drop-in: `rlforge config from-verl` translates a verl GRPO config and reports every key; the result trains
a verl GSM8K-format parquet (no reward file) on the tiny chat model; verl-style overrides name the rlforge key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlforge.cli import main
from rlforge.config import verl

VERL_YAML = Path(__file__).parent / "data" / "verl_grpo_gsm8k.yaml"


def test_translation_maps_ignores_and_reports_every_key() -> None:
    source = yaml.safe_load(VERL_YAML.read_text())
    result = verl.translate(source)
    assert result.algorithm == "grpo"
    o = result.overrides
    assert o["rollout.max_new_tokens"] == 8 and o["data.max_prompt_length"] == 192 and o["rollout.n"] == 2
    assert o["actor.lr"] == 1e-6 and o["actor.use_kl_loss"] is True and o["actor.ppo_micro_batch_size"] == 4
    assert o["trainer.save_every"] == 20 and o["trainer.val_every"] == 5 and o["trainer.total_steps"] == 2
    assert o["logger.backends"] == ["console", "wandb"] and o["data.name"] == "files"
    assert o["model.gradient_checkpointing"] is True and o["rollout.vllm.gpu_memory_utilization"] == 0.6
    ignored = dict(result.ignored)
    assert "data.truncation" in ignored and f"{verl.ARO}.rollout.log_prob_micro_batch_size_per_gpu" in ignored
    not_mapped = {k: why for k, _, why in result.unmapped}
    assert "trainer.total_steps" in not_mapped["trainer.total_epochs"]
    # every leaf of the input is accounted for exactly once
    leaves = {k for k, _ in verl.flatten(source)}
    reported = {k for k, _, _ in result.mapped} | set(ignored) | set(not_mapped) | {"algorithm.adv_estimator"}
    assert leaves <= reported | {"trainer.nnodes", "trainer.n_gpus_per_node"}


@pytest.mark.parametrize("estimator,algo", [("gae", "ppo"), ("rloo", "rloo"), ("reinforce_plus_plus", "reinforce_pp")])
def test_estimators_pick_the_algorithm(estimator: str, algo: str) -> None:
    assert verl.translate({"algorithm": {"adv_estimator": estimator}}).algorithm == algo


def test_reward_model_and_checkpoint_folder_keys() -> None:
    r = verl.translate({"reward_model": {"enable": True, "model": {"path": "/models/rm"}, "micro_batch_size_per_gpu": 8,
                                         "reward_manager": "naive"},
                        "trainer": {"default_local_dir": "/ckpts"}})
    assert r.overrides == {"reward.manager": "model", "reward.model.path": "/models/rm", "reward.model.batch_size": 8,
                           "trainer.runs_root": "/ckpts"}
    assert [k for k, _ in r.ignored] == ["reward_model.reward_manager"] and r.unmapped == []
    assert verl.translate({"reward_model": {"enable": False}}).overrides == {"reward.manager": "rule"}


def test_dr_grpo_and_multi_gpu() -> None:
    r = verl.translate({"algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False},
                        "actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-sum-norm"}},
                        "trainer": {"nnodes": 2, "n_gpus_per_node": 4}})
    assert r.algorithm == "dr_grpo"
    assert r.overrides["strategy.num_processes"] == 8 and r.overrides["trainer.controller"] == "ray"


@pytest.mark.parametrize("override,needle", [
    ("data.max_response_length=64", "'data.max_response_length' is verl's key; rlforge's is 'rollout.max_new_tokens'"),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "rlforge's is 'actor.lr'"),
    ("actor_rollout_ref.rollout.mode=async", "translate a verl config with 'rlforge config from-verl FILE'"),
    ("trainer.total_epochs=3", "set trainer.total_steps"),
])
def test_verl_style_overrides_name_the_rlforge_key(override: str, needle: str, capsys) -> None:
    assert main(["fit", override]) == 2
    err = capsys.readouterr().err
    assert needle in err and "docs/migration-from-verl.md" in err


@pytest.mark.slow
def test_translated_config_trains_a_verl_gsm8k_parquet_without_a_reward_file(tmp_path, tiny_chat_model, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "user", "content": f"Tom has {a} apples and buys {b}. How many? Answer after '####'."}],
             "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"split": "train", "index": i}} for i, (a, b) in enumerate(zip(range(3, 19), range(5, 21)))]
    pq.write_table(pa.Table.from_pylist(rows[:12]), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[12:]), tmp_path / "test.parquet")
    text = VERL_YAML.read_text().replace("PLACEHOLDER_TRAIN", str(tmp_path / "train.parquet")).replace(
        "PLACEHOLDER_TEST", str(tmp_path / "test.parquet")).replace("PLACEHOLDER_MODEL", str(tiny_chat_model))
    (tmp_path / "verl.yaml").write_text(text)
    out = tmp_path / "rlforge.yaml"
    assert main(["config", "from-verl", str(tmp_path / "verl.yaml"), "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "mapped      data.max_response_length -> rollout.max_new_tokens = 8" in report
    assert "NOT MAPPED  trainer.total_epochs = 15" in report and f"wrote {out}" in report
    assert main(["fit", "--config", str(out), "rollout.name=hf", "logger.backends=[console]",
                 f"trainer.runs_root={tmp_path / 'runs'}", "trainer.progress=false", "trainer.save_every=0"]) == 0
    summary = list((tmp_path / "runs").rglob("summary.json"))
    assert summary and '"steps": 2' in summary[0].read_text()
