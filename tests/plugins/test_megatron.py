"""``megatron`` strategy over 2 CPU processes (gloo), against one plain HF process on the same batch.

megatron-core's forward needs CUDA: on CPU these tests run it through ``megatron_cpu``'s test-only shim. With
plain SGD and clipping active, for tensor parallel 2 (one model split over both ranks) and data parallel 2: the
log-probs, the loss metrics and the clipped gradient norm equal the single-process ones, and the updated weights
(gathered back into HF names on rank 0) equal the single-process update; every rank streams the full HF weights
for its rollout engine; a sharded checkpoint (megatron ``dist_checkpointing``) restores model and AdamW state
exactly. The ``gpu`` tests check the same numerics on a GPU without the shim.
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
from tests.plugins.megatron_cpu import allow_megatron_forward_on_cpu, free_port, launch_env
from tests.plugins.test_fsdp import COMMON, _worker

pytest.importorskip("megatron.core", reason="megatron-core is not installed: pip install 'rlforge[megatron]'")

RTOL, ATOL = 1e-5, 1e-6
MEGATRON = ["strategy.name=megatron", "strategy.checkpoint=sharded", "trainer.controller=ray"]


def _rank_main(rank: int, tp: int, port: int, batch: B.Batch, out_dir: str) -> None:
    launch_env(rank, 2, port)
    torch.set_num_threads(1)
    allow_megatron_forward_on_cpu()
    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [*COMMON, *MEGATRON, "strategy.device=cpu", "strategy.num_processes=2",
                               f"strategy.megatron.tensor_parallel_size={tp}"], plugins=pm)
    worker, _ = _worker(pm, cfg, SGDGRPO)
    dp, dp_rank = worker.strategy.world_size, worker.strategy.rank
    out: dict = {"dp": (dp, dp_rank)}
    out["log_probs"] = worker.compute_log_probs(split_even(batch, dp, "test")[dp_rank])
    out["metrics"] = worker.update(shard_for_update(batch, dp, 8)[dp_rank])
    out["weights"] = worker.model_state_dict()
    out["streamed"] = {name: t.clone() for name, t in worker.named_weights()}
    adam, _ = _worker(pm, cfg, GRPO)
    shard = shard_for_update(batch, dp, 8)[dp_rank]
    adam.update(shard)
    small = adam.save_sharded(os.path.join(out_dir, "dist"))
    restored, _ = _worker(pm, cfg, GRPO)
    restored.load_sharded(os.path.join(out_dir, "dist"), small)
    out["adam"] = [[{k: v.clone() for k, v in w.optimizer.state[p].items()} for p in w.model.parameters()]
                   for w in (adam, restored)]
    for w in (adam, restored):
        w.update(shard)
    out["after_resume"] = [w.model_state_dict() for w in (adam, restored)]
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def single(pm):
    cfg = load_config("grpo", COMMON, plugins=pm)
    worker, module = _worker(pm, cfg, SGDGRPO)
    batch = _rollout_batch(module)
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch) + 0.05 * batch[B.RESPONSE_MASK]
    log_probs = worker.compute_log_probs(batch)
    metrics = worker.update(batch)
    return batch, {"log_probs": log_probs, "metrics": metrics,
                   "weights": {k: v.clone() for k, v in module.actor.state_dict().items()}}


@pytest.mark.parametrize("tp", [2, 1])  # tensor parallel 2 x data parallel 1, and data parallel 2
def test_update_on_two_processes_matches_one_hf_process(single, tmp_path, tp):
    batch, expected = single
    mp.spawn(_rank_main, args=(tp, free_port(), batch, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["dp"] for r in ranks] == [(2 // tp, i // tp) for i in range(2)]
    assert expected["metrics"]["actor/grad_norm"] > 0.05  # clipping was active
    for r in ranks:
        for k, v in expected["metrics"].items():
            assert r["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    torch.testing.assert_close(torch.cat([r["log_probs"] for r in ranks[::tp]]), expected["log_probs"],
                               rtol=RTOL, atol=ATOL)
    gathered = ranks[0]["weights"]
    assert ranks[1]["weights"] == {}  # gathered on rank 0 only
    assert gathered.keys() == expected["weights"].keys()
    for name, w in expected["weights"].items():
        torch.testing.assert_close(gathered[name], w, rtol=RTOL, atol=ATOL, msg=name)
    for r in ranks:
        assert all(torch.equal(t, gathered[name]) for name, t in r["streamed"].items())
        saved, restored = r["adam"]
        for i, st in enumerate(saved):
            assert st.keys() == restored[i].keys() == {"step", "exp_avg", "exp_avg_sq"}
            for k, v in st.items():
                assert torch.equal(restored[i][k], v), (i, k)
    a, b = ranks[0]["after_resume"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_config_mistakes(pm):
    with pytest.raises(ConfigError, match="pipeline_parallel_size=2: only 1 is supported"):
        load_config("grpo", [*MEGATRON, "strategy.megatron.pipeline_parallel_size=2"], plugins=pm)
    with pytest.raises(ConfigError, match="set strategy.checkpoint=sharded"):
        load_config("grpo", ["strategy.name=megatron", "trainer.controller=ray"], plugins=pm)
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 must be >= 1 and divide strategy.num_processes=1"):
        load_config("grpo", [*MEGATRON, "strategy.megatron.tensor_parallel_size=2"], plugins=pm)


def test_the_cli_does_not_import_megatron():
    import subprocess
    import sys

    code = ("import sys; from rlforge.cli import main\n"
            "try:\n    main(['plugins'])\nexcept SystemExit:\n    pass\n"
            "print('megatron' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr  # listed, not imported


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_megatron_logits_equal_hf_on_a_gpu(pm, dtype):
    """TP 1, PP 1 on one GPU, no shim: the converted model's logits equal the HF model's (benchmarks/gpu_check.py
    runs the same comparison at Qwen2.5-0.5B's shape)."""
    from megatron.core import parallel_state

    from rlforge.models import load_model

    launch_env(0, 1, free_port())
    cfg = load_config("grpo", [*MEGATRON, "strategy.device=cuda"], plugins=pm)
    strategy = pm.registry.strategy.get("megatron")(cfg)
    try:
        hf = load_model(cfg.model.path).to(dtype).cuda().eval()
        wrapped = strategy.setup_model(load_model(cfg.model.path).to(dtype)).eval()
        ids = torch.randint(7, hf.config.vocab_size, (4, 24), device="cuda")
        with torch.no_grad():
            expected, got = hf(input_ids=ids).logits.float(), wrapped(input_ids=ids).logits.float()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
