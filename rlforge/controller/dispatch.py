"""How a call to a worker group is split over its ranks and how their results are joined: the dispatch and collect
modes that worker methods declare (``rlforge.worker.remote``), registered as the ``dispatch_mode`` and
``collect_mode`` kinds (a plugin may add its own). Cheap to import: no torch at module level."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rlforge import batch as B
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.microbatch import balanced_split


def split_rows(batch: B.Batch, parts: int) -> list[B.Batch]:
    """``parts`` consecutive chunks whose sizes differ by at most one (some may be empty); one part is the batch."""
    if parts == 1:
        return [batch]
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
    if parts == 1:
        return [batch]
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


# --- dispatch and collect modes (registry kinds ``dispatch_mode`` / ``collect_mode``) ------------------------------
# A dispatch mode turns one driver-side call into each rank's arguments: ``mode(group, args) -> Shares``. A collect
# mode joins the ranks' results: ``mode(group, results, shares) -> value`` (``results``: those ``Shares.keep``
# selects, in rank order). ``group`` is the :class:`rlforge.controller.remote.WorkerGroup` (``role``, ``config``,
# ``world_size``, ``dp_size``). Worker methods name their modes with ``rlforge.worker.remote``.


@dataclass
class Shares:
    """One call's plan: each rank's positional arguments (None: the rank sits out), which results count (every
    ``keep``-th from rank 0: the first rank of each data-parallel group) and the rows' order for ``restore``."""

    args: list[tuple | None]
    keep: int = 1
    order: list[int] | None = None


@dataclass(frozen=True)
class PerRank:
    """An argument with one value per rank (``values[r]`` goes to rank ``r``); other arguments go to every rank."""

    values: Sequence[Any]


def dispatch_all(group: Any, args: tuple) -> Shares:
    """Every rank runs the call with the same arguments, except :class:`PerRank` ones."""
    n = group.world_size
    for a in args:
        if isinstance(a, PerRank) and len(a.values) != n:
            raise RLForgeError(f"{group.role}: {len(a.values)} per-rank values for a group of {n} ranks.")
    return Shares([tuple(a.values[r] if isinstance(a, PerRank) else a for a in args) for r in range(n)])


def _per_group(group: Any, shards: list[tuple], order: list[int] | None = None) -> Shares:
    """Data-parallel group ``g`` (``per`` consecutive ranks: a tensor-parallel group) runs ``shards[g]``."""
    per = group.world_size // len(shards)
    return Shares([shards[r // per] for r in range(group.world_size)], keep=per, order=order)


def balance_of(config: Any, section: str) -> bool:
    """Spread real tokens evenly over the ranks (``trainer.balance_batch``; unset: when micro-batches are cut by token
    budget, ``<section>.max_tokens_per_micro_batch``)."""
    from rlforge.config.batches import config_section

    balance = config.trainer.balance_batch
    return bool(config_section(config, section).max_tokens_per_micro_batch) if balance is None else bool(balance)


def dispatch_dp_score(group: Any, args: tuple) -> Shares:
    """A forward-only pass over ``args[0]`` (a Batch): equal (or token-balanced) slices per data-parallel group."""
    batch, rest = args[0], args[1:]
    what = f"the {group.role} group's forward pass"
    shards, order = shard_for_scoring(batch, group.dp_size, what, balance_of(group.config, group.section))
    return _per_group(group, [(s, *rest) for s in shards], order)


def dispatch_dp_update(group: Any, args: tuple) -> Shares:
    """An update over ``args[0]``: each data-parallel group gets its slice of every mini-batch (``shard_for_update``)."""
    from rlforge.config.batches import config_section

    config = group.config
    mini = config_section(config, group.section).ppo_mini_batch_size * config.rollout.n
    shards = shard_for_update(args[0], group.dp_size, mini, balance=balance_of(config, group.section))
    return _per_group(group, [(s, *args[1:]) for s in shards])


def dispatch_rows(group: Any, args: tuple) -> Shares:
    """``args[0]`` (a Batch) in consecutive parts of sizes that differ by at most one, one per rank (a rank without
    rows sits out), the other arguments to each: for models without collectives (a frozen reward model)."""
    parts = split_rows(args[0], group.world_size)
    return Shares([(part, *args[1:]) if len(part) else None for part in parts])


def dispatch_engine_rows(group: Any, args: tuple) -> Shares:
    """``(batch, params)``: the prompts split over the ranks' engines; with a seed, each engine samples from a stream
    of its own (``derived_seed``)."""
    from rlforge.sampling import derived_seed

    batch, params = args
    return Shares([(s, replace(params, seed=derived_seed(params.seed, i))) if len(s) else None
                   for i, s in enumerate(split_rows(batch, group.world_size))])


def dispatch_engine_requests(group: Any, args: tuple) -> Shares:
    """``(prompts, params[, multi_modal])``: agent loops' requests in contiguous parts over the engines (seeded as
    ``engine_rows``), each with its vision inputs."""
    from rlforge.sampling import derived_seed

    prompts, params, *rest = args  # rest: [multi_modal] where the method takes it
    n = group.world_size
    bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
    return Shares([(prompts[a:b], [replace(p, seed=derived_seed(p.seed, i)) for p in params[a:b]],
                    *(None if m is None else m[a:b] for m in rest)) if b > a else None
                   for i, (a, b) in enumerate(zip(bounds, bounds[1:]))])


def collect_all(group: Any, results: list[Any], shares: Shares) -> list[Any]:
    return results


def collect_first(group: Any, results: list[Any], shares: Shares) -> Any:
    return results[0]


def collect_max(group: Any, results: list[Any], shares: Shares) -> Any:
    return max(results)


def collect_concat(group: Any, results: list[Any], shares: Shares) -> Any:
    """Batches concatenated, or per-row tensors concatenated and put back in the batch's row order."""
    if results and isinstance(results[0], B.Batch):
        return B.Batch.concat(results)
    import torch

    return restore(torch.cat(results), shares.order)


def collect_flatten(group: Any, results: list[list[Any]], shares: Shares) -> list[Any]:
    return [item for part in results for item in part]


@hookimpl
def rlforge_register(registry):
    for name, mode in (("all", dispatch_all), ("dp_score", dispatch_dp_score), ("dp_update", dispatch_dp_update),
                       ("rows", dispatch_rows),
                       ("engine_rows", dispatch_engine_rows), ("engine_requests", dispatch_engine_requests)):
        registry.dispatch_mode.register(name, mode)
    for name, mode in (("all", collect_all), ("first", collect_first), ("max", collect_max),
                       ("concat", collect_concat), ("flatten", collect_flatten)):
        registry.collect_mode.register(name, mode)
