"""Config values of the wrong shape, through the CLI: a mapping for a list key (from an override, a --config file or a
plugin's options) and a file for trainer.resume each end the command with one line naming the key, what it takes and
what was given (OmegaConf's own error named an index of the list)."""

from __future__ import annotations

import pytest

from tests.test_bad_inputs import _error

PLUGIN_OPTIONS = '''from dataclasses import dataclass, field

from rlforge import hookimpl


@dataclass
class Opts:
    names: list = field(default_factory=lambda: ["a"])  # some names


@hookimpl
def rlforge_register(registry):
    registry.plugin_options(Opts)
'''


@pytest.mark.parametrize("value", ["{a: 1}", "{}"])
def test_a_mapping_for_a_list_key_names_the_key_the_type_and_the_value(capsys, value):
    err = _error(capsys, ["config", "show", f"logger.backends={value}"])
    given = "{'a': 1}" if value != "{}" else "{}"
    assert err == (f"rlforge: error: Invalid value for 'logger.backends' (in command-line overrides): it takes a list "
                   f"of str, got the mapping {given}; give a list, e.g. 'logger.backends=[console,mlflow]'.")


def test_the_example_of_an_empty_list_of_numbers_is_numbers(capsys):
    err = _error(capsys, ["config", "show", "--algo", "gdpo", "algorithm.reward_weights={a: 1}"])
    assert err.endswith("it takes a list of float, got the mapping {'a': 1}; give a list, e.g. "
                        "'algorithm.reward_weights=[1.0,0.5]'.")


def test_a_mapping_for_a_list_key_in_a_config_file(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  train_files:\n    a: 1\n", encoding="utf-8")
    err = _error(capsys, ["config", "show", "--config", str(config)])
    assert err.startswith(f"rlforge: error: Invalid value for 'data.train_files' (in {config}): it takes a list of "
                          f"str, got the mapping {{'a': 1}}; give a list")


def test_a_mapping_for_a_plugin_option_typed_list(capsys, tmp_path):
    plugin = tmp_path / "shape_opts.py"
    plugin.write_text(PLUGIN_OPTIONS, encoding="utf-8")
    err = _error(capsys, ["config", "show", "-p", str(plugin), "plugins.shape_opts.names={x: 1}"])
    assert err == ("rlforge: error: Invalid value for 'plugins.shape_opts.names' (in command-line overrides): it takes "
                   "a list, got the mapping {'x': 1}; give a list, e.g. 'plugins.shape_opts.names=[a]'.")


def test_a_file_for_trainer_resume_says_it_is_a_file(capsys, tmp_path):
    file = tmp_path / "trainer_state.pt"
    file.write_bytes(b"")
    err = _error(capsys, ["config", "show", f"trainer.resume={file}"])
    assert err.startswith(f"rlforge: error: trainer.resume='{file}': a file, not a folder. Use never, auto")
    assert "a checkpoint folder (<run>/checkpoints/step_N) or a run folder" in err
