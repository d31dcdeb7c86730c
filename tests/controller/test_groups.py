"""Worker groups (``rlforge/controller/remote.py``) and the dispatch modes of ``dispatch.py``: declared methods are
bound to the group; tensor-parallel groups of consecutive ranks get the same rows, and the answer of each group's first
rank stands for the group; generation goes to the group that owns the engines, each engine with its own seed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rlforge import batch as B
from rlforge import capabilities, load_config
from rlforge.capabilities import StrategyCapabilities, shown
from rlforge.controller.dispatch import PerRank
from rlforge.controller.groups import GroupController
from rlforge.controller.remote import InProcess, WorkerGroup
from rlforge.errors import RLForgeError
from rlforge.sampling import SamplingParams, derived_seed
from rlforge.capabilities import declared_methods, remote


class Rank:
    """A worker whose methods say which rank ran them with which arguments."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.seeds: list = []

    @remote("dp_update", "all")
    def update(self, batch):
        return self.rank, batch[B.INPUT_IDS][:, 0].tolist()

    @remote("dp_score", "concat")
    def compute_log_probs(self, batch, role="actor"):
        return batch[B.INPUT_IDS][:, :1].float() + (100 if role == "ref" else 0)

    @remote()
    def load(self, state, rng=None):
        return self.rank, state, rng

    @remote(collect="max")
    def sync_weights(self):
        return float(self.rank)

    @remote("engine_rows", "concat")
    def generate(self, batch, params):
        self.seeds.append(params.seed)
        return batch

    @remote("engine_requests", "flatten")
    def generate_tokens(self, prompts, params):
        self.seeds.append([p.seed for p in params])
        return [None] * len(prompts)

    def private(self):  # not declared: not on the group
        return self.rank


def _config(mini=4, balance=False):
    return OmegaConf.create({"trainer": {"balance_batch": balance}, "rollout": {"n": 1},
                             "actor": {"ppo_mini_batch_size": mini, "max_tokens_per_micro_batch": 0}})


def _group(world, registry, dp=None, role="actor"):
    ranks = [Rank(r) for r in range(world)]
    return WorkerGroup(role, Rank, InProcess(ranks), _config(), registry, dp), ranks


def _rows(n):
    return B.Batch({B.INPUT_IDS: torch.arange(n).unsqueeze(1).repeat(1, 3), B.ATTENTION_MASK: torch.ones(n, 3),
                    B.PROMPTS: torch.zeros(n, 2)})


def test_declared_methods_are_bound_and_others_are_not(registry):
    group, _ = _group(2, registry)
    assert set(declared_methods(Rank)) == {"update", "compute_log_probs", "load", "sync_weights", "generate",
                                   "generate_tokens"}
    assert not hasattr(group, "private")
    assert group.sync_weights() == 1.0  # collect=max
    assert group.load("s", rng=PerRank(["r0", "r1"])) == [(0, "s", "r0"), (1, "s", "r1")]  # keywords bind too
    with pytest.raises(RLForgeError, match=r"actor.load\(state, rng=None\): missing a required argument: 'state'"):
        group.load()  # the worker method's own signature, named with its role
    with pytest.raises(RLForgeError, match=r"Dispatch mode 'dp_score' \(role 'actor', method compute_log_probs\) "
                                           r"cannot split the arguments actor.compute_log_probs\(int, str\)"):
        group.compute_log_probs(7)  # a number where a Batch goes


