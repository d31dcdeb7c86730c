"""Print this machine's fp32 matrix-multiply speed, so that every timing can be compared across machines.

    .venv/bin/python scripts/machine_speed.py           # one line, e.g. "fp32 matmul 1024x1024: 2 threads 308 GFLOP/s ..."
    .venv/bin/python scripts/machine_speed.py --gflops  # only the 2-thread figure (for scripts)

Machines of the CI kind differ by about 3x (from ~120 to ~430 GFLOP/s with 2 threads). A wall time t measured here
corresponds to about t x (GFLOP/s here / 120) on the slowest machine seen, which is where CI's limit bites.
"""

from __future__ import annotations

import sys
import time

SLOWEST_GFLOPS = 120.0  # 2 threads, the slowest machine of the CI kind seen so far


def matmul_gflops(threads: int, size: int = 1024, repeats: int = 30) -> float:
    """Best-of-``repeats`` speed of one ``size`` x ``size`` fp32 matrix product on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(5):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def main(argv: list[str]) -> int:
    two = matmul_gflops(2)
    if "--gflops" in argv:
        print(f"{two:.0f}")
        return 0
    one = matmul_gflops(1)
    print(f"fp32 matmul 1024x1024 (best of 30): 2 threads {two:.0f} GFLOP/s, 1 thread {one:.0f} GFLOP/s "
          f"({two / SLOWEST_GFLOPS:.2f}x the slowest CI machine seen, {SLOWEST_GFLOPS:.0f} GFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
