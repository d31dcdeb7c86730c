"""Process-level settings of the strategy: the CPU allocator keeps freed tensor memory (``strategy.keep_freed_memory``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlforge import load_config
from rlforge.build import Builder

FAULTS = """
import resource, sys, torch
from rlforge.strategy import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
x = torch.randn(256, 4096)
w = torch.randn(4096, 4096, requires_grad=True)
def step():  # a forward and backward whose activations (4 MiB each) and gradient (64 MiB) are freed after it
    (torch.relu(x @ w) @ w).sum().backward()
    w.grad = None
for _ in range(4):  # the heap grows to the step's peak
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_tensor_memory_is_reused_without_page_faults():
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    default = faults("default")
    assert default > 4 * 16384  # each of the 4 steps faults its 64 MiB gradient (16,384 pages of 4 KiB) in again
    # kept: nothing in a quiet machine (< 1,000 faults); a machine that reclaims idle memory (e.g. DAMON) may take
    # back a kept block between steps (one CI run: 16,384 faults in 2 steps), so the bound is a quarter
    assert faults("keep") < default / 4


@pytest.mark.parametrize(("value", "applied"), [("true", 1), ("false", 0)])
def test_the_strategy_of_a_cpu_process_keeps_freed_memory(monkeypatch, pm, value, applied):
    calls = []
    monkeypatch.setattr("rlforge.strategy.keep_freed_memory", lambda: calls.append(1) or True)
    cfg = load_config("grpo", ["strategy.device=cpu", f"strategy.keep_freed_memory={value}"], plugins=pm)
    Builder(cfg, pm).strategy()
    assert len(calls) == applied
