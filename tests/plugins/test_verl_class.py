"""``data.name=verl_class``: a verl dataset class by path (verl's ``data.custom_cls``), subclassing the real verl 0.9.1
``RLHFDataset``, built as verl builds it and read as verl-format rows (docs/data.md#a-verl-dataset-class)."""

from __future__ import annotations

import json
import sys

import pytest

import rlforge
from rlforge.build import Builder
from rlforge.errors import ConfigError, DataError, RLForgeError

pytest.importorskip("verl.utils.dataset", reason="the test extra installs verl (scripts/setup.sh)")

CLASSES = '''
import datasets
from verl.utils.dataset import RLHFDataset


class QADataset(RLHFDataset):
    """Rows {"q": ..., "a": ...} mapped to verl's format; a data-config key of its own picks the data_source."""

    def _read_files_and_tokenize(self):
        frames = [datasets.load_dataset("json", data_files=f)["train"] for f in self.data_files]
        df = datasets.concatenate_datasets(frames)
        source = self.config.get("qa_source", "arith")
        self.dataframe = df.map(lambda r, i: {"data_source": source, "prompt": [{"role": "user", "content": r["q"]}],
                                              "reward_model": {"ground_truth": r["a"]}, "extra_info": {"index": i}},
                                with_indices=True, remove_columns=df.column_names)
        self.dataframe = self.maybe_filter_out_long_prompts(self.dataframe)


class Broken(RLHFDataset):
    def _read_files_and_tokenize(self):
        raise ValueError("cannot parse the files")


class Pictures(QADataset):
    def __getitem__(self, item):
        row = super().__getitem__(item)
        row["raw_prompt"] = [{"role": "user",
                              "content": [{"type": "video", "video": "v.mp4"}, {"type": "text", "text": "?"}]}]
        return row


class RaisesAt1(QADataset):
    def __getitem__(self, item):
        if item == 1:
            raise KeyError("boom")
        return super().__getitem__(item)


class TextParts(QADataset):
    def __getitem__(self, item):
        row = super().__getitem__(item)
        row["raw_prompt"] = [{"role": "user", "content": [{"type": "text", "text": "2+"}, {"type": "text", "text": "3?"}]}]
        row["agent_name"] = "single_turn_agent"
        return row


NotADataset = dict
'''


@pytest.fixture
def files(tmp_path):
    (tmp_path / "qa_classes.py").write_text(CLASSES)
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"q": q, "a": a}) + "\n" for q, a in
                          [("2+3?", "5"), ("4+4?", "8"), ("what is " + "1+" * 40 + "1?", "41")]))
    return str(tmp_path / "qa_classes.py"), str(qa)


def _rows(pm, path, data, *extra, cls="QADataset"):
    cfg = rlforge.load_config("grpo", ["data.name=verl_class", f"data.verl_class.path={path}",
                                       f"data.verl_class.name={cls}", f"data.train_files=[{data}]", *extra], plugins=pm)
    return Builder(cfg, pm).dataset("train")


def test_the_class_builds_rows_as_verl_builds_them(pm, files):
    path, data = files
    rows = _rows(pm, path, data, "data.max_prompt_length=64", "data.filter_overlong_prompts=true")
    # verl's own filter (maybe_filter_out_long_prompts, the tokenizer's chat template) dropped the long prompt
    assert [(r["data_source"], r["prompt"], r["reward_model"], r["extra_info"]) for r in rows] == [
        ("arith", [{"role": "user", "content": "2+3?"}], {"ground_truth": "5"}, {"index": 0}),
        ("arith", [{"role": "user", "content": "4+4?"}], {"ground_truth": "8"}, {"index": 1})]
    assert rows[0]["_origin"].startswith("QADataset (") and rows[0]["_origin"].endswith("item 0")


def test_text_content_parts_are_joined_and_folders_are_the_class_s_to_read(pm, files, tmp_path):
    path, data = files
    rows = _rows(pm, path, data, "data.max_prompt_length=200", cls="TextParts")
    assert rows[0]["prompt"] == [{"role": "user", "content": "2+3?"}] and rows[0]["agent_name"] == "single_turn_agent"
    folder = tmp_path / "shards"  # verl's classes read folders and Hub ids themselves: not checked as files
    folder.mkdir()
    (folder / "part.jsonl").write_text(open(data).read())
    cfg = rlforge.load_config("grpo", ["data.name=verl_class", f"data.verl_class.path={path}",
                                       "data.verl_class.name=QADataset", f"data.train_files=[{folder}]"], plugins=pm)
    assert cfg.data.train_files == [str(folder)]


