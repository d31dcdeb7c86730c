"""``code`` reward: run the model's Python program on stdin/stdout test cases in the sandbox.

The ground truth holds the tests as ``{"inputs": [stdin, ...], "outputs": [expected stdout, ...]}``, a dict
or its JSON string (the APPS / verl ``input_output`` layout). The score is the fraction of tests passed.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

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


def code_exec_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    timeout_s: float = 10.0,
    sandbox_timeout_s: float = 5.0,
    sandbox_memory_mb: int = 512,
) -> dict[str, float]:
    """Fraction of the tests whose stdout the program reproduces; ``acc`` is 1 when all pass.

    Each test runs in a fresh sandbox for at most ``sandbox_timeout_s``. The tests stop at the first one
    that times out (the rest count as failed) or when 80% of ``timeout_s`` (the reward manager's limit on
    the whole call) is spent, so the call returns before the manager has to kill it.
    """
    tests = load_tests(ground_truth)
    code = extract_code(solution_str)
    deadline = time.monotonic() + 0.8 * timeout_s
    passed = 0
    for stdin, expected in tests:
        budget = min(sandbox_timeout_s, deadline - time.monotonic())
        if budget <= 0:
            break
        result = run_sandboxed(code, stdin, timeout_s=budget, memory_mb=sandbox_memory_mb)
        if result.timed_out:
            break
        passed += result.exit_code == 0 and outputs_match(result.stdout, expected)
    return {"score": passed / len(tests), "acc": float(passed == len(tests))}
