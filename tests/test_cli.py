"""rlforge.cli.main: list commands, config show, and one-line user errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlforge.cli import main
from rlforge.config import compose, explain_batch_sizes
from rlforge.errors import ConfigError
from rlforge.module import RLModule

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
    _assert_one_line_error(capsys, "Unknown algorithm 'nope' (algorithm.name).", "Available: dapo, dpo, dr_grpo, gdpo, gpg, grpo, ")


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


# --- everyday tools: parsing and one-line errors (their behaviour is tested in tests/tools/) -------


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("fit", "sft", "algos", "plugins", "config", "new", "eval", "generate", "export", "data", "report"):
        assert cmd in out


def test_plugins_list_header_and_tool_plugins(capsys, monkeypatch) -> None:
    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("# hook spec version 2; entry-point plugins: off (RLFORGE_DISABLE_PLUGIN_AUTOLOAD)")
    assert "plugins.disable=[NAME,...]" in first
    assert "    logger:tensorboard  (capabilities: shows_generations)\n" in out
    assert "    logger:wandb  (capabilities: shows_generations, marks_outcome)\n" in out
    assert "    logger:mlflow  (capabilities: marks_outcome)\n" in out
    assert "rlforge.plugins.logger.plots  (builtin, rlforge " in out
    monkeypatch.delenv("RLFORGE_DISABLE_PLUGIN_AUTOLOAD")
    assert main(["plugins", "list"]) == 0
    assert "entry-point plugins: on" in capsys.readouterr().out.splitlines()[0]


def test_config_show_explains_gradient_accumulation(capsys) -> None:
    assert main(["config", "show", "actor.ppo_micro_batch_size=16"]) == 0
    out = capsys.readouterr().out.partition("# batch sizes")[2]
    assert "4 mini-batch(es) of 8 prompts (64 sequences) = 4 optimizer step(s)" in out
    assert "split into 4 micro-batch(es) of 16 sequences (gradient accumulation steps)" in out


def test_rlforge_traceback_prints_the_chain_of_a_user_error(capsys, monkeypatch) -> None:
    assert main(["config", "show", "trainer=5"]) == 2
    assert "Traceback" not in capsys.readouterr().err  # one line by default
    monkeypatch.setenv("RLFORGE_TRACEBACK", "1")
    assert main(["config", "show", "trainer=5"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith("to list every key.")


@pytest.mark.parametrize("algo, first, mini", [
    ("dpo", "Each step reads 32 pairs x 2 rows (chosen, rejected) = 64 sequences.", "of 8 pairs (16 sequences)"),
    ("kto", "Each step reads 32 examples x 1 row(s) = 32 sequences.", "of 8 examples (8 sequences)"),
])
def test_config_show_of_an_offline_algorithm_counts_pairs_not_samples(capsys, algo, first, mini) -> None:
    assert main(["config", "show", "--algo", algo]) == 0
    out = capsys.readouterr().out.partition("# batch sizes")[2]
    assert first in out and mini in out and "samples" not in out


@pytest.mark.parametrize("argv, needle", [
    (["new", "plugin", "bad name"], "Invalid plugin name 'bad name'"),
    (["export", "/no/such/ckpt", "/tmp/out"], "'/no/such/ckpt' does not exist"),
    (["report", "/no/such/run"], "/no/such/run has no mlflow.db"),
    (["eval", "builtin:nope"], "Unknown built-in model 'builtin:nope' (model.path)"),
    (["generate", "builtin:tiny-arith", "--out", "x.jsonl", "--temperature", "-1"], "rollout.val_temperature"),
    (["data", "gsm8k", "--input", "train.csv", "--out", "d"], "Input file not found: train.csv (--input)."),
])
def test_tool_errors_are_one_line(capsys, argv, needle) -> None:
    assert main(argv) == 2
    _assert_one_line_error(capsys, needle)


@pytest.mark.parametrize("argv", [
    ["new", "widget", "x"], ["data", "squad", "--input", "a", "--out", "b"], ["generate", "builtin:tiny-arith"],
    ["export", "only_one_arg"],
])
def test_tool_usage_errors(capsys, argv) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: rlforge" in capsys.readouterr().err


def test_sft_refuses_keys_only_fit_reads_and_verl_s_sft_keys(capsys, tmp_path: Path) -> None:
    """An RL key given to `rlforge sft` would go unread: an error with the sft key; verl's SFT keys get rlforge's."""
    assert main(["sft", "actor.lr=1e-5", "trainer.total_epochs=2", "model.precision=32-true"]) == 2
    err = capsys.readouterr().err
    assert "rlforge sft does not read 'actor.lr' (SFT's is 'sft.lr'), 'trainer.total_epochs' (SFT's is 'sft.epochs')" \
           " (in command-line overrides)" in err
    (tmp_path / "c.yaml").write_text("algorithm:\n  name: grpo\n")
    assert main(["sft", "--config", str(tmp_path / "c.yaml")]) == 2
    assert f"'algorithm.name' (in {tmp_path / 'c.yaml'})" in capsys.readouterr().err
    assert main(["sft", "optim.lr=1e-5", "trainer.total_training_steps=3", "model.strategy=fsdp"]) == 2
    err = capsys.readouterr().err
    assert "'optim.lr' is verl's SFT key, rlforge's is 'sft.lr'" in err
    assert "'trainer.total_training_steps' is verl's SFT key; rlforge's is sft.steps / sft.epochs" in err
    assert "'model.strategy' is verl's SFT key, with no rlforge counterpart needed" in err
    assert main(["sft", "sft.steps=0", "model.lora.rank=4", "data.arith.train_size=8", "rollout.n=2"]) == 2
    assert "sft.steps" in capsys.readouterr().err  # keys SFT reads pass this check (the value is the error)
    assert main(["verl", "--sft", "--print", "data.train_files=/x.parquet", "--", "strategy.name=fsdp"]) == 2
    assert "'strategy.name' (SFT's is 'sft.strategy') (in rlforge's keys after --)" in capsys.readouterr().err


def test_fit_refuses_the_sft_keys_it_never_reads_but_not_a_saved_config(tmp_path: Path) -> None:
    """sft.steps given to `rlforge fit` (or after -- of an RL verl launch) would go unread: an error; a run's saved
    config repeats the sft section's defaults, which is not asking for anything."""
    from omegaconf import OmegaConf

    from rlforge.config import compose_with_plugins
    from rlforge.config.checks import check_fit_keys

    with pytest.raises(ConfigError, match=r"rlforge fit does not read sft.steps, sft.lr: rlforge sft's key\(s\)"):
        check_fit_keys(compose_with_plugins("grpo", None, ["sft.steps=2", "sft.lr=1e-5"])[1])
    saved = tmp_path / "config.yaml"
    saved.write_text(OmegaConf.to_yaml(compose_with_plugins("grpo", None, [])[1]))
    check_fit_keys(compose_with_plugins(None, str(saved), [])[1])  # the whole section at its defaults: no error


