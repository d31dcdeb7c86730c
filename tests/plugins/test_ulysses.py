"""Ulysses sequence parallelism (``rlforge/ulysses.py``): pure functions here, collectives in ONE spawn of
2 CPU processes over gloo (one sequence-parallel group of 2) that runs every check and writes what it saw, against
the one-process results each rank computes itself on the same inputs:

- pad / slice / gather round trip for lengths that 2 does not divide;
- the sequence <-> heads all-to-all round trip, and its gradient;
- attention on packed rows (position-id resets: block-diagonal causal) equal to one process, sdpa and eager, with
  GQA (4 heads, 2 KV heads) and with fewer KV heads than ranks (1: repeated), outputs and q/k/v gradients;
- tiny Llama (GQA, sdpa and eager) and Qwen2 (1 KV head, attention biases) marked ``ops.sequence_parallel``: packed
  log-probs, entropy (at a temperature), ``sum pi^2`` and the parameter gradients (summed over the 2 ranks) equal to
  the unmarked model's (``ops.response_logprobs(remove_padding=True)``, ...), with a
  slice boundary inside a response (the label of the last position of rank 0's slice is rank 1's first token,
  verl #6068); critic values equal ``ops.response_values``;
- an exchange whose heads 2 does not divide names the sizes;
- the ``fsdp`` strategy with ``strategy.fsdp.sequence_parallel_size=2`` (one data-parallel group of 2 ranks, packed
  rows, token budgets): the workers' old and reference log-probs, one whole GRPO update with a KL loss (SGD: the
  weights after it and its metrics), critic values and one critic update (PPO) equal the ``single`` strategy's in one
  process; the per-rank token budget holds twice the tokens per micro-batch; the actor's sharded checkpoint written by
  both ranks restores a fresh worker whose next update is the same.

The config checks of ``strategy.fsdp.sequence_parallel_size`` are unit tests without processes.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from rlforge import batch as B
from rlforge import load_config, ops
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugin_manager import PluginManager
from rlforge import ulysses as U
from tests.plugins.megatron_cpu import free_port, launch_env

SP = 2
RTOL, ATOL = 1e-5, 1e-6
MODELS = ("llama", "llama_eager", "qwen2")


def _model(kind: str, seed: int = 0, critic: bool = False) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification, Qwen2Config, Qwen2ForCausalLM

    shape = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=128)
    torch.manual_seed(seed)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape, num_key_value_heads=1)).eval()
    config = LlamaConfig(**shape, num_key_value_heads=2, attn_implementation="eager" if kind.endswith("eager") else
                         "sdpa", **({"num_labels": 1} if critic else {}))
    return (LlamaForTokenClassification if critic else LlamaForCausalLM)(config).eval()


def _batch(resp_len: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """5 rows: prompts of 4 (some left-padded), responses of 1..7 tokens (right padding); 39 real tokens (odd)."""
    g = torch.Generator().manual_seed(1)
    prompts, responses = torch.randint(1, 96, (5, 4), generator=g), torch.randint(1, 96, (5, resp_len), generator=g)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[:2, :1] = 0
    lengths = torch.tensor([7, 1, 5, 2, 6])
    resp_mask = (torch.arange(resp_len)[None] < lengths[:, None]).long()
    advantages = torch.randn(5, resp_len, generator=g)
    return torch.cat([prompts, responses], 1), torch.cat([prompt_mask, resp_mask], 1), advantages


def _round_trips(sp: U.SequenceParallel) -> dict:
    out: dict = {}
    for n in (7, 8, 1):
        x = torch.arange(n)[None] + 10
        ids, pos = U.pad_packed(x, torch.arange(n)[None], sp.size)
        local = U.shard(ids, sp)[0].float().requires_grad_()
        whole = U.gather_seq(local, sp)
        (whole * torch.arange(len(whole))).sum().backward()
        out[f"gather{n}"] = (ids, pos, whole.detach(), local.grad)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 6, 16, generator=g)  # [b, heads, seq, d]
    local = U.shard(x.transpose(-1, -2), sp).transpose(-1, -2).clone().requires_grad_()  # this rank's 3 positions
    heads = U.all_to_all(local, 1, 2, sp)  # [b, 2 heads, 6, d]
    back = U.all_to_all(heads, 2, 1, sp)
    weight = torch.randn(heads.shape, generator=g)
    (heads * weight).sum().backward()
    out["a2a"] = (x, local.detach(), heads.detach(), back.detach(), local.grad, weight)
    try:
        U.all_to_all(torch.zeros(1, 3, 2, 4), 1, 2, sp)
    except RLForgeError as e:
        out["a2a_error"] = str(e)
    return out


def _attention(sp: U.SequenceParallel) -> dict:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    out: dict = {}
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]])  # 3 packed sequences, 10 tokens
    for kv in (2, 1):
        for inner in U.INNER:
            module = LlamaAttention(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=kv), 0)
            g = torch.Generator().manual_seed(3 + kv)
            q, k, v = (torch.randn(1, h, 10, 16, generator=g) for h in (4, kv, kv))
            weight = torch.randn(1, 10, 4, 16, generator=g)
            local = [U.shard(t.transpose(-1, -2), sp).transpose(-1, -2).clone().requires_grad_() for t in (q, k, v)]
            mine = replace(sp, inner=inner, segments=U.segment_bounds(pos))
            o, _ = U.ulysses_attention(module, *local, None, scaling=0.25, **{U.SP_KWARG: mine})
            (o * U.shard(weight.transpose(1, -1), sp).transpose(1, -1)).sum().backward()
            out[(kv, inner)] = (q, k, v, weight, o.detach(), [t.grad for t in local])
    return out


def _models(sp: U.SequenceParallel) -> dict:
    """Each model twice: as it is, and switched to Ulysses and marked for ``ops`` (``ops.sequence_parallel``)."""
    out: dict = {}
    ids, mask, adv = _batch()
    resp_len = adv.shape[1]
    _, _, before, _ = ops._pack(ids, mask, resp_len)
    out["packed"] = (int(mask.sum()), before)
    for kind in MODELS:
        single = _model(kind)
        model = copy.deepcopy(single)
        mine = U.use_ulysses(model, sp, "strategy.fsdp.sequence_parallel_size")
        ops.sequence_parallel(model, mine)
        results = []
        for m in (single, model):
            logp, ent = ops.response_logprobs(m, ids, mask, resp_len, temperature=0.7, with_entropy=True,
                                              remove_padding=True)
            ((logp * adv).sum() + 0.1 * ent.sum()).backward()
            results.append((logp.detach(), ent.detach(), {n: p.grad for n, p in m.named_parameters()},
                            ops.response_sum_pi_squared(m, ids, mask, resp_len, remove_padding=True)))
        for g in results[1][2].values():
            torch.distributed.all_reduce(g, group=sp.group)  # what FSDP's sum over the sp ranks does
        out[kind] = (mine.inner, model.config._attn_implementation, *results)
    critic = _model("llama", critic=True)
    values = ops.response_values(critic, ids, mask, resp_len, remove_padding=True)
    ops.sequence_parallel(critic, U.use_ulysses(critic, sp, "critic"))
    out["critic"] = (values.detach(), ops.response_values(critic, ids, mask, resp_len, remove_padding=True).detach())
    return out


# the workers on the shipped tiny model (2 heads, 2 KV heads): packed rows of 7 to 11 tokens, a per-rank token budget
WORKERS = ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2",
           "actor.lr=1e-2", "critic.lr=1e-2", "actor.entropy_coeff=0.01", "actor.use_kl_loss=true",
           "model.remove_padding=true", "actor.max_tokens_per_micro_batch=24", "critic.max_tokens_per_micro_batch=24",
           "data.max_prompt_length=16"]
SEQUENCE_PARALLEL = ["strategy.name=fsdp", "strategy.device=cpu", f"strategy.num_processes={SP}",
                     "trainer.controller=ray", f"strategy.fsdp.sequence_parallel_size={SP}"]


def _workers(pm: PluginManager, extra: list[str], out_dir: str | None = None) -> dict:
    """Old and reference log-probs, one GRPO update (SGD), critic values and one critic update (PPO), on a strategy
    built from ``WORKERS + extra``; with ``out_dir``, the actor saved sharded after its update, restored into a fresh
    worker, and one more update taken by both."""
    from rlforge.algorithms.ppo import PPO
    from rlforge.worker import ActorWorker, CriticWorker
    from tests.controller.test_worker import SGDGRPO, _rollout_batch

    class SGDPPO(PPO):
        def configure_critic_optimizers(self):
            return torch.optim.SGD(self.critic.parameters(), lr=self.config.critic.lr), None

    out: dict = {}
    cfg = load_config("grpo", [*WORKERS, *extra], plugins=pm)
    module = SGDGRPO(cfg)
    module.configure_model()
    actor = ActorWorker(cfg, module, pm.registry.strategy.get(cfg.strategy.name)(cfg))
    batch = _rollout_batch(module, group=4)
    out["log_probs"] = actor.compute_log_probs(batch)
    out["ref_log_probs"] = actor.compute_log_probs(batch, "ref")
    batch[B.OLD_LOG_PROBS] = out["log_probs"] + 0.05 * batch[B.RESPONSE_MASK]
    batch[B.REF_LOG_PROBS] = out["ref_log_probs"] - 0.03 * batch[B.RESPONSE_MASK]
    out["micro_batches"] = len(actor.micro_plan(batch.select(list(range(8)))))
    out["metrics"] = actor.update(batch)
    out["weights"] = actor.model_state_dict()  # complete on rank 0
    if out_dir is not None:  # resume with sp: shards written by both ranks, read into a fresh worker
        from pathlib import Path

        small = actor.save_sharded(Path(out_dir) / "dcp")
        restored = SGDGRPO(cfg)
        restored.configure_model()
        fresh = ActorWorker(cfg, restored, pm.registry.strategy.get(cfg.strategy.name)(cfg))
        fresh.load_sharded(Path(out_dir) / "dcp", small)
        out["after_resume"] = []
        for w in (actor, fresh):
            w.update(batch)
            out["after_resume"].append(w.model_state_dict())
    ppo_cfg = load_config("ppo", [*WORKERS, *extra], plugins=pm)
    ppo = SGDPPO(ppo_cfg)
    ppo.roles = frozenset({"critic"})
    torch.manual_seed(0)  # the critic's fresh scalar head
    ppo.configure_model()
    critic = CriticWorker(ppo_cfg, ppo, pm.registry.strategy.get(ppo_cfg.strategy.name)(ppo_cfg))
    out["values"] = critic.compute_values(batch)
    batch[B.VALUES] = out["values"]
    batch[B.RETURNS] = out["values"] + batch[B.ADVANTAGES]
    out["critic_metrics"] = critic.update(batch)
    out["critic_weights"] = critic.model_state_dict()
    return out


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    launch_env(rank, SP, port)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=SP)
    mesh = U.sequence_parallel_mesh("cpu", SP, SP)
    sp = U.from_mesh(mesh)
    out = {"sp": (sp.size, sp.rank), **_round_trips(sp), "attention": _attention(sp), "models": _models(sp)}
    pm = PluginManager(autoload=False)
    out["workers"] = _workers(pm, SEQUENCE_PARALLEL, out_dir)
    if rank == 0:  # the one-process reference, while rank 1 waits
        out["single_workers"] = _workers(pm, [])
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("ulysses")
    mp.spawn(_rank_main, args=(free_port(), str(out_dir)), nprocs=SP, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(SP)]


def _slice(t: torch.Tensor, rank: int, dim: int) -> torch.Tensor:
    return t.chunk(SP, dim=dim)[rank]


# --- pure functions -----------------------------------------------------------------------------------------------

def test_pad_packed_appends_a_sequence_of_its_own():
    ids, pos = U.pad_packed(torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 0]]), 4)
    assert ids.tolist() == [[5, 6, 7, 0]] and pos.tolist() == [[0, 1, 0, 0]]
    ids, pos = U.pad_packed(torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 2]]), 5)
    assert ids.tolist() == [[5, 6, 7, 0, 0]] and pos.tolist() == [[0, 1, 2, 0, 1]]
    same = torch.tensor([[1, 2]])
    assert U.pad_packed(same, same, 2)[0] is same


def test_shift_labels_before_slicing_keeps_the_label_across_the_slice_boundary():
    ids = torch.tensor([[10, 11, 12, 13]])
    labels = U.shift_labels(ids)
    first = U.SequenceParallel(None, 2, 0)
    assert U.shard(labels, first).tolist() == [[11, 12]]  # position 1 predicts 12, held by rank 1
    assert U.shift_labels(U.shard(ids, first)).tolist() == [[11, 10]]  # shifting after slicing loses it (#6068)


def test_segment_bounds_by_hand():
    assert U.segment_bounds(torch.tensor([[0, 1, 2, 0, 1]])) == (0, 3, 5)
    assert U.segment_bounds(torch.tensor([[0, 1, 0, 0, 1, 2, 3]])) == (0, 2, 3, 7)
    assert U.segment_bounds(torch.tensor([[4, 5, 6]])) == (0, 3)  # a row that starts mid-sequence: one sequence


def test_causal_mask_by_hand():
    assert U.causal_mask(3, "sdpa") is None  # sdpa's is_causal
    mask = U.causal_mask(3, "eager")
    low = torch.finfo(torch.float32).min
    assert mask.shape == (1, 1, 3, 3) and mask[0, 0].tolist() == [[0, low, low], [0, 0, low], [0, 0, 0]]


def test_kv_heads_are_repeated_only_when_fewer_than_ranks():
    assert [U.kv_repeats(kv, 4) for kv in (1, 2, 4, 8)] == [4, 2, 1, 1]


def test_shard_refuses_a_length_the_ranks_do_not_divide():
    with pytest.raises(RLForgeError, match="a sequence of 5 tokens does not split into 2 equal slices"):
        U.shard(torch.zeros(1, 5), U.SequenceParallel(None, 2, 1))


@pytest.mark.parametrize(("heads", "kv"), [(3, 3), (3, 1), (6, 3)])
def test_divisibility_errors_name_the_sizes(heads, kv):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=16 * heads, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=heads, num_key_value_heads=kv))
    with pytest.raises(ConfigError, match=rf"strategy.fsdp.sequence_parallel_size=2 does not fit the model's {heads} "
                                          rf"attention heads and {kv} KV heads"):
        U.use_ulysses(model, U.SequenceParallel(None, 2, 0), "strategy.fsdp.sequence_parallel_size")
    assert model.config._attn_implementation != U.ATTENTION


def test_other_attention_implementations_are_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=8, num_hidden_layers=1,
                                         num_attention_heads=2, attn_implementation="flex_attention"))
    with pytest.raises(ConfigError, match="needs attention 'sdpa' or 'eager'.*uses 'flex_attention'"):
        U.use_ulysses(model, U.SequenceParallel(None, 2, 0), "critic.sp")


def test_mesh_size_must_divide_the_ranks():
    with pytest.raises(ConfigError, match="sequence parallel size 3 must be >= 1 and divide the 4 ranks"):
        U.sequence_parallel_mesh("cpu", 4, 3)


def test_a_switched_model_outside_the_sequence_parallel_path_is_refused():
    """No mask is built for rlforge_ulysses: a plain forward (generation, say) must not run without one."""
    model = _model("llama")
    U.use_ulysses(model, U.SequenceParallel(None, 2, 0), "k")
    with pytest.raises(RLForgeError, match="uses attention 'rlforge_ulysses', which runs only in the packed"):
        model(input_ids=torch.tensor([[1, 2, 3]]))


# --- two processes ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_pad_slice_gather_round_trip(ranks):
    assert [r["sp"] for r in ranks] == [(SP, 0), (SP, 1)]
    for n in (7, 8, 1):
        for rank, r in enumerate(ranks):
            ids, pos, whole, grad = r[f"gather{n}"]
            padded = -(-n // SP) * SP
            assert ids.shape == (1, padded) and ids[0, :n].tolist() == list(range(10, 10 + n))
            assert whole.tolist() == ids[0].float().tolist()  # every rank gathers the whole padded row
            assert grad.tolist() == _slice(torch.arange(padded).float(), rank, 0).tolist()  # its slice, unscaled


@pytest.mark.slow
def test_all_to_all_round_trip_and_gradient(ranks):
    for rank, r in enumerate(ranks):
        x, local, heads, back, grad, weight = r["a2a"]
        torch.testing.assert_close(heads, _slice(x, rank, 1))  # the whole sequence of this rank's 2 heads
        torch.testing.assert_close(back, local)
    for rank, r in enumerate(ranks):  # d(sum heads_j * weight_j)/d local_i: rank j's weight at rank i's positions
        expected = torch.cat([_slice(ranks[j]["a2a"][5], rank, 2) for j in range(SP)], 1)
        torch.testing.assert_close(r["a2a"][4], expected)
    assert "cannot split dimension 1 of size 3" in ranks[0]["a2a_error"]


def _reference_attention(q, k, v, weight, starts):
    """Each packed sequence on its own, causal, GQA by repetition; output [1, T, H, d] and the q/k/v gradients."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    ks, vs = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    parts = [torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], ks[:, :, a:b], vs[:, :, a:b],
                                                              is_causal=True, scale=0.25)
             for a, b in zip(starts, starts[1:])]
    out = torch.cat(parts, 2).transpose(1, 2)
    (out * weight).sum().backward()
    return out.detach(), [q.grad, k.grad, v.grad]


