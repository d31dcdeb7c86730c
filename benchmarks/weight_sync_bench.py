"""Weight sync into the vllm engine on this machine (``rollout.weight_sync``, docs/rollout.md): the bytes and seconds
of a full sync with the ``files`` backend (all weights through /dev/shm, and inside vLLM's RPC without it) and of a
LoRA run's sync (the adapter alone, rank 8 on every linear layer, loaded as a vLLM LoRA adapter), best of 3 after the
engine's first sync. The CUDA backend (``vllm_native``) is measured by ``benchmarks/gpu_check.py --only weight_sync``.

    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/weight_sync_bench.py [--out weight_sync_bench.json]

Model: the random 20.6M-parameter Llama of ``rollout_bench.py`` (hidden 512, 6 layers, 8 heads, ffn 1536), float32.
Prints one line per case and the machine's matmul speed (scripts/machine_speed.py); writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from rlforge import load_config, lora
from rlforge.build import Builder
from rlforge.models import load_model, load_tokenizer
from rlforge.plugin_manager import PluginManager
from rlforge.weight_sync import adapter_weights, timed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from machine_speed import matmul_gflops  # noqa: E402
from rollout_bench import random_llama_20m  # noqa: E402

CASES = {"files (/dev/shm)": [], "files (inside vLLM's RPC)": ["rollout.vllm.weight_sync_dir=null"],
         "LoRA adapter, rank 8 (files)": ["model.lora.rank=8", "model.lora.alpha=16"]}


def bench(pm: PluginManager, path: str, extra: list[str], repeats: int) -> dict:
    cfg = load_config("grpo", [f"model.path={path}", "rollout.name=vllm", *extra], plugins=pm)
    actor = load_model(path)
    if lora.enabled(cfg):
        actor = lora.wrap(actor, cfg)
        weights = lambda: adapter_weights(actor)  # noqa: E731
    else:
        weights = lambda: ((n, p.detach()) for n, p in actor.named_parameters())  # noqa: E731
    engine = Builder(cfg, pm).rollout(actor, load_tokenizer(path))
    try:
        engine.update_weights(weights())  # starts the engine
        runs = [timed(engine.update_weights, weights()) for _ in range(repeats)]
    finally:
        engine.shutdown()
    best = min(runs, key=lambda r: r.seconds)
    return {"bytes": best.bytes, "seconds": best.seconds, "all_seconds": [r.seconds for r in runs],
            "mb_per_s": best.bytes / best.seconds / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="weight_sync_bench.json")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    pm = PluginManager(autoload=False)
    result = {"gflops_2_threads": matmul_gflops(2), "torch": torch.__version__}
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = random_llama_20m(tmp)
        for name, extra in CASES.items():
            result[name] = r = bench(pm, path, extra, args.repeats)
            print(f"{name}: {r['bytes'] / 2**20:.2f} MiB in {1000 * r['seconds']:.0f} ms ({r['mb_per_s']:.0f} MB/s)",
                  flush=True)
    print(f"machine: fp32 matmul {result['gflops_2_threads']:.0f} GFLOP/s on 2 threads")
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
