"""YAML as the user writes it (rlforge.config.yaml_text): values YAML 1.1 reads other than they look, on the command
line and in config files, are refused naming the override or the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge.config import compose
from rlforge.errors import ConfigError
from tests.test_config import _yaml


@pytest.mark.parametrize(("override", "says"), [
    ("reward.generative.system=Note: be strict", r"reads the value as a mapping \(it has ': '\)"),
    ("trainer.experiment=E:", r"reads the value as a mapping \(it ends in ':'\)"),  # helper-80
    ("reward.generative.template=Q: {prompt} A: {response}", "not valid YAML"),
])
def test_override_values_yaml_misreads_name_the_override_and_the_quoting(registry, override: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        compose(registry, None, None, [override])
    assert override in str(info.value) and "quote it" in str(info.value)


@pytest.mark.parametrize(("value", "number", "why"), [
    ("5_0.5", "50.5", "it drops the underscores of a number"),
    ("1:30", "90", "base 60"),
    ("010", "8", "a leading 0 makes it octal"),
])
def test_numbers_yaml_1_1_misreads_are_refused(registry, value: str, number: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"Override 'algorithm.rollout_is_threshold={value}': YAML reads '{value}' "
                                          f"as the number {number} \\(.*{why}.*\\); write the number you mean, or "
                                          f"quote the value as a string"):
        compose(registry, None, None, [f"algorithm.rollout_is_threshold={value}"])
    cfg = compose(registry, None, None, ["trainer.total_steps=1_000", "actor.lr=1e-6", "trainer.seed=0"])
    assert (cfg.trainer.total_steps, cfg.actor.lr, cfg.trainer.seed) == (1000, 1e-6, 0)


def test_numbers_yaml_1_1_misreads_in_a_config_file_are_refused_naming_the_line(registry, tmp_path: Path) -> None:
    path = _yaml(tmp_path, "algorithm:\n  rollout_is: token\n  rollout_is_threshold: 0.5_5\n")
    with pytest.raises(ConfigError, match=f"Config file {path}, line 3: YAML reads '0.5_5' as the number 0.55 \\(it "
                                          f"drops the underscores of a number\\); write the number you mean, or quote"):
        compose(registry, "grpo", path)
    path = _yaml(tmp_path, "trainer:\n  total_steps: 1:30\n", "b.yaml")
    with pytest.raises(ConfigError, match=r"line 2: YAML reads '1:30' as the number 90 \(YAML 1.1 reads a colon"):
        compose(registry, "grpo", path)
    path = _yaml(tmp_path, "trainer:\n  total_steps: 1_000\n  experiment: '010'\nactor:\n  lr: 1e-6\n", "c.yaml")
    cfg = compose(registry, "grpo", path)
    assert (cfg.trainer.total_steps, cfg.trainer.experiment, cfg.actor.lr) == (1000, "010", 1e-6)


def test_misreads_inside_a_list_on_the_command_line_are_refused(registry) -> None:
    with pytest.raises(ConfigError, match=r"Override 'data.train_files=\[1:30\]': YAML reads '1:30' as the number 90 "
                                          r".*: quote that item inside it"):
        compose(registry, "grpo", None, ["data.train_files=[1:30]"])
    with pytest.raises(ConfigError, match=r"'logger.backends' \(in command-line overrides\) is text, and YAML read "
                                          r"its value as the boolean False"):
        compose(registry, "grpo", None, ["logger.backends=[console,off]"])


@pytest.mark.parametrize("where", ["file", "override"])
def test_a_yes_or_no_for_a_text_key_is_refused(registry, tmp_path: Path, where: str) -> None:
    path = _yaml(tmp_path, "trainer:\n  experiment: no\n") if where == "file" else None
    overrides = [] if where == "file" else ["trainer.experiment=yes"]
    with pytest.raises(ConfigError, match=r"'trainer.experiment' \(in .*\) is text, and YAML read its value as the "
                                          r"boolean (False|True) \(an unquoted yes, no, on, off"):
        compose(registry, "grpo", path, overrides)


def test_a_mapping_without_a_space_after_the_colon_is_refused_not_misread(registry) -> None:
    """Hydra (which verl users type) reads {a:b} as a: b; YAML reads it as the key 'a:b' without a value."""
    with pytest.raises(ConfigError, match="Override 'data.apply_chat_template_kwargs=\\{enable_thinking:false\\}': "
                                          "YAML reads '\\{enable_thinking:false\\}' as the key 'enable_thinking:false' "
                                          "without a value \\(Hydra reads it as enable_thinking: false\\); write "
                                          "'\\{enable_thinking: false\\}'"):
        compose(registry, None, None, ["data.apply_chat_template_kwargs={enable_thinking:false}"])
    assert compose(registry, None, None, ["data.apply_chat_template_kwargs={url: 'http://x'}"]
                   ).data.apply_chat_template_kwargs == {"url": "http://x"}