@pytest.mark.slow
def test_attention_on_packed_rows_equals_one_process(ranks):
    for (kv, inner), (q, k, v, weight, _, _) in ranks[0]["attention"].items():
        out, grads = _reference_attention(q, k, v, weight, [0, 4, 7, 10])
        for rank, r in enumerate(ranks):
            _, _, _, _, o, local_grads = r["attention"][(kv, inner)]
            torch.testing.assert_close(o, _slice(out, rank, 1), rtol=RTOL, atol=ATOL, msg=f"{kv} kv, {inner}")
            for name, got, full in zip("qkv", local_grads, grads):
                torch.testing.assert_close(got, _slice(full, rank, 2), rtol=RTOL, atol=ATOL,
                                           msg=f"{name}, {kv} kv, {inner}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", MODELS)
def test_model_logprobs_and_gradients_equal_one_process(ranks, kind):
    length, before = ranks[0]["models"]["packed"]
    assert length % SP and -(-length // SP) in (before + 1).tolist()  # padded; a label crosses the slice boundary
    for r in ranks:
        inner, attn, single, sharded = r["models"][kind]
        assert (inner, attn) == ("eager" if kind.endswith("eager") else "sdpa", U.ATTENTION)
        for name, want, got in zip(("log-probs", "entropy", "", "sum pi^2"), single, sharded):
            if name:
                torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=name)
        grads, sp_grads = single[2], sharded[2]
        assert grads.keys() == sp_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(sp_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_critic_values_equal_one_process(ranks):
    for r in ranks:
        values, sp_values = r["models"]["critic"]
        torch.testing.assert_close(sp_values, values, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_fsdp_sequence_parallel_workers_equal_one_process(ranks):
    """Log-probs, reference log-probs, one GRPO update, critic values and one critic update with sp=2 equal the single
    strategy's; every rank of the group holds the same gathered results."""
    single = ranks[0]["single_workers"]
    for r in ranks:
        w = r["workers"]
        for key in ("log_probs", "ref_log_probs", "values"):
            torch.testing.assert_close(w[key], single[key], rtol=RTOL, atol=ATOL, msg=key)
        for key in ("metrics", "critic_metrics"):
            for name, value in single[key].items():
                assert w[key][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
        assert w["micro_batches"] < single["micro_batches"]  # the budget is per rank: 2 ranks hold twice the tokens
    assert single["metrics"]["actor/kl_loss"] > 0 and single["metrics"]["actor/grad_norm"] > 0
    sp = ranks[0]["workers"]
    assert ranks[1]["workers"]["weights"] == {}  # gathered on rank 0 only
    for key in ("weights", "critic_weights"):
        assert sp[key].keys() == single[key].keys()
        for name, w in single[key].items():
            torch.testing.assert_close(sp[key][name], w, rtol=1e-4, atol=1e-6, msg=f"{key} {name}")


@pytest.mark.slow
def test_fsdp_sequence_parallel_resumes_from_sharded_checkpoints(ranks):
    """Shards written by the 2 sequence-parallel ranks restore a fresh worker: its next update equals the original's."""
    kept, resumed = ranks[0]["workers"]["after_resume"]
    before = ranks[0]["workers"]["weights"]
    assert kept.keys() == resumed.keys() == before.keys()
    assert all(not torch.equal(w, before[name]) for name, w in kept.items())  # the second update moved every weight
    for name, w in kept.items():
        torch.testing.assert_close(resumed[name], w, rtol=0, atol=0, msg=name)


# --- the strategy's config checks (no processes) ------------------------------------------------------------------

SP_BASE = ["strategy.name=fsdp", "trainer.controller=ray", "data.train_batch_size=4", "rollout.n=4",
           "actor.ppo_mini_batch_size=2"]


@pytest.fixture(scope="module")
def pm() -> PluginManager:
    return PluginManager(autoload=False)


@pytest.mark.parametrize(("extra", "message"), [
    (["strategy.num_processes=2", "strategy.fsdp.sequence_parallel_size=2"],
     r"strategy.fsdp.sequence_parallel_size=2 slices packed sequences: set model.remove_padding=true"),
    (["strategy.num_processes=3", "strategy.fsdp.sequence_parallel_size=2", "model.remove_padding=true"],
     r"strategy.fsdp.sequence_parallel_size=2 must be >= 1 and divide strategy.num_processes=3"),
    (["strategy.num_processes=2", "strategy.fsdp.sequence_parallel_size=0", "model.remove_padding=true"],
     r"strategy.fsdp.sequence_parallel_size=0 must be >= 1"),
    (["strategy.name=tp", "strategy.num_processes=4", "strategy.fsdp.sequence_parallel_size=2",
      "model.remove_padding=true"], r"read by strategy.name=fsdp; strategy.name=tp lays out its own device mesh"),
    (["strategy.num_processes=2", "strategy.fsdp.sequence_parallel_size=2", "model.remove_padding=true",
      "actor.max_tokens_per_micro_batch=35"],  # 72 tokens over 2 ranks: 36 per rank
     r"\(35\) must hold the longest sequence: \(data.max_prompt_length \+ rollout.max_new_tokens\) / "
     r"strategy.fsdp.sequence_parallel_size=2 = 36 tokens per rank"),
    (["strategy.name=single", "strategy.num_processes=1", "strategy.fsdp.sequence_parallel_size=2",
      "model.remove_padding=true"], r"read by strategy.name=fsdp, but this run's strategy is strategy.name=single"),
], ids=["padded", "indivisible", "zero", "tp", "budget", "other strategy"])
def test_sequence_parallel_config_errors_name_the_keys(pm, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config("grpo", [*SP_BASE, *extra], plugins=pm)


def test_sequence_parallel_groups_are_the_data_parallel_unit(pm):
    """4 ranks with sp=2 are 2 data-parallel groups: the batch arithmetic counts groups, not ranks."""
    cfg = load_config("grpo", [*SP_BASE, "strategy.num_processes=4", "strategy.fsdp.sequence_parallel_size=2",
                               "model.remove_padding=true"], plugins=pm)
    assert pm.registry.strategy.entry("fsdp").capabilities.data_parallel_size(cfg) == 2
    load_config("grpo", [*SP_BASE, "strategy.num_processes=2", "strategy.fsdp.sequence_parallel_size=2",
                         "model.remove_padding=true", "actor.max_tokens_per_micro_batch=36"], plugins=pm)  # per rank
    with pytest.raises(ConfigError, match="over 2 data-parallel groups"):  # a mini-batch of 3 sequences
        load_config("grpo", [*SP_BASE, "rollout.n=3", "actor.ppo_mini_batch_size=1", "strategy.num_processes=4",
                             "strategy.fsdp.sequence_parallel_size=2", "model.remove_padding=true"], plugins=pm)
