"""rlforge.cli.main: list commands, config show, and one-line user errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlforge.cli import main

pytestmark = pytest.mark.usefixtures("no_autoload")


def test_algos(capsys) -> None:
    assert main(["algos"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("grpo"))
    assert "Group Relative Policy Optimization" in line
    assert "plugin: rlforge.algorithms.grpo" in line


def test_plugins_list(capsys) -> None:
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "rlforge.algorithms.grpo  (builtin, rlforge " in out
    for comp in ("algorithm:grpo", "rollout:hf", "reward manager:rule", "strategy:single", "logger:console",
                 "logger:mlflow", "dataset:arith", "dataset:files", "controller:local"):
        assert f"    {comp}" in out
    assert "FAILED" not in out


def test_plugins_default_action_is_list(capsys) -> None:
    assert main(["plugins"]) == 0
    assert "algorithm:grpo" in capsys.readouterr().out


def test_config_show(capsys) -> None:
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    yaml_part, _, explain = out.partition("# batch sizes")
    cfg = yaml.safe_load(yaml_part)
    assert cfg["algorithm"]["name"] == "grpo"
    assert cfg["actor"]["lr"] == 5e-5
    assert cfg["rollout"]["n"] == 8
    assert "# Each step samples 32 prompts x 8 responses = 256 sequences." in explain
    assert "micro-batch" in explain


def test_config_show_with_overrides_then_file(capsys, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  total_steps: 11\nrollout:\n  n: 2\n")
    assert main(["config", "show", "rollout.n=4", "actor.ppo_micro_batch_size=32", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out.partition("# batch sizes")[0])
    assert cfg["rollout"]["n"] == 4
    assert cfg["trainer"]["total_steps"] == 11
    assert "32 prompts x 4 responses = 128 sequences" in out


def test_fit_options_before_overrides_parse(capsys) -> None:
    # `fit --algo X key=value` parses; the (unknown) algorithm is what fails
    assert main(["fit", "--algo", "nope", "rollout.n=4"]) == 2
    assert "Unknown algorithm 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("opt", ["--algo", "--config"])
def test_config_show_options_before_overrides(capsys, tmp_path: Path, opt: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  total_steps: 11\nrollout:\n  n: 2\n")
    value = "grpo" if opt == "--algo" else str(path)
    assert main(["config", "show", opt, value, "rollout.n=4", "actor.ppo_micro_batch_size=32"]) == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out.partition("# batch sizes")[0])
    assert cfg["rollout"]["n"] == 4
    if opt == "--config":
        assert cfg["trainer"]["total_steps"] == 11
    assert "32 prompts x 4 responses = 128 sequences" in out


def _assert_one_line_error(capsys, *needles: str) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("rlforge: error: ")
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in captured.err + captured.out
    for n in needles:
        assert n in err
    return err


def test_fit_unknown_algorithm(capsys) -> None:
    assert main(["fit", "--algo", "nope"]) == 2
    _assert_one_line_error(capsys, "Unknown algorithm 'nope'", "Available: grpo")


def test_fit_unknown_algorithm_suggests(capsys) -> None:
    assert main(["fit", "--algo", "grp"]) == 2
    _assert_one_line_error(capsys, "Did you mean 'grpo'?")


def test_fit_bad_override(capsys) -> None:
    assert main(["fit", "actor.lrr=1e-5"]) == 2
    _assert_one_line_error(capsys, "'actor.lrr'", "Did you mean 'actor.lr'?")


def test_fit_missing_config_file(capsys, tmp_path: Path) -> None:
    assert main(["fit", "--config", str(tmp_path / "nope.yaml")]) == 2
    _assert_one_line_error(capsys, "Config file not found")


def test_fit_bad_batch_sizes(capsys) -> None:
    assert main(["fit", "data.train_batch_size=30"]) == 2
    _assert_one_line_error(capsys, "actor.ppo_mini_batch_size")


def test_config_show_error(capsys) -> None:
    assert main(["config", "show", "rollout.name=vlm"]) == 2
    _assert_one_line_error(capsys, "Unknown rollout 'vlm' (rollout.name)", "Available: hf")


def test_unknown_command_exits_with_usage(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bogus"])
    assert info.value.code == 2
    assert "usage: rlforge" in capsys.readouterr().err
