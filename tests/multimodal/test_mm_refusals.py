"""What rlforge does not do with images is refused, naming the row and the reason, instead of training on the text
alone or crashing later (found by a docs-only adversarial pass): SFT rows with images, a critic over images, an image
in a preference completion, a <video> placeholder in a row without images, a placeholder without an image column,
eval/generate on image rows, and the Geometry3K converter's empty answers and missing image column."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlforge import load_config
from rlforge.data import tokenize_rows
from rlforge.preferences import tokenize_preferences
from rlforge.errors import DataError, RLForgeError
from rlforge.tools.data_prep import SOURCES, convert_row
from tests.multimodal.test_mm_data import _png, _row
from tests.multimodal.test_mm_preferences import _pair


def test_sft_refuses_rows_with_images(char_tokenizer):
    from rlforge.sft.data import build_examples
    from rlforge.sft.formats import Keys

    s = OmegaConf.create({"format": "auto", "max_length": 64, "truncation": "drop"})
    rows = [{"messages": [{"role": "user", "content": "<image>How many?"}, {"role": "assistant", "content": "3"}],
             "images": [{"bytes": _png()}]}]
    with pytest.raises(DataError, match=r"sft.jsonl, row 1: the row has images or videos; rlforge sft trains on text"):
        build_examples(rows, char_tokenizer, s, Keys(), "sft.jsonl")


def test_a_critic_over_images_is_refused():
    from rlforge.algorithms.ppo import PPO

    module = PPO(load_config("ppo", ["model.path=builtin:tiny-vlm", "data.name=vision", "data.max_prompt_length=48"]))
    module.configure_tokenizer()
    with pytest.raises(DataError, match=r"rows with images, but --algo ppo trains a critic \(value model\)"):
        module.prepare_data([_row()], "train")


def test_an_image_in_a_completion_is_refused(vlm):
    _, tok, proc = vlm
    row = {**_pair(), "chosen": [{"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "3"}]}]}
    with pytest.raises(DataError, match=r"row 1: 'chosen' has an image .* completions are text"):
        tokenize_preferences([row], tok, 64, 8, False, "pairs", processor=proc)


def test_video_and_a_missing_image_column_are_named(vlm):
    _, tok, proc = vlm
    video = {"data_source": "x", "prompt": [{"role": "user", "content": "<video>What happens?"}],
             "reward_model": {"ground_truth": "1"}}
    with pytest.raises(DataError, match=r"row 1: the prompt has a <video> placeholder; rlforge trains on images only"):
        tokenize_rows([video], tok, 64, False, "t", processor=proc)
    other = {k: v for k, v in _row().items() if k != "images"} | {"pics": [{"bytes": _png()}]}
    with pytest.raises(DataError, match=r"row 1: the prompt has 1 <image> placeholder\(s\) but the row has no column "
                                        r"'images' \(data.image_key\). Columns present: \[.*'pics'"):
        tokenize_rows([other], tok, 64, False, "t", processor=proc)


@pytest.mark.slow
def test_eval_and_generate_run_image_rows_and_a_text_model_names_the_row(tmp_path, capsys):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlforge.cli import main

    path = tmp_path / "v.parquet"
    pq.write_table(pa.Table.from_pylist([_row(), _row()]), path)
    common = [f"--data={path}", "data.max_prompt_length=48", "rollout.max_new_tokens=4"]
    assert main(["generate", "builtin:tiny-vlm", *common, "--out", str(tmp_path / "g.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["prompt"][0]["content"].startswith("<image>")
    assert main(["eval", "builtin:tiny-vlm", *common, "--out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["by_data_source"]["vision_count"]["prompts"] == 2
    assert main(["eval", "builtin:tiny-arith", *common, "--out", str(tmp_path / "t.json")]) == 2
    assert "row 1: the row has images (column 'images', data.image_key), but model.path has no image processor" in \
        capsys.readouterr().err


def test_geometry3k_rows_need_an_answer_and_an_image_column():
    geo = SOURCES["geometry3k"]
    with pytest.raises(DataError, match=r"row 3: cannot find the final answer in 'answer'"):
        convert_row(geo, {"problem": "<image>Find x.", "answer": "  ", "images": [{"bytes": _png()}]}, "train", 2,
                    "row 3")
    with pytest.raises(DataError, match=r"row 1: no image column 'images'. Columns present: \['answer', 'problem'\]"):
        convert_row(geo, {"problem": "<image>Find x.", "answer": "3"}, "train", 0, "row 1")


def test_an_image_the_processor_refuses_is_named_with_its_size_and_a_hint(vlm):
    """A 2000 x 3 image: Qwen2-VL's smart_resize raises 'absolute aspect ratio must be smaller than 200', which was
    passed on without saying which image or what to do (adversarial review)."""
    _, tok, proc = vlm
    row = _row("<image> and <image>: how many?", images=[{"bytes": _png()}, {"bytes": _png((2000, 3))}])
    with pytest.raises(DataError) as info:
        tokenize_rows([_row(), row], tok, 64, False, "t", processor=proc)
    assert str(info.value) == (
        "t, row 2: image 2 of 2 is 2000 x 3 pixels (aspect ratio 667:1), which the model's image processor refuses "
        "(ValueError: absolute aspect ratio must be smaller than 200, got 666.6666666666666). Resize or pad the image "
        "in the data (or in the tool that returns it; Qwen2-VL-style processors refuse an aspect ratio of 200:1 or "
        "more); the processor then scales it to between its min_pixels and max_pixels (the model folder's "
        "preprocessor_config.json; rlforge has no key for them).")


def test_an_agent_turn_s_refused_image_is_named_too(vlm):
    from rlforge import multimodal as mm
    from PIL import Image

    _, _, proc = vlm
    with pytest.raises(DataError, match=r"^the inserted messages: image 1 of 1 is 3 x 900 pixels \(aspect ratio "
                                        r"300:1\), which the model's image processor refuses"):
        mm.encode_text(proc, "<|vision_start|><|image_pad|><|vision_end|>", [Image.new("RGB", (3, 900))],
                       "the inserted messages", "them")
