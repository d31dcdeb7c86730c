"""How a controller splits batches over data-parallel ranks (cheap to import: no torch at module level)."""

from __future__ import annotations

from typing import Any

from rlforge import batch as B
from rlforge.controller.microbatch import balanced_split
from rlforge.errors import RLForgeError


def split_rows(batch: B.Batch, parts: int) -> list[B.Batch]:
    """``parts`` consecutive chunks whose sizes differ by at most one (some may be empty)."""
    base, extra = divmod(len(batch), parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (i < extra))
    return [batch.select(list(range(a, b))) for a, b in zip(bounds, bounds[1:])]


def _check_even(batch: B.Batch, parts: int, what: str) -> None:
    """Sharded models run collectives, so every rank needs the same number of rows."""
    if len(batch) % parts:
        raise RLForgeError(
            f"{what}: a batch of {len(batch)} sequences does not split evenly over {parts} data-parallel ranks "
            f"(strategy.num_processes={parts}). Make data.train_batch_size x rollout.n a multiple of it."
        )


def split_even(batch: B.Batch, parts: int, what: str) -> list[B.Batch]:
    """``parts`` equal consecutive chunks (see ``_check_even``)."""
    _check_even(batch, parts, what)
    return split_rows(batch, parts)


def shard_for_scoring(batch: B.Batch, parts: int, what: str, balance: bool) -> tuple[list[B.Batch], list[int] | None]:
    """The ranks' shares of a forward-only pass (log-probs, values): equal consecutive chunks, or with ``balance`` equal
    in rows and similar in real tokens (``balanced_split``), with the rows' order (``restore`` puts results back)."""
    _check_even(batch, parts, what)
    if not balance or parts == 1:
        return split_rows(batch, parts), None
    groups = balanced_split(batch[B.ATTENTION_MASK].sum(-1).tolist(), parts)
    return [batch.select(g) for g in groups], [i for g in groups for i in g]


def restore(rows: Any, order: list[int] | None) -> Any:
    """Per-row results of ``shard_for_scoring``'s shares, concatenated, back in the batch's row order."""
    if order is None:
        return rows
    out = rows.new_empty(rows.shape)
    out[order] = rows
    return out


def shard_for_update(batch: B.Batch, parts: int, mini_size: int, balance: bool = False) -> list[B.Batch]:
    """Rank ``r``'s share of an update batch: the ``r``-th slice of every mini-batch of ``mini_size`` rows, so the
    ranks' ``TrainWorker.update`` steps see together exactly the mini-batches one process would. With
    ``balance`` the slices are equal in rows and similar in real tokens (``balanced_split``) instead of consecutive."""
    shards: list[list[B.Batch]] = [[] for _ in range(parts)]
    for mini in batch.split(mini_size):
        if balance:
            _check_even(mini, parts, "update")
            pieces = [mini.select(g) for g in balanced_split(mini[B.ATTENTION_MASK].sum(-1).tolist(), parts)]
        else:
            pieces = split_even(mini, parts, "update")
        for rank, piece in enumerate(pieces):
            shards[rank].append(piece)
    return [B.Batch.concat(pieces) for pieces in shards]
