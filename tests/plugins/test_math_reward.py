"""Rewards for verl's data sources: math answers checked by math-verify, Search-R1 exact match, the
data_source -> function table, the check before a run, and extra keys of dict results as metrics."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlforge import batch as B
from rlforge.config.schema import RewardConfig
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugins.reward.functions import normalize_answer, qa_em_score
from rlforge.plugins.reward.math import equivalent, geo3k_score, last_boxed, math_boxed_score, math_dapo_score
from rlforge.plugins.reward.results import extra_metrics, extra_values
from rlforge.plugins.reward.rule import DATA_SOURCES, RuleRewardManager, check_data_sources, function_for

# every data_source that verl's default_compute_score (verl/utils/reward_score/__init__.py) knows
VERL_SOURCES = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math_boxed", "DigitalLearningGmbH/MATH-lighteval": "math_boxed",
    "HuggingFaceH4/MATH-500": "math_boxed",
    "math_dapo": "math_dapo", "math": "math_dapo", "math_dapo_reasoning": "math_dapo",
    "aime2024": "math_dapo", "aime_2025": "math_dapo",
    "numina_aops_forum": "math_boxed", "numina_synthetic_math": "math_boxed", "numina_amc_aime": "math_boxed",
    "numina_synthetic_amc": "math_boxed", "numina_cn_k12": "math_boxed", "numina_olympiads": "math_boxed",
    "codecontests": "code", "apps": "code", "codeforces": "code", "taco": "code",
    "hiyouga/geometry3k": "geo3k",
    "searchR1_nq": "qa_em", "searchR1_triviaqa": "qa_em", "searchR1_popqa": "qa_em", "searchR1_hotpotqa": "qa_em",
    "searchR1_2wikimultihopqa": "qa_em", "searchR1_musique": "qa_em", "searchR1_bamboogle": "qa_em",
}


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{5}.", "5"),
    ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one, nested braces
    ("\\boxed{{a}+{b}}", "{a}+{b}"),
    ("the answer is \\boxed 7 because", "7"),
    ("$\\boxed 9$", "9"),
    ("\\fbox{3}", "3"),
    ("\\boxed{unclosed", None),
    ("no box here", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("answer, truth, same", [
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac{1}{2}", "\\frac12", True),
    ("1/2", "\\frac{1}{2}", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("3", "4", False),
    ("", "4", False),
])
def test_equivalent_is_symbolic(answer, truth, same):
    assert equivalent(answer, truth) is same


def test_equivalent_off_the_main_thread():
    """math-verify's signal-based timeout needs the main thread; elsewhere it runs without it."""
    result = []
    thread = threading.Thread(target=lambda: result.append(equivalent("0.5", "\\frac{1}{2}")))
    thread.start()
    thread.join()
    assert result == [True]


def test_math_boxed_score():
    assert math_boxed_score("lighteval/MATH", "... so it is \\boxed{\\frac{2}{4}}.", "\\frac{1}{2}") == 1.0
    assert math_boxed_score("lighteval/MATH", "The answer is 1/2.", "\\frac{1}{2}") == 0.0  # not boxed
    assert math_boxed_score("lighteval/MATH", "\\boxed{3}", "4") == 0.0


def test_math_dapo_score():
    right = math_dapo_score("math_dapo", "Work...\nAnswer: $\\boxed{34}$", "34")
    assert right == {"score": 1.0, "acc": 1.0, "pred": "34"}
    assert math_dapo_score("aime2024", "Answer: 12\nthen\nAnswer: 0.25", "\\frac{1}{4}")["score"] == 1.0  # last line
    assert math_dapo_score("math_dapo", "Answer: 35", "34") == {"score": -1.0, "acc": 0.0, "pred": "35"}
    assert math_dapo_score("math_dapo", "\\boxed{34} and no answer line", "34")["score"] == -1.0
    far = "Answer: 34\n" + "x" * 400  # only the last 300 characters are read, as in verl
    assert math_dapo_score("math_dapo", far, "34")["score"] == -1.0


def test_geo3k_score():
    # (1 - 0.1) * correct + 0.1 * format
    right = geo3k_score("hiyouga/geometry3k", "<think>angles</think> so \\boxed{30}", "30")
    assert right["score"] == pytest.approx(1.0)
    assert geo3k_score("hiyouga/geometry3k", "so \\boxed{30}", "30") == {"score": 0.9, "acc": 1.0, "format": 0.0}
    assert geo3k_score("hiyouga/geometry3k", "<think>x</think> \\boxed{31}", "30")["score"] == pytest.approx(0.1)


