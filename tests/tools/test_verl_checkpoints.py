"""A verl launch that resumes automatically (verl's default resume_mode=auto) into a trainer.default_local_dir that
holds verl's own checkpoints stops: verl would continue from the newest, rlforge cannot read their format and would
start over beside them without a word (helper-38's finding)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge.cli import main

DATA = Path(__file__).parent / "data"
PPO = ["algorithm.adv_estimator=grpo", f"data.train_files={DATA / 'gsm8k_train.jsonl'}", "data.max_prompt_length=32",
       "data.max_response_length=8", "actor_rollout_ref.model.path=builtin:tiny-arith", "trainer.device=cpu",
       "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", f"data.val_files={DATA / 'verl_gsm8k_test.jsonl'}"]
SFT = ["--sft", "data.train_files=chat.jsonl", "model.path=builtin:tiny-arith", "trainer.device=cpu",
       "data.train_batch_size=2", "data.micro_batch_size_per_gpu=2", "trainer.logger=[console]"]


@pytest.mark.parametrize("launch", [PPO, SFT], ids=["main_ppo", "sft"])
def test_auto_resume_into_verl_s_checkpoints_stops(launch, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "1+1"}, '
                                         '{"role": "assistant", "content": "2"}]}\n' * 4)
    folder = tmp_path / "ckpts"
    (folder / "global_step_20" / "actor").mkdir(parents=True)
    (folder / "global_step_100").mkdir()
    (folder / "latest_checkpointed_iteration.txt").write_text("100")
    assert main(["verl", "--print", *launch, f"trainer.default_local_dir={folder}"]) == 2
    err = capsys.readouterr().err
    assert "resume_mode=auto would continue from global_step_100 in verl" in err and "verl.model_merger" in err
    assert main(["verl", "--print", *launch, f"trainer.default_local_dir={folder}", "trainer.resume_mode=disable"]) == 0
    assert "verl's own checkpoints" not in capsys.readouterr().err
    assert main(["verl", "--print", *launch, "trainer.resume_mode=resume_path",
                 f"trainer.resume_from_path={folder / 'global_step_20'}"]) == 2
    assert "global_step_20 is a checkpoint of verl's" in capsys.readouterr().err


def test_where_verl_would_start_anew_so_does_the_launch(tmp_path, capsys) -> None:
    """verl 0.9.1 continues from the global_step_N its tracker file names, where both exist (find_latest_ckpt_path);
    without the file, or naming a missing folder, it trains from scratch: then the launch is not stopped. A tracker
    that is not a step stops verl (int() of it), and the launch."""
    folder = tmp_path / "ckpts"
    (folder / "global_step_3").mkdir(parents=True)
    assert main(["verl", "--print", *PPO, f"trainer.default_local_dir={folder}"]) == 0  # no tracker file
    (folder / "latest_checkpointed_iteration.txt").write_text("7")
    assert main(["verl", "--print", *PPO, f"trainer.default_local_dir={folder}"]) == 0  # names a missing folder
    (folder / "latest_checkpointed_iteration.txt").write_text("seven")
    assert main(["verl", "--print", *PPO, f"trainer.default_local_dir={folder}"]) == 2
    assert "holds b'seven', not a step" in capsys.readouterr().err
    (folder / "latest_checkpointed_iteration.txt").write_text("+3\n")  # int() reads it as verl does: 3
    assert main(["verl", "--print", *PPO, f"trainer.default_local_dir={folder}"]) == 2
    assert "would continue from global_step_3 in verl" in capsys.readouterr().err


def test_a_folder_rlforge_already_runs_in_is_resumed_as_rlforge_s(tmp_path, capsys) -> None:
    """Beside verl's checkpoints, a run of rlforge's own (its config.yaml) is what resume_mode=auto continues."""
    folder = tmp_path / "ckpts"
    (folder / "global_step_3").mkdir(parents=True)
    (folder / "config.yaml").write_text("{}\n")
    main(["verl", "--print", *PPO, f"trainer.default_local_dir={folder}"])
    assert "verl's own checkpoints" not in capsys.readouterr().err
