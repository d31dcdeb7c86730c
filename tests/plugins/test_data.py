"""rlforge.plugins.data.builtin: row readers and the built-in arith task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import rlforge
from rlforge.errors import DataError
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.data.builtin import arith_dataset, arith_rows, files_dataset, read_rows

ROW = {
    "data_source": "arith",
    "prompt": [{"role": "user", "content": "What is 1+2?"}],
    "reward_model": {"style": "rule", "ground_truth": "3"},
    "extra_info": {"a": 1, "b": 2},
}


def _write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# --- read_rows ----------------------------------------------------------------------------------------


def test_read_jsonl(tmp_path: Path) -> None:
    second = dict(ROW, extra_info={"a": 2, "b": 2})
    path = _write_jsonl(tmp_path / "train.jsonl", [ROW, second])
    assert read_rows(path) == [ROW, second]


def test_read_jsonl_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n   \n" + json.dumps(ROW) + "\n")
    assert len(read_rows(str(path))) == 2


def test_read_json_extension_is_line_delimited(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "t.json", [ROW])
    assert read_rows(path) == [ROW]


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n{not json\n")
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    msg = str(info.value)
    assert str(path) in msg
    assert "line 3" in msg
    assert "not valid JSON" in msg


def test_bad_json_line_number_counts_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n{\"a\": }\n")
    with pytest.raises(DataError, match="line 3"):
        read_rows(str(path))


@pytest.mark.parametrize("line", ["[1, 2]", "\"text\"", "42", "null"])
def test_non_object_row(tmp_path: Path, line: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + line + "\n")
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    msg = str(info.value)
    assert str(path) in msg and "line 2" in msg
    assert "JSON object" in msg


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match="no rows") as info:
        read_rows(str(path))
    assert str(path) in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + '{"data_source": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    msg = str(info.value)
    assert str(path) in msg
    assert "UTF-8" in msg


def test_non_utf8_names_the_byte_and_line_in_the_whole_file(tmp_path: Path) -> None:
    head = _write_jsonl(tmp_path / "head.jsonl", [ROW] * 200)  # past the first block a text file decodes
    bad = json.dumps(dict(ROW, data_source="caf\u00e9"), ensure_ascii=False).encode("latin-1")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(Path(head).read_bytes() + bad + b"\n")
    at = len(Path(head).read_bytes()) + bad.index(b"\xe9")
    with pytest.raises(DataError, match=rf"^{path} is not UTF-8 text \(invalid continuation byte at byte {at}, "
                                        rf"line 201\)\.$"):
        read_rows(str(path))


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json"])
def test_a_leading_bom_is_skipped(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    text = json.dumps([ROW, ROW]) if name.endswith(".json") else json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n"
    path.write_text("\ufeff" + text, encoding="utf-8")
    assert read_rows(str(path)) == [ROW, ROW]


@pytest.mark.parametrize("line, key", [
    (json.dumps(ROW)[:-1] + ', "prompt": "What is 9+9?"}', "prompt"),
    (json.dumps(ROW).replace('"style": "rule"', '"ground_truth": "4", "style": "rule"'), "ground_truth"),
])
def test_a_key_written_twice_names_the_file_line_and_key(tmp_path: Path, line: str, key: str) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}, line 2: the key '{key}' is written twice in one object; a JSON "
                                        rf"reader keeps only one of its values"):
        read_rows(str(path))
    array = tmp_path / "dup.json"
    array.write_text(f"[{json.dumps(ROW)}, {line}]", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{array}: the key '{key}' is written twice"):
        read_rows(str(array))


def test_a_nan_ground_truth_names_the_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    nan = dict(ROW, reward_model={"ground_truth": float("nan")})
    path = _write_jsonl(tmp_path / "nan.jsonl", [ROW, ROW, nan])  # json.dumps writes NaN, which json reads back
    with pytest.raises(DataError, match=rf"^{path}, row 3: reward_model.ground_truth is NaN, which no answer matches"):
        files_dataset(_files_cfg([path]), "train")
    table = tmp_path / "nan.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "arith", "reward_model": {"ground_truth": t}}
                                         for t in (1.5, float("nan"))]), table)
    with pytest.raises(DataError, match=rf"^{table}, row 2: reward_model.ground_truth is NaN"):
        files_dataset(_files_cfg([str(table)]), "train")


def test_values_are_kept_as_written_in_a_column_of_mixed_types(tmp_path: Path) -> None:
    truths = ["007", "3.50", "1e3", " 12 ", "-0", 5, 2.0, True]
    rows = [dict(ROW, reward_model={"ground_truth": t}) for t in truths]
    got = [r["reward_model"]["ground_truth"] for r in read_rows(_write_jsonl(tmp_path / "mixed.jsonl", rows))]
    assert [(t, type(t)) for t in got] == [(t, type(t)) for t in truths]


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="not found") as info:
        read_rows(missing)
    assert missing in str(info.value)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    folder = tmp_path / "dir.jsonl"
    folder.mkdir()
    with pytest.raises(DataError, match=rf"^Data file {folder} is a directory, not a file: give the .jsonl or "
                                        rf".parquet files themselves"):
        read_rows(str(folder))


def test_directory_named_like_a_data_file_is_said_to_be_one_at_compose_time(tmp_path: Path) -> None:
    from rlforge.config import compose
    from rlforge.errors import ConfigError

    folder = tmp_path / "x.jsonl"
    folder.mkdir()
    with pytest.raises(ConfigError, match=rf"^Data file {folder} is a directory, not a file.* \(data.train_files\)"):
        compose(PluginManager(autoload=False).registry, "grpo", None, ["data.name=files",
                                                                       f"data.train_files=[{folder}]"])


def test_empty_parquet_names_the_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([ROW]).slice(0, 0), path)
    with pytest.raises(DataError, match=rf"^Data file {path} has no rows: the parquet table is empty \(columns: "
                                        rf"data_source, prompt, reward_model, extra_info\)\.$"):
        read_rows(str(path))


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [ROW, dict(ROW, data_source="openai/gsm8k")]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    out = read_rows(str(path))
    assert [r["data_source"] for r in out] == ["arith", "openai/gsm8k"]
    assert out[0]["prompt"] == ROW["prompt"]
    assert out[0]["reward_model"]["ground_truth"] == "3"


def test_corrupt_parquet(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(DataError, match="Cannot read parquet") as info:
        read_rows(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("name", ["rows.csv", "rows.txt", "rows"])
def test_bad_extension(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="unsupported extension") as info:
        read_rows(str(path))
    assert ".jsonl" in str(info.value)


# --- files dataset ------------------------------------------------------------------------------------


def _files_cfg(train: list[str], val: list[str] | None = None):
    return OmegaConf.create({"data": {"train_files": train, "val_files": val or []}})


def test_files_dataset_tags_origin(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", [ROW, ROW])
    b = _write_jsonl(tmp_path / "b.jsonl", [ROW])
    rows = files_dataset(_files_cfg([a, b]), "train")
    assert [r["_origin"] for r in rows] == [f"{a}, row 1", f"{a}, row 2", f"{b}, row 1"]
    assert files_dataset(_files_cfg([a]), "val") == []


def test_files_dataset_without_train_files() -> None:
    with pytest.raises(DataError, match="data.train_files"):
        files_dataset(_files_cfg([]), "train")


# --- arith ---------------------------------------------------------------------------------------------


def test_arith_rows_format() -> None:
    rows = arith_rows(5, 9, seed=0)
    assert len(rows) == 5
    for r in rows:
        a, b = r["extra_info"]["a"], r["extra_info"]["b"]
        assert 0 <= a <= 9 and 0 <= b <= 9
        assert r["data_source"] == "arith"
        assert r["prompt"] == [{"role": "user", "content": f"What is {a}+{b}?"}]
        assert r["reward_model"]["ground_truth"] == str(a + b)


def test_arith_rows_deterministic() -> None:
    assert arith_rows(50, 20, seed=7) == arith_rows(50, 20, seed=7)
    assert arith_rows(50, 20, seed=7) != arith_rows(50, 20, seed=8)


def test_arith_rows_unique_and_exclude() -> None:
    rows = arith_rows(30, 5, seed=1, unique=True)
    questions = [r["prompt"][0]["content"] for r in rows]
    assert len(set(questions)) == 30
    excluded = frozenset(questions)
    others = arith_rows(100, 5, seed=2, exclude=excluded)
    assert not excluded & {r["prompt"][0]["content"] for r in others}


def test_arith_rows_too_many_unique() -> None:
    with pytest.raises(DataError, match="data.arith.max_operand"):
        arith_rows(17, 3, seed=0, unique=True)  # only 16 distinct questions
    assert len(arith_rows(16, 3, seed=0, unique=True)) == 16


@pytest.fixture(scope="module")
def arith_config():
    return rlforge.load_config(
        overrides=["data.arith.train_size=3000", "data.arith.val_size=60", "data.arith.max_operand=15"],
        plugins=PluginManager(autoload=False),
    )


def test_arith_dataset_val_never_in_train(arith_config) -> None:
    val = arith_dataset(arith_config, "val")
    train = arith_dataset(arith_config, "train")
    assert len(val) == 60 and len(train) == 3000
    val_q = {r["prompt"][0]["content"] for r in val}
    assert len(val_q) == 60  # validation questions are distinct
    train_q = {r["prompt"][0]["content"] for r in train}
    assert not val_q & train_q


def test_arith_dataset_is_deterministic(arith_config) -> None:
    assert arith_dataset(arith_config, "val") == arith_dataset(arith_config, "val")
    assert arith_dataset(arith_config, "train") == arith_dataset(arith_config, "train")


def test_arith_dataset_train_depends_on_seed_val_does_not(arith_config) -> None:
    other = rlforge.load_config(
        overrides=["data.arith.train_size=3000", "data.arith.val_size=60", "data.arith.max_operand=15", "trainer.seed=2"],
        plugins=PluginManager(autoload=False),
    )
    assert arith_dataset(other, "val") == arith_dataset(arith_config, "val")
    assert arith_dataset(other, "train") != arith_dataset(arith_config, "train")


def test_arith_dataset_registered(registry) -> None:
    assert registry.dataset.get("arith") is arith_dataset
    assert registry.dataset.get("files") is files_dataset
