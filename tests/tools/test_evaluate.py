"""``rlforge eval`` and ``rlforge generate``: pass@k math, reports, JSONL output, checkpoints as models."""

from __future__ import annotations

import json
import math

import pytest

from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.testing import FixedAnswerEngine
from rlforge.tools.evaluate import parse_ks, pass_at_k, summarize

pytestmark = pytest.mark.usefixtures("no_autoload")


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0), (4, 4, 4, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (8, 3, 4, 1 - 5 / 70),  # 1 - C(5,4)/C(8,4)
    (3, 2, 2, 1.0),  # n - c < k: every draw of 2 holds a correct one
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_the_product_form():
    # Chen et al.'s numerically stable form: 1 - prod_{i=n-c+1}^{n} (1 - k/i)
    for n, c, k in [(10, 3, 5), (16, 1, 8), (20, 7, 1)]:
        stable = 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
        assert pass_at_k(n, c, k) == pytest.approx(stable)


def test_parse_ks():
    assert parse_ks(None, 8) == [1, 8]
    assert parse_ks(None, 1) == [1]
    assert parse_ks("4, 1,4", 8) == [1, 4]
    with pytest.raises(RLForgeError, match="between 1 and the samples per prompt n=2"):
        parse_ks("3", 2)
    with pytest.raises(RLForgeError, match="comma-separated integers"):
        parse_ks("one", 2)


def test_summarize():
    groups = {0: [(1.0, 1.0), (0.0, 0.0)], 1: [(0.5, 0.0), (0.0, 0.0)]}
    assert summarize(groups, [1, 2]) == {"reward/mean": 0.375, "accuracy": 0.25, "pass@1": 0.25, "pass@2": 0.5}


def test_eval_builtin_model_writes_report(tmp_path, capsys):
    out = tmp_path / "r" / "report.json"
    assert main(["eval", "builtin:tiny-arith", "--n", "4", "--temperature", "1.0", "--k", "1,2,4", "--limit", "12",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["prompts"], report["rows"], report["samples_per_prompt"]) == (12, 12, 4)
    assert report["model"] == "builtin:tiny-arith" and report["dataset"] == "arith" and report["split"] == "val"
    m = report["metrics"]
    assert set(m) == {"reward/mean", "accuracy", "pass@1", "pass@2", "pass@4"}
    assert m["pass@1"] == pytest.approx(m["accuracy"])  # the same n for every prompt
    assert m["pass@1"] <= m["pass@2"] <= m["pass@4"]
    assert m["pass@4"] > 0  # the shipped model solves some of these
    assert report["by_data_source"]["arith"]["prompts"] == 12
    v = report["validation_metrics"]  # a training run's validation names, verl's mean@N among them
    assert v["val/reward"] == pytest.approx(m["reward/mean"]) and v["val/accuracy"] == pytest.approx(m["accuracy"])
    assert v["val-core/arith/acc/mean@4"] == pytest.approx(m["accuracy"])  # 4 samples of every prompt
    assert f"report: {out}" in capsys.readouterr().out


def test_eval_logs_the_numeric_keys_a_reward_function_returns(tmp_path):
    """A dict result's other numeric keys are validation variables, as verl logs its reward_extra_info."""
    scorer = tmp_path / "score.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return {'score': 0.5, 'length': float(len(solution_str)), 'pred': solution_str}\n")
    out = tmp_path / "report.json"
    assert main(["eval", "builtin:tiny-arith", "--n", "2", "--temperature", "1.0", "--limit", "3", "--out", str(out),
                 f"reward.file={scorer}"]) == 0
    v = json.loads(out.read_text())["validation_metrics"]
    assert v["val/reward"] == pytest.approx(0.5) and v["val-aux/arith/length/mean@2"] >= 1
    assert "val-aux/arith/length/std@2" in v and not any("/pred/" in k for k in v)


def test_eval_checkpoint_and_run_folder(fitted_run, tmp_path):
    trainer, _ = fitted_run
    step1 = trainer.run_dir / "checkpoints" / "step_000001"
    for model, expected in [(step1, step1 / "actor"), (trainer.run_dir, trainer.run_dir / "checkpoints" / "step_000002" / "actor")]:
        out = tmp_path / "report.json"
        assert main(["eval", str(model), "--limit", "4", "--out", str(out)]) == 0
        report = json.loads(out.read_text())
        assert report["model"] == str(expected)
        assert list(report["metrics"]) == ["reward/mean", "accuracy", "pass@1"]


@pytest.mark.parametrize("args, needle", [
    (["--n", "4"], "4 samples per prompt (rollout.val_n) at temperature 0 are 4 identical greedy answers"),
    (["--split", "test"], "Unknown split 'test' (--split). Available: train, val."),
    (["--limit", "0"], "--limit must be a positive number of prompts, got 0."),
    (["data.name=files"], "Dataset 'files' (data.name) has no rows in the 'val' split. Pass --data FILE"),
    (["--data", "missing.jsonl"], "Data file not found: missing.jsonl"),
    (["rollout.name=vlm"], "Unknown rollout 'vlm' (rollout.name)"),
])
def test_eval_user_errors_are_one_line(args, needle, capsys):
    assert main(["eval", "builtin:tiny-arith", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlforge: error: ") and len(err.splitlines()) == 1 and needle in err


def test_eval_missing_model(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert f"'{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert "is neither a checkpoint" in capsys.readouterr().err


def test_generate_jsonl_from_prompt_only_rows(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": [{"role": "user", "content": "What is 2+2?"}]}\n{"prompt": "What is 10+5?"}\n')
    out = tmp_path / "gen.jsonl"
    assert main(["generate", "builtin:tiny-arith", "--data", str(prompts), "--n", "3", "--temperature", "1.0",
                 "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["index"], r["sample"]) for r in lines] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert lines[3]["prompt"] == [{"role": "user", "content": "What is 10+5?"}]
    assert all(isinstance(r["response"], str) and 1 <= r["response_tokens"] <= 8 for r in lines)
    assert lines[0]["ground_truth"] is None and lines[0]["data_source"] == ""
    assert f"wrote 6 samples to {out}" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    assert main(["generate", "builtin:tiny-arith", "--data", str(prompts), "--n", "3", "--temperature", "1.0",
                 "--out", str(again), "rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor"]) == 0
    assert again.read_text() == out.read_text()  # sampling is seeded by trainer.seed; no agent loop here, and it says so
    assert "rollout.agent.loop=interaction is not run (rlforge eval runs it)" in capsys.readouterr().err


def test_generate_greedy_matches_eval_answers(tmp_path):
    out = tmp_path / "gen.jsonl"
    assert main(["generate", "builtin:tiny-arith", "--limit", "5", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2, 3, 4]
    assert all(r["data_source"] == "arith" and r["ground_truth"] for r in lines)
    correct = sum(r["response"].strip() == r["ground_truth"] for r in lines)
    report = tmp_path / "r.json"
    assert main(["eval", "builtin:tiny-arith", "--limit", "5", "--out", str(report)]) == 0
    assert json.loads(report.read_text())["metrics"]["accuracy"] == pytest.approx(correct / 5)


class CannedEngine(FixedAnswerEngine):
    """A registered rollout engine that answers "42" to everything (generate/eval use whatever is registered)."""

    instances: list[FixedAnswerEngine] = []


def test_generate_and_eval_use_the_configured_rollout_engine(tmp_path):
    from rlforge import hookimpl, load_config
    from rlforge.plugin_manager import PluginManager
    from rlforge.tools.evaluate import evaluate
    from rlforge.tools.generate import generate

    class Canned:
        @hookimpl
        def rlforge_register(self, registry):
            registry.rollout.register("canned", CannedEngine)

    pm = PluginManager(autoload=False)
    pm.register(Canned(), name="canned")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"data_source": "arith", "prompt": "What is 40+2?", "reward_model": {"ground_truth": "42"}}\n'
                    '{"data_source": "arith", "prompt": "What is 1+2?", "reward_model": {"ground_truth": "3"}}\n')
    cfg = load_config(None, ["rollout.name=canned", "data.name=files", f"data.val_files=[{rows}]", "rollout.val_n=2",
                             "rollout.val_temperature=1.0"], plugins=pm)
    assert generate(cfg, pm, tmp_path / "g.jsonl", log=lambda _: None) == 4
    assert {json.loads(line)["response"] for line in (tmp_path / "g.jsonl").read_text().splitlines()} == {"42"}
    report = evaluate(cfg, pm, ks="1,2", log=lambda _: None)
    assert report["rollout"] == "canned"
    assert report["metrics"] == {"reward/mean": 0.5, "accuracy": 0.5, "pass@1": 0.5, "pass@2": 0.5}
    assert all(engine.closed for engine in CannedEngine.instances)


def test_a_run_trained_on_several_processes_is_evaluated_in_one(tmp_path):
    from omegaconf import OmegaConf

    from rlforge import load_config
    from rlforge.tools.inference import compose_for_model

    trained = load_config("grpo", ["trainer.controller=ray", "strategy.name=fsdp", "strategy.num_processes=2",
                                   "data.train_batch_size=8"])
    checkpoint = tmp_path / "checkpoints" / "step_000001"
    (checkpoint / "actor").mkdir(parents=True)
    (checkpoint / "actor" / "config.json").write_text("{}")
    (checkpoint / "trainer_state.pt").touch()
    (checkpoint / "meta.json").write_text(json.dumps({"config": OmegaConf.to_container(trained)}))
    _, cfg = compose_for_model(str(checkpoint))
    assert (cfg.trainer.controller, cfg.strategy.name, cfg.strategy.num_processes) == ("local", "single", 1)
    assert cfg.data.train_batch_size == 8  # the rest is the training run's


def test_eval_of_a_run_with_data_reads_only_the_given_files(tmp_path, monkeypatch, capsys):
    """A run trained on relative data paths, evaluated from another folder with --data: the run's own files (not
    found from there) are not read; the given ones are."""
    from rlforge import Trainer
    from rlforge.plugins.data.builtin import arith_rows
    from rlforge.testing import fast_config

    rows = "".join(json.dumps(r) + "\n" for r in arith_rows(8, 9, seed=0))
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "eval.jsonl").write_text(rows)
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(fast_config("grpo", tmp_path / "runs", "data.name=files", "data.train_files=[train.jsonl]",
                                  "data.val_files=[]", "trainer.total_steps=1", "trainer.save_every=1"))
    trainer.fit()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "report.json"
    assert main(["eval", str(trainer.run_dir), "--data", str(tmp_path / "eval.jsonl"), "--limit", "2",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["rows"] == 2
    capsys.readouterr()
    assert main(["eval", str(trainer.run_dir), "--out", str(out)]) == 2
    assert "no rows in the 'val' split" in capsys.readouterr().err  # not: train.jsonl is not found from here


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_an_output_that_is_the_input_or_a_folder_is_refused_before_the_model_loads(command, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "What is 2+2?", "data_source": "arith", "reward_model": {"ground_truth": "4"}}\n')
    kept = data.read_text()
    assert main([command, "builtin:tiny-arith", "--data", str(data), "--out", str(data)]) == 2
    assert (f"--out {data} is the file the command reads ({data}): writing it would replace that data"
            in capsys.readouterr().err)
    assert data.read_text() == kept
    assert main([command, "builtin:tiny-arith", "--data", str(data), "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a folder: give the path of a file to write." in capsys.readouterr().err
    sneaky = tmp_path / "missing" / ".." / "rows.jsonl"  # the write lands on rows.jsonl once missing/ is made
    assert main([command, "builtin:tiny-arith", "--data", str(data), "--out", str(sneaky)]) == 2
    assert f"--out {sneaky} is the file the command reads ({data})" in capsys.readouterr().err
    assert data.read_text() == kept and not (tmp_path / "missing").exists()


def test_an_output_inside_the_run_evaluated_is_refused(fitted_run, capsys):
    trainer, _ = fitted_run
    target = trainer.run_dir / "config.yaml"
    kept = target.read_bytes()
    assert main(["eval", str(trainer.run_dir), "--limit", "2", "--out", str(target)]) == 2
    assert f"--out {target} is inside {trainer.run_dir}, which the command reads" in capsys.readouterr().err
    assert target.read_bytes() == kept
