"""Dispatch over worker groups (``rlforge/controller/groups.py``): tensor-parallel groups of consecutive ranks
get the same rows, and the answer of each group's first rank stands for the group; generation goes to the group
that owns the engines, each engine with its own seed."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.controller.groups import GroupController, data_parallel_call, data_parallel_size
from rlforge.protocols import SamplingParams, derived_seed


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



class FakeEngines(FakeGroup):
    """Records the sampling seed each engine is given."""

    def call_each(self, method, args):
        self.calls.append((method, [[p.seed for p in a[1]] if method == "generate_tokens" else a[1].seed
                                    for a in args]))
        return [a[0] if method == "generate" else [None] * len(a[0]) for a in args]


class FakeController(GroupController):
    def __init__(self):
        self.actor, self.rollout = FakeGroup(3), FakeEngines(2)


def test_generation_goes_to_the_rollout_group_and_each_engine_samples_its_own_stream():
    """With a rollout group its workers own the engines; a seeded generation (the off-policy pipelines') gives each
    engine a seed of its own, the first keeping the launch seed, as the agent engine does for its waves."""
    controller = FakeController()
    prompts = B.Batch({B.PROMPTS: torch.zeros(4, 2)})
    assert len(controller.generate(prompts, SamplingParams(seed=7))) == 4
    controller.generate(prompts, SamplingParams())
    controller.generate_tokens([[1], [2], [3]], [SamplingParams(seed=5)] * 3)
    assert controller.rollout.calls == [("generate", [7, derived_seed(7, 1)]), ("generate", [None, None]),
                                        ("generate_tokens", [[5, 5], [derived_seed(5, 1)]])]
    assert derived_seed(7, 1) != 7
    assert not controller.actor.calls  # the actor ranks own no engine