def test_a_row_whose_agent_name_is_not_the_run_s_loop_is_refused(pm, files):
    """verl picks the agent loop per row (agent_name); rlforge runs one per run, so another is a DataError."""
    from rlforge.agent.config import check_row_loops

    path, data = files
    rows = _rows(pm, path, data, "data.max_prompt_length=200", cls="TextParts")  # agent_name single_turn_agent
    check_row_loops(rows, "single_turn", "verl_class (train)")
    with pytest.raises(DataError, match=r"TextParts .* item 0: agent_name 'single_turn_agent' asks for the agent loop "
                                        r"'single_turn', but this run's is rollout.agent.loop=tool_agent.*"
                                        r"default_agent_loop=single_turn_agent"):
        check_row_loops(rows, "tool_agent", "verl_class (train)")
    check_row_loops([{"agent_name": "tool_agent"}], "tool_agent", "x")


def test_the_class_reads_its_own_keys_of_verl_s_data_section(pm, files):
    path, data = files
    rows = _rows(pm, path, data, "data.max_prompt_length=200", "data.verl_class.config={qa_source: openai/gsm8k}")
    assert {r["data_source"] for r in rows} == {"openai/gsm8k"} and len(rows) == 3


@pytest.mark.parametrize(("cls", "error", "message"), [
    ("Broken", DataError, r"The verl dataset class Broken \(.*qa_classes.py\) on .*qa.jsonl failed building it: "
                          "ValueError: cannot parse the files"),
    ("Pictures", DataError, r"item 0: a message's content has a video part; rlforge reads text and images"),
    ("RaisesAt1", DataError, r"failed reading item 1: KeyError"),
    ("NotADataset", RLForgeError, r"is not a torch.utils.data.Dataset class"),
    ("Missing", RLForgeError, r"verl could not load the dataset class of data.verl_class.path=.* "
                              r"data.verl_class.name=Missing: AttributeError"),
])
def test_a_class_that_fails_is_named(pm, files, cls, error, message):
    path, data = files
    with pytest.raises(error, match=message):
        _rows(pm, path, data, "data.max_prompt_length=200", cls=cls)


def test_config_errors(pm, files, monkeypatch):
    path, data = files
    with pytest.raises(ConfigError, match="data.name=verl_class needs 'data.verl_class.name'"):
        rlforge.load_config("grpo", ["data.name=verl_class", f"data.verl_class.path={path}",
                                     f"data.train_files=[{data}]"], plugins=pm)
    monkeypatch.setitem(sys.modules, "verl.utils.import_utils", None)
    with pytest.raises(RLForgeError, match=r"verl cannot be imported .*pip install --no-deps verl==0.9.1"):
        _rows(pm, path, data)


def test_verl_s_custom_cls_maps_to_the_verl_class_dataset(files):
    from rlforge.config.verl_launch import prepare

    path, data = files
    t = prepare([f"data.custom_cls.path={path}", "data.custom_cls.name=QADataset", f"data.train_files={data}",
                 "data.max_prompt_length=64", "data.filter_overlong_prompts=True", "data.train_max_samples=5",
                 "data.prompt_key=question", "+data.my_key=3", "actor_rollout_ref.rollout.name=vllm"],
                refuse=False).translation
    assert not t.refused  # keys rlforge lacks (max_samples, another prompt column, the class's own) are the class's
    o = t.overrides
    assert (o["data.name"], o["data.verl_class.path"], o["data.verl_class.name"]) == ("verl_class", path, "QADataset")
    assert o["data.verl_class.config"] == {"max_prompt_length": 64, "filter_overlong_prompts": True,
                                           "train_max_samples": 5, "prompt_key": "question", "my_key": 3}
    # the class filters as it reads (verl's RLHFDataset filter); its rows are kept, cut from the left as verl's loop does
    assert (o["data.filter_overlong_prompts"], o["data.truncation"]) == (False, "left")


@pytest.mark.slow
def test_fit_trains_on_a_verl_dataset_class(pm, files, tmp_path):
    path, data = files
    cfg = rlforge.load_config("grpo", [
        "data.name=verl_class", f"data.verl_class.path={path}", "data.verl_class.name=QADataset",
        f"data.train_files=[{data}]", f"data.val_files=[{data}]", "data.max_prompt_length=200",
        "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "trainer.total_steps=1",
        "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[console]",
        f"trainer.runs_root={tmp_path}"], plugins=pm)
    assert rlforge.Trainer(cfg).fit()["steps"] == 1


