"""Padded forward passes over rows of very different lengths: which rows run together (``length_groups``), used by
``rlforge.ops`` (a leaf: no torch, no other rlforge module)."""

from __future__ import annotations

import math
from collections.abc import Sequence

GROUP_OVERHEAD_TOKENS = 256  # the cost of one more forward pass in padded tokens (length_groups): small next to a
# dispatch-bound pass of the tiny test model (~200 tokens' time) and to the rest of a 20M-parameter one (~15)
LENGTH_STEP = 16  # length_groups' costs round lengths up to a multiple of this (fewer distinct lengths to cut between)


def length_groups(lengths: Sequence[int], overhead: int = GROUP_OVERHEAD_TOKENS) -> list[list[int]]:
    """The rows of one padded forward pass split into groups (lists of row indices, ascending) that run as separate
    padded passes: rows sorted longest first and cut consecutively where that lowers the sum over the groups of
    rows x longest row + ``overhead`` (one group, ``[all rows]``, when nothing is saved). ``lengths``: each row's real
    tokens (prompt + response). An exact dynamic program over the distinct lengths (rounded up to ``LENGTH_STEP``)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    levels: list[list[int]] = []  # [rounded length, rows], longest first
    for i in order:
        size = -(-lengths[i] // LENGTH_STEP) * LENGTH_STEP
        if levels and levels[-1][0] == size:
            levels[-1][1] += 1
        else:
            levels.append([size, 1])
    best, cut = [0.0] + [math.inf] * len(levels), [0] * (len(levels) + 1)
    for j in range(1, len(levels) + 1):  # best[j]: the cheapest grouping of the first j levels
        rows = 0
        for i in range(j - 1, -1, -1):  # the last group is levels i..j-1, padded to level i's length
            rows += levels[i][1]
            cost = best[i] + rows * levels[i][0] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(levels)
    while j:
        bounds.append(sum(n for _, n in levels[: cut[j]]))
        j = cut[j]
    starts = sorted(bounds)
    ends = starts[1:] + [len(order)]
    return [sorted(order[a:b]) for a, b in zip(starts, ends)]
