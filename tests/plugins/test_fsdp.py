"""``fsdp`` strategy over 2 CPU processes (gloo), against one process on the same batch.

One spawn of 2 ranks checks, with plain SGD (Adam's first step is sign-like and would amplify float noise):
loss metrics, clipped gradients and updated weights equal the single-process update within
``RTOL``/``ATOL``; log-probs match; the batch holds 4 samples of each prompt (rows shuffled), so the ranks'
micro-batches that repeat a prompt run it once (``model.shared_prefix``: two forward passes, the prompts' and the
responses' on their KV cache, before one backward through the sharded model); after a weight sync the rollout
replica equals the gathered weights exactly, never holding more than one bucket of gathered tensors, and greedy
generations equal one process's.
With AdamW: sharded and full checkpoints restore the model and optimizer bit for bit.
With parameter offload (``strategy.fsdp.offload_params``, FSDP2's CPUOffloadPolicy on the actor and the reference):
the policy reaches every ``fully_shard``, and log-probs, the SGD update, the streamed weights and an AdamW update
(with ``strategy.offload_optimizer``) equal the ones without offload. On CPU ranks this checks the wiring and the
arithmetic, not the memory moves a GPU would make.
"""

from __future__ import annotations

import copy
import os
import weakref

import pytest
import torch
import torch.multiprocessing as mp

from rlforge import batch as B
from rlforge import load_config, ops
from rlforge.algorithms.grpo import GRPO
from rlforge.controller.dispatch import shard_for_update, split_even, split_rows
from rlforge.plugin_manager import PluginManager
from rlforge.sampling import SamplingParams
from rlforge.worker import ActorWorker
from tests.controller.test_worker import SGDGRPO, _rollout_batch
from tests.plugins.megatron_cpu import free_port

WORLD = 2
RTOL, ATOL = 1e-5, 1e-7  # float32; the two runs differ only in the order of the summations
BUCKET_MB = 0.3  # the largest parameter of the tiny model (MLP, 128 x 512 fp32) is 0.25 MiB
COMMON = ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size=4",
          "actor.lr=1e-2", "actor.entropy_coeff=0.01", "actor.grad_clip=0.05"]

FAST = [*(c for c in COMMON if "micro" not in c), "model.remove_padding=true", "actor.max_tokens_per_micro_batch=24",
        "data.max_prompt_length=16"]


def _config(pm, *extra):
    return load_config("grpo", [*COMMON, *extra], plugins=pm)


def _worker(pm, cfg, module_cls):
    module = module_cls(cfg)
    module.configure_model()
    torch.manual_seed(0)
    return ActorWorker(cfg, module, pm.registry.strategy.get(cfg.strategy.name)(cfg)), module


def _record_grads(worker, full: bool) -> dict:
    """Filled with the gradients of each optimizer step as it is taken (an update frees them when it ends)."""
    grads: dict = {}
    step = worker.optimizer.step

    def recording_step(*args, **kwargs):
        grads.update({n: p.grad.full_tensor() if full else p.grad.clone() for n, p in worker.model.named_parameters()})
        return step(*args, **kwargs)

    worker.optimizer.step = recording_step
    return grads


def _greedy(engine, prompts):
    return engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=6))[B.RESPONSES]


