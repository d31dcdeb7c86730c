"""The bad-input catalogue, end to end through the CLI: each mistake gives one clear line, exit code 2,
and no traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from rlforge.cli import main
from rlforge.models import ASSETS

QUICK = ["trainer.total_steps=1", "data.train_batch_size=8", "rollout.n=2", "data.arith.val_size=4",
         "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[console]"]


def _error(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, captured.out[-2000:], err)
    assert "Traceback" not in captured.out + captured.err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("rlforge: error: ")
    return err


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _row(q="What is 1+1?", a="2"):
    return {"data_source": "arith", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": a}}


@pytest.fixture
def model_copy(tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(ASSETS / "tiny-arith", dst)
    return dst


CASES = {
    "misspelled key": (["actor.lrr=1"], "Unknown config key 'actor.lrr'", "Did you mean 'actor.lr'?"),
    "wrong type": (["actor.lr=fast"], "Invalid value for 'actor.lr'", "fast"),
    "negative size": (["data.train_batch_size=-4"], "'data.train_batch_size' must be a positive integer", "-4"),
    "mini-batch does not divide": (["actor.ppo_mini_batch_size=5"], "'actor.ppo_mini_batch_size' (5 prompts)",
                                   "'data.train_batch_size' (32 prompts)"),
    "unknown engine": (["rollout.name=vlm"], "Unknown rollout 'vlm' (rollout.name)", "Available:"),
    "missing model": (["model.path=/no/such/model"], "Model path '/no/such/model' does not exist (model.path)", ""),
    "missing data file": (["data.name=files", "data.train_files=[/no/such.jsonl]"],
                          "Data file not found: /no/such.jsonl (data.train_files)", ""),
    "missing reward file": (["reward.file=/no/reward.py"], "Reward file not found: /no/reward.py (reward.file)", ""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_config_mistakes(capsys, name):
    overrides, *needles = CASES[name]
    err = _error(capsys, ["fit", *overrides])
    for needle in needles:
        assert needle in err


def test_unknown_algorithm(capsys):
    assert "Unknown algorithm 'grpoo' (algorithm.name). Did you mean 'grpo'?" in _error(capsys, ["fit", "--algo", "grpoo"])


@pytest.mark.parametrize("content, needle", [
    (b"", "has no rows"),
    (b'{"data_source": "arith"\n', "line 1: not valid JSON"),
    (b'{"data_source": "arith", "prompt": "hi"}\n', "row 1: missing 'reward_model.ground_truth'"),
    (b'{"prompt": "hi", "reward_model": {"ground_truth": "1"}}\n', "row 1: missing column 'data_source'"),
    (b'{"data_source": "arith", "prompt": [{"role": "user", "content": "  "}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: the prompt is empty"),
    (b"\xff\xfe\x00bad", "is not UTF-8"),
])
def test_data_file_mistakes(capsys, tmp_path, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", "data.name=files",
                          f"data.train_files=[{bad}]"])
    assert str(bad) in err and needle in err


def test_all_prompts_too_long(capsys, tmp_path):
    data = _jsonl(tmp_path / "long.jsonl", [_row(q="x" * 200)] * 8)
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", "data.name=files",
                          f"data.train_files=[{data}]"])
    assert "all 8 prompts are longer than data.max_prompt_length=64" in err


def test_reward_file_syntax_error_and_missing_function(capsys, tmp_path):
    bad = tmp_path / "reward.py"
    bad.write_text("def compute_score(:\n")
    assert "has a syntax error at line 1" in _error(
        capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"reward.file={bad}"])
    bad.write_text("def other(): pass\n")
    assert "has no function 'compute_score' (reward.fn_name)" in _error(
        capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"reward.file={bad}"])


def test_tokenizer_without_chat_template(capsys, tmp_path, model_copy):
    (model_copy / "chat_template.jinja").unlink()
    cfg = json.loads((model_copy / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (model_copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"model.path={model_copy}"])
    assert "has no chat template" in err


def test_corrupted_and_foreign_checkpoints(capsys, tmp_path, model_copy):
    runs = tmp_path / "runs"
    assert main(["fit", *QUICK, f"trainer.runs_root={runs}"]) == 0
    ckpt = next((runs / "default").iterdir()) / "checkpoints" / "step_000001"
    capsys.readouterr()
    # a checkpoint from a different model: refused by the resume check, then by the weights themselves
    from rlforge.models import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    other = tmp_path / "other"
    build_tiny_llama(tok, hidden=64, layers=2, heads=1).save_pretrained(other)
    tok.save_pretrained(other)
    err = _error(capsys, ["fit", *QUICK, "trainer.total_steps=2", f"trainer.resume={ckpt}", f"model.path={other}"])
    assert "model.path: 'builtin:tiny-arith' -> " in err
    err = _error(capsys, ["fit", *QUICK, "trainer.total_steps=2", f"trainer.resume={ckpt}", f"model.path={other}",
                          "trainer.resume_force=true"])
    assert "does not match model.path" in err
    # a truncated state file
    state = ckpt / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    err = _error(capsys, ["fit", *QUICK, "trainer.total_steps=2", f"trainer.resume={ckpt}"])
    assert "is corrupted and cannot be read" in err
