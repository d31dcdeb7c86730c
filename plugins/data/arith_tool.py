"""Built-in agentic task ``arith_tool``: "What is 347*29?" answered with the ``calculator`` tool (docs/agentic.md).

A product of an ``a_digits``-digit and a ``b_digits``-digit number is out of reach of the tiny model's head, but a
tool call and a copy of the tool's reply solve it. Rows are verl-style; the reward (registered under the data source
``arith_tool``) is an exact match of the **final answer**: the text of the last model turn, stripped, must be the
product in plain decimal digits (``10063``; no separators, no words).

:func:`demonstrations` writes the SFT conversations (``messages`` format) that the shipped base model
``builtin:tiny-agent`` saw (``scripts/build_agentic_base_model.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlforge.config.schema import option
from rlforge.errors import DataError
from rlforge.hookspecs import hookimpl
from rlforge.plugins.agent.parsers import HermesParser
from rlforge.plugins.agent.tools import Calculator, CalculatorConfig, evaluate, format_number
from rlforge.plugins.data.builtin import draw_rows
from rlforge.plugins.reward.functions import arith_score

SOURCE = "arith_tool"
VAL_SEED = 54321  # the held-out questions are the same whatever trainer.seed is


@dataclass
class ArithToolConfig:
    """The built-in tool task (``data.name=arith_tool``)."""

    train_size: int = option(20000, ge=1)  # training prompts
    val_size: int = option(200, ge=0)  # distinct held-out prompts, never seen in training
    a_digits: int = option(3, ge=1, le=9)  # digits of the first factor (347)
    b_digits: int = option(2, ge=1, le=9)  # digits of the second factor (29)


def question(a: int, b: int) -> str:
    return f"What is {a}*{b}?"


def arith_tool_rows(size: int, a_digits: int, b_digits: int, seed: int, exclude: frozenset[str] = frozenset(),
                    unique: bool = False) -> list[dict[str, Any]]:
    """``size`` questions ``"What is a*b?"`` (``a`` with ``a_digits`` digits, ``b`` with ``b_digits``), verl rows.
    Questions in ``exclude`` are skipped; with ``unique`` no question repeats."""
    lo_a, hi_a, lo_b, hi_b = 10 ** (a_digits - 1), 10 ** a_digits - 1, 10 ** (b_digits - 1), 10 ** b_digits - 1
    total = (hi_a - lo_a + 1) * (hi_b - lo_b + 1)
    if len(exclude) + (size if unique else 1) > total:
        raise DataError(f"Cannot draw {size} arith_tool questions from {total} with data.arith_tool.a_digits="
                        f"{a_digits} and b_digits={b_digits}: raise the digits or lower the sizes.")
    return draw_rows(size, (lo_a, hi_a), (lo_b, hi_b), seed, exclude, unique, lambda a, b: {
        "data_source": SOURCE,
        "prompt": [{"role": "user", "content": question(a, b)}],
        "reward_model": {"style": "rule", "ground_truth": str(a * b)},
        "extra_info": {"a": a, "b": b, "expression": f"{a}*{b}"},
    })


def arith_tool_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """Train/val splits; validation questions never appear in training."""
    d = config.data.arith_tool
    val = arith_tool_rows(d.val_size, d.a_digits, d.b_digits, seed=VAL_SEED, unique=True)
    if split == "val":
        return val
    held_out = frozenset(r["prompt"][0]["content"] for r in val)
    return arith_tool_rows(d.train_size, d.a_digits, d.b_digits, seed=config.trainer.seed, exclude=held_out)


# --- SFT demonstrations -------------------------------------------------------------------------------------------

CALCULATOR = Calculator(None)


def _call(expression: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": CALCULATOR.name, "arguments": {"expression": expression}}}


def _broken_calls(expression: str) -> list[str]:
    """Tool calls as a careless model writes them: none of them can be read by the hermes parser."""
    body = f'"name": "{CALCULATOR.name}", "arguments": '
    return [
        f'<tool_call>{{{body}{{"expression": "{expression}"}}</tool_call>',  # a closing brace missing
        f'<tool_call>{{{body}{{"expression": {expression}}}}}</tool_call>',  # the expression not quoted
        f'<tool_call>{{{body}{{"expression": "{expression}"}}}}',  # no </tool_call>
    ]


def solved(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The right conversation: a calculator call, its reply, the reply copied as the final answer."""
    expression = row["extra_info"]["expression"]
    result = format_number(evaluate(expression, CalculatorConfig()))
    return [*row["prompt"], {"role": "assistant", "content": "", "tool_calls": [_call(expression)]},
            {"role": "tool", "name": CALCULATOR.name, "content": result},
            {"role": "assistant", "content": result}]


def broken(row: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """A tool call that cannot be read (the demonstration ends there)."""
    text = rng.choice(_broken_calls(row["extra_info"]["expression"]))
    assert HermesParser().parse(text).errors, text  # each variant must be unreadable
    return [*row["prompt"], {"role": "assistant", "content": text}]


def in_the_head(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer written directly, without the tool."""
    return [*row["prompt"], {"role": "assistant", "content": str(row["reward_model"]["ground_truth"])}]


KINDS: dict[str, Callable[[dict[str, Any], random.Random], list[dict[str, Any]]]] = {
    "solved": lambda row, rng: solved(row),
    "broken": broken,
    "in_the_head": lambda row, rng: in_the_head(row),
}


def demonstrations(rows: list[dict[str, Any]], shares: dict[str, float], seed: int) -> list[dict[str, Any]]:
    """One SFT row ``{"messages": [...], "tools": [calculator schema]}`` per task row; each is a ``KINDS``
    conversation drawn with the probabilities ``shares`` (e.g. ``{"solved": 0.6, "broken": 0.25,
    "in_the_head": 0.15}``)."""
    unknown = sorted(set(shares) - set(KINDS))
    if unknown or not shares or any(p < 0 for p in shares.values()) or sum(shares.values()) <= 0:
        raise DataError(f"Demonstration shares {shares}: give non-negative weights for some of {sorted(KINDS)}.")
    rng = random.Random(seed)
    kinds, weights = list(shares), list(shares.values())
    return [{"messages": KINDS[rng.choices(kinds, weights)[0]](row, rng), "tools": [CALCULATOR.schema()]}
            for row in rows]


@hookimpl
def rlforge_register(registry):
    registry.dataset.register("arith_tool", arith_tool_dataset, config=ArithToolConfig,
                              description="built-in 'What is a*b?' task for the calculator tool, generated offline")
    registry.reward_fn.register(SOURCE, arith_score,
                                description="arith_tool: 1.0 if the final answer (last model turn) is the product")
