"""Loading a user's reward function from a file (``reward.file``): import errors, the contract, ``reward.fn_kwargs``.
How the rule manager calls what is loaded: test_reward.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlforge.plugins.reward.user_file import load_user_function

from rlforge.errors import ConfigError, RLForgeError


def test_load_user_function(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'acc': 1.0}\n"
        "def other(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 0.5\n"
    )
    fn = load_user_function(str(path))
    assert fn("src", "1", "1", None) == {"score": 1.0, "acc": 1.0}
    assert load_user_function(str(path), "other")("src", "x", "y", None) == 0.5


def test_load_user_function_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.py")
    with pytest.raises(RLForgeError, match="not found") as info:
        load_user_function(missing)
    assert missing in str(info.value)
    assert "reward.file" in str(info.value)


def test_load_user_function_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import math\n\ndef compute_score(a, b, c, d):\n    return (\n\nx = = 1\n")
    with pytest.raises(RLForgeError) as info:
        load_user_function(str(path))
    msg = str(info.value)
    assert str(path) in msg
    assert "syntax error" in msg
    assert "line " in msg


def test_load_user_function_syntax_error_line_number(tmp_path: Path) -> None:
    path = tmp_path / "broken2.py"
    path.write_text("x = 1\ny = 2\nz = = 3\n")
    with pytest.raises(RLForgeError, match="line 3"):
        load_user_function(str(path))


def test_load_user_function_import_error(tmp_path: Path) -> None:
    path = tmp_path / "imports.py"
    path.write_text("import rlforge_definitely_missing_module\n")
    with pytest.raises(RLForgeError, match="failed to import.*ModuleNotFoundError"):
        load_user_function(str(path))


def test_load_user_function_missing_function(tmp_path: Path) -> None:
    path = tmp_path / "nofn.py"
    path.write_text("def score(a, b, c, d):\n    return 1.0\ncompute_score = 3\n")
    with pytest.raises(RLForgeError) as info:
        load_user_function(str(path))
    msg = str(info.value)
    assert "no function 'compute_score'" in msg
    assert "reward.fn_name" in msg
    with pytest.raises(RLForgeError, match="no function 'missing'"):
        load_user_function(str(path), "missing")


def test_fn_kwargs_are_bound_to_the_user_function_and_checked_against_its_signature(tmp_path: Path) -> None:
    path = tmp_path / "kw.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, format_score=0.0):\n"
                    "    return 1.0 if solution_str == ground_truth else format_score\n"
                    "def any_kw(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                    "    return float(kw['w'])\n")
    assert load_user_function(str(path), kwargs={"format_score": 0.1})("d", "x", "y", None) == 0.1
    assert load_user_function(str(path), "any_kw", kwargs={"w": 3})("d", "x", "y", None) == 3.0  # verl binds any
    with pytest.raises(ConfigError, match=r"reward.fn_kwargs.fmt: .*has no parameter 'fmt'.*takes: format_score"):
        load_user_function(str(path), kwargs={"fmt": 0.1})
    with pytest.raises(ConfigError, match="reward.fn_kwargs.extra_info: .*argument of the reward-function contract"):
        load_user_function(str(path), "any_kw", kwargs={"extra_info": {}})
