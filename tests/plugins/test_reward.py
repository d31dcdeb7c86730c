"""rlforge.plugins.reward: rule functions, user reward files, and the rule reward manager."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlforge import batch as B
from rlforge.errors import RLForgeError
from rlforge.plugins.reward.functions import arith_score, gsm8k_score
from rlforge.plugins.reward.rule import RuleRewardManager, load_user_function, split_result

# --- arith ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("42", "42", 1.0),
        ("  42\n", "42", 1.0),
        ("42", 42, 1.0),
        ("41", "42", 0.0),
        ("42.", "42", 0.0),
        ("The answer is 42", "42", 0.0),
        ("", "42", 0.0),
        ("-3", "-3", 1.0),
    ],
)
def test_arith_score(solution, truth, expected) -> None:
    assert arith_score("arith", solution, truth) == expected


# --- gsm8k ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72", 1.0),
        ("#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # commas removed
        ("#### 1234", "1,234", 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 71", "72", 0.0),  # wrong number -> format_score (0)
        ("The answer is 72", "72", 0.0),  # strict needs '#### '
        ("####72", "72", 0.0),  # no space after ####
        ("#### 10 and later #### 72", "72", 1.0),  # the last '#### ' answer counts
        ("#### 72 then 99", "72", 1.0),  # strict ignores later numbers
    ],
)
def test_gsm8k_strict(solution, truth, expected) -> None:
    assert gsm8k_score("gsm8k", solution, truth) == expected
    assert gsm8k_score("gsm8k", solution, truth, method="strict") == expected


def test_gsm8k_strict_format_score_and_custom_score() -> None:
    assert gsm8k_score("gsm8k", "#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k_score("gsm8k", "no answer", "72", format_score=0.1) == 0.0  # nothing extracted
    assert gsm8k_score("gsm8k", "#### 72", "72", score=2.0) == 2.0


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("The answer is 72", "72", 1.0),
        ("3 + 4 = 7", "7", 1.0),  # the last number
        ("7 is not it, 8 is", "7", 0.0),
        ("we get 1,000 apples", "1000", 1.0),  # commas removed
        ("#### 72", "72", 1.0),
        ("so -12.", "-12", 1.0),
        ("no digits here", "1", 0.0),
        ("", "1", 0.0),
    ],
)
def test_gsm8k_flexible(solution, truth, expected) -> None:
    assert gsm8k_score("gsm8k", solution, truth, method="flexible") == expected


def test_gsm8k_flexible_format_score() -> None:
    assert gsm8k_score("gsm8k", "it is 5", "6", method="flexible", format_score=0.25) == 0.25


# --- user reward functions ------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"score": 0.5, "acc": 1}, (0.5, 1.0)),
        ({"score": 1.0}, (1.0, 1.0)),
        ({"score": 0.5}, (0.5, 0.0)),
        ({"score": 2, "acc": False}, (2.0, 0.0)),
        (1.0, (1.0, 1.0)),
        (0.3, (0.3, 0.0)),
        (1, (1.0, 1.0)),
        (-1.0, (-1.0, 0.0)),
    ],
)
def test_split_result(result, expected) -> None:
    score, acc = split_result(result)
    assert (score, acc) == pytest.approx(expected)
    assert isinstance(score, float) and isinstance(acc, float)


# --- the rule reward manager ---------------------------------------------------------------------------


def _reward_config(file: str | None = None, fn: str | None = None, fn_name: str = "compute_score"):
    return SimpleNamespace(reward=SimpleNamespace(manager="rule", fn=fn, file=file, fn_name=fn_name))


def _response_batch(tok, texts: list[str], sources: list[str], truths: list[str], width: int = 6) -> B.Batch:
    """Right-padded responses: the text's chars, then EOS, then pad; the mask covers text + EOS."""
    rows, masks = [], []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        assert len(ids) <= width
        rows.append(ids + [tok.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    return B.Batch(
        {B.RESPONSES: torch.tensor(rows), B.RESPONSE_MASK: torch.tensor(masks)},
        {B.DATA_SOURCE: sources, B.GROUND_TRUTH: truths, B.EXTRA_INFO: [None] * len(texts), B.UID: list(range(len(texts)))},
    )


def test_rule_manager_scores_at_last_valid_token(char_tokenizer, registry) -> None:
    mgr = RuleRewardManager(_reward_config(), char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["12", "7", "1234"], ["arith"] * 3, ["12", "8", "1234"])
    out = mgr.score(batch)
    assert out[B.RESPONSE_TEXT] == ["12", "7", "1234"]
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(out[B.ACC], torch.tensor([1.0, 0.0, 1.0]))
    expected = torch.zeros(3, 6)
    expected[0, 2] = 1.0  # "12" + EOS: last valid index 2 (the EOS)
    expected[2, 4] = 1.0  # "1234" + EOS
    torch.testing.assert_close(out[B.TOKEN_LEVEL_SCORES], expected)
    assert out[B.TOKEN_LEVEL_SCORES].dtype == torch.float32


def test_rule_manager_uses_data_source(char_tokenizer, registry) -> None:
    mgr = RuleRewardManager(_reward_config(), char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["#### 5", "#### 5"], ["openai/gsm8k", "arith"], ["5", "5"], width=8)
    out = mgr.score(batch)
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.0]))  # arith wants exactly "5"
    assert out[B.TOKEN_LEVEL_SCORES][0, 6].item() == 1.0


