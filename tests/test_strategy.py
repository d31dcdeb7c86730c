"""Process-level settings of the strategy: the CPU allocator keeps freed tensor memory (``strategy.keep_freed_memory``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlforge import load_config
from rlforge.build import Builder

KEPT = """
import ctypes, sys, torch
from rlforge.strategy import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h), all size_t
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
mallinfo2.restype = MallInfo2
x = torch.randn(256, 4096)
w = torch.randn(4096, 4096, requires_grad=True)
(torch.relu(x @ w) @ w).sum().backward()  # activations (4 MiB each) and a 64 MiB gradient
w.grad = None  # freed
info = mallinfo2()
print(info.fordblks, info.hblkhd)  # free bytes the heap keeps; bytes in separately mapped blocks
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_tensor_memory_stays_in_the_heap_for_reuse():
    """With keep_freed_memory, a freed 64 MiB gradient stays in glibc's heap as free memory for the next step to
    reuse (by default it is a separate mapping, returned to the system when freed, and every step faults it in
    again: the cost is in docs/performance.md). Read from glibc's own accounting (mallinfo2), not from page faults,
    which a machine that reclaims idle memory also causes (the fault count failed a clean-clone run: 49,152 kept vs
    133,128 by default)."""
    def kept(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", KEPT, mode], capture_output=True, text=True, check=True)
        free, mapped = out.stdout.split()[-2:]
        return int(free), int(mapped)

    free, _ = kept("default")
    assert free < 64 * 2**20  # the gradient went back to the system
    free, mapped = kept("keep")
    assert free >= 64 * 2**20 and mapped < 64 * 2**20  # it stays in the heap, as does the live 64 MiB weight


@pytest.mark.parametrize(("value", "applied"), [("true", 1), ("false", 0)])
def test_the_strategy_of_a_cpu_process_keeps_freed_memory(monkeypatch, pm, value, applied):
    calls = []
    monkeypatch.setattr("rlforge.strategy.keep_freed_memory", lambda: calls.append(1) or True)
    cfg = load_config("grpo", ["strategy.device=cpu", f"strategy.keep_freed_memory={value}"], plugins=pm)
    Builder(cfg, pm).strategy()
    assert len(calls) == applied