def test_every_verl_sft_rule_translated_together_names_rlforge_s_keys() -> None:
    from rlforge.config.checks import SFT_DERIVED
    from rlforge.config.verl_rules import Derived
    from rlforge.config.verl_sft import TABLE

    assert {r.owner for _, r in TABLE.items() if isinstance(r, Derived)} <= set(SFT_DERIVED)


# --- explain_batch_sizes (what `rlforge config show` prints under '# batch sizes') ---------------------------------


def test_explain_batch_sizes_defaults(registry) -> None:
    text = explain_batch_sizes(compose(registry), RLModule.batch_words())
    assert "Each step samples 32 prompts x 8 responses = 256 sequences." in text
    assert "1 epoch(s) of 4 mini-batch(es) of 8 prompts (64 sequences) = 4 optimizer step(s)" in text
    assert "1 micro-batch(es) of 64 sequences" in text


def test_explain_batch_sizes_custom(registry) -> None:
    cfg = compose(
        registry, None, None,
        ["data.train_batch_size=16", "rollout.n=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8",
         "actor.ppo_epochs=2"],
    )
    text = explain_batch_sizes(cfg, RLModule.batch_words())
    assert "16 prompts x 4 responses = 64 sequences" in text
    assert "2 epoch(s) of 4 mini-batch(es) of 4 prompts (16 sequences) = 8 optimizer step(s)" in text
    assert "2 micro-batch(es) of 8 sequences" in text
    # actor.ppo_micro_batch_size is per data-parallel rank: 2 ranks get 8 of the mini-batch's 16 sequences each
    text = explain_batch_sizes(cfg, RLModule.batch_words(), ranks=2)
    assert "dealt to 2 ranks (8 sequences each), and each rank's share is split into 1 micro-batch(es) of 8" in text


def test_an_unexpected_error_ends_with_a_line_naming_the_hook_that_raised(capsys) -> None:
    """helper-80: a plugin hook that raised under `rlforge fit` ended in pluggy's and the Trainer's frames with no
    line of rlforge's: the traceback stays, and the last line names the hook, its file and line (exit 1)."""
    from rlforge.cli import _run

    def rlforge_step_end(step):
        raise RuntimeError(f"boom at step {step}")

    def command() -> int:
        rlforge_step_end(2)
        return 0

    assert _run(command) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("rlforge: error: RuntimeError: boom at step 2 (raised in the hook rlforge_step_end "
                           "in "), last
    assert last.endswith(f"{__file__}:{rlforge_step_end.__code__.co_firstlineno + 1}; traceback above)"), last
    assert _run(lambda: int("x")) == 1
    assert "ValueError: invalid literal for int() with base 10: 'x' (raised in " in capsys.readouterr().err

    def empty() -> int:
        raise RuntimeError()

    assert _run(empty) == 1
    assert capsys.readouterr().err.rstrip().splitlines()[-1].startswith("rlforge: error: RuntimeError (raised in ")