def _rank_main(rank: int, port: int, inputs: dict, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    pm = PluginManager(autoload=False)
    dist = ["strategy.name=fsdp", "strategy.device=cpu", f"strategy.num_processes={WORLD}", "trainer.controller=ray",
            f"strategy.fsdp.weight_sync_bucket_mb={BUCKET_MB}"]
    cfg = _config(pm, *dist)
    out: dict = {}
    # 1. SGD update on this rank's share of the same batch, counting the forward passes that shared prompts
    worker, module = _worker(pm, cfg, SGDGRPO)
    batch = inputs["batch"]
    shared = ops._shared_prefix_forward
    ops._shared_prefix_forward = lambda *a, **k: out.update(shared_forwards=out.get("shared_forwards", 0) + 1) or (
        shared(*a, **k))
    out["log_probs"] = worker.compute_log_probs(split_even(batch, WORLD, "test")[rank])
    out["grads"] = _record_grads(worker, full=True)
    out["metrics"] = worker.update(shard_for_update(batch, WORLD, 8)[rank])
    ops._shared_prefix_forward = shared
    out["weights"] = worker.model_state_dict()
    # 2. weight sync into the rollout replica, measuring the gathered tensors the stream keeps alive
    refs: list[weakref.ref] = []
    peak = 0
    replica = dict(worker.rollout_model.named_parameters())
    for name, tensor in worker.named_weights():
        refs.append(weakref.ref(tensor))
        peak = max(peak, sum(r().numel() * r().element_size() for r in refs if r() is not None))
        with torch.no_grad():
            replica[name].copy_(tensor)
        del tensor  # a consumer that keeps nothing: what stays alive is the stream's bucket
    out["peak_gathered_bytes"] = peak
    out["replica"] = {k: v.detach().clone() for k, v in worker.rollout_model.state_dict().items()}
    engine = pm.registry.rollout.get("hf")(cfg, worker.rollout_model, module.tokenizer)
    out["greedy"] = _greedy(engine, split_rows(inputs["prompts"], WORLD)[rank])
    # 3. AdamW: save full and sharded after one update, restore into fresh workers, take one more step each
    adam, _ = _worker(pm, cfg, GRPO)
    shard = shard_for_update(batch, WORLD, 8)[rank]
    adam.update(shard)
    adam.compute_log_probs(split_even(batch, WORLD, "test")[rank])  # FSDP2 keeps the root gathered after it
    full = [adam.state_dict(), adam.model_state_dict()]  # complete on rank 0 only
    torch.distributed.broadcast_object_list(full, src=0)  # as the Ray controller sends rank 0's state to all
    full = copy.deepcopy(full)  # as read back from a file: rank 0's dict shares tensors (step) with its optimizer
    out["adam_weights"] = copy.deepcopy(full[1])  # after one AdamW update (loading full[1] below changes it)
    small = adam.save_sharded(os.path.join(out_dir, "dcp"))
    from_sharded, _ = _worker(pm, cfg, GRPO)
    from_sharded.load_sharded(os.path.join(out_dir, "dcp"), small)
    from_full, _ = _worker(pm, cfg, GRPO)
    from_full.load_model_state_dict(full[1])
    from_full.load_state_dict(full[0])
    workers = (adam, from_sharded, from_full)
    out["restored_optimizer"] = [copy.deepcopy(w.state_dict()["optimizer"].get("state")) for w in workers]  # rank 0
    for w in workers:
        w.update(shard)
    out["after_resume"] = [w.model_state_dict() for w in workers]
    # 4. the fast path: packed sequences in token-budget micro-batches (the ranks agree on how many), rows
    # spread over the ranks by length instead of consecutively
    fast_cfg = load_config("grpo", [*FAST, "strategy.name=fsdp", "strategy.device=cpu",
                                    f"strategy.num_processes={WORLD}", "trainer.controller=ray"], plugins=pm)
    fast, _ = _worker(pm, fast_cfg, SGDGRPO)
    out["fast_micro_batches"] = len(fast.micro_plan(shard_for_update(batch, WORLD, 8, balance=True)[rank]))
    fast.update(shard_for_update(batch, WORLD, 8, balance=True)[rank])
    out["fast_weights"] = fast.model_state_dict()
    # 5. parameter offload: the actor's and the reference's shards in CPU memory (FSDP2 CPUOffloadPolicy)
    offload = [*dist, "strategy.fsdp.offload_params=[actor,ref]", "strategy.offload_optimizer=true",
               "actor.use_kl_loss=true", "actor.kl_loss_coef=0"]  # a reference model whose KL term weighs 0
    off, off_module = _worker(pm, _config(pm, *offload), SGDGRPO)
    out["offload_policies"] = [type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
                               for m in (off.model, off_module.ref) for m in m.modules() if hasattr(m, "_get_fsdp_state")]
    rows = split_even(batch, WORLD, "test")[rank]
    out["offload_log_probs"] = [off.compute_log_probs(rows, role) for role in ("actor", "ref")]
    with_ref = shard_for_update(batch, WORLD, 8)[rank]
    with_ref[B.REF_LOG_PROBS] = with_ref[B.OLD_LOG_PROBS]
    off.update(with_ref)
    out["offload_weights"] = off.model_state_dict()
    out["offload_streamed"] = {n: t.clone() for n, t in off.named_weights()}
    off_adam, _ = _worker(pm, _config(pm, *offload), GRPO)
    with_ref = shard.select(list(range(len(shard))))
    with_ref[B.REF_LOG_PROBS] = with_ref[B.OLD_LOG_PROBS]
    off_adam.update(with_ref)
    out["offload_adam_weights"] = off_adam.model_state_dict()
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _spawn(inputs: dict, out_dir) -> list[dict]:
    mp.spawn(_rank_main, args=(free_port(), inputs, str(out_dir)), nprocs=WORLD, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def fsdp_vs_single(tmp_path_factory):
    pm = PluginManager(autoload=False)
    cfg = _config(pm)
    worker, module = _worker(pm, cfg, SGDGRPO)
    batch = _rollout_batch(module, group=4)
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch) + 0.05 * batch[B.RESPONSE_MASK]
    prompts = B.Batch({B.PROMPTS: batch[B.PROMPTS][:5], B.PROMPT_MASK: batch[B.PROMPT_MASK][:5]})
    ref_log_probs = worker.compute_log_probs(batch)
    grads = _record_grads(worker, full=False)
    metrics = worker.update(batch)
    single = {
        "log_probs": ref_log_probs, "metrics": metrics, "grads": grads,
        "weights": {k: v.clone() for k, v in module.actor.state_dict().items()},
    }
    inputs = {"batch": batch, "prompts": prompts}
    ranks = _spawn(inputs, tmp_path_factory.mktemp("fsdp"))
    engine = pm.registry.rollout.get("hf")(cfg, _plain_model(module, ranks[0]["weights"]), module.tokenizer)
    single["greedy"] = [_greedy(engine, part) for part in split_rows(prompts, WORLD)]  # the ranks' shapes
    return single, ranks


def _plain_model(module, weights):
    model = type(module.actor)(module.actor.config)
    model.load_state_dict(weights)
    return model


def test_fast_path_update_on_two_processes_matches_one_process(fsdp_vs_single):
    single, ranks = fsdp_vs_single
    assert all(r["fast_micro_batches"] > 1 for r in ranks)  # the budget did split the mini-batch
    for k, v in single["weights"].items():
        torch.testing.assert_close(ranks[0]["fast_weights"][k], v, rtol=1e-4, atol=1e-6, msg=k)


def test_two_process_update_matches_one_process(fsdp_vs_single):
    single, ranks = fsdp_vs_single
    assert all(r["shared_forwards"] >= 2 for r in ranks)  # log-probs and the update shared prompts on each rank
    for r in ranks:  # metrics are all-reduced: every rank reports the mini-batch-wide values
        for k, v in single["metrics"].items():
            assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert single["metrics"]["actor/grad_norm"] > 0.05  # clipping was active, across the shards
    torch.testing.assert_close(torch.cat([r["log_probs"] for r in ranks]), single["log_probs"], rtol=RTOL, atol=1e-6)
    for name, grad in single["grads"].items():
        for r in ranks:
            torch.testing.assert_close(r["grads"][name], grad, rtol=RTOL, atol=ATOL, msg=name)
    assert ranks[1]["weights"] == {}  # gathered on rank 0 only
    for name, w in single["weights"].items():
        torch.testing.assert_close(ranks[0]["weights"][name], w, rtol=RTOL, atol=ATOL, msg=name)


def test_weight_sync_streams_buckets_and_the_replica_equals_the_gathered_weights(fsdp_vs_single):
    single, ranks = fsdp_vs_single
    gathered = ranks[0]["weights"]
    for r in ranks:
        assert r["replica"].keys() == gathered.keys()
        for name, w in gathered.items():
            assert torch.equal(r["replica"][name], w), name
        assert r["peak_gathered_bytes"] <= BUCKET_MB * 2**20  # one bucket alive beyond the model, never more
    # greedy generations of each replica equal a plain single-process model's with the gathered weights
    for r, expected in zip(ranks, single["greedy"]):
        assert torch.equal(r["greedy"], expected)


def test_full_and_sharded_checkpoints_restore_model_and_optimizer_exactly(fsdp_vs_single):
    _, ranks = fsdp_vs_single
    saved, from_sharded, from_full = ranks[0]["restored_optimizer"]
    for restored in (from_sharded, from_full):
        assert restored.keys() == saved.keys()
        for name, st in saved.items():
            for k, v in st.items():
                assert torch.equal(torch.as_tensor(restored[name][k]), torch.as_tensor(v)), (name, k)
    reference, *others = ranks[0]["after_resume"]
    for other in others:
        for name, w in reference.items():
            assert torch.equal(other[name], w), name


def test_parameter_offload_reaches_fully_shard_and_computes_the_same(fsdp_vs_single):
    single, ranks = fsdp_vs_single
    for r in ranks:
        assert r["offload_policies"] and set(r["offload_policies"]) == {"CPUOffloadPolicy"}  # every shard, both models
        assert r["offload_streamed"].keys() == single["weights"].keys()
    for i in range(2):  # the actor's and the reference's
        torch.testing.assert_close(torch.cat([r["offload_log_probs"][i] for r in ranks]), single["log_probs"],
                                   rtol=RTOL, atol=1e-6)
    for name, w in single["weights"].items():
        torch.testing.assert_close(ranks[0]["offload_weights"][name], w, rtol=RTOL, atol=ATOL, msg=name)
        torch.testing.assert_close(ranks[1]["offload_streamed"][name], w, rtol=RTOL, atol=ATOL, msg=name)
    assert ranks[0]["adam_weights"]
    for name, w in ranks[0]["adam_weights"].items():  # AdamW stepping on the CPU shards, its state offloaded
        torch.testing.assert_close(ranks[0]["offload_adam_weights"][name], w, rtol=RTOL, atol=ATOL, msg=name)


def test_offload_params_names_roles_on_the_fsdp_strategy_itself():
    from rlforge.errors import ConfigError

    pm = PluginManager(autoload=False)
    dist = ["strategy.device=cpu", "strategy.num_processes=2", "trainer.controller=ray"]
    with pytest.raises(ConfigError, match=r"strategy.fsdp.offload_params=\['actor', 'rollout'\]: unknown role\(s\) "
                                          r"'rollout'. Allowed: actor, ref, critic"):
        _config(pm, "strategy.name=fsdp", *dist, "strategy.fsdp.offload_params=[actor,rollout]")
    with pytest.raises(ConfigError, match="strategy.fsdp.offload_params is read by strategy.name=fsdp; "
                                          "strategy.name=tp"):
        _config(pm, "strategy.name=tp", *dist, "strategy.fsdp.offload_params=[actor]")
    with pytest.raises(ConfigError, match=r"this run's strategy is strategy.name=single: set strategy.name=fsdp or "
                                          r"strategy.fsdp.offload_params=\[\]"):  # nothing else would offload
        _config(pm, "strategy.fsdp.offload_params=[actor]")


def test_fsdp_under_the_local_controller_says_to_use_a_launcher(tmp_path):
    from rlforge.errors import ConfigError

    with pytest.raises(ConfigError, match="needs one process per rank.*Set trainer.controller=ray, or torchrun"):
        load_config("grpo", [*COMMON, "strategy.name=fsdp", f"trainer.runs_root={tmp_path}"])  # when composed


def test_nccl_on_a_cpu_device_is_refused_when_composed_or_when_the_rank_starts(monkeypatch):
    """nccl reduces CUDA tensors only: with strategy.device=cpu refused when the config is composed; with
    strategy.device=auto, on a rank that sees no GPU, when its strategy starts (before the process group: no gloo
    or nccl set-up to time out)."""
    from rlforge.errors import ConfigError

    pm = PluginManager(autoload=False)
    dist = ["strategy.name=fsdp", "strategy.num_processes=2", "trainer.controller=ray", "strategy.fsdp.backend=nccl"]
    with pytest.raises(ConfigError, match=r"^strategy.fsdp.backend=nccl reduces CUDA tensors only, and "
                                          r"strategy.device=cpu: set strategy.fsdp.backend=gloo or auto"):
        _config(pm, *dist, "strategy.device=cpu")
    if torch.cuda.is_available():
        return
    cfg = _config(pm, *dist, "strategy.device=auto")
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"^strategy.fsdp.backend=nccl reduces CUDA tensors only, and this rank's "
                                          r"device is cpu"):
        pm.registry.strategy.get("fsdp")(cfg)
    assert not torch.distributed.is_initialized()