def test_rows_that_name_several_or_unknown_loops_are_refused_with_what_to_do():
    from collections.abc import Sequence

    from rlforge.agent.config import check_row_loops

    mixed = [{"agent_name": "single_turn_agent", "_origin": "a.jsonl, row 1"},
             {"agent_name": "tool_agent", "_origin": "a.jsonl, row 2"}]
    with pytest.raises(DataError, match=r"name several agent loops in agent_name: 'single_turn_agent' \(a.jsonl, row "
                                        r"1\), 'tool_agent' \(a.jsonl, row 2\)"):
        check_row_loops(mixed, "tool_agent", "files (train)")
    with pytest.raises(DataError, match="agent_name 'react_agent' is not one of verl's built-in agent loops .*"
                                        "rollout.agent.loop=verl_agent"):
        check_row_loops([{"agent_name": "react_agent"}], "single_turn", "files (train)")
    check_row_loops([*mixed, {"agent_name": "react_agent"}], "verl_agent", "files (train)")  # verl's loops, per row

    class ArrowLike(Sequence):  # hf's Arrow-backed rows: a Sequence of dicts, not a list
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

    with pytest.raises(DataError, match="asks for the agent loop 'tool_agent'"):
        check_row_loops(ArrowLike([{"agent_name": "tool_agent"}]), "single_turn", "hf (train)")
    check_row_loops(ArrowLike([{"prompt": "x"}]), "single_turn", "hf (train)")  # no such column: not read


def test_images_of_verl_s_own_rlhf_dataset_become_the_rows_images(pm, tmp_path):
    """verl's RLHFDataset itself, given the tiny vision-language model's processor (as verl gives the model's): its
    <image> placeholders and image column come back as rlforge's image rows."""
    import importlib.util
    import inspect

    from PIL import Image
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from rlforge.data import tokenize_rows
    from rlforge.models import load_processor, load_tokenizer

    paths = []
    for n, color in enumerate(("red", "blue")):
        paths.append(str(tmp_path / f"{color}.png"))
        Image.new("RGB", (56 + 28 * n, 56), color).save(paths[-1])
    data = tmp_path / "pictures.jsonl"
    data.write_text("".join(json.dumps({"data_source": "geo3k", "prompt": [{"role": "user", "content": text}],
                                        "images": images, "reward_model": {"ground_truth": truth}}) + "\n"
                            for text, images, truth in [("<image>Which color?", paths[:1], "red"),
                                                        ("<image> or <image>?", paths, "blue")]))
    keys = ["model.path=builtin:tiny-vlm", "data.name=verl_class",
            f"data.verl_class.path={inspect.getfile(RLHFDataset)}", "data.verl_class.name=RLHFDataset",
            f"data.train_files=[{data}]", "data.max_prompt_length=400"]
    rows = Builder(rlforge.load_config("grpo", [*keys, "data.filter_overlong_prompts=false"], plugins=pm),
                   pm).dataset("train")
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": "<image>Which color?"}],
                                           [{"role": "user", "content": "<image> or <image>?"}]]
    assert [r["images"] for r in rows] == [paths[:1], paths]
    tok = load_tokenizer("builtin:tiny-vlm")
    prompts = tokenize_rows(rows, tok, 400, True, "verl_class", processor=load_processor("builtin:tiny-vlm", tok))
    assert [p.multi_modal is not None for p in prompts] == [True, True]
    # data.image_key is the class's image column too (verl's data.image_key)
    pics = tmp_path / "pics.jsonl"
    pics.write_text(data.read_text().replace('"images":', '"pics":'))
    renamed = [k.replace(str(data), str(pics)) for k in keys]
    rows = Builder(rlforge.load_config("grpo", [*renamed, "data.filter_overlong_prompts=false", "data.image_key=pics"],
                                       plugins=pm), pm).dataset("train")
    assert [r["pics"] for r in rows] == [paths[:1], paths]
    if importlib.util.find_spec("qwen_vl_utils") is None:  # verl measures image prompts with it (needs torchvision)
        with pytest.raises(DataError, match="has no items. verl's filter of overlong prompts drops every prompt it "
                                            "cannot measure, .* qwen_vl_utils, which is not installed"):
            Builder(rlforge.load_config("grpo", [*keys, "data.filter_overlong_prompts=true"], plugins=pm),
                    pm).dataset("train")
