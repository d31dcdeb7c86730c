"""A tiny Qwen2-architecture chat model, built by code (nothing downloaded), for tests and docs.

It has the shape of a real instruct model, down to the details that trip frameworks up:

- ``Qwen2ForCausalLM`` (grouped-query attention, qkv bias, tied embeddings, a vocabulary padded past the
  tokenizer's length), head_dim 64 (vLLM's CPU attention needs >= 64), random weights;
- a byte-level BPE tokenizer trained offline with ``tokenizers`` on a generated corpus (arithmetic, chat-like
  text, JSON tool calls) with Qwen2's normalizer and pre-tokenizer, saved as ``Qwen2Tokenizer``: the class that
  ``AutoTokenizer`` forces on every ``model_type=qwen2`` folder, so the ids read back are the ids built;
- ChatML: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` are special tokens; ``<tool_call>``,
  ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` are added tokens that stay in decoded text (as in
  Qwen2.5, so tool calls can be parsed from a decoded response);
- a chat template that renders ``tools=`` into the system message, assistant ``tool_calls`` as
  ``<tool_call>{json}</tool_call>`` and ``tool`` messages as ``<tool_response>`` blocks in a user turn;
- Llama-3 / Qwen2.5-Instruct's end-of-turn shape: the tokenizer's ``eos_token`` is ``<|endoftext|>``, not the
  end-of-turn token; ``generation_config.json`` lists both: ``eos_token_id = [<|im_end|>, <|endoftext|>]``, with
  Qwen2.5-Instruct's sampling defaults (temperature, top-p, top-k, repetition penalty).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rlforge.models import quiet_transformers

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
DEFAULT_SYSTEM = "You are a helpful assistant."
# what instruct checkpoints put in generation_config.json (these are Qwen2.5-Instruct's); rollouts must ignore them
INSTRUCT_SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                              "repetition_penalty": 1.05}

# ChatML with tools, in the layout of Qwen2.5's template (written for rlforge).
CHAT_TEMPLATE = """\
{%- set default_system = '""" + DEFAULT_SYSTEM + """' -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + (messages[0].content if has_system else default_system) -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call the functions described inside <tools></tools>:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nTo call one, answer with its name and arguments as JSON inside <tool_call></tool_call>:\\n' -}}
  {{- '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in messages -%}
  {%- if message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message.role == 'assistant' and message.tool_calls -%}
    {{- '<|im_start|>assistant' + ('\\n' + message.content if message.content else '') -}}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}
      {{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' + args + '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif not (loop.first and message.role == 'system') -%}
    {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Delhi", "Quebec"]
GREETINGS = ["Hello!", "Hi there.", "Good morning!", "Thanks, that helps.", "Sure, here you go."]
PHRASES = [
    "How can I help you today?", "Let me think step by step.", "The answer is below.",
    "I will call a tool to find out.", "Here is what the tool returned.", "Is there anything else?",
]


def corpus(lines: int = 3000, seed: int = 0) -> Iterator[str]:
    """Training text for the tokenizer: arithmetic, chat-like sentences and JSON tool calls and results."""
    rng = random.Random(seed)
    for i in range(lines):
        a, b, city = rng.randint(0, 999), rng.randint(0, 999), rng.choice(CITIES)
        kind = i % 3
        if kind == 0:
            yield f"What is {a} + {b}? {a} + {b} = {a + b}. #### {a + b} The answer is \\boxed{{{a + b}}}."
        elif kind == 1:
            yield f"{rng.choice(GREETINGS)} {rng.choice(PHRASES)} The weather in {city} is {a % 40} degrees."
        else:
            call = {"name": rng.choice(["get_weather", "calculator", "search"]), "arguments": {"city": city, "n": b}}
            yield f"<tool_call>\n{json.dumps(call)}\n</tool_call> <tool_response>\n{json.dumps({'result': a})}"


def build_tokenizer(vocab_size: int = 512, seed: int = 0) -> Any:
    """A byte-level BPE (256 bytes + merges, at most ``vocab_size`` tokens) trained on ``corpus``, then the ChatML
    and tool tokens after it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    reference = Qwen2Tokenizer()._tokenizer  # Qwen2's normalizer and pre-tokenizer: what it rebuilds on load
    bpe = Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer, bpe.decoder = reference.normalizer, reference.pre_tokenizer, decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(corpus(seed=seed), trainer)
    model = json.loads(bpe.to_str())["model"]
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], unk_token=None,
                         eos_token=ENDOFTEXT, pad_token=ENDOFTEXT)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS[1:]], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_chat_model(
    out_dir: str | Path, *, hidden: int = 128, layers: int = 2, heads: int = 2, kv_heads: int = 1,
    ffn: int = 256, vocab_size: int = 512, seed: int = 0, tie_word_embeddings: bool = True,
) -> Path:
    """Write the tiny chat model (weights, config, tokenizer, template, generation config) to ``out_dir``.

    ``hidden // heads`` is the head dim (64 by default). The model's vocabulary is the tokenizer's length
    rounded up to a multiple of 64, as real checkpoints pad it. Deterministic for a given ``seed``.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    quiet_transformers()
    out = Path(out_dir)
    tok = build_tokenizer(vocab_size, seed)
    eot, eos = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    config = Qwen2Config(
        vocab_size=-(-len(tok) // 64) * 64, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(  # Qwen2.5-Instruct's, sampling defaults included
        bos_token_id=eos, eos_token_id=[eot, eos], pad_token_id=eos, **INSTRUCT_SAMPLING_DEFAULTS)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
