"""Micro-batch plans: which rows of a batch share one forward (and backward) pass.

Without a token budget a batch is cut into consecutive chunks of ``ppo_micro_batch_size`` rows. With
``<role>.max_tokens_per_micro_batch`` the rows are grouped by their real length (prompt + response tokens):

- packed forward passes (``model.remove_padding``) cost the sum of the lengths: the rows are spread over the
  fewest micro-batches whose sums stay within the budget, longest first into the lightest (balanced);
- padded forward passes cost rows x the longest row: rows of similar length are grouped (sorted, cut
  consecutively) so that rows x longest stays within the budget.

A row longer than the budget gets a micro-batch of its own. Sharded models need every rank to run the same
number of passes, so ranks agree on the largest count (``parts``) and each splits its rows into that many.
Losses are normalized by mini-batch-wide counts, so the grouping never changes the gradient.

The forward-only passes (old and reference log-probs, values) cut the same way, by the update's settings unless
their own section sets a size or a budget (:func:`scoring_cut`).

Inside one padded micro-batch, ``rlforge.ops`` runs rows of very different lengths as separate forward passes
(``rlforge.lengths.length_groups``), so that a heavy-tailed micro-batch costs its tokens rather than rows x its longest row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cut:
    """How a pass cuts its rows into micro-batches: ``rows`` at a time, or with ``tokens`` > 0 by a token budget."""

    rows: int
    tokens: int = 0


def scoring_cut(update: Cut, scoring: Any) -> Cut:
    """The cut of a forward-only pass (``<role>.log_prob``, ``ref_log_prob``, ``values``: ``schema.ScoringConfig``):
    a token budget > 0 where it sets one, else its ``micro_batch_size`` where set (0 tokens and no size: the update's
    row count), else the update's cut."""
    tokens, rows = scoring.max_tokens_per_micro_batch, scoring.micro_batch_size
    if tokens:
        return Cut(update.rows, int(tokens))
    if rows is not None:
        return Cut(int(rows))
    return update if tokens is None else Cut(update.rows)


def fixed_plan(rows: int, size: int) -> list[list[int]]:
    """Consecutive chunks of ``size`` rows."""
    return [list(range(i, min(i + size, rows))) for i in range(0, rows, size)]


def _balanced(order: list[int], lengths: list[int], parts: int) -> list[list[int]]:
    """Longest first into the part with the fewest tokens."""
    bins: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in order:
        j = min(range(parts), key=lambda b: (loads[b], len(bins[b]), b))
        bins[j].append(i)
        loads[j] += lengths[i]
    return bins


def _packed_plan(order: list[int], lengths: list[int], budget: int, parts: int | None) -> list[list[int]]:
    if parts is not None:
        return _balanced(order, lengths, parts)
    alone = [n for n in lengths if n >= budget]  # each needs a micro-batch of its own
    k = max(1, len(alone) + math.ceil((sum(lengths) - sum(alone)) / budget))
    while True:
        bins = _balanced(order, lengths, k)
        if all(len(b) == 1 or sum(lengths[i] for i in b) <= budget for b in bins):
            return bins
        k += 1


def _padded_plan(order: list[int], lengths: list[int], budget: int, parts: int | None) -> list[list[int]]:
    bins: list[list[int]] = []
    for i in order:  # longest first: a chunk's first row is its longest
        if bins and (len(bins[-1]) + 1) * lengths[bins[-1][0]] <= budget:
            bins[-1].append(i)
        else:
            bins.append([i])
    while parts is not None and len(bins) < parts:  # halve the costliest chunk until there are enough
        j = max(range(len(bins)), key=lambda b: (len(bins[b]) > 1, len(bins[b]) * lengths[bins[b][0]]))
        half = (len(bins[j]) + 1) // 2
        bins[j:j + 1] = [bins[j][:half], bins[j][half:]]
    return bins


def token_budget_plan(lengths: list[int], budget: int, packed: bool, parts: int | None = None) -> list[list[int]]:
    """Micro-batches (lists of row indices, ascending) of at most ``budget`` tokens each; exactly ``parts`` of
    them when given (it must not exceed the number of rows)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan = (_packed_plan if packed else _padded_plan)(order, lengths, budget, parts)
    return [sorted(b) for b in plan if b]




def balanced_split(lengths: list[int], parts: int) -> list[list[int]]:
    """``parts`` groups of equal size (``len(lengths)`` must divide) with similar token sums, for the
    data-parallel ranks: rows sorted longest first are dealt out back and forth (0, 1, ..., p-1, p-1, ..., 0)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = [[] for _ in range(parts)]
    for pos, i in enumerate(order):
        lap, k = divmod(pos, parts)
        groups[k if lap % 2 == 0 else parts - 1 - k].append(i)
    return [sorted(g) for g in groups]


def groups_splitting_evenly(uids: Sequence[Hashable], groups: Sequence[Hashable], unit: int) -> list[Hashable]:
    """The longest prefix of ``groups`` (group ids in priority order) whose rows (the entries of ``uids``, the batch's
    ``uid`` column) number a multiple of ``unit`` (``StepContext.data_parallel_size``)."""
    size = Counter(uids)
    kept = list(groups)
    total = sum(size[g] for g in kept)
    while kept and total % unit:
        total -= size[kept.pop()]
    return kept