def test_qa_em_score():
    truth = {"target": ["The Eiffel Tower", "Eiffel tower"]}
    assert normalize_answer("  The  Eiffel-Tower! ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert qa_em_score("searchR1_nq", "<answer>Paris</answer> <answer>eiffel tower.</answer>", truth) == 1.0
    assert qa_em_score("searchR1_nq", "<answer>Louvre</answer>", truth) == 0.0
    assert qa_em_score("searchR1_nq", "eiffel tower", truth) == 0.0  # no answer tag
    assert qa_em_score("searchR1_nq", "<answer>x</answer>" * 11 + "<answer>Eiffel Tower</answer>", truth) == 0.25
    assert qa_em_score("searchR1_nq", "<answer>Oslo</answer>", {"target": "oslo"}) == 1.0


# --- data sources ----------------------------------------------------------------------------------------------
def test_verl_data_sources_have_built_in_functions(registry):
    for source, fn in VERL_SOURCES.items():
        assert function_for(source, registry) == fn, source
    assert set(DATA_SOURCES) <= set(VERL_SOURCES)
    assert function_for("arith", registry) == "arith"  # a registered name is its own function
    assert function_for("my_task", registry) is None
    assert function_for("MATH", registry) is None  # names are exact


def _config(**reward):
    return SimpleNamespace(reward=OmegaConf.structured(RewardConfig(**reward)))


def test_check_data_sources(registry, tmp_path):
    check_data_sources(_config(), registry, ["openai/gsm8k", "aime2025", "arith", "lighteval/MATH"])
    with pytest.raises(ConfigError) as err:
        check_data_sources(_config(), registry, ["openai/gsm8k", "my_task", "other", "my_task"])
    message = str(err.value)
    assert message.startswith("No reward function for data_source 'my_task', 'other'. Reward functions: ")
    assert "math_boxed" in message and "reward.fn=NAME or reward.file=path.py" in message
    check_data_sources(_config(fn="gsm8k"), registry, ["my_task"])  # a fixed function scores every row
    check_data_sources(_config(file=str(tmp_path / "r.py")), registry, ["my_task"])


# --- extra keys of dict results ----------------------------------------------------------------------------------
def test_extra_values_keep_numbers_and_strings():
    result = {"score": 1.0, "acc": 1.0, "pred": "34", "format": True, "len": 3, "bad": float("nan"),
              "obj": object(), "arr": [1, 2]}
    assert extra_values(result) == {"acc": 1.0, "pred": "34", "format": 1.0, "len": 3.0}
    assert extra_values(0.5) == {"acc": 0.5}  # verl's reward_extra_info of a number


def test_extra_metrics_are_means_over_samples_that_return_them():
    extras = [{"format": 1.0, "pred": "3"}, {"format": 0.0, "len": 4.0}, {}, {"format": 0.5}]
    assert extra_metrics(extras) == {"reward/extra/format/mean": 0.5,  # (1 + 0 + 0.5) / 3
                                     "reward/extra/len/mean": 4.0}


def test_rule_manager_reports_extra_keys(char_tokenizer, registry):
    manager = RuleRewardManager(_config(), char_tokenizer, registry)
    texts = ["Answer: 34", "Answer: 3", "#### 7"]
    ids = [char_tokenizer.encode(t, add_special_tokens=False) + [char_tokenizer.eos_token_id] for t in texts]
    width = max(map(len, ids))
    batch = B.Batch(
        {B.RESPONSES: torch.tensor([r + [char_tokenizer.pad_token_id] * (width - len(r)) for r in ids]),
         B.RESPONSE_MASK: torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])},
        {B.DATA_SOURCE: ["math_dapo", "aime2024", "openai/gsm8k"], B.GROUND_TRUTH: ["34", "34", "7"],
         B.EXTRA_INFO: [None] * 3, B.UID: [0, 1, 2]},
    )
    try:
        out = manager.score(batch)
    finally:
        manager.close()
    assert out[B.SCORES].tolist() == [1.0, -1.0, 1.0]
    assert out[B.ACC].tolist() == [1.0, 0.0, 1.0]
    assert out[B.REWARD_EXTRA_INFO] == [{"acc": 1.0, "pred": "34"}, {"acc": 0.0, "pred": "3"}, {"acc": 1.0}]
    assert out.meta["metrics"] == {"reward/errors": 0.0, "reward/timeouts": 0.0,  # pred is not a number
                                   "reward/error_share": 0.0}


def test_rule_manager_numeric_extra_keys_become_metrics(char_tokenizer, registry, tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return {'score': float(solution_str == ground_truth), 'length': len(solution_str)}\n")
    manager = RuleRewardManager(_config(file=str(path)), char_tokenizer, registry)
    batch = B.Batch({B.RESPONSES: torch.tensor([[23, 2], [24, 25]]), B.RESPONSE_MASK: torch.tensor([[1, 1], [1, 1]])},
                    {B.DATA_SOURCE: ["x", "x"], B.GROUND_TRUTH: ["0", "12"], B.EXTRA_INFO: [None] * 2, B.UID: [0, 1]})
    try:
        out = manager.score(batch)
    finally:
        manager.close()
    assert out[B.RESPONSE_TEXT] == ["0", "12"] and out[B.SCORES].tolist() == [1.0, 1.0]
    assert out.meta["metrics"]["reward/extra/length/mean"] == 1.5  # (1 + 2) / 2


def test_unknown_data_source_at_score_time(char_tokenizer, registry):
    manager = RuleRewardManager(_config(), char_tokenizer, registry)
    with pytest.raises(RLForgeError, match="No reward function for data_source 'MATH'"):
        manager.key_for("MATH")