def test_rule_manager_unknown_data_source(char_tokenizer, registry) -> None:
    mgr = RuleRewardManager(_reward_config(), char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["1"], ["my_task"], ["1"])
    with pytest.raises(RLForgeError, match="No reward function for data_source 'my_task'.*arith"):
        mgr.score(batch)


def test_rule_manager_fixed_fn(char_tokenizer, registry) -> None:
    mgr = RuleRewardManager(_reward_config(fn="gsm8k"), char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["#### 3"], ["anything"], ["3"], width=8)
    assert mgr.score(batch)[B.SCORES].tolist() == [1.0]


def test_rule_manager_unknown_fixed_fn(char_tokenizer, registry) -> None:
    with pytest.raises(RLForgeError, match="Unknown reward fn 'gsm9k'.*Did you mean 'gsm8k'"):
        RuleRewardManager(_reward_config(fn="gsm9k"), char_tokenizer, registry)


def test_rule_manager_user_file_with_dict_result(char_tokenizer, registry, tmp_path: Path) -> None:
    path = tmp_path / "reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    right = solution_str == ground_truth\n"
        "    return {'score': 0.5 + 0.5 * right, 'acc': float(right)}\n"
    )
    mgr = RuleRewardManager(_reward_config(file=str(path)), char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["ab", "c"], ["x", "y"], ["ab", "d"])
    out = mgr.score(batch)
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(out[B.ACC], torch.tensor([1.0, 0.0]))
    assert out[B.TOKEN_LEVEL_SCORES][0, 2].item() == 1.0
    assert out[B.TOKEN_LEVEL_SCORES][1, 1].item() == 0.5
    assert out[B.TOKEN_LEVEL_SCORES].sum().item() == pytest.approx(1.5)


def test_rule_manager_rejects_non_finite_scores(char_tokenizer, registry, tmp_path: Path) -> None:
    path = tmp_path / "nan_reward.py"
    path.write_text("def compute_score(a, b, c, d):\n    return float('nan')\n")
    mgr = RuleRewardManager(_reward_config(file=str(path)), char_tokenizer, registry)
    with pytest.raises(RLForgeError, match="returned nan"):
        mgr.score(_response_batch(char_tokenizer, ["1"], ["x"], ["1"]))


def test_rule_manager_passes_extra_info(char_tokenizer, registry, tmp_path: Path) -> None:
    path = tmp_path / "extra.py"
    path.write_text("def compute_score(ds, s, gt, extra_info):\n    return float(extra_info['w'])\n")
    mgr = RuleRewardManager(_reward_config(file=str(path)), char_tokenizer, registry)
    batch = _response_batch(char_tokenizer, ["1", "2"], ["x", "x"], ["1", "2"])
    batch[B.EXTRA_INFO] = [{"w": 0.25}, {"w": 0.75}]
    torch.testing.assert_close(mgr.score(batch)[B.SCORES], torch.tensor([0.25, 0.75]))
