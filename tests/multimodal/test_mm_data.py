"""verl's multimodal rows: images from bytes, paths and PIL, <image> placeholders split into typed parts, the count
checked against the images (errors name the row), image tokens as the processor expands them, sizes bounded."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from rlforge import batch as B
from rlforge import multimodal as mm
from rlforge.data import collate, tokenize_rows
from rlforge.errors import DataError


def _png(size=(84, 84), color="red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def _row(content="<image>How many squares?", images=None, **extra):
    return {"data_source": "vision_count", "prompt": [{"role": "user", "content": content}],
            "images": [{"bytes": _png()}] if images is None else images, "reward_model": {"ground_truth": "1"},
            **extra}


def test_placeholders_split_content_into_typed_parts_in_order():
    messages = [{"role": "system", "content": "Count."}, {"role": "user", "content": "A <image> and B <image>?"}]
    typed = mm.typed_messages(messages, 2, "row 1", "images")
    assert typed[0]["content"] == [{"type": "text", "text": "Count."}]
    assert typed[1]["content"] == [{"type": "text", "text": "A "}, {"type": "image"}, {"type": "text", "text": " and B "},
                                   {"type": "image"}, {"type": "text", "text": "?"}]
    assert mm.typed_messages([{"role": "user", "content": "<image>"}], 1, "r", "images")[0]["content"] == [
        {"type": "image"}]


@pytest.mark.parametrize("content, images, found, held", [
    ("<image><image>How many?", [{"bytes": _png()}], 2, 1),
    ("How many squares?", [{"bytes": _png()}], 0, 1),
    ("<image>How many?", [], 1, 0),
])
def test_placeholder_count_must_equal_image_count_and_the_error_names_file_and_row(vlm, content, images, found, held):
    _, tok, proc = vlm
    rows = [_row(), _row(content, images, _origin="geo.parquet, row 2")]
    with pytest.raises(DataError, match=rf"geo.parquet, row 2: the prompt has {found} <image> placeholder\(s\) but "
                                        rf"column 'images' \(data.image_key\) holds {held} image"):
        tokenize_rows(rows, tok, 64, False, "geo.parquet", processor=proc)


def test_images_come_from_bytes_paths_pil_and_lists_under_data_image_key(vlm, tmp_path):
    _, tok, proc = vlm
    path = tmp_path / "a.png"
    path.write_bytes(_png(color="blue"))
    pil = Image.new("L", (84, 84), 128)  # grayscale: converted to RGB
    rows = [{**_row(images=None), "pics": {"bytes": _png()}}, {**_row(), "pics": str(path)},
            {**_row("<image> then <image>"), "pics": [pil, {"path": str(path)}]}]
    prompts = tokenize_rows(rows, tok, 64, False, "t", processor=proc, image_key="pics")
    assert [len(p.multi_modal[mm.IMAGE_GRID_THW]) for p in prompts] == [1, 1, 2]
    with pytest.raises(DataError, match=r"t, row 1: pics\[0\] names the image file /nope.png, which does not exist"):
        tokenize_rows([{**_row(), "pics": "/nope.png"}], tok, 64, False, "t", processor=proc, image_key="pics")
    with pytest.raises(DataError, match=r"t, row 1: images\[0\] is not a readable image"):
        tokenize_rows([_row(images=[{"bytes": b"not a png"}])], tok, 64, False, "t", processor=proc)
    with pytest.raises(DataError, match=r"t, row 1: images\[0\] holds no image: bytes=b'', path=None \(empty or null\)"):
        tokenize_rows([_row(images=[{"bytes": b"", "path": None}])], tok, 64, False, "t", processor=proc)


def test_image_tokens_are_the_processors_expansion_bounded_by_min_and_max_pixels(vlm):
    _, tok, proc = vlm
    image_token = tok.convert_tokens_to_ids("<|image_pad|>")
    for size, tokens in [((84, 84), 9), ((56, 56), 4), ((10, 10), 4), ((600, 300), None)]:
        (prompt,) = tokenize_rows([_row(images=[{"bytes": _png(size)}])], tok, 64, False, "t", processor=proc)
        grid = prompt.multi_modal[mm.IMAGE_GRID_THW]
        expanded = prompt.ids.count(image_token)
        assert expanded == int(grid.prod()) // 4 == len(prompt.multi_modal[mm.PIXEL_VALUES]) // 4  # merge 2 x 2
        assert 4 <= expanded <= 16  # min_pixels 56*56, max_pixels 112*112: one token per 28 x 28 pixels
        assert tokens is None or expanded == tokens
    text = proc.apply_chat_template(mm.typed_messages(_row()["prompt"], 1, "r", "images"), add_generation_prompt=True,
                                    tokenize=False)
    assert text == "<|user|><|vision_start|><|image_pad|><|vision_end|>How many squares?<|end|><|assistant|>"


TEXT_ROW = {"data_source": "arith", "prompt": [{"role": "user", "content": "What is 1+2?"}],
            "reward_model": {"ground_truth": "3"}}


def mixed_batch(tok, proc):
    """(prompts, batch) of a row with an image and a text row."""
    prompts = tokenize_rows([_row(), TEXT_ROW], tok, 64, False, "t", processor=proc)
    return prompts, collate(prompts, tok.pad_token_id, [0, 1])


def test_collate_carries_one_vision_dict_per_row_and_text_rows_none(vlm):
    _, tok, proc = vlm
    prompts, batch = mixed_batch(tok, proc)
    rows = batch[B.MULTI_MODAL_INPUTS]
    assert rows[1] is None and rows[0][mm.IMAGE_GRID_THW].tolist() == [[1, 6, 6]]
    assert batch[B.RAW_PROMPT][0] == _row()["prompt"]  # the verl messages, placeholders kept (samples.jsonl)
    repeated = batch.repeat_interleave(2)
    assert [r is None for r in repeated[B.MULTI_MODAL_INPUTS]] == [False, False, True, True]
    assert B.MULTI_MODAL_INPUTS not in collate(prompts[1:], tok.pad_token_id, [0])  # text-only batches: no column


def test_images_for_a_text_model_are_refused_naming_the_row(char_tokenizer):
    with pytest.raises(DataError, match=r"t, row 1: the row has images .* no image processor: a text-only model"):
        tokenize_rows([_row()], char_tokenizer, 64, False, "t")
    (text,) = tokenize_rows([_row(images=[])], char_tokenizer, 64, False, "t")  # <image> is plain text there
    assert text.multi_modal is None and char_tokenizer.decode(text.ids).startswith("<|user|><image>How")


def test_video_placeholders_are_refused(vlm):
    _, tok, proc = vlm
    with pytest.raises(DataError, match="<video> placeholder; rlforge trains on images only"):
        tokenize_rows([_row("<video><image>?")], tok, 64, False, "t", processor=proc)


def test_the_data_fingerprint_covers_the_images_by_their_digest(vlm):
    from rlforge.resume import data_fingerprint

    _, tok, proc = vlm
    red, blue = (tokenize_rows([_row(images=[{"bytes": _png(color=c)}])], tok, 64, False, "t", processor=proc)
                 for c in ("red", "blue"))
    assert red[0].ids == blue[0].ids
    assert data_fingerprint(red)["sha256"] != data_fingerprint(blue)["sha256"]
    assert data_fingerprint(red) == data_fingerprint(tokenize_rows([_row()], tok, 64, False, "t", processor=proc))


def test_a_verl_geometry3k_style_parquet_reads_unchanged(vlm, tmp_path):
    """verl's geo3k preprocessing writes ``images`` as a list of {bytes, path} structs and the prompt with one
    <image>: rlforge's files dataset reads it and the processor encodes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlforge.plugins.data.builtin import read_rows

    _, tok, proc = vlm
    row = {"data_source": "hiyouga/geometry3k",
           "prompt": [{"role": "user", "content": "<image>Find x. Put the answer in \\boxed{}."}],
           "images": [{"bytes": _png((140, 100)), "path": None}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"split": "train", "index": 0}}
    path = tmp_path / "geo3k.parquet"
    pq.write_table(pa.Table.from_pylist([row, row]), path)
    (prompt, _) = tokenize_rows(read_rows(str(path)), tok, 96, False, str(path), processor=proc)
    assert prompt.data_source == "hiyouga/geometry3k" and prompt.ground_truth == "3"
    # 140 x 100 is over max_pixels (112 * 112): resized to 112 x 84, 8 x 6 patches of 14, 12 image tokens
    assert prompt.multi_modal[mm.IMAGE_GRID_THW].tolist() == [[1, 6, 8]]


