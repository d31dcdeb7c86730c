"""The update loop: splitting a mini-batch into micro-batches does not change the optimizer step."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.algorithms.grpo import GRPO
from rlforge.capabilities import StrategyCapabilities
from rlforge.errors import RLForgeError
from rlforge.microbatch import token_budget_plan
from rlforge.ops import shares_prompts
from rlforge.plugin_manager import PluginManager
from rlforge.worker import ActorWorker

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _rollout_batch(module, n_seqs=16, resp_len=5, seed=0, group=1):
    """Random prompts and responses; ``group`` > 1: GRPO-like, ``group`` samples of each prompt, rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    vocab = module.actor.config.vocab_size
    prompts = torch.randint(7, vocab, (n_seqs // group, 6), generator=g).repeat_interleave(group, 0)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[: n_seqs // 2, :2] = 0  # some left padding
    responses = torch.randint(7, vocab, (n_seqs, resp_len), generator=g)
    lengths = torch.randint(1, resp_len + 1, (n_seqs,), generator=g)
    resp_mask = (torch.arange(resp_len)[None, :] < lengths[:, None]).long()
    batch = B.Batch({
        B.PROMPTS: prompts, B.PROMPT_MASK: prompt_mask, B.RESPONSES: responses, B.RESPONSE_MASK: resp_mask,
        B.INPUT_IDS: torch.cat([prompts, responses], 1), B.ATTENTION_MASK: torch.cat([prompt_mask, resp_mask], 1),
        B.ADVANTAGES: torch.randn(n_seqs, resp_len, generator=g) * resp_mask,
    })
    return batch.select(torch.randperm(n_seqs, generator=g)) if group > 1 else batch


@pytest.fixture(scope="module")
def pm():
    return PluginManager(autoload=False)


class SGDGRPO(GRPO):
    """Plain SGD: Adam's first step is sign-like, which would amplify float noise in near-zero gradients."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.actor.parameters(), lr=self.config.actor.lr), None


def _update(pm, mode, overrides, group=1):
    """One actor update of the same batch; returns (weights after, metrics, old log-probs)."""
    cfg = load_config("grpo", [
        "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", f"actor.loss_agg_mode={mode}",
        "actor.lr=1e-2", "actor.entropy_coeff=0.01", *overrides,
    ], plugins=pm)
    module = SGDGRPO(cfg)
    module.configure_model()
    torch.manual_seed(0)
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    batch = _rollout_batch(module, group=group)
    old = worker.compute_log_probs(batch)
    batch[B.OLD_LOG_PROBS] = old + 0.05 * batch[B.RESPONSE_MASK]
    metrics = worker.update(batch)
    return {k: v.detach().clone() for k, v in module.actor.state_dict().items()}, metrics, old


def _assert_same_update(a, b, rtol=1e-5, atol=1e-6):
    (wa, ma, la), (wb, mb, lb) = a, b
    torch.testing.assert_close(la, lb, rtol=rtol, atol=atol)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=rtol, atol=atol, msg=k)
    for k in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert ma[k] == pytest.approx(mb[k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_split_gives_the_same_update(pm, mode):
    _assert_same_update(_update(pm, mode, ["actor.ppo_micro_batch_size=16"]),
                        _update(pm, mode, ["actor.ppo_micro_batch_size=4"]))


def test_a_mini_batch_without_trained_tokens_changes_nothing_and_logs_finite_numbers(pm):
    """Every response masked (an agent loop's inserted text only): the loss is 0, not 0/0 (NaN) as before."""
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
                               "actor.lr=1e-2", "actor.entropy_coeff=0.01"], plugins=pm)
    module = SGDGRPO(cfg)
    module.configure_model()
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    batch = _rollout_batch(module)
    batch[B.RESPONSE_MASK] = torch.zeros_like(batch[B.RESPONSE_MASK])
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch)
    before = {k: v.detach().clone() for k, v in module.actor.state_dict().items()}
    metrics = worker.update(batch)
    assert metrics["actor/pg_loss"] == 0.0 and all(math.isfinite(v) for v in metrics.values())
    assert all(torch.equal(before[k], v) for k, v in module.actor.state_dict().items())


