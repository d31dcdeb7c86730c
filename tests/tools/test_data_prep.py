"""``rlforge data gsm8k|math``: verl's row format from local source files; verl-prepared parquet works as is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlforge.cli import main
from rlforge.errors import DataError, RLForgeError
from rlforge.tools.data_prep import GSM8K_INSTRUCTION, MATH_INSTRUCTION, gsm8k_answer, last_boxed, prepare

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.usefixtures("no_autoload")


def _jsonl_to_parquet(src: Path, dest: Path) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows), dest)
    return dest


@pytest.mark.parametrize("text, expected", [
    ("so 12 pens.\n#### 12", "12"), ("#### 1,200", "1200"), ("#### -3", "-3"), ("#### 3.50", "3.50"), ("12", None),
])
def test_gsm8k_answer(text, expected):
    assert gsm8k_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    (r"so $\boxed{\frac{3}{4}}$.", r"\frac{3}{4}"),
    (r"$\boxed{32}$ no; $\boxed{1024}$", "1024"),
    (r"$x = \fbox{2}$", "2"),
    (r"the answer is $\boxed 5$.", "5"),
    (r"$\boxed{\frac{1}{2}$", None),  # unbalanced
    ("no box", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_gsm8k_rows_match_verl(tmp_path, registry):
    # parquet input, as downloaded from the dataset's page (main/train-00000-of-00001.parquet)
    source = _jsonl_to_parquet(DATA / "gsm8k_train.jsonl", tmp_path / "train-00000-of-00001.parquet")
    [out] = prepare("gsm8k", [str(source)], tmp_path / "gsm8k", registry)
    assert out == tmp_path / "gsm8k" / "train.parquet"
    rows = pq.read_table(out).to_pylist()
    question = "Mia has 3 boxes with 4 pens each. How many pens does she have?"
    answer = "Each box holds 4 pens, so 3 boxes hold 3*4 = <<3*4=12>>12 pens.\n#### 12"
    assert rows[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "12"},
        "extra_info": {"split": "train", "index": 0, "answer": answer, "question": question},
    }
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["12", "1200", "-3"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2]


def test_math_rows_match_verl(tmp_path, capsys):
    assert main(["data", "math", "--input", str(DATA / "math_test.jsonl"), "--out", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'test.parquet'}" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert rows[0] == {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": "What is $\\frac{1}{2} + \\frac{1}{4}$? " + MATH_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "\\frac{3}{4}"},
        "extra_info": {"split": "test", "index": 0},
    }
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{3}{4}", "1024", "2"]


def test_split_from_option_and_errors(tmp_path, registry):
    src = tmp_path / "gsm.jsonl"
    shutil.copy(DATA / "gsm8k_train.jsonl", src)
    with pytest.raises(RLForgeError, match="Cannot tell the split of .*gsm.jsonl"):
        prepare("gsm8k", [str(src)], tmp_path / "out", registry)
    [out] = prepare("gsm8k", [str(src)], tmp_path / "out", registry, split="test")
    assert out.name == "test.parquet" and pq.read_table(out).to_pylist()[0]["extra_info"]["split"] == "test"
    with pytest.raises(RLForgeError, match="Unknown split 'dev'"):
        prepare("gsm8k", [str(src)], tmp_path / "out", registry, split="dev")
    with pytest.raises(RLForgeError, match="same split"):
        prepare("gsm8k", [str(src), str(src)], tmp_path / "out", registry, split="test")


def test_bad_rows_name_file_and_row(tmp_path, registry):
    no_answer = tmp_path / "train.jsonl"
    no_answer.write_text('{"question": "q1", "answer": "#### 1"}\n{"question": "q2", "answer": "no marker"}\n')
    with pytest.raises(DataError, match=r"train.jsonl, row 2: cannot find the final answer in 'answer'"):
        prepare("gsm8k", [str(no_answer)], tmp_path / "out", registry)
    math_as_gsm8k = DATA / "math_test.jsonl"
    with pytest.raises(DataError, match=r"math_test.jsonl, row 1: text column\(s\) \['question', 'answer'\] missing or "
                                        r"not text"):
        prepare("gsm8k", [str(math_as_gsm8k)], tmp_path / "out", registry, split="test")


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["data", "gsm8k", "--input", str(tmp_path / "nope.parquet"), "--out", str(tmp_path), "--split", "test"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rlforge: error: Input file not found: {tmp_path / 'nope.parquet'} (--input)."
    out = tmp_path / "out"
    assert main(["data", "gsm8k", "--input", str(DATA / "gsm8k_train.jsonl"), "--input", str(DATA / "math_test.jsonl"),
                 "--out", str(out)]) == 2
    assert "math_test.jsonl, row 1: text column(s) ['question', 'answer'] missing or not text" in capsys.readouterr().err
    assert not out.exists()  # nothing is written unless every input converts


def test_verl_prepared_parquet_runs_unchanged(tmp_path, capsys):
    """A parquet file exactly as verl's gsm8k preprocessing writes it, through data.name=files and the rewards."""
    verl_file = _jsonl_to_parquet(DATA / "verl_gsm8k_test.jsonl", tmp_path / "test.parquet")
    report = tmp_path / "report.json"
    assert main(["eval", "builtin:tiny-arith", "--data", str(verl_file), "--out", str(report),
                 "data.max_prompt_length=248"]) == 0  # + 8 new tokens: the tiny model's 256 positions
    result = json.loads(report.read_text())
    assert result["dataset"] == "files" and result["prompts"] == 2
    assert set(result["by_data_source"]) == {"openai/gsm8k"}  # scored by verl's gsm8k rule (strict "####")
    assert result["metrics"]["accuracy"] == 0.0  # the tiny arithmetic model never writes "####"


def test_an_input_the_output_would_replace_is_refused(tmp_path, capsys):
    raw = tmp_path / "train.parquet"
    import pandas as pd

    pd.read_json(DATA / "gsm8k_train.jsonl", lines=True).to_parquet(raw)
    kept = raw.read_bytes()
    assert main(["data", "gsm8k", "--input", str(raw), "--out", str(tmp_path), "--split", "train"]) == 2
    assert f"--out {raw} is the file the command reads ({raw})" in capsys.readouterr().err
    assert raw.read_bytes() == kept
