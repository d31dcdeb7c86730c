"""``tp`` strategy (DTensor tensor parallel x FSDP2) over CPU processes (gloo), against one process.

With plain SGD and clipping active: log-probs, loss metrics, the clipped gradient norm, every gradient (gathered)
and the updated weights equal the single-process update within float tolerance; ``named_weights`` streams the
full tensors that the rollout engine needs, equal to the gathered state dict; a sharded checkpoint restores
model and AdamW state exactly. 2 ranks = one tensor-parallel group (tp 2); the slow variant runs 4 ranks as a
2 x 2 mesh (2 data-parallel groups of 2), where the gradients live on two meshes.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from rlforge import batch as B
from rlforge import load_config
from rlforge.algorithms.grpo import GRPO
from rlforge.controller.dispatch import shard_for_update, split_even
from rlforge.errors import ConfigError
from rlforge.plugin_manager import PluginManager
from tests.controller.test_worker import SGDGRPO, _rollout_batch
from tests.plugins.megatron_cpu import free_port
from tests.plugins.test_fsdp import COMMON, _record_grads, _worker

RTOL, ATOL = 1e-5, 1e-7


def _rank_main(rank: int, world: int, tp: int, port: int, batch: B.Batch, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [*COMMON, "strategy.name=tp", f"strategy.tp.size={tp}", "strategy.device=cpu",
                               f"strategy.num_processes={world}", "trainer.controller=ray", "strategy.fsdp.weight_sync_bucket_mb=0.3"],
                      plugins=pm)
    worker, _ = _worker(pm, cfg, SGDGRPO)
    dp, dp_rank = worker.strategy.world_size, worker.strategy.rank
    out: dict = {"dp": (dp, dp_rank)}
    out["log_probs"] = worker.compute_log_probs(split_even(batch, dp, "test")[dp_rank])
    out["grads"] = _record_grads(worker, full=True)
    out["metrics"] = worker.update(shard_for_update(batch, dp, 8)[dp_rank])
    out["weights"] = worker.model_state_dict()
    out["streamed"] = {name: t.clone() for name, t in worker.named_weights()}
    adam, _ = _worker(pm, cfg, GRPO)
    adam.update(shard_for_update(batch, dp, 8)[dp_rank])
    small = adam.save_sharded(os.path.join(out_dir, "dcp"))
    restored, _ = _worker(pm, cfg, GRPO)
    restored.load_sharded(os.path.join(out_dir, "dcp"), small)
    out["adam"] = [w.state_dict()["optimizer"].get("state") for w in (adam, restored)]  # rank 0
    out["adam_weights"] = [w.model_state_dict() for w in (adam, restored)]
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _single(pm):
    cfg = load_config("grpo", COMMON, plugins=pm)
    worker, module = _worker(pm, cfg, SGDGRPO)
    batch = _rollout_batch(module)
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch) + 0.05 * batch[B.RESPONSE_MASK]
    log_probs = worker.compute_log_probs(batch)
    grads = _record_grads(worker, full=False)
    metrics = worker.update(batch)
    return batch, {"log_probs": log_probs, "grads": grads, "metrics": metrics,
                   "weights": {k: v.clone() for k, v in module.actor.state_dict().items()}}


def _run(tmp_path, world, tp):
    pm = PluginManager(autoload=False)
    batch, single = _single(pm)
    mp.spawn(_rank_main, args=(world, tp, free_port(), batch, str(tmp_path)), nprocs=world, join=True)
    return single, [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _check(single, ranks, tp):
    assert [r["dp"] for r in ranks] == [(len(ranks) // tp, i // tp) for i in range(len(ranks))]
    assert single["metrics"]["actor/grad_norm"] > 0.05  # clipping was active
    for r in ranks:
        for k, v in single["metrics"].items():
            assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
        for name, grad in single["grads"].items():
            torch.testing.assert_close(r["grads"][name], grad, rtol=RTOL, atol=ATOL, msg=name)
    first_of_each_group = ranks[::tp]
    torch.testing.assert_close(torch.cat([r["log_probs"] for r in first_of_each_group]), single["log_probs"],
                               rtol=RTOL, atol=1e-6)
    gathered = ranks[0]["weights"]
    assert all(r["weights"] == {} for r in ranks[1:])  # gathered on rank 0 only
    for name, w in single["weights"].items():
        torch.testing.assert_close(gathered[name], w, rtol=RTOL, atol=ATOL, msg=name)
    for r in ranks:  # every rank streams the full tensors to its rollout engine
        assert r["streamed"].keys() == gathered.keys()
        assert all(torch.equal(r["streamed"][k], gathered[k]) for k in gathered)
    saved, restored = ranks[0]["adam"]
    for name, st in saved.items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(restored[name][k]), torch.as_tensor(v)), (name, k)
    a, b = ranks[0]["adam_weights"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tensor_parallel_update_on_two_processes_matches_one_process(tmp_path):
    single, ranks = _run(tmp_path, world=2, tp=2)
    _check(single, ranks, tp=2)
    # the projections really were split: each rank's gradient shard of q_proj was half of it (checked by DTensor)
    assert ranks[0]["grads"]["model.layers.0.self_attn.q_proj.weight"].shape == (128, 128)


@pytest.mark.slow
def test_two_by_two_mesh_matches_one_process(tmp_path):
    single, ranks = _run(tmp_path, world=4, tp=2)
    _check(single, ranks, tp=2)


def test_config_mistakes(pm):
    with pytest.raises(ConfigError, match=r"strategy.tp.size=3 must be >= 1 and divide strategy.num_processes=2"):
        load_config("grpo", ["strategy.name=tp", "strategy.tp.size=3", "strategy.num_processes=2",
                             "trainer.controller=ray"], plugins=pm)
    # the plan and its refusals: tests/plugins/test_tp_plan.py