# the fast path: packed sequences, token-budget micro-batches (sequences here are 7 to 11 tokens long) and
# activation recomputation change how the update is computed, never its result
FAST_PATHS = {
    "packed": ["model.remove_padding=true"],
    "token budget": ["actor.max_tokens_per_micro_batch=40", "data.max_prompt_length=16"],
    "packed + token budget": ["model.remove_padding=true", "actor.max_tokens_per_micro_batch=40", "data.max_prompt_length=16"],
    "gradient checkpointing": ["model.gradient_checkpointing=true", "actor.ppo_micro_batch_size=8"],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", list(FAST_PATHS))
def test_fast_paths_give_the_same_update(pm, mode, path):
    _assert_same_update(_update(pm, mode, []), _update(pm, mode, FAST_PATHS[path]), rtol=1e-4, atol=1e-5)


# model.shared_prefix (on by default) on GRPO-like batches, 4 samples of each prompt with the rows shuffled: each
# micro-batch runs its distinct prompts once; one without a repeated prompt takes the plain path (micro-batches of
# 4 rows here: 3 of the 4 share, in every loss aggregation mode)
SHARED = {
    "whole mini-batch": [],
    "micro-batches": ["actor.ppo_micro_batch_size=4"],
    "token budget": ["actor.max_tokens_per_micro_batch=40", "data.max_prompt_length=16"],
}


@pytest.mark.parametrize(("layout", "mode"), [("micro-batches", m) for m in MODES] + [
    ("whole mini-batch", "token-mean"), ("token budget", "seq-mean-token-mean")])
def test_shared_prefix_gives_the_plain_update(pm, shared_calls, layout, mode):
    plain = _update(pm, mode, ["model.shared_prefix=false", *SHARED[layout]], group=4)
    assert not shared_calls
    _assert_same_update(plain, _update(pm, mode, SHARED[layout], group=4), rtol=1e-5, atol=1e-6)
    assert shared_calls  # (log-probs and the update)


def _actor_worker(pm, overrides, shares_prompts=None):
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", *overrides],
                      plugins=pm)
    module = GRPO(cfg)
    module.configure_model()
    strategy = pm.registry.strategy.get("single")(cfg)
    if shares_prompts is not None:
        strategy.capabilities = StrategyCapabilities(shares_prompts=shares_prompts)
    return ActorWorker(cfg, module, strategy)


@pytest.mark.parametrize("overrides", [
    ["model.shared_prefix=false"], ["model.remove_padding=true"], ["model.compile=true"],
    ["model.gradient_checkpointing=true", "actor.use_kl_loss=true"],
], ids=["off", "packed", "compiled", "gradient checkpointing"])
def test_shared_prefix_falls_back_to_the_plain_path(pm, overrides):
    worker = _actor_worker(pm, overrides)
    assert not shares_prompts(worker.module.actor)
    if worker.module.ref is not None:  # the reference is not checkpointed: it keeps its cache and shares
        assert shares_prompts(worker.module.ref)


def test_shared_prefix_applies_only_on_strategies_verified_with_it(pm):
    assert shares_prompts(_actor_worker(pm, ["actor.use_kl_loss=true"]).module.actor)
    worker = _actor_worker(pm, ["actor.use_kl_loss=true"], shares_prompts=False)  # a strategy not verified with it
    assert not shares_prompts(worker.module.actor) and not shares_prompts(worker.module.ref)


@pytest.mark.parametrize("layout", [
    ["model.compile_backend=aot_eager"],  # graph capture and AOT autograd without inductor's C++ codegen (minutes)
    ["model.remove_padding=true"],
], ids=["padded-aot_eager", "packed-inductor"])
def test_compiled_forward_gives_the_same_update(pm, layout):
    """``model.compile``: log-probs and the update through torch.compile (dynamic shapes) equal the eager ones."""
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = _update(pm, "token-mean", ["model.compile=true", *layout])
    assert counters["stats"]["unique_graphs"] >= 2  # the scoring (no autograd) and the training forward
    _assert_same_update(_update(pm, "token-mean", layout), compiled, rtol=1e-4, atol=1e-5)


def _two_updates(pm, overrides, device="cpu"):
    """Two AdamW updates of the same batch; returns (worker, weights after)."""
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=2",
                               "actor.lr=1e-2", f"strategy.device={device}", *overrides], plugins=pm)
    module = GRPO(cfg)
    module.configure_model()
    torch.manual_seed(0)
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    batch = _rollout_batch(module)
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch)
    for _ in range(2):
        worker.update(batch)
    return worker, {k: v.detach().cpu().clone() for k, v in module.actor.state_dict().items()}


def _moments(worker):
    return [v for state in worker.optimizer.state.values() for v in state.values() if v.dim() > 0]


