"""Dispatch over worker groups (``rlforge/controller/groups.py``): tensor-parallel groups of consecutive ranks
get the same rows, and the answer of each group's first rank stands for the group."""

from __future__ import annotations

import pytest

from rlforge import load_config
from rlforge.controller.groups import data_parallel_call, data_parallel_size


class FakeGroup:
    def __init__(self, world_size):
        self.world_size = world_size
        self.calls = []

    def call_each(self, method, args):
        self.calls.append((method, args))
        return [(rank, a) for rank, a in enumerate(args)]


@pytest.mark.parametrize(("world", "groups", "expected_args"), [
    (4, 2, [("a",), ("a",), ("b",), ("b",)]),  # 2 data-parallel groups of tp 2: ranks 0,1 | 2,3
    (2, 2, [("a",), ("b",)]),  # data parallel only
    (2, 1, [("a",), ("a",)]),  # one tensor-parallel group
])
def test_each_data_parallel_group_gets_its_shard(world, groups, expected_args):
    group = FakeGroup(world)
    shards = [("a",), ("b",)][:groups]
    results = data_parallel_call(group, "update", shards)
    assert group.calls == [("update", expected_args)]
    assert results == [(r, expected_args[r]) for r in range(0, world, world // groups)]


def test_data_parallel_size_follows_the_strategy(pm):
    fsdp = load_config("grpo", ["strategy.name=fsdp", "strategy.num_processes=4", "trainer.controller=ray",
                                "data.train_batch_size=8"], plugins=pm)
    tp = load_config("grpo", ["strategy.name=tp", "strategy.tp.size=2", "strategy.num_processes=4",
                              "trainer.controller=ray", "data.train_batch_size=8"], plugins=pm)
    assert data_parallel_size(fsdp, pm.registry.strategy.get("fsdp")) == 4
    assert data_parallel_size(tp, pm.registry.strategy.get("tp")) == 2
