"""Which examples make up the global batch of each optimizer step (``sft.sampling``).

An order answers ``batch(step)`` for any step, with nothing to save in a checkpoint: a resumed run asks for
the batches of its remaining steps and gets what an uninterrupted run would have had.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

import torch


class BatchOrder(Protocol):
    def batch(self, step: int) -> list[int]:
        """Indices of the examples of optimizer step ``step`` (from 0)."""


class EpochOrder:
    """Each example once per epoch: epoch ``e`` is a permutation drawn from a generator seeded with
    ``seed + e``, cut into batches; the tail that does not fill a batch is left out."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self._epoch, self._perm = -1, list[int]()

    def batch(self, step: int) -> list[int]:
        epoch, position = divmod(step, self.size // self.batch_size)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.size, generator=generator).tolist()
        return self._perm[position * self.batch_size : (position + 1) * self.batch_size]


class RandomOrder:
    """Each step draws ``batch_size`` distinct examples at random, independently of the other steps, from one
    ``random.Random(seed)`` stream (the order that built the shipped tiny model). Step ``k`` replays the first
    ``k`` draws when asked out of turn (a resumed run, once), then follows the stream."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self._rng, self._next, self._last = random.Random(seed), 0, list[int]()

    def batch(self, step: int) -> list[int]:
        if step < self._next - 1:
            self._rng, self._next = random.Random(self.seed), 0
        while self._next <= step:
            self._last = self._rng.sample(range(self.size), self.batch_size)
            self._next += 1
        return self._last


ORDERS: dict[str, Callable[[int, int, int], BatchOrder]] = {"epoch": EpochOrder, "random": RandomOrder}
