"""A vision-language model through rlforge's passes: M-RoPE positions equal the model's own, forward/backward with
pixel values, per-sample image tensors split and joined by micro-batching, the hf engine generating with images and
reporting the actor's log-probs, the vision tower frozen by a key, packed passes equal to padded ones."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import multimodal as mm
from rlforge import ops
from rlforge.data import collate, tokenize_rows
from rlforge.errors import RLForgeError
from rlforge.plugins.data.vision import vision_rows
from rlforge.plugins.rollout.hf import response_mask
from rlforge.plugins.rollout.hf_decode import Decoder
from rlforge.sampling import SamplingParams

TEXT_ROW = {"data_source": "arith", "prompt": [{"role": "user", "content": "What is 12+30?"}],
            "reward_model": {"ground_truth": "42"}}


@pytest.fixture(scope="module")
def prompts(vlm):
    _, tok, proc = vlm
    rows = vision_rows(3, 4, seed=0)
    rows[1]["prompt"] = [{"role": "user", "content": "Look: <image> and <image>. Squares?"}]
    rows[1]["images"] = rows[1]["images"] + vision_rows(1, 4, seed=1)[0]["images"]
    return tokenize_rows([*rows, TEXT_ROW], tok, 64, False, "t", processor=proc)


@pytest.fixture(scope="module")
def rollout(vlm, prompts):
    """Two samples per prompt from the hf engine's decoder (seeded), in the rollout layout."""
    model, tok, _ = vlm
    batch = collate(prompts, tok.pad_token_id, list(range(len(prompts)))).repeat_interleave(2)
    decoder = Decoder(model.eval(), [tok.eos_token_id], tok.pad_token_id)
    with torch.no_grad():
        responses, log_probs = decoder.decode(batch[B.PROMPTS], batch[B.PROMPT_MASK],
                                              SamplingParams(max_new_tokens=6, seed=3), batch[B.MULTI_MODAL_INPUTS])
    mask = response_mask(responses, [tok.eos_token_id])
    batch[B.RESPONSES], batch[B.ROLLOUT_LOG_PROBS] = responses, log_probs * mask
    batch[B.INPUT_IDS] = torch.cat([batch[B.PROMPTS], responses], 1)
    batch[B.ATTENTION_MASK] = torch.cat([batch[B.PROMPT_MASK], mask], 1)
    return batch


def test_rope_positions_equal_the_models_own_for_each_row_under_left_padding(vlm, prompts):
    model, tok, proc = vlm
    batch = collate(prompts, tok.pad_token_id, list(range(len(prompts))))
    joined = mm.join(batch[B.MULTI_MODAL_INPUTS])
    got = mm.rope_positions(model, batch[B.PROMPTS], batch[B.PROMPT_MASK], joined[mm.IMAGE_GRID_THW])
    assert got.shape == (3, len(prompts), batch[B.PROMPTS].shape[1])
    for i, p in enumerate(prompts):  # each row alone, unpadded, with the processor's own token types
        ids = torch.tensor([p.ids])
        types = (ids == model.config.image_token_id).int()
        grid = p.multi_modal[mm.IMAGE_GRID_THW] if p.multi_modal else None
        own, _ = model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=grid)
        assert torch.equal(got[:, i, -len(p.ids):], own[:, 0])
        assert (got[:, i, : -len(p.ids)] == 0).all()  # padding
    assert got[0, 3, -1] == got[1, 3, -1] == got[2, 3, -1] == len(prompts[3].ids) - 1  # a text row: 1-D positions


def test_join_concatenates_the_rows_image_tensors_in_row_order(prompts):
    rows = [p.multi_modal for p in prompts]
    joined = mm.join(rows)
    assert joined[mm.IMAGE_GRID_THW].shape == (4, 3) and len(joined[mm.PIXEL_VALUES]) == 4 * 36  # row 1 has two
    assert torch.equal(joined[mm.PIXEL_VALUES][36:108], rows[1][mm.PIXEL_VALUES])
    assert torch.equal(joined[mm.IMAGE_GRID_THW][3], rows[2][mm.IMAGE_GRID_THW][0])
    assert mm.join([None, None]) is None


def test_the_engine_reports_the_actors_log_probs_and_micro_batches_give_the_whole_batchs(vlm, rollout):
    model, _, _ = vlm
    width = rollout[B.RESPONSES].shape[1]
    rows = rollout[B.MULTI_MODAL_INPUTS]
    with torch.no_grad():
        whole, _ = ops.response_logprobs(model, rollout[B.INPUT_IDS], rollout[B.ATTENTION_MASK], width, multi_modal=rows)
        blind, _ = ops.response_logprobs(model, rollout[B.INPUT_IDS], rollout[B.ATTENTION_MASK], width)
        parts = [ops.response_logprobs(model, m[B.INPUT_IDS], m[B.ATTENTION_MASK], width,
                                       multi_modal=m[B.MULTI_MODAL_INPUTS])[0] for m in rollout.split(3)]
    assert torch.allclose(whole, rollout[B.ROLLOUT_LOG_PROBS], atol=1e-5)
    assert torch.allclose(torch.cat(parts), whole, atol=1e-6)  # micro-batches 3 + 3 + 2: images split with rows
    assert (blind - whole)[:6].abs().max() > 1e-3  # the images matter
    assert torch.allclose(blind[6:], whole[6:], atol=1e-5)  # ... and the text row has none
    image_tokens = set(mm.placeholder_token_ids(model))
    assert not image_tokens & set(rollout[B.RESPONSES].flatten().tolist())  # never sampled