def test_update_frees_gradients_and_offloaded_optimizer_state_round_trips(pm):
    """Gradients are dropped after every update; ``strategy.offload_optimizer`` (optimizer state in CPU memory
    between updates, moved back for the next one) changes nothing in the result. On a CPU machine the move
    itself is a no-op: ``test_offloaded_optimizer_state_leaves_the_gpu`` checks it on a GPU."""
    plain, weights = _two_updates(pm, [])
    offloaded, weights_offloaded = _two_updates(pm, ["strategy.offload_optimizer=true"])
    for k in weights:
        torch.testing.assert_close(weights_offloaded[k], weights[k], rtol=0, atol=0, msg=k)
    for worker in (plain, offloaded):
        assert all(p.grad is None for p in worker.model.parameters())
    assert _moments(offloaded) and all(m.device.type == "cpu" for m in _moments(offloaded))


def test_a_stateless_optimizers_state_loads_and_another_optimizers_is_refused(pm):
    """SGD without momentum keeps no per-parameter state: its checkpoint restores the groups' settings (torch's loader
    cannot place an empty state on a device). A state written by another optimizer is refused by name."""
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4"], plugins=pm)
    strategy = pm.registry.strategy.get("single")(cfg)

    def worker(module_class):
        module = module_class(cfg)
        module.configure_model()
        return ActorWorker(cfg, module, strategy)

    sgd = worker(SGDGRPO)
    batch = _rollout_batch(sgd.module)
    batch[B.OLD_LOG_PROBS] = sgd.compute_log_probs(batch)
    sgd.update(batch)
    state = sgd.state_dict()
    assert state["optimizer"]["state"] == {}
    again = worker(SGDGRPO)
    again.optimizer.param_groups[0]["lr"] = 0.5
    again.load_state_dict(state)
    assert again.optimizer.param_groups[0]["lr"] == sgd.optimizer.param_groups[0]["lr"]
    with pytest.raises(RLForgeError, match=r"The checkpoint's optimizer state lacks what this run's optimizer "
                                           r"\(AdamW\) holds: amsgrad, betas, .* It was written by another optimizer"):
        worker(GRPO).load_state_dict(state)


def test_a_scheduler_added_or_dropped_on_resume_is_not_another_optimizer(pm):
    """A scheduler marks its optimizer's groups (initial_lr): a resume that drops it (Lightning's bare optimizer) or
    adds one loads the optimizer's state as it is, AdamW's moments included."""
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4"], plugins=pm)
    strategy = pm.registry.strategy.get("single")(cfg)

    def worker(given):
        module = type("Mine", (Returns,), {"given": staticmethod(given)})(cfg)
        module.configure_model()
        return ActorWorker(cfg, module, strategy)

    scheduled = worker(lambda m: GRPO.configure_optimizers(m))  # AdamW and the configured schedule
    batch = _rollout_batch(scheduled.module)
    batch[B.OLD_LOG_PROBS] = scheduled.compute_log_probs(batch)
    scheduled.update(batch)
    state = scheduled.state_dict()
    assert "initial_lr" in state["optimizer"]["param_groups"][0]
    bare = worker(lambda m: torch.optim.AdamW(m.actor.parameters(), lr=1e-3))
    bare.load_state_dict(copy.deepcopy(state))
    moments = [v["exp_avg"] for v in bare.optimizer.state.values()]
    assert moments and "initial_lr" not in bare.optimizer.param_groups[0]
    again = worker(lambda m: GRPO.configure_optimizers(m))
    again.load_state_dict(bare.state_dict())  # and back: a scheduler added


class Returns(GRPO):
    """configure_optimizers returns ``self.given`` (a callable of the module)."""

    given = staticmethod(lambda module: None)

    def configure_optimizers(self):
        return self.given(self)


def test_what_configure_optimizers_returns_is_checked_and_a_bare_optimizer_is_taken(pm):
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4"], plugins=pm)

    def worker(given):
        module = type("Mine", (Returns,), {"given": staticmethod(given)})(cfg)
        module.configure_model()
        return ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))

    bare = worker(lambda m: torch.optim.SGD(m.actor.parameters(), lr=0.1))  # Lightning's form
    assert isinstance(bare.optimizer, torch.optim.SGD) and bare.scheduler is None
    for given, said in [(lambda m: (None, None), "returned a tuple of 2 (NoneType, NoneType)"),
                        (lambda m: None, "returned None"),
                        (lambda m: (torch.optim.SGD(m.actor.parameters(), lr=0.1), "cosine"),
                         "returned a scheduler of type str, which has no step() and state_dict()"),
                        (lambda m: (o := torch.optim.SGD(m.actor.parameters(), lr=0.1),
                                    torch.optim.lr_scheduler.ReduceLROnPlateau(o)),
                         "returned ReduceLROnPlateau, whose step() needs a metric")]:
        with pytest.raises(RLForgeError, match=r"^Mine.configure_optimizers\(\) " + re.escape(said)):
            worker(given)