def test_concat_of_a_draw_with_images_and_one_without(vlm):
    _, tok, proc = vlm
    with_images = collate(tokenize_rows([_row()], tok, 64, False, "t", processor=proc), tok.pad_token_id, [0])
    text_only = collate(tokenize_rows([TEXT_ROW], tok, 64, False, "t", processor=proc), tok.pad_token_id, [1])
    for parts, expected in (([text_only, with_images], [True, False]), ([with_images, text_only], [False, True])):
        joined = B.Batch.concat(parts)
        assert [r is None for r in joined[B.MULTI_MODAL_INPUTS]] == expected
    partial = text_only.select([0])
    del partial.lists[B.RAW_PROMPT]
    with pytest.raises(KeyError, match=B.RAW_PROMPT):  # any other column must be in every batch
        B.Batch.concat([with_images, partial])


def test_a_prompt_with_images_over_the_limit_is_never_cut(vlm):
    """data.truncation cuts text prompts only: cutting a prompt with images would part image tokens from their
    images (verl 0.9.1's agent loop refuses such a prompt too)."""
    _, tok, proc = vlm
    with pytest.raises(DataError, match="row 1: prompt is .* a prompt with images is never cut"):
        tokenize_rows([_row()], tok, 4, False, "t", processor=proc, truncation="left")


def test_rows_with_images_get_the_chat_template_kwargs(vlm):
    """``data.apply_chat_template_kwargs`` reach the processor's template as they reach the tokenizer's."""
    import copy

    _, tok, proc = vlm
    proc = copy.copy(proc)
    proc.chat_template = "{% if system_note %}<|system|>" + "{{ system_note }}<|end|>{% endif %}" + mm.VLM_CHAT_TEMPLATE
    plain, noted = (tokenize_rows([_row()], tok, 64, False, "t", processor=proc, template=t)[0].ids
                    for t in (None, {"system_note": "hi"}))
    assert noted[-len(plain):] == plain and tok.decode(noted[:len(noted) - len(plain)]) == "<|system|>hi<|end|>"


def test_a_prefill_after_an_image_prompt_is_continued_with_continue_final(vlm):
    _, tok, proc = vlm
    row = _row()
    row["prompt"] = [*row["prompt"], {"role": "assistant", "content": "I count"}]
    opened = tokenize_rows([row], tok, 64, False, "t", processor=proc, continue_final=True)[0].ids
    closed = tokenize_rows([row], tok, 64, False, "t", processor=proc)[0].ids
    assert tok.decode(opened).endswith("<|assistant|>I count")
    assert tok.decode(closed).endswith("I count<|end|><|assistant|>")