def test_backward_reaches_the_vision_tower_unless_it_is_frozen(rollout):
    from rlforge.models import load_model

    model = load_model("builtin:tiny-vlm")
    width = rollout[B.RESPONSES].shape[1]

    def grads():
        model.zero_grad(set_to_none=True)
        logp, ent = ops.response_logprobs(model, rollout[B.INPUT_IDS], rollout[B.ATTENTION_MASK], width,
                                          with_entropy=True, multi_modal=rollout[B.MULTI_MODAL_INPUTS])
        (logp.sum() + ent.sum()).backward()
        return mm.vision_tower(model).patch_embed.proj.weight.grad, model.lm_head.weight.grad

    vision, head = grads()
    assert vision is not None and vision.abs().sum() > 0 and head.abs().sum() > 0
    mm.freeze_vision_tower(model)
    vision, head = grads()
    assert vision is None and head.abs().sum() > 0
    assert not any(p.requires_grad for p in mm.vision_tower(model).parameters())


def test_packed_passes_with_images_equal_the_padded_ones(vlm, rollout):
    model, _, _ = vlm
    width = rollout[B.RESPONSES].shape[1]
    rows = rollout[B.MULTI_MODAL_INPUTS]
    with torch.no_grad():
        padded = ops.response_logprobs(model, rollout[B.INPUT_IDS], rollout[B.ATTENTION_MASK], width, with_entropy=True,
                                       multi_modal=rows)
        packed = ops.response_logprobs(model, rollout[B.INPUT_IDS], rollout[B.ATTENTION_MASK], width, with_entropy=True,
                                       remove_padding=True, multi_modal=rows)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(padded, packed))  # no attention across sequences


def test_sequence_parallel_packed_passes_with_images_are_refused(vlm, rollout):
    model, _, _ = vlm
    ops.sequence_parallel(model, object())
    try:
        with pytest.raises(RLForgeError, match="sequence_parallel_size > 1.* does not take rows with images"):
            ops.response_logprobs(model, rollout[B.INPUT_IDS], rollout[B.ATTENTION_MASK], 4, remove_padding=True,
                                  multi_modal=rollout[B.MULTI_MODAL_INPUTS])
    finally:
        ops.sequence_parallel(model, None)


def test_freezing_a_text_models_vision_tower_is_an_error():
    from rlforge.models import load_model

    with pytest.raises(RLForgeError, match="model.freeze_vision_tower=true, but LlamaForCausalLM has no vision tower"):
        mm.freeze_vision_tower(load_model("builtin:tiny-arith"))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_newer_qwen_vl_shapes_take_the_same_path(vlm, rollout, family):
    """Qwen2.5-VL (windowed vision attention) and Qwen3-VL (learned vision positions, deepstack features), each with
    its own get_rope_index: the engine's log-probs are the actor's."""
    _, tok, _ = vlm
    torch.manual_seed(0)
    model = mm.build_tiny_vlm(family=family)[0].eval()  # the same tokenizer, so the same vision token ids
    prompts = rollout.select(list(range(0, len(rollout), 2)))  # one row per prompt
    decoder = Decoder(model, [tok.eos_token_id], tok.pad_token_id)
    with torch.no_grad():
        responses, log_probs = decoder.decode(prompts[B.PROMPTS], prompts[B.PROMPT_MASK],
                                              SamplingParams(max_new_tokens=5, seed=0), prompts[B.MULTI_MODAL_INPUTS])
        real = response_mask(responses, [tok.eos_token_id])
        actor, _ = ops.response_logprobs(model, torch.cat([prompts[B.PROMPTS], responses], 1),
                                         torch.cat([prompts[B.PROMPT_MASK], real], 1), responses.shape[1],
                                         multi_modal=prompts[B.MULTI_MODAL_INPUTS])
    assert torch.allclose(actor, log_probs * real, atol=1e-5)


def test_lora_on_all_linear_adapts_the_language_model_only(default_config):
    from omegaconf import OmegaConf

    from rlforge import lora
    from rlforge.models import load_model

    cfg = OmegaConf.merge(default_config, {"model": {"lora": {"rank": 4}}})
    model = lora.wrap(load_model("builtin:tiny-vlm"), cfg)
    adapted = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert any(".language_model." in n for n in adapted) and not any(".visual." in n for n in adapted)


def test_sequence_parallelism_refuses_a_vision_language_model_when_set_up(vlm):
    from rlforge.errors import ConfigError
    import types

    from rlforge.ulysses import use_ulysses

    model, _, _ = vlm
    with pytest.raises(ConfigError, match=r"strategy.fsdp.sequence_parallel_size=2: sequence parallelism does not take "
                                          r"vision-language models \(Qwen2VLForConditionalGeneration\) yet"):
        use_ulysses(model, types.SimpleNamespace(size=2), "strategy.fsdp.sequence_parallel_size")
