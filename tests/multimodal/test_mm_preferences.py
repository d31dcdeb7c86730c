"""Preference pairs with images (TRL's vision DPO format: typed content parts, an ``images`` column): the prompt goes
through the processor, the completions are text, the pair's rows carry the prompt's vision inputs into the batch,
the DPO loss reads them; two DPO steps train on a parquet of such pairs on builtin:tiny-vlm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlforge import batch as B
from rlforge import multimodal as mm
from rlforge.cli import main
from rlforge.preferences import collate_preferences, tokenize_preferences
from rlforge.errors import DataError
from tests.multimodal.test_mm_data import _png


def _pair(answer="3", wrong="5", color="red", typed=True):
    question = "How many squares?"
    prompt = ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}] if typed
              else [{"role": "user", "content": "<image>" + question}])
    return {"images": [{"bytes": _png(color=color)}], "prompt": prompt,
            "chosen": [{"role": "assistant", "content": [{"type": "text", "text": answer}]}],
            "rejected": [{"role": "assistant", "content": [{"type": "text", "text": wrong}]}]}


def test_typed_parts_and_placeholders_give_the_same_pair(vlm):
    model, tok, proc = vlm
    typed, plain = (tokenize_preferences([_pair(typed=t)], tok, 64, 8, False, "pairs", processor=proc)[0]
                    for t in (True, False))
    assert typed.prompt.ids == plain.prompt.ids and typed.completions == plain.completions
    grid = typed.prompt.multi_modal[mm.IMAGE_GRID_THW]
    assert grid.tolist() == [[1, 6, 6]]  # 84 x 84: 6 x 6 patches of 14
    assert typed.prompt.ids.count(mm.placeholder_token_ids(model)[0]) == 9  # merged 2 x 2: 36 / 4 image tokens
    assert tok.decode(typed.completions[0]).startswith("3") and tok.decode(typed.completions[1]).startswith("5")


def test_both_rows_of_a_pair_carry_the_prompts_images(vlm):
    _, tok, proc = vlm
    examples = tokenize_preferences([_pair(color="red"), _pair(color="blue")], tok, 64, 8, False, "pairs",
                                    processor=proc)
    batch = collate_preferences(examples, tok.pad_token_id, ["a", "b"])
    inputs = batch[B.MULTI_MODAL_INPUTS]
    assert len(inputs) == 4 and inputs[0] is inputs[1] and inputs[2] is inputs[3]
    assert not torch.equal(inputs[0][mm.PIXEL_VALUES], inputs[2][mm.PIXEL_VALUES])  # red vs blue


def test_image_pairs_need_a_vision_model_and_matching_placeholders(vlm, char_tokenizer):
    _, tok, proc = vlm
    with pytest.raises(DataError, match=r"pairs, row 1: the row has images .* has no image processor"):
        tokenize_preferences([_pair()], char_tokenizer, 64, 8, False, "pairs")
    two = {**_pair(), "images": [{"bytes": _png()}, {"bytes": _png()}]}
    with pytest.raises(DataError, match=r"row 1: the prompt has 1 <image> placeholder\(s\) but column 'images'"):
        tokenize_preferences([two], tok, 64, 8, False, "pairs", processor=proc)
    bad = {**_pair(), "prompt": [{"role": "user", "content": [{"type": "audio"}]}]}
    with pytest.raises(DataError, match=r"row 1: prompt message 1: content part 1 is \{'type': 'audio'\}"):
        tokenize_preferences([bad], tok, 64, 8, False, "pairs", processor=proc)


@pytest.mark.slow  # ~10 s: a whole fit is the way to see the reference and update passes take the images
def test_two_dpo_steps_on_image_pairs(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_pair(str(n), str(n + 2), color) for n in range(1, 5) for color in ("red", "blue")]
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert main(["fit", "--algo", "dpo", "model.path=builtin:tiny-vlm", "data.name=files",
                 f"data.train_files=[{path}]", "data.val_files=[]", "data.max_prompt_length=48",
                 "algorithm.max_completion_length=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                 "actor.ppo_micro_batch_size=4", "trainer.total_steps=2", "trainer.val_every=0",
                 "trainer.val_before_train=false", "trainer.save_every=0", f"trainer.runs_root={tmp_path}",
                 "logger.backends=[console]", "trainer.progress=false"]) == 0
    summary = json.loads(next(tmp_path.glob("*/*/summary.json")).read_text())
    assert summary["steps"] == 2


def test_reward_model_training_refuses_image_pairs():
    from rlforge import load_config
    from rlforge.algorithms.reward_model import RewardModel

    module = RewardModel(load_config("rm", ["model.path=builtin:tiny-vlm"]))
    module.configure_tokenizer()
    with pytest.raises(DataError, match=r"rows with images: reward-model training \(--algo rm\) scores text only"):
        module.prepare_data([_pair()], "train")
