"""The bad-input catalogue, end to end through the CLI: each mistake gives one clear line, exit code 2,
and no traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch

from rlforge import checkpoint as ckpt
from rlforge import diskio
from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.models import ASSETS

QUICK = ["trainer.total_steps=1", "data.train_batch_size=8", "rollout.n=2", "data.arith.train_size=512", "data.arith.val_size=4",
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
    "a Lightning Trainer argument": (["trainer.max_steps=3"], "Unknown config key 'trainer.max_steps'",
                                     "is Lightning's Trainer argument; rlforge's is 'trainer.total_steps'"),
    "a TRL GRPOConfig field": (["algorithm.scale_rewards=batch"], "Unknown config key 'algorithm.scale_rewards'",
                               "is TRL's GRPOConfig field; rlforge's: group: 'algorithm.norm_adv_by_std=true'"),
    "TRL's epsilon": (["actor.epsilon=0.2"], "Unknown config key 'actor.epsilon'",
                      "'epsilon' is TRL's GRPOConfig field; rlforge's: 'actor.clip_ratio_low'"),
    "an OpenRLHF flag": (["actor.eps_clip=0.2"], "Unknown config key 'actor.eps_clip'",
                         "is OpenRLHF's flag; rlforge's: 'actor.clip_ratio_low' and 'actor.clip_ratio_high'"),
    "std_scope=batch with no std": (["algorithm.std_scope=batch", "algorithm.norm_adv_by_std=false"],
                                    "'algorithm.std_scope=batch' chooses the std",
                                    "'algorithm.norm_adv_by_std=false' divides by none"),
    "an IcePop range read as a number": (["algorithm.rollout_is=token", "algorithm.rollout_is_threshold=0.5_5"],
                                         "YAML reads '0.5_5' as the number 0.55",
                                         "it drops the underscores of a number"),
    "another algorithm's option": (["algorithm.gamma=1.0"], "'algorithm.gamma' (in command-line overrides) is not an "
                                   "option of --algo grpo", "it is one of --algo pf_ppo, ppo, reinforce_pp, vapo"),
    "wrong type": (["actor.lr=fast"], "Invalid value for 'actor.lr'", "fast"),
    "a number for a true/false key": (["trainer.val_before_train=2"], "Invalid value for 'trainer.val_before_train'",
                                      "2; it is true or false"),
    "a number as a mapping key": (["model.config_overrides={1: 2}"], "Invalid value for 'model.config_overrides.1'",
                                  "quote a key YAML reads as a number or boolean"),
    "a value for a section": (["trainer=5"], "'trainer' (in command-line overrides) is a section of the config",
                              "trainer.total_steps"),
    "negative size": (["data.train_batch_size=-4"], "'data.train_batch_size' must be a positive integer", "-4"),
    "mini-batch does not divide": (["actor.ppo_mini_batch_size=5"], "'actor.ppo_mini_batch_size' (5 prompts)",
                                   "'data.train_batch_size' (32 prompts)"),
    "unknown engine": (["rollout.name=vlm"], "Unknown rollout 'vlm' (rollout.name)", "Available:"),
    "missing model": (["model.path=/no/such/model"], "Model path '/no/such/model' does not exist (model.path)", ""),
    "missing data file": (["data.name=files", "data.train_files=[/no/such.jsonl]"],
                          "Data file not found: /no/such.jsonl (data.train_files)", ""),
    "missing reward file": (["reward.file=/no/reward.py"], "Reward file not found: /no/reward.py (reward.file)", ""),
    "a glob for data files": (["data.name=files", "data.train_files=[data/*.jsonl]"],
                              "Data file not found: data/*.jsonl (data files are named one by one: a glob is not "
                              "expanded)", ""),
    "reward file a directory": (["reward.file=/tmp"], "Reward file /tmp (reward.file) is a directory; give the Python "
                                                      "file", ""),
    # the interpolation that fails, not one that fails because it refers to it
    "unresolvable interpolation": (["trainer.project=${trainer.experiment}", "trainer.experiment=x_${oc.env:RLFORGE_NOPE}"],
                                   "Cannot resolve 'trainer.experiment: x_${oc.env:RLFORGE_NOPE}'", "RLFORGE_NOPE"),
    "interpolation in a mapping": (["reward.fn_kwargs={x: ${reward.timeout_s}}"],
                                   "quote each interpolation inside it as a YAML string", "{x: \"${a.b}\"}"),
    "two reward functions": (["reward.fn=gsm8k", "reward.file=/no/reward.py"], "reward.fn='gsm8k' and reward.file=",
                             "set one of them"),
    "reward kwargs without a file": (["reward.fn_kwargs={format_score: 0.1}"],
                                     "reward.fn_kwargs (format_score) go to the function of reward.file", "not set"),
    # every value has a declared range (rlforge.config.schema.Valid), core, algorithm and component sections alike
    "negative learning rate": (["actor.lr=-1"], "'actor.lr' must be >= 0, got -1.0.", ""),
    "NaN coefficient": (["actor.kl_loss_coef=.nan"], "'actor.kl_loss_coef' must be a finite number, got nan.", ""),
    "infinite value": (["reward.fallback_score=-.inf"], "'reward.fallback_score' must be a finite number", ""),
    "negative weight decay": (["critic.weight_decay=-0.1"], "'critic.weight_decay' must be >= 0", ""),
    "greedy training": (["rollout.temperature=0"], "'rollout.temperature' must be > 0", "rollout.val_temperature=0"),
    "clip ratio": (["actor.clip_ratio_low=-0.5"], "'actor.clip_ratio_low' must be >= 0, got -0.5.", ""),
    "dual clip": (["actor.clip_ratio_c=0.5"], "'actor.clip_ratio_c' must be > 1, got 0.5.", ""),
    "top_k": (["rollout.top_k=-1"], "'rollout.top_k' must be an integer >= 0, got -1.", ""),
    "top_p": (["rollout.top_p=0"], "'rollout.top_p' must be in (0, 1], got 0.0.", ""),
    "sizes": (["rollout.micro_batch_size=0"], "'rollout.micro_batch_size' must be a positive integer, got 0.", ""),
    "stop criterion": (["trainer.max_nonfinite_steps=0"], "'trainer.max_nonfinite_steps' must be a positive", ""),
    "seed": (["trainer.seed=-1"], "'trainer.seed' must be an integer in [0, 4294967295], got -1.", ""),
    "precision": (["model.precision=fp16"], "'model.precision' must be one of auto, 32-true, bf16-mixed, 16-mixed, bf16-true, got 'fp16'.", ""),
    "device": (["strategy.device=gpu 0"], "'strategy.device' must be auto, cpu, cuda or cuda:N", ""),
    "grpo epsilon": (["algorithm.epsilon=0"], "'algorithm.epsilon' must be > 0, got 0.0.", ""),
    "ppo lambda": (["--algo", "ppo", "algorithm.lam=1.5"], "'algorithm.lam' must be in [0, 1], got 1.5.", ""),
    "kl horizon": (["algorithm.kl_horizon=0"], "'algorithm.kl_horizon' must be a positive integer", ""),
    "reward timeout": (["reward.timeout_s=0"], "'reward.timeout_s' must be > 0, got 0.0.", ""),
    "reward function name": (["reward.fn_name=compute-score"], "'reward.fn_name' must be a Python identifier", ""),
    "sandbox limit": (["reward.code.sandbox_timeout_s=-1"], "'reward.code.sandbox_timeout_s' must be > 0", ""),
    "arith operands": (["data.arith.max_operand=-1"], "'data.arith.max_operand' must be a positive integer", ""),
    "ray cpus": (["ray.num_cpus=0"], "'ray.num_cpus' must be a positive integer, got 0.", ""),
    "duplicate logger": (["logger.backends=[console,console]"], "'logger.backends' names 'console' more than once", ""),
    "response beyond the context": (["rollout.max_new_tokens=300"], "rollout.max_new_tokens (300) = 364 tokens exceed "
                                    "the context of model.path: max_position_embeddings = 256", "config.json"),
    "prompt + response beyond the context": (["data.max_prompt_length=200", "rollout.max_new_tokens=60"],
                                             "data.max_prompt_length (200) + rollout.max_new_tokens (60) = 260", ""),
    "missing resume folder": (["trainer.resume=/no/such/step_000001"], "trainer.resume='/no/such/step_000001': no "
                              "such folder", ""),
    # keys that would change nothing in the run they are set in
    "critic warm-up as long as the run": (["--algo", "vapo", "trainer.total_steps=3"], "'trainer.critic_warmup' (5) is "
                                          "not below 'trainer.total_steps' (3)", "would never train"),
    "pf_ppo filter key in reweight mode": (["--algo", "pf_ppo", "algorithm.filter_method=best_of_n"],
                                           "'algorithm.filter_method' (best_of_n) is read only with "
                                           "algorithm.pf_mode=filter", ""),
    "pf_ppo reweight key in filter mode": (["--algo", "pf_ppo", "algorithm.pf_mode=filter", "algorithm.weight_pow=3"],
                                           "'algorithm.weight_pow' (3.0) is read only with algorithm.pf_mode=reweight",
                                           ""),
    "gdpo key twice": (["--algo", "gdpo", "algorithm.reward_keys=[acc,acc]"], "names 'acc' more than once", ""),
    "gdpo components with overlong shaping": (["--algo", "gdpo", "algorithm.reward_keys=[acc]",
                                               "algorithm.overlong_buffer=4"],
                                              "'algorithm.overlong_buffer=4' shapes the token rewards, which GDPO "
                                              "with algorithm.reward_keys does not read", "Return a length penalty"),
    "gdpo components with KL in the reward": (["--algo", "gdpo", "algorithm.reward_keys=[acc]",
                                               "algorithm.use_kl_in_reward=true"],
                                              "'algorithm.use_kl_in_reward=True' shapes the token rewards", ""),
    "gdpo weights all 0": (["--algo", "gdpo", "algorithm.reward_keys=[acc]", "algorithm.reward_weights=[0.0]"],
                           "'algorithm.reward_weights' are all 0", ""),
    # paths stay under trainer.runs_root
    "experiment leaves the runs root": (["trainer.experiment=../../x"], "'trainer.experiment' must be a folder name",
                                        "got '../../x'"),
    "absolute experiment": (["trainer.experiment=/tmp/x"], "'trainer.experiment' must be a folder name", ""),
    "experiment with a slash": (["trainer.experiment=a/b"], "'trainer.experiment' must be a folder name", ""),
    "empty experiment": (['trainer.experiment=""'], "'trainer.experiment' must be a folder name", "got ''"),
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
    (b'{"data_source": "arith", "prompt": "hi", "reward_model": {"ground_truth": null}}\n',
     "row 1: missing 'reward_model.ground_truth' (null)"),  # as data.name=hf reads it (a null is an absent key)
    (b'{"prompt": "hi", "reward_model": {"ground_truth": "1"}}\n',
     "row 1: missing column 'data_source'. Columns present: ['prompt', 'reward_model']."),  # not the loader's _origin
    (b'{"data_source": "arith", "prompt": [{"role": "user", "content": "  "}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: the prompt is empty"),
    (b"\xff\xfe\x00bad", "is not UTF-8"),
    (b'{"data_source": "arith", "prompt": [{"content": "hi"}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: prompt message 1 has no role"),
    (b'{"data_source": "arith", "prompt": [{"role": "user", "content": ["hi"]}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: prompt message 1: content part 1 is 'hi'; typed parts are {\"type\": \"text\", \"text\": str} or"),
    (b'{"data_source": "arith", "prompt": [{"role": "user", "content": null}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: prompt message 1 has content of type NoneType, not a string"),
    (b'{"data_source": "arith", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: prompt message 1 has no content"),
    (b'{"data_source": "arith", "prompt": [{"role": 1, "content": "hi"}], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: prompt message 1 has a role that is not a non-empty string (1)"),
    (b'{"data_source": "arith", "prompt": ["hi"], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: prompt message 1 is a str, not a {role, content} object"),
    (b'{"data_source": "arith", "prompt": [], "reward_model": {"ground_truth": "1"}}\n',
     "row 1: 'prompt' must be a string or a list of chat messages {role, content}, got list (empty)"),
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


def test_model_folder_without_tokenizer_files(capsys, tmp_path, model_copy):
    for f in model_copy.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            f.unlink()
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"model.path={model_copy}"])
    assert f"Cannot load a tokenizer from '{model_copy}' (model.path)" in err


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
    assert "trainer_state.pt cannot be read: it is truncated or corrupted" in err


def test_chat_template_that_rejects_a_row(capsys, tmp_path, model_copy):
    (model_copy / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] != 'user' %}{{ raise_exception('Unknown role ' + m['role']) }}"
        "{% endif %}<|user|>{{ m['content'] }}<|end|>{% endfor %}<|assistant|>")
    data = _jsonl(tmp_path / "tool.jsonl", [_row(), {**_row(), "prompt": [{"role": "tool", "content": "4"}]}])
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"model.path={model_copy}",
                          "data.name=files", f"data.train_files=[{data}]"])
    assert f"{data}, row 2: the tokenizer's chat template cannot render this row" in err
    assert "Unknown role tool" in err


def test_pickle_only_model_is_refused(capsys, tmp_path, model_copy):
    from safetensors.torch import load_file

    torch.save(load_file(str(model_copy / "model.safetensors")), model_copy / "pytorch_model.bin")
    (model_copy / "model.safetensors").unlink()
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"model.path={model_copy}"])
    assert f"Model folder '{model_copy}' (model.path) holds its weights only as a pickle (pytorch_model.bin)" in err
    assert "save_pretrained(o)" in err and f"model.path={model_copy}-safetensors" in err
    assert not (tmp_path / "default").exists()  # refused before any run folder is made


def test_runs_root_that_cannot_be_written(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={blocker / 'runs'}"])
    assert f"Cannot create a run folder in {blocker / 'runs' / 'default'}" in err
    assert "Not a directory" in err and "Choose a writable trainer.runs_root" in err


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_while_writing_a_checkpoint_keeps_the_previous_one(capsys, tmp_path, monkeypatch):
    real_save = torch.save

    def full_at_step_2(obj, fh, *args, **kwargs):
        if list(tmp_path.glob("default/*/checkpoints/step_000001")):
            _enospc()
        real_save(obj, fh, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_at_step_2)
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", "trainer.total_steps=2",
                          "trainer.save_every=1"])
    (run,) = (tmp_path / "default").iterdir()
    ckpts = run / "checkpoints"
    assert f"Cannot write checkpoint step 2 into {ckpts}: No space left on device " \
           f"({ckpts / '.tmp_step_000002' / 'trainer_state.pt'}). It needs about " in err and "free there" in err
    assert f"The previous checkpoint {ckpts / 'step_000001'} is intact" in err and "trainer.resume=auto" in err
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001"]  # no half-written temporary folder
    ckpt.read(ckpts / "step_000001")  # complete and readable


def test_disk_full_while_writing_samples(capsys, tmp_path, monkeypatch):
    real_open = diskio.open_text

    def full_at_step_2(path, *args, **kwargs):
        if path.name == "samples.jsonl" and (path.parent / "checkpoints" / "step_000001").is_dir():
            _enospc()
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(diskio, "open_text", full_at_step_2)
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", "trainer.total_steps=2",
                          "trainer.save_every=1"])
    (run,) = (tmp_path / "default").iterdir()
    assert f"Cannot write {run / 'samples.jsonl'}: No space left on device." in err and "trainer.resume=auto" in err
    ckpt.read(run / "checkpoints" / "step_000001")


@pytest.mark.parametrize("exc", [
    OSError(errno.EROFS, "Read-only file system", "/x"),
    RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'),
    Exception("database or disk is full"),
])
def test_write_failures_from_native_writers_are_recognized(exc):
    with pytest.raises(RLForgeError, match=r"^Cannot save it: (Read-only file system \(/x\)|No space left on device)"):
        with diskio.disk_errors("save it"):
            raise exc
    with pytest.raises(KeyError):  # anything else is not a write failure and passes through
        with diskio.disk_errors("save it"):
            raise KeyError("x")


# --- damaged model folders: one error naming the file, before anything trains ---------------------------------
def _overwrite(path, offset, data):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def test_truncated_model_weights_are_named_at_load(capsys, tmp_path, model_copy):
    weights = model_copy / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"model.path={model_copy}"])
    assert f"Cannot load the model '{model_copy}' (model.path): {weights} cannot be read: it is truncated or " \
           f"corrupted ({weights.stat().st_size} bytes)." in err


def test_eval_of_a_model_whose_safetensors_header_is_overwritten(capsys, tmp_path, model_copy):
    weights = model_copy / "model.safetensors"
    _overwrite(weights, 10, b"\x00garbage" * 4)  # same size, header no longer JSON
    err = _error(capsys, ["eval", str(model_copy), "--limit", "2", "--out", str(tmp_path / "r.json")])
    assert f"{weights} cannot be read: it is truncated or corrupted" in err


def test_a_model_vocabulary_smaller_than_its_tokenizer_is_refused_at_load(capsys, tmp_path, model_copy):
    config = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**config, "vocab_size": 40}))
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"model.path={model_copy}"])
    assert f"The model in '{model_copy}' (model.path) has a vocabulary of 40 tokens (config.json vocab_size) but " \
           f"its tokenizer has 103: token ids 40 to 102 have no embedding." in err


# --- a reward file that fails on every sample: the run stops, never trains on the fallback alone --------------
@pytest.mark.slow  # a fit up to the first reward stage
def test_a_reward_file_that_fails_on_every_sample_stops_the_run(capsys, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                      "    return {'score': float(solution_str)}['answer']\n")
    err = _error(capsys, ["fit", *QUICK, f"trainer.runs_root={tmp_path}", f"reward.file={reward}"])
    assert "16 of 16 reward calls failed on this batch (16 raised), which reaches reward.max_error_share=1" in err
    assert "The first: data_source 'arith', sample 0: raised " in err


def test_the_summary_shows_the_share_of_failed_reward_calls(capsys):
    from rlforge.trainer.report import print_summary, reward_error_share

    history = [{"reward/error_share": 0.25}, {"reward/error_share": 0.75}, {"val/accuracy": 0.5}]
    assert reward_error_share(history) == 0.5 and reward_error_share([{"actor/loss": 1.0}]) is None
    print_summary({"accuracy_before": None, "accuracy_after": 0.5, "steps": 2, "reward_error_share": 0.5,
                   "tokens_per_s": 1.0, "seconds": 1.0, "run_dir": "r", "mlflow_uri": ""}, with_mlflow=False)
    assert "50.0% (reward/error_share)" in capsys.readouterr().out
