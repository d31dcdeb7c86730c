"""``fabric`` strategy with Lightning Fabric's ``ddp`` over 2 CPU processes (gloo), against the ``fsdp`` strategy on
the same ranks and batch: with plain SGD and clipping active, the loss metrics, the clipped gradient norm and the
updated weights are equal within float tolerance (both sum the gradients over the ranks); the weight stream carries
the full weights; sharded (``fabric.save``) and full checkpoints restore model and AdamW state exactly.
DeepSpeed and Fabric's FSDP need a GPU here: their configs are refused on CPU with a clear error.
"""

from __future__ import annotations

import copy
import importlib.util
import os

import pytest
import torch
import torch.multiprocessing as mp

from rlforge import batch as B
from rlforge import load_config
from rlforge.algorithms.grpo import GRPO
from rlforge.controller.dispatch import shard_for_update
from rlforge.errors import ConfigError
from rlforge.plugin_manager import PluginManager
from tests.controller.test_worker import SGDGRPO, _rollout_batch
from tests.plugins.megatron_cpu import free_port, launch_env
from tests.plugins.test_fsdp import COMMON, _worker

RTOL, ATOL = 1e-5, 1e-7
LAUNCHED = ["strategy.device=cpu", "strategy.num_processes=2", "trainer.controller=ray"]


def _rank_main(rank: int, port: int, batch: B.Batch, out_dir: str) -> None:
    launch_env(rank, 2, port)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    torch.set_num_threads(1)
    pm = PluginManager(autoload=False)
    shard = shard_for_update(batch, 2, 8)[rank]
    out: dict = {}
    for name in ("fsdp", "fabric"):
        cfg = load_config("grpo", [*COMMON, *LAUNCHED, f"strategy.name={name}"], plugins=pm)
        worker, _ = _worker(pm, cfg, SGDGRPO)
        out[name] = {"metrics": worker.update(shard), "weights": worker.model_state_dict(),
                     "streamed": {n: t.clone() for n, t in worker.named_weights()}}
    cfg = load_config("grpo", [*COMMON, *LAUNCHED, "strategy.name=fabric"], plugins=pm)
    adam, _ = _worker(pm, cfg, GRPO)
    adam.update(shard)
    full = [adam.state_dict(), adam.model_state_dict()]  # complete on rank 0
    torch.distributed.broadcast_object_list(full, src=0)
    full = copy.deepcopy(full)  # as read from a file: rank 0's dict shares tensors (Adam's step) with its optimizer
    small = adam.save_sharded(os.path.join(out_dir, "fabric.ckpt"))
    from_sharded, _ = _worker(pm, cfg, GRPO)
    from_sharded.load_sharded(os.path.join(out_dir, "fabric.ckpt"), small)
    from_full, _ = _worker(pm, cfg, GRPO)
    from_full.load_model_state_dict(full[1])
    from_full.load_state_dict(full[0])
    workers = (adam, from_sharded, from_full)
    for w in workers:
        w.update(shard)
    out["after_resume"] = [{k: v.clone() for k, v in w.module.actor.state_dict().items()} for w in workers]
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def test_ddp_updates_equal_the_fsdp_strategys(pm, tmp_path):
    cfg = load_config("grpo", COMMON, plugins=pm)
    worker, module = _worker(pm, cfg, SGDGRPO)
    batch = _rollout_batch(module)
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch) + 0.05 * batch[B.RESPONSE_MASK]
    mp.spawn(_rank_main, args=(free_port(), batch, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    fsdp, fabric = ranks[0]["fsdp"], ranks[0]["fabric"]
    assert fsdp["metrics"]["actor/grad_norm"] > 0.05  # clipping was active
    for k, v in fsdp["metrics"].items():
        assert fabric["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert fabric["weights"].keys() == fsdp["weights"].keys()
    for name, w in fsdp["weights"].items():
        torch.testing.assert_close(fabric["weights"][name], w, rtol=RTOL, atol=ATOL, msg=name)
    for r in ranks:
        assert all(torch.equal(t, fabric["weights"][n]) for n, t in r["fabric"]["streamed"].items())
    for r in ranks:
        reference, *restored = r["after_resume"]
        for other in restored:
            assert all(torch.equal(other[k], reference[k]) for k in reference)


@pytest.mark.parametrize(("overrides", "needle"), [
    (["strategy.fabric.strategy=deepspeed_stage_3", "strategy.device=cpu"], "needs a GPU"),
    (["strategy.fabric.strategy=horovod"], "strategy.fabric.strategy='horovod'. Allowed: ddp, deepspeed_stage_2"),
    (["strategy.fabric.precision=8"], "strategy.fabric.precision='8'"),
])
def test_config_mistakes(pm, overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config("grpo", ["strategy.name=fabric", "trainer.controller=ray", *overrides], plugins=pm)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_deepspeed_without_deepspeed_installed_is_refused_when_composed(pm):
    needle = r"strategy.fabric.strategy=deepspeed_stage_2 needs DeepSpeed, which is not installed here"
    overrides = ["strategy.fabric.strategy=deepspeed_stage_2"]  # (device auto: a GPU machine's default)
    with pytest.raises(ConfigError, match=needle):
        load_config("grpo", ["strategy.name=fabric", "trainer.controller=ray", *overrides], plugins=pm)