def test_a_trained_roles_section_without_the_update_options_and_a_missing_role_section_are_named():
    from rlforge.build import Builder
    from rlforge.controller.remote import Role
    from rlforge.errors import ConfigError
    from rlforge.worker import TrainWorker

    class AuxWorker(TrainWorker):
        role = "actor"
        section_key = "algorithm"  # GRPO's algorithm section has none of the update's options

    manager = PluginManager(autoload=False)
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4"],
                      plugins=manager)
    module = GRPO(cfg)
    with pytest.raises(ConfigError, match=r"The 'actor' role's config section 'algorithm' lacks ppo_epochs, "
                                          r"ppo_mini_batch_size, .*grad_clip, which the update of a trained role reads"):
        AuxWorker(cfg, module, manager.registry.strategy.get("single")(cfg))
    manager.registry.role.register("aux", Role(AuxWorker, section="algorithm.aux"))
    module.worker_roles = lambda: ["actor", "aux"]  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match=r"The role 'aux' \(plugin .*\) reads its batch options from the config "
                                          r"section 'algorithm.aux' \(its Role's section\), which this config does not"):
        Builder(cfg, manager).roles(module)


def test_a_trained_role_without_an_optimizer_is_named(pm):
    from rlforge.worker import TrainWorker

    class AuxWorker(TrainWorker):
        role = "actor"

    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4"], plugins=pm)
    module = GRPO(cfg)
    module.configure_model()
    aux = AuxWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    with pytest.raises(RLForgeError, match=r"AuxWorker \(role 'actor'\) has no optimizer: its __init__ sets one with "
                                           r"self.optimize\("):
        aux.update(_rollout_batch(module))


@pytest.mark.gpu
def test_offloaded_optimizer_state_leaves_the_gpu(pm):
    worker, weights = _two_updates(pm, ["strategy.offload_optimizer=true"], device="cuda")
    assert all(m.device.type == "cpu" for m in _moments(worker))
    assert all(p.device.type == "cuda" and p.grad is None for p in worker.model.parameters())
    _, weights_on_gpu = _two_updates(pm, [], device="cuda")
    for k in weights:
        torch.testing.assert_close(weights[k], weights_on_gpu[k], msg=k)


def test_an_unknown_compile_backend_names_the_key():
    from rlforge.errors import RLForgeError
    from rlforge.ops import compile_forward

    with pytest.raises(RLForgeError, match=r"Unknown torch.compile backend 'nope' \(model.compile_backend\)"):
        compile_forward(torch.nn.Linear(2, 2), "nope")


def test_scoring_passes_cut_their_own_micro_batches(pm):
    """actor.log_prob / actor.ref_log_prob: the forward-only passes' micro-batches (memory only: same values)."""
    cfg = load_config("grpo", ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
                               "actor.use_kl_loss=true", "actor.log_prob.micro_batch_size=3",
                               "actor.ref_log_prob.max_tokens_per_micro_batch=144"], plugins=pm)
    module = GRPO(cfg)
    module.configure_model()
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    batch = _rollout_batch(module)
    sizes: list[int] = []
    forward = module.forward_responses
    module.forward_responses = lambda model, mb, t: sizes.append(len(mb)) or forward(model, mb, t)
    old = worker.compute_log_probs(batch)
    assert sizes == [3, 3, 3, 3, 3, 1]
    sizes.clear()
    ref = worker.compute_log_probs(batch, "ref")
    lengths = batch[B.ATTENTION_MASK].sum(-1).tolist()  # padded rows x the longest row within 144 tokens
    assert sizes == [len(rows) for rows in token_budget_plan(lengths, 144, packed=False)] and len(sizes) == 2
    with torch.no_grad():
        whole = forward(module.actor, batch, cfg.rollout.temperature).float()  # one pass over every row
    torch.testing.assert_close(old, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref, old, atol=1e-5, rtol=1e-5)  # the reference starts as the actor
