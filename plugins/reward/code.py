"""``code`` reward: run the model's Python program on stdin/stdout test cases in the sandbox.

The ground truth holds the tests as ``{"inputs": [stdin, ...], "outputs": [expected stdout, ...]}``, a dict
or its JSON string (the APPS / verl ``input_output`` layout). The score is the fraction of tests passed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rlforge.config.schema import option
from rlforge.plugins.reward.cputime import process_cpu_seconds
from rlforge.plugins.reward.sandbox import run_sandboxed

_FENCE = re.compile(r"```(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(solution_str: str) -> str:
    """The last fenced code block of the response, or the whole response when it has none."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def load_tests(ground_truth: Any) -> list[tuple[str, str]]:
    """``(stdin, expected stdout)`` pairs from the ground truth, or ``ValueError`` saying what is wrong."""
    spec = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not (isinstance(spec, dict) and isinstance(spec.get("inputs"), list) and isinstance(spec.get("outputs"), list)):
        raise ValueError("code reward: ground_truth must be {'inputs': [...], 'outputs': [...]} (or its JSON), "
                         f"got {ground_truth!r:.100}")
    if not spec["inputs"] or len(spec["inputs"]) != len(spec["outputs"]):
        raise ValueError(f"code reward: {len(spec['inputs'])} inputs and {len(spec['outputs'])} outputs; "
                         f"need the same number, at least one")
    return [(str(i), str(o)) for i, o in zip(spec["inputs"], spec["outputs"])]


def outputs_match(actual: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and blank lines at the end."""
    return _lines(actual) == _lines(expected)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().splitlines()]


@dataclass
class CodeRewardConfig:
    """The ``code`` reward function (runs the model's program in the sandbox, docs/reliability.md)."""

    sandbox_timeout_s: float = option(5.0, gt=0)  # CPU-time limit of each run of the sandboxed program
    sandbox_memory_mb: int = option(512, ge=16)  # address-space limit of each process of the program
    sandbox_allow_weak: bool = False  # without root or user namespaces: run under the weak audit hook (no security boundary) instead of refusing


def code_exec_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    timeout_s: float = 10.0,
    sandbox_timeout_s: float = 5.0,
    sandbox_memory_mb: int = 512,
    sandbox_allow_weak: bool = False,
) -> dict[str, float]:
    """Fraction of the tests whose stdout the program reproduces; ``acc`` is 1 when all pass.

    Each test runs in a fresh sandbox with a CPU-time limit of ``sandbox_timeout_s``. The tests stop at the
    first one that runs out of time (the rest count as failed) or when 80% of ``timeout_s`` (the reward
    manager's CPU-time limit on the whole call, which counts the sandboxed programs too) is spent, so the
    call returns before the manager has to kill it. CPU time, not wall-clock time: the score is the same on
    a loaded machine. ``sandbox_allow_weak`` (``reward.code.sandbox_allow_weak``) lets the sandbox fall back to
    its weak audit-hook isolation where no real isolation works; without it such a machine refuses.
    """
    tests = load_tests(ground_truth)
    code = extract_code(solution_str)
    budget = 0.8 * timeout_s + (process_cpu_seconds() or 0.0)  # the manager measures the same clock
    passed = 0
    for stdin, expected in tests:
        left = min(sandbox_timeout_s, budget - (process_cpu_seconds() or 0.0))
        if left <= 0:
            break
        result = run_sandboxed(code, stdin, timeout_s=left, memory_mb=sandbox_memory_mb,
                               allow_weak=sandbox_allow_weak)
        if result.timed_out:
            break
        passed += result.exit_code == 0 and outputs_match(result.stdout, expected)
    return {"score": passed / len(tests), "acc": float(passed == len(tests))}
