"""rlforge.plugins.data.hf_datasets (data.name=hf): rows through Hugging Face datasets, for real and offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

import rlforge  # noqa: E402
from rlforge.cli import main  # noqa: E402
from rlforge.data import tokenize_rows  # noqa: E402
from rlforge.errors import ConfigError, DataError, RLForgeError  # noqa: E402
from rlforge.plugins.data.builtin import files_dataset, read_rows  # noqa: E402
from rlforge.plugins.data.hf_datasets import ArrowPrompts, ArrowRows  # noqa: E402
from tests.test_bad_inputs import QUICK  # noqa: E402


def _row(i: int) -> dict:
    return {"data_source": "arith", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"a": i}}


ROWS = [_row(i) for i in range(24)]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets' cache in the test's folder (read from HF_DATASETS_CACHE once, at import)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture
def saved_dict(tmp_path: Path) -> Path:
    """A DatasetDict (train, test) saved by save_to_disk."""
    folder = tmp_path / "arith_dict"
    datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS),
                         test=datasets.Dataset.from_list(ROWS[:4])).save_to_disk(str(folder))
    return folder


def _config(pm, tmp_path: Path, *overrides: str):
    return rlforge.load_config(plugins=pm, overrides=["data.name=hf", f"data.hf.cache_dir={tmp_path / 'cache'}",
                                                      *overrides])


def _read(pm, cfg, split: str = "train"):
    return pm.registry.dataset.get("hf")(cfg, split)


def _without_origin(rows) -> list:
    return [{k: v for k, v in r.items() if k != "_origin"} for r in rows]


# --- sources ----------------------------------------------------------------------------------------------------


def test_saved_dataset_dict_splits_are_read_lazily_and_named(pm, tmp_path, saved_dict):
    cfg = _config(pm, tmp_path, f"data.hf.path={saved_dict}")
    train, val = _read(pm, cfg), _read(pm, cfg, "val")
    assert isinstance(train, ArrowRows) and (len(train), len(val)) == (24, 4)
    assert _without_origin(train) == ROWS
    assert train[5]["_origin"] == f"{saved_dict} (train), row 6"
    assert train[-1]["_origin"] == f"{saved_dict} (train), row 24"
    assert val[3]["_origin"] == f"{saved_dict} (test), row 4"
    first = train[2:5]  # a slice stays in Arrow and keeps the source's row numbers
    assert isinstance(first, ArrowRows) and [r["_origin"] for r in first][0] == f"{saved_dict} (train), row 3"
    assert _read(pm, _config(pm, tmp_path, f"data.hf.path={saved_dict}", "data.hf.val_split=null"), "val") == []


def test_files_parquet_jsonl_arrow_and_dataset_folders_read_as_the_files_dataset_does(pm, tmp_path):
    parquet = tmp_path / "a.parquet"
    datasets.Dataset.from_list(ROWS[:5]).to_parquet(str(parquet))
    jsonl = _jsonl(tmp_path / "b.jsonl", ROWS[5:10])
    folder = tmp_path / "c_saved"
    datasets.Dataset.from_list(ROWS[10:15]).save_to_disk(str(folder))
    arrow = next(folder.glob("*.arrow"))  # an Arrow file, as datasets writes them
    files = [str(parquet), str(jsonl), str(folder), str(arrow)]
    cfg = _config(pm, tmp_path, f"data.train_files=[{','.join(files)}]")
    rows = _read(pm, cfg)
    assert _without_origin(rows) == ROWS[:15] + ROWS[10:15]
    assert [r["_origin"] for r in rows][4:6] == [f"{parquet}, row 5", f"{jsonl}, row 1"]
    plain = rlforge.load_config(plugins=pm, overrides=["data.name=files", f"data.train_files=[{parquet},{jsonl}]"])
    assert list(rows[:10]) == files_dataset(plain, "train")  # the same rows, the same names
    assert _read(pm, cfg, "val") == []


def test_files_dataset_points_a_saved_folder_to_data_name_hf(tmp_path):
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS[:2]).save_to_disk(str(folder))
    with pytest.raises(DataError, match=r"saved by Dataset.save_to_disk.*data.name=hf"):
        read_rows(str(folder))


def test_max_rows_take_the_first_rows_across_files(pm, tmp_path):
    a, b = _jsonl(tmp_path / "a.jsonl", ROWS[:3]), _jsonl(tmp_path / "b.jsonl", ROWS[3:9])
    cfg = _config(pm, tmp_path, f"data.train_files=[{a},{b}]", "data.hf.max_train_rows=5")
    rows = _read(pm, cfg)
    assert _without_origin(rows) == ROWS[:5] and rows[4]["_origin"] == f"{b}, row 2"


# --- tokenization -----------------------------------------------------------------------------------------------


def test_prompts_match_the_in_memory_path_and_are_cached(pm, tmp_path, saved_dict, char_tokenizer):
    cfg = _config(pm, tmp_path, f"data.hf.path={saved_dict}", "data.hf.num_proc=2")
    rows = _read(pm, cfg)
    prompts = tokenize_rows(rows, char_tokenizer, 64, True, "hf (train)")
    assert isinstance(prompts, ArrowPrompts) and len(prompts) == 24
    assert list(prompts) == tokenize_rows(list(rows), char_tokenizer, 64, True, "x")  # ids, fields, index
    assert prompts[7].index == 7 and prompts[-1].ground_truth == "24" and prompts[3:5][1].extra_info == {"a": 4}
    written = sorted(p.name for p in (saved_dict / "train").glob("cache-*.arrow"))
    assert len(written) == 2  # one per process, beside the dataset
    again = tokenize_rows(_read(pm, cfg), char_tokenizer, 64, True, "hf (train)")
    assert [f["filename"] for f in again.table.cache_files] == [f["filename"] for f in prompts.table.cache_files]
    assert sorted(p.name for p in (saved_dict / "train").glob("cache-*.arrow")) == written  # read, not rewritten
    short = tokenize_rows(_read(pm, cfg), char_tokenizer, 15, True, "hf (train)")  # other settings: another cache
    assert [p.index for p in short] == list(range(10))  # "What is 10+1?" and on: 16 tokens


def test_row_errors_name_file_row_and_column_as_the_files_dataset_does(pm, tmp_path, char_tokenizer):
    no_source = {k: v for k, v in _row(2).items() if k != "data_source"}
    path = _jsonl(tmp_path / "rows.jsonl", [_row(0), _row(1), no_source, _row(3)])
    cfg = _config(pm, tmp_path, f"data.train_files=[{path}]", "data.hf.num_proc=2")
    with pytest.raises(DataError) as hf_error:  # raised in a worker process, named as in this one
        tokenize_rows(_read(pm, cfg), char_tokenizer, 64, True, "hf (train)")
    with pytest.raises(DataError) as files_error:
        tokenize_rows(read_rows(str(path)), char_tokenizer, 64, True, str(path))
    assert f"{path}, row 3: missing column 'data_source'" in str(hf_error.value)
    assert str(hf_error.value).split(". Columns")[0] == str(files_error.value).split(". Columns")[0]
    assert "Columns present: ['extra_info', 'prompt', 'reward_model']" in str(hf_error.value)  # no internal _origin

    no_truth = {**_row(1), "reward_model": {"style": "rule"}}  # Arrow fills the key with null: still missing
    path = _jsonl(tmp_path / "truth.jsonl", [_row(0), no_truth])
    with pytest.raises(DataError, match=rf"{path}, row 2: missing 'reward_model.ground_truth'"):
        tokenize_rows(_read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]")), char_tokenizer, 64, True, "t")

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row(0)) + "\n" + json.dumps(_row(1)) + "\n{not json\n")
    with pytest.raises(DataError, match=rf"{bad}, line 3: not valid JSON"):
        _read(pm, _config(pm, tmp_path, f"data.train_files=[{bad}]"))

    with pytest.raises(DataError, match="all 24 prompts are longer than data.max_prompt_length=3"):
        tokenize_rows(_read(pm, _config(pm, tmp_path, f"data.train_files=[{_jsonl(tmp_path / 'ok.jsonl', ROWS)}]")),
                      char_tokenizer, 3, True, "hf (train)")


# --- values as written ------------------------------------------------------------------------------------------


def _truths(path: Path, truths: list) -> Path:
    return _jsonl(path, [{**_row(i), "reward_model": {"style": "rule", "ground_truth": t}}
                         for i, t in enumerate(truths)])


@pytest.mark.parametrize("streaming", ["false", "true"])
def test_a_mixed_column_that_datasets_would_change_is_refused(pm, tmp_path, streaming):
    truths = ["007", "3.50", "1e3", " 12 ", "0x1F", 5, "-0"]  # datasets reads the strings that parse as JSON parsed
    path = _truths(tmp_path / "mixed.jsonl", truths)
    with pytest.raises(DataError) as info:
        _read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]", f"data.hf.streaming={streaming}"))
    msg = str(info.value)
    assert msg.startswith(f"{path}, row 1: datasets would read '007' (column 'reward_model.ground_truth') back as 7: ")
    assert "this one holds string (row 1), integer (row 6). Write every value of 'reward_model.ground_truth' as " \
           "one JSON type" in msg and msg.endswith("or read the file with data.name=files, which keeps each value " \
                                                   "as written.")
    plain = rlforge.load_config(plugins=pm, overrides=["data.name=files", f"data.train_files=[{path}]"])
    assert [r["reward_model"]["ground_truth"] for r in files_dataset(plain, "train")] == truths


def test_an_integer_in_a_float_column_is_refused(pm, tmp_path):
    rows = [{**_row(0), "extra_info": {"w": 0.5}}, {**_row(1), "extra_info": {"w": 2}}]
    path = _jsonl(tmp_path / "weights.jsonl", rows)
    with pytest.raises(DataError, match=rf"^{path}, row 2: datasets would read 2 \(column 'extra_info.w'\) back as "
                                        rf"2.0: .* holds number \(row 1\), integer \(row 2\)\."):
        _read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]"))


def test_values_datasets_keeps_are_read_as_written(pm, tmp_path):
    rows = [{**r, "reward_model": {"style": "rule", "ground_truth": t}} for r, t in
            zip(ROWS, ["007", "3.50", "1e3", " 12 ", "-0"])]  # strings only: no column of several types
    rows += [{**_row(5), "extra_info": {"tag": "abc"}}, {**_row(6), "extra_info": {"tag": 7, "b": [1]}}]
    path = _jsonl(tmp_path / "kept.jsonl", rows)  # extra_info: keys and types vary, but no string parses as JSON
    assert _without_origin(_read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]"))) == rows


def test_a_file_that_is_not_utf8_is_named_as_the_files_dataset_names_it(pm, tmp_path):
    head = "".join(json.dumps(r) + "\n" for r in ROWS[:3]).encode()
    bad = json.dumps(_row(3), ensure_ascii=False).replace("What", "Wh\u00e9t").encode("latin-1")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(head + bad + b"\n")
    at = len(head) + bad.index(b"\xe9")
    needle = f"{path} is not UTF-8 text (invalid continuation byte at byte {at}, line 4)."
    with pytest.raises(DataError) as info:
        _read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]"))
    assert str(info.value) == needle
    with pytest.raises(DataError) as files_error:
        read_rows(str(path))
    assert str(files_error.value) == needle


@pytest.mark.parametrize("extra, key", [(', "prompt": "What is 9+9?"', "prompt"),  # a list, then a string
                                        (', "data_source": "other"', "data_source")])  # pyarrow refuses it
def test_a_key_written_twice_is_refused_as_the_files_dataset_refuses_it(pm, tmp_path, extra, key):
    path = tmp_path / "dup.jsonl"
    lines = [json.dumps(r) for r in ROWS[:4]]
    lines[2] = lines[2][:-1] + extra + "}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{path}, line 3: the key '{key}' is written twice in one object"):
        _read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]"))
    with pytest.raises(DataError, match=rf"^{path}, line 3: the key '{key}' is written twice in one object"):
        read_rows(str(path))


def test_a_nan_ground_truth_is_named_as_the_files_dataset_names_it(pm, tmp_path, char_tokenizer):
    nan = float("nan")
    sources = {
        "keys.jsonl": lambda p: _jsonl(p, [ROWS[0], ROWS[1], {**ROWS[2], "reward_model": {"ground_truth": nan}}]),
        "floats.jsonl": lambda p: _truths(p, [1.5, 2.5, nan]),
        "floats.parquet": lambda p: datasets.Dataset.from_list(
            [{**r, "reward_model": {"ground_truth": t}} for r, t in zip(ROWS, [1.5, 2.5, nan])]).to_parquet(str(p)),
    }
    for name, write in sources.items():
        path = tmp_path / name
        write(path)
        needle = rf"^{path}, row 3: reward_model.ground_truth is NaN, which no answer matches"
        with pytest.raises(DataError, match=needle):  # a jsonl file when read, a parquet file when tokenized
            tokenize_rows(_read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]")), char_tokenizer, 64, True, "t")
        plain = rlforge.load_config(plugins=pm, overrides=["data.name=files", f"data.train_files=[{path}]"])
        with pytest.raises(DataError, match=needle):
            files_dataset(plain, "train")


def test_a_leading_bom_is_skipped_as_the_files_dataset_skips_it(pm, tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in ROWS[:4]).encode())
    assert _without_origin(_read(pm, _config(pm, tmp_path, f"data.train_files=[{path}]"))) == ROWS[:4]
    assert read_rows(str(path)) == ROWS[:4]


# --- streaming --------------------------------------------------------------------------------------------------


def test_streaming_reads_a_source_once_into_a_file_of_the_run(pm, tmp_path, char_tokenizer):
    repo = tmp_path / "repo" / "data"  # a local dataset folder, as `hf download` writes one
    repo.mkdir(parents=True)
    datasets.Dataset.from_list(ROWS).to_parquet(str(repo / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(ROWS[:3]).to_parquet(str(repo / "test-00000-of-00001.parquet"))
    cfg = _config(pm, tmp_path, f"data.hf.path={repo.parent}", "data.hf.streaming=true", "data.hf.max_train_rows=10")
    rows = _read(pm, cfg)
    assert _without_origin(rows) == ROWS[:10] and rows[9]["_origin"] == f"{repo.parent} (train), row 10"
    spooled = Path(rows.segments[0].rows.cache_files[0]["filename"])
    assert spooled.is_relative_to(tmp_path / "cache") and "rlforge-stream-" in str(spooled)
    assert len(_read(pm, cfg, "val")) == 3
    prompts = tokenize_rows(rows, char_tokenizer, 64, True, "hf (train)")
    assert [p.ground_truth for p in prompts] == [str(i + 1) for i in range(10)]


def test_a_streamed_file_is_removed_when_the_process_exits(tmp_path):
    path = _jsonl(tmp_path / "s.jsonl", ROWS)
    code = ("from omegaconf import OmegaConf; "
            "from rlforge.plugins.data.hf_datasets import HFDataConfig, HFDataset; "
            f"hf = OmegaConf.merge(OmegaConf.structured(HFDataConfig), {{'streaming': True, 'cache_dir': "
            f"'{tmp_path / 'cache'}'}}); "
            f"cfg = OmegaConf.create({{'data': {{'hf': hf, 'train_files': ['{path}'], 'val_files': []}}}}); "
            "rows = HFDataset()(cfg, 'train'); assert len(rows) == 24; "
            "print(rows.segments[0].rows.cache_files[0]['filename'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    spooled = Path(done.stdout.strip().splitlines()[-1])
    assert "rlforge-stream-" in str(spooled) and not spooled.exists()


# --- mistakes ---------------------------------------------------------------------------------------------------


def test_source_mistakes_are_config_errors(pm, tmp_path, saved_dict):
    one = tmp_path / "one"
    datasets.Dataset.from_list(ROWS[:2]).save_to_disk(str(one))
    cases = {
        f"data.hf.val_split=validation": r"data.hf.val_split='validation'.*its splits: \['train', 'test'\].*null",
        f"data.hf.path={one}": r"saved by Dataset.save_to_disk.*data.train_files=\[",
        f"data.hf.path={tmp_path / 'no' / 'such' / 'dir'}": "does not exist, and is not a Hub dataset id",
    }
    for override, needle in cases.items():
        cfg = _config(pm, tmp_path, f"data.hf.path={saved_dict}", override)
        with pytest.raises(ConfigError, match=needle):
            _read(pm, cfg, "val")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"empty is an empty folder: it holds no dataset files\. data.hf.path takes"):
        _read(pm, _config(pm, tmp_path, f"data.hf.path={tmp_path / 'empty'}"))
    zero = tmp_path / "zero_rows"
    datasets.Dataset.from_dict({"prompt": []}).save_to_disk(str(zero))
    with pytest.raises(DataError, match=rf"^{zero}: 0 rows \(a folder saved by Dataset.save_to_disk"):
        _read(pm, _config(pm, tmp_path, f"data.train_files=[{zero}]"))
    both = _config(pm, tmp_path, f"data.hf.path={saved_dict}", f"data.train_files=[{_jsonl(tmp_path / 'x.jsonl', ROWS)}]")
    with pytest.raises(ConfigError, match="both set"):
        _read(pm, both)
    with pytest.raises(DataError, match="'data.train_files' is empty and data.hf.path is unset"):
        _read(pm, _config(pm, tmp_path))
    with pytest.raises(ConfigError, match=r"DatasetDict.save_to_disk.*data.hf.path="):  # at compose time
        _config(pm, tmp_path, f"data.train_files=[{saved_dict}]")


def test_an_unreachable_hub_id_names_the_id_and_a_local_folder(pm, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    cfg = _config(pm, tmp_path, "data.hf.path=openai/gsm8k", "data.hf.config_name=main")
    with pytest.raises(ConfigError) as info:
        _read(pm, cfg)
    msg = str(info.value)
    assert "Dataset 'openai/gsm8k' (data.hf.path) is not a local folder" in msg and "HF_HUB_OFFLINE is set. " in msg
    assert "None" not in msg
    assert "load_dataset('openai/gsm8k', 'main').save_to_disk('DIR')" in msg and "data.hf.path=DIR" in msg


def test_without_datasets_installed_the_error_says_how_to_install_it(pm, tmp_path, saved_dict, monkeypatch):
    cfg = _config(pm, tmp_path, f"data.hf.path={saved_dict}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(RLForgeError, match=r"data.name=hf .* not installed: pip install 'rlforge\[datasets\]'"):
        _read(pm, cfg)


# --- the commands -----------------------------------------------------------------------------------------------


def test_fit_trains_on_a_saved_dataset_and_resumes(tmp_path, saved_dict, capsys):
    run = [*QUICK, f"trainer.runs_root={tmp_path / 'runs'}", "data.name=hf", f"data.hf.path={saved_dict}",
           f"data.hf.cache_dir={tmp_path / 'cache'}", "data.hf.num_proc=2", "trainer.save_every=1",
           "trainer.experiment=hf"]
    assert main(["fit", *run, "trainer.total_steps=1"]) == 0
    capsys.readouterr()
    assert main(["fit", *run, "trainer.total_steps=2", "trainer.resume=auto"]) == 0
    assert "rlforge: resumed from" in capsys.readouterr().out  # the prompts' fingerprint is the same
    (folder,) = (tmp_path / "runs" / "hf").iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["steps"] == 2
    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert {s["ground_truth"] for s in samples} <= {r["reward_model"]["ground_truth"] for r in ROWS}


def test_rlforge_data_converts_a_saved_dataset(tmp_path, capsys):
    raw = [{"question": f"Tom has {i} apples and gets 1 more. How many?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
           for i in range(6)]
    folder = tmp_path / "gsm8k_saved"
    datasets.DatasetDict(train=datasets.Dataset.from_list(raw),
                         test=datasets.Dataset.from_list(raw[:2])).save_to_disk(str(folder))
    assert main(["data", "gsm8k", "--input", str(folder), "--out", str(tmp_path / "out")]) == 0
    train, test = (read_rows(str(tmp_path / "out" / f"{s}.parquet")) for s in ("train", "test"))
    assert len(train) == 6 and len(test) == 2
    assert train[3]["reward_model"]["ground_truth"] == "4" and train[3]["extra_info"]["split"] == "train"
    raw_repo = tmp_path / "gsm8k_raw"  # as `hf download openai/gsm8k --repo-type dataset` lays it out
    (raw_repo / "main").mkdir(parents=True)
    datasets.Dataset.from_list(raw).to_parquet(str(raw_repo / "main" / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(raw[:2]).to_parquet(str(raw_repo / "main" / "test-00000-of-00001.parquet"))
    (raw_repo / "README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n"
                                        "    path: main/train-*\n  - split: test\n    path: main/test-*\n---\n")
    assert main(["data", "gsm8k", "--input", str(raw_repo), "--out", str(tmp_path / "out_raw")]) == 0  # subset main
    assert read_rows(str(tmp_path / "out_raw" / "train.parquet")) == train
    one = tmp_path / "one_split"
    datasets.Dataset.from_list(raw[:3]).save_to_disk(str(one))
    assert main(["data", "gsm8k", "--input", str(one), "--split", "test", "--out", str(tmp_path / "out2")]) == 0
    assert len(read_rows(str(tmp_path / "out2" / "test.parquet"))) == 3
    bad = tmp_path / "bad_saved"
    datasets.Dataset.from_list([{"question": "q", "answer": "no final answer"}]).save_to_disk(str(bad))
    assert main(["data", "gsm8k", "--input", str(bad), "--split", "train", "--out", str(tmp_path / "o3")]) == 2
    assert f"{bad}, row 1: cannot find the final answer" in capsys.readouterr().err


def test_eval_reads_a_saved_dataset_split(tmp_path, saved_dict):
    report = tmp_path / "report.json"
    assert main(["eval", "builtin:tiny-arith", "--limit", "3", "--out", str(report), "data.name=hf",
                 f"data.hf.path={saved_dict}", f"data.hf.cache_dir={tmp_path / 'cache'}"]) == 0
    result = json.loads(report.read_text())
    assert result["dataset"] == "hf" and result["prompts"] == 3 and result["split"] == "val"
