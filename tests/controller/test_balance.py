"""Sequence-length balancing over data-parallel ranks (``trainer.balance_batch``, verl's key): the partition function
(``microbatch.balanced_split``), the forward-only passes' shares and their results back in row order, and the
controller's choice. Balancing moves rows between ranks only: what is computed does not change."""

from __future__ import annotations

import random
import pytest
import torch
from omegaconf import OmegaConf

from rlforge import batch as B
from rlforge.controller.dispatch import restore, shard_for_scoring, shard_for_update
from rlforge.controller.remote import InProcess, WorkerGroup
from rlforge.errors import RLForgeError
from rlforge.microbatch import balanced_split
from rlforge.worker import remote


def _batch(lengths: list[int], width: int = 40) -> B.Batch:
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    return B.Batch({B.ATTENTION_MASK: mask, B.INPUT_IDS: torch.arange(len(lengths))[:, None].expand(-1, width),
                    B.RESPONSE_MASK: mask[:, -8:]})


def test_balanced_split_gives_equal_rows_and_token_sums_within_one_row() -> None:
    rng = random.Random(0)
    for parts, rows in ((2, 8), (4, 32), (8, 64)):
        lengths = [rng.randint(1, 40) for _ in range(rows)]
        groups = balanced_split(lengths, parts)
        assert sorted(i for g in groups for i in g) == list(range(rows))  # every row once
        assert {len(g) for g in groups} == {rows // parts}  # equal rows: sharded models run the same collectives
        sums = [sum(lengths[i] for i in g) for g in groups]
        assert max(sums) - min(sums) <= max(lengths)
    # a batch sorted by length: consecutive chunks put all the long rows on one rank, balancing spreads them
    lengths = [40, 39, 38, 37, 2, 2, 1, 1]
    consecutive = [sum(lengths[:4]), sum(lengths[4:])]
    balanced = [sum(lengths[i] for i in g) for g in balanced_split(lengths, 2)]
    assert consecutive == [154, 6] and balanced == [80, 80]


def test_scoring_shares_are_balanced_and_results_come_back_in_row_order() -> None:
    batch = _batch([40, 39, 38, 37, 2, 2, 1, 1])
    shards, order = shard_for_scoring(batch, 2, "log-probs", balance=True)
    assert [int(s[B.ATTENTION_MASK].sum()) for s in shards] == [80, 80]
    per_row = torch.cat([s[B.INPUT_IDS][:, :1].float() * 10 for s in shards])  # each rank's result for its rows
    assert restore(per_row, order)[:, 0].tolist() == [10.0 * i for i in range(8)]
    plain, none = shard_for_scoring(batch, 2, "log-probs", balance=False)
    assert none is None and [int(s[B.ATTENTION_MASK].sum()) for s in plain] == [154, 6]
    with pytest.raises(RLForgeError, match="log-probs: a batch of 8 sequences does not split evenly over 3"):
        shard_for_scoring(batch, 3, "log-probs", balance=True)


def test_update_shares_keep_each_mini_batch_and_balance_inside_it() -> None:
    batch = _batch([40, 39, 38, 37, 2, 2, 1, 1])
    for balance in (False, True):
        shards = shard_for_update(batch, 2, 4, balance=balance)
        ranks = [s[B.INPUT_IDS][:, 0].tolist() for s in shards]
        # rank r holds 2 rows of mini-batch 1 (rows 0-3), then 2 of mini-batch 2 (rows 4-7): one process's minis
        assert all(set(r[:2]) <= {0, 1, 2, 3} and set(r[2:]) <= {4, 5, 6, 7} for r in ranks)
    assert [int(s[B.ATTENTION_MASK][:2].sum()) for s in shard_for_update(batch, 2, 4, balance=True)] == [77, 77]


class _Rank:
    """A rank whose log-prob pass returns each row's id and records its share's real tokens."""

    tokens: list[int] = []

    @remote("dp_score", "concat")
    def compute_log_probs(self, batch: B.Batch, role: str = "actor") -> torch.Tensor:
        _Rank.tokens.append(int(batch[B.ATTENTION_MASK].sum()))
        return batch[B.INPUT_IDS][:, :1].float()


@pytest.mark.parametrize("balance,budget,expected", [(None, 0, [154, 6]), (None, 64, [80, 80]), (True, 0, [80, 80]),
                                                      (False, 64, [154, 6])])
def test_the_actor_group_balances_when_trainer_balance_batch_says_so(balance, budget, expected, registry) -> None:
    config = OmegaConf.create({"trainer": {"balance_batch": balance}, "actor": {"max_tokens_per_micro_batch": budget}})
    actor = WorkerGroup("actor", _Rank, InProcess([_Rank(), _Rank()]), config, registry)
    _Rank.tokens = []
    out = actor.compute_log_probs(_batch([40, 39, 38, 37, 2, 2, 1, 1]))
    assert _Rank.tokens == expected and out[:, 0].tolist() == list(range(8))  # rows in order either way