@pytest.mark.parametrize(("world", "dp", "expected"), [
    (4, 2, [[0, 1], [0, 1], [2, 3], [2, 3]]),  # 2 data-parallel groups of tp 2: ranks 0,1 | 2,3
    (2, 2, [[0, 1], [2, 3]]),  # data parallel only
    (2, 1, [[0, 1, 2, 3], [0, 1, 2, 3]]),  # one tensor-parallel group
])
def test_each_data_parallel_group_gets_its_shard_and_its_first_rank_answers(world, dp, expected, registry):
    group, ranks = _group(world, registry, dp)
    seen = []
    for rank in ranks:
        rank.update = lambda batch, rank=rank: seen.append((rank.rank, batch[B.INPUT_IDS][:, 0].tolist())) or rank.rank
    assert group.update(_rows(4)) == list(range(0, world, world // dp))
    assert [rows for _, rows in sorted(seen)] == expected


def test_scoring_results_come_back_in_row_order(registry):
    group, _ = _group(2, registry)
    out = group.compute_log_probs(_rows(4), "ref")
    assert out[:, 0].tolist() == [100.0, 101.0, 102.0, 103.0]


def test_an_unknown_mode_names_the_method_and_the_mode(registry):
    class Bad:
        @remote("scatter_gather")
        def run(self):
            return None

    with pytest.raises(RLForgeError, match=r"Bad.run \(role 'actor'\).*scatter_gather"):
        WorkerGroup("actor", Bad, InProcess([Bad()]), _config(), registry)


def test_per_rank_values_must_match_the_ranks(registry):
    group, _ = _group(2, registry)
    with pytest.raises(RLForgeError, match="3 per-rank values for a group of 2 ranks"):
        group.load("s", PerRank([1, 2, 3]))


def test_an_undeclared_method_names_the_role_and_the_declared_ones(registry):
    group, _ = _group(2, registry)
    with pytest.raises(AttributeError, match=r"Role 'actor' has no method 'updat'.*compute_log_probs.*"
                                             r"Did you mean 'update'\?"):
        group.updat(_rows(4))


def test_a_dispatch_mode_must_give_shares_with_one_entry_per_rank():
    from rlforge.controller.dispatch import Shares
    from rlforge.plugin_manager import PluginManager

    registry = PluginManager(autoload=False).registry
    registry.dispatch_mode.register("short", lambda group, args: Shares([args]))
    registry.dispatch_mode.register("listed", lambda group, args: [args] * group.world_size)

    class Odd:
        @remote("short")
        def short(self):
            return 1

        @remote("listed")
        def listed(self):
            return 1

    group = WorkerGroup("odd", Odd, InProcess([Odd(), Odd()]), _config(), registry)
    with pytest.raises(RLForgeError, match=r"Dispatch mode 'short' \(role 'odd', method short\) gave 1 entries .* "
                                           r"for 2 ranks"):
        group.short()
    with pytest.raises(RLForgeError, match=r"Dispatch mode 'listed' \(role 'odd', method listed\) returned list, "
                                           r"not a rlforge.controller.dispatch.Shares"):
        group.listed()


def test_data_parallel_size_follows_the_strategy(pm):
    fsdp = load_config("grpo", ["strategy.name=fsdp", "strategy.num_processes=4", "trainer.controller=ray",
                                "data.train_batch_size=8"], plugins=pm)
    tp = load_config("grpo", ["strategy.name=tp", "strategy.tp.size=2", "strategy.num_processes=4",
                              "trainer.controller=ray", "data.train_batch_size=8"], plugins=pm)
    caps = {name: pm.registry.strategy.entry(name).capabilities for name in ("fsdp", "tp")}
    assert caps["fsdp"].data_parallel_size(fsdp) == 4
    assert caps["tp"].data_parallel_size(tp) == 2
    assert "same_rows_key=strategy.tp.size" in shown(caps["tp"])  # declared: `rlforge plugins list` shows it
    with pytest.raises(RLForgeError, match=r"strategy.tp.size=3 must be a whole number >= 1 that divides "
                                           r"strategy.num_processes=4 \(strategy.name=tp declares"):
        caps["tp"].data_parallel_size(OmegaConf.merge(tp, {"strategy": {"tp": {"size": 3}}}))
    with pytest.raises(RLForgeError, match="capability same_rows_key must be a str, got 2"):
        capabilities.declared("strategy", "odd", type("Odd", (), {"capabilities": StrategyCapabilities(
            same_rows_key=2)}), StrategyCapabilities)  # type: ignore[arg-type]


class TwoGroups(GroupController):
    def __init__(self, registry):
        actor, self.actor_ranks = _group(3, registry)
        self.groups = {"actor": actor}
        self.rollout, self.engines = _group(2, registry, role="rollout")


def test_generation_goes_to_the_rollout_group_and_each_engine_samples_its_own_stream(registry):
    """With a rollout group its workers own the engines; a seeded generation (the off-policy pipelines') gives each
    engine a seed of its own, the first keeping the launch seed, as the agent engine does for its waves."""
    controller = TwoGroups(registry)
    prompts = _rows(4)
    engines = controller.workers.rollout
    assert engines is controller.rollout
    assert len(engines.generate(prompts, SamplingParams(seed=7))) == 4
    engines.generate(prompts, SamplingParams())
    assert len(engines.generate_tokens([[1], [2], [3]], [SamplingParams(seed=5)] * 3)) == 3
    assert [e.seeds for e in controller.engines] == [[7, None, [5, 5]], [derived_seed(7, 1), None, [derived_seed(5, 1)]]]
    assert derived_seed(7, 1) != 7
    assert not any(r.seeds for r in controller.actor_ranks)  # the actor ranks own no engine


class VisionRank(Rank):
    @remote("engine_requests", "flatten")
    def generate_tokens(self, prompts, params, multi_modal=None):
        self.seeds.append(multi_modal)
        return [None] * len(prompts)


def test_agent_requests_keep_their_images_when_split_over_the_engines(registry):
    ranks = [VisionRank(r) for r in range(2)]
    engines = WorkerGroup("rollout", VisionRank, InProcess(ranks), _config(), registry)
    engines.generate_tokens([[1], [2], [3]], [SamplingParams()] * 3, multi_modal=[{"a": 1}, None, {"c": 3}])
    engines.generate_tokens([[1], [2], [3]], [SamplingParams()] * 3)  # text requests: the default None
    assert [r.seeds for r in ranks] == [[[{"a": 1}, None], None], [[{"c": 3}], None]]

class Trained:
    """A trained role's rank: its checkpoint state (with its weights when asked) and its RNG state."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    @remote()
    def state_dict(self, with_model):
        return {"optimizer": self.rank, **({"model": {"w": self.rank}} if with_model else {}), "rng": f"rng{self.rank}"}


def test_every_controller_checkpoints_each_rank_and_a_missing_role_is_named(registry, tmp_path):
    """The one checkpoint path (the local controller's too): each role's rank-0 state, each rank's RNG state; the
    actor's weights stay out where the driver trains the actor (``actor/`` is written from it)."""
    c = GroupController()
    c.config = OmegaConf.create({"strategy": {"checkpoint": "full"}})
    c.module = SimpleNamespace(loads=lambda model: True)  # the local controller's driver trains module.actor
    c.groups = {role: WorkerGroup(role, Trained, InProcess([Trained(0), Trained(1)]), c.config, registry)
                for role in ("actor", "critic")}
    state = c.state_dict(tmp_path)
    assert state == {"world_size": 2, "rng": {"actor": ["rng0", "rng1"], "critic": ["rng0", "rng1"]},
                     "actor": {"optimizer": 0}, "critic": {"optimizer": 0, "model": {"w": 0}}}
    del state["critic"]
    with pytest.raises(RLForgeError, match=r"holds no state of the 'critic' role \(it has: actor\): it was saved by "
                                           r"a run with other roles"):
        c.load_state_dict(state, tmp_path)


def test_the_testing_kit_names_a_role_it_was_not_given_like_the_controllers():
    from rlforge.testing import fake_controller

    controller = fake_controller(workers={"actor": {"compute_log_probs": lambda batch, role: batch}})
    assert controller.workers.actor.compute_log_probs(1, "ref") == 1 and "actor" in controller.workers
    with pytest.raises(RLForgeError, match=r"No 'teacher' worker group in this run \(placed: actor\)"):
        controller.workers.teacher


def test_rendezvous_ports_are_free_and_below_the_ephemeral_range() -> None:
    """A port bind(0) found and released can go to any outgoing connection before the group's store binds it; one
    drawn below the kernel's ephemeral range only to another listener."""
    import socket
    from pathlib import Path

    from rlforge.controller.rendezvous import rendezvous_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {rendezvous_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports) and len(ports) > 1  # drawn, not one fixed port
    with socket.socket() as s:
        s.bind(("", ports.pop()))  # free


def test_an_undeclared_method_is_one_line_and_still_an_attribute_error(registry):
    from rlforge.errors import RLForgeError

    group, _ = _group(1, registry)
    with pytest.raises(RLForgeError, match=r"Role 'actor' has no method 'unknown' the driver can call") as info:
        group.unknown()
    assert isinstance(info.value, AttributeError) and not hasattr(group, "unknown")
