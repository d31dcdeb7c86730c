"""Geometry3K the way verl trains it: `rlforge data geometry3k` writes verl's rows (images kept) from a local copy of
the source files, and two GRPO steps (the rows' images through rollout, reference and update) and two DPO steps on
image pairs run on a tiny Qwen2.5-VL-shaped model built offline."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlforge.cli import main
from rlforge.errors import DataError
from rlforge.tools.data_prep import GEO3K_INSTRUCTION, prepare
from tests.multimodal.test_mm_data import _png
from tests.multimodal.test_mm_preferences import _pair

FAST = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8",
        "trainer.total_steps=2", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.save_every=0",
        "logger.backends=[console]", "trainer.progress=false"]


@pytest.fixture(scope="module")
def qwen25_vl(tmp_path_factory) -> str:
    from rlforge.multimodal import build_tiny_vlm, save_vlm

    folder = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    save_vlm(*build_tiny_vlm(family="qwen2_5_vl"), folder)
    return str(folder)


def _source(path: Path, rows: int = 8, problem: str = "<image>Find x.") -> Path:
    """A file in the layout of hiyouga/geometry3k's parquet: images as a list of {bytes, path}, problem, answer."""
    pq.write_table(pa.Table.from_pylist([{"images": [{"bytes": _png((140, 100)), "path": None}], "problem": problem,
                                          "answer": f" {i % 3} "} for i in range(rows)]), path)
    return path


def test_rlforge_data_geometry3k_writes_verls_rows_with_the_images(tmp_path, capsys):
    src = _source(tmp_path / "train-00000-of-00001.parquet")
    assert main(["data", "geometry3k", "--input", str(src), "--out", str(tmp_path / "geo3k")]) == 0
    rows = pq.read_table(tmp_path / "geo3k" / "train.parquet").to_pylist()
    assert len(rows) == 8
    row = rows[1]
    assert row["data_source"] == "hiyouga/geometry3k" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": f"<image>Find x. {GEO3K_INSTRUCTION}"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "1"}
    assert row["extra_info"] == {"split": "train", "index": 1, "answer": " 1 ", "question": "<image>Find x."}
    assert row["images"] == [{"bytes": _png((140, 100)), "path": None}]


def test_a_problem_without_its_placeholder_is_named(tmp_path, no_autoload):
    from rlforge.plugin_manager import PluginManager

    src = _source(tmp_path / "test.parquet", rows=2, problem="Find x.")
    with pytest.raises(DataError, match=r"test.parquet, row 1: 'problem' has 0 <image> placeholder\(s\) and column "
                                        r"'images' holds 1 image"):
        prepare("geometry3k", [str(src)], tmp_path / "out", PluginManager(autoload=False).registry)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # two whole fits (~10 s each) on the tiny Qwen2.5-VL model
def test_grpo_and_dpo_train_two_steps_on_a_tiny_qwen25_vl(tmp_path, qwen25_vl):
    assert main(["data", "geometry3k", "--input", str(_source(tmp_path / "train.parquet")),
                 "--out", str(tmp_path / "geo3k")]) == 0
    geo = tmp_path / "geo3k" / "train.parquet"
    assert main(["fit", "--algo", "grpo", f"model.path={qwen25_vl}", "data.name=files", f"data.train_files=[{geo}]",
                 "data.val_files=[]", "data.max_prompt_length=320", "rollout.max_new_tokens=6", "rollout.n=4",
                 "actor.use_kl_loss=true", f"trainer.runs_root={tmp_path / 'grpo'}", *FAST]) == 0
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist([_pair(str(n), str(n + 2), c) for n in range(1, 5) for c in ("red", "blue")]),
                   pairs)
    assert main(["fit", "--algo", "dpo", f"model.path={qwen25_vl}", "data.name=files", f"data.train_files=[{pairs}]",
                 "data.val_files=[]", "data.max_prompt_length=48", "algorithm.max_completion_length=4",
                 "actor.ppo_micro_batch_size=4", f"trainer.runs_root={tmp_path / 'dpo'}", *FAST]) == 0
    for algo in ("grpo", "dpo"):
        summary = json.loads(next((tmp_path / algo).glob("*/*/summary.json")).read_text())
        assert summary["steps"] == 2, algo
