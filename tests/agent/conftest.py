"""Fixtures for agent-loop tests: the char tokenizer of the tiny model, configs, and a scripted model.

``Scripted`` stands in for the rollout engine: it answers each request with the text that ``reply(prompt_text)``
returns, followed by EOS, with log-prob -0.5 per token, and records every wave of requests it received.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import rlforge
from rlforge.build import Builder
from rlforge.data import collate, tokenize_rows
from rlforge.sampling import Generation, SamplingParams

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
LOGPROB = -0.5


class Scripted:
    """A fake ``generate_tokens``: the reply to a prompt is ``reply(decoded prompt)`` + EOS (cut to max_new_tokens,
    then finish is "length")."""

    def __init__(self, tokenizer, reply: Callable[[str], str]) -> None:
        self.tokenizer, self.reply = tokenizer, reply
        self.waves: list[list[str]] = []
        self.params: list[SamplingParams] = []

    def __call__(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        texts = [self.tokenizer.decode(p) for p in prompts]
        self.waves.append(texts)
        self.params += params
        out = []
        for text, p in zip(texts, params):
            ids = self.tokenizer.encode(self.reply(text), add_special_tokens=False) + [self.tokenizer.eos_token_id]
            cut = len(ids) > p.max_new_tokens
            ids = ids[:p.max_new_tokens]
            out.append(Generation(ids, [LOGPROB] * len(ids), "length" if cut else "stop"))
        return out


def calculator_then_answer(text: str) -> str:
    """Turn 1 calls the calculator; once a tool replied, answer with the tool's result."""
    if "<|tool|>" not in text:
        return CALL
    return text.rsplit("<|tool|>", 1)[1].split("<|end|>", 1)[0]


@pytest.fixture
def make_config(pm):
    def make(*overrides: str):
        return rlforge.load_config("grpo", ["data.max_prompt_length=64", "rollout.max_new_tokens=160", *overrides],
                                   plugins=pm)
    return make


@pytest.fixture
def tok(char_tokenizer):
    return char_tokenizer


@pytest.fixture
def make_runner(pm, tok, make_config):
    def make(*overrides: str):
        cfg = make_config(*overrides)
        return Builder(cfg, pm).agent(tok), cfg
    return make


def prompt_batch(tok, questions: list[tuple[str, str]], max_len: int = 64):
    """A loader batch of arithmetic rows ``(question, answer)``."""
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": a}}
            for q, a in questions]
    return collate(tokenize_rows(rows, tok, max_len, True, "test"), tok.pad_token_id,
                   [f"u{i}" for i in range(len(rows))])


def sampling(n: int = 1, max_new_tokens: int = 160) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_new_tokens=max_new_tokens)


def runner_for(pm, tok, *overrides):
    """The agent runner of a config with ``overrides`` (short prompts, 160 response tokens)."""
    cfg = rlforge.load_config("grpo", ["data.max_prompt_length=64", "rollout.max_new_tokens=160", *overrides],
                              plugins=pm)
    return Builder(cfg, pm).agent(tok)


def run_loop(pm, tok, loop, engine, questions=(("2+3?", "5"),), n=1, params=None):
    """One rollout of ``questions`` through ``rollout.agent.loop=loop`` on ``engine`` (default sampling: greedy):
    (batch, metrics)."""
    runner = runner_for(pm, tok, f"rollout.agent.loop={loop}")
    try:
        return runner.rollout(prompt_batch(tok, list(questions)), params or sampling(n=n), engine)
    finally:
        runner.close()
