"""Rollout engines: tokens/s of ``hf`` and ``vllm`` on the same model and batch, and seconds per weight sync.

    python benchmarks/rollout_bench.py [--prompts 16] [--n 8] [--tokens 64] [--repeats 3] [--out rollout_bench.json]

Both engines sample (temperature 1) exactly ``--tokens`` new tokens for each of ``--prompts`` x ``--n``
sequences: no sequence stops early (the hf engine gets an EOS id outside the vocabulary, the vllm engine
no stop token). Models: the shipped
``tiny-arith`` (1.1M parameters) and a random 20M-parameter Llama (hidden 512, 6 layers, 8 heads, ffn 1536).
The weight sync streams the actor's parameters into the vLLM engine (``update_weights``); the hf engine
shares the actor's weights, so it has nothing to copy. Needs vllm (``pip install 'rlforge[vllm]'``; on CPU
set ``VLLM_CPU_KVCACHE_SPACE=1``). Prints a markdown table (docs/performance.md keeps the figures), writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from types import SimpleNamespace

import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.data import collate, tokenize_rows
from rlforge.models import build_char_tokenizer, build_tiny_llama, load_model, load_tokenizer
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.rollout.vllm import VLLMRollout, import_vllm
from rlforge.sampling import SamplingParams


class VLLMNoStop(VLLMRollout):
    """The vllm engine without a stop token (vLLM rejects the out-of-vocabulary EOS id the hf engine gets)."""

    def _sampling_params(self, params: SamplingParams, seed: int | None):
        sampling = super()._sampling_params(params, seed)
        sampling.stop_token_ids = []
        return sampling


def random_llama_20m(folder: str) -> str:
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    build_tiny_llama(tok, hidden=512, layers=6, heads=8, ffn=1536).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def bench_model(pm: PluginManager, path: str, args: argparse.Namespace) -> dict:
    cfg = load_config("grpo", [f"model.path={path}", f"rollout.max_new_tokens={args.tokens}",
                               f"rollout.micro_batch_size={args.prompts * args.n}"], plugins=pm)
    tok = load_tokenizer(path)
    model = load_model(path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[: args.prompts]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "bench"), tok.pad_token_id,
                    list(range(len(rows))))
    never_eos = SimpleNamespace(pad_token_id=tok.pad_token_id, eos_token_id=len(tok))
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.tokens)
    tokens = args.prompts * args.n * args.tokens
    out: dict = {"parameters": sum(p.numel() for p in model.parameters()), "tokens_per_batch": tokens}
    for name, factory in (("hf", pm.registry.rollout.get("hf")), ("vllm", VLLMNoStop)):
        engine = factory(cfg, model, never_eos)
        try:
            torch.manual_seed(0)
            start = time.perf_counter()
            engine.generate(batch, params)  # warm-up; starts the vLLM engine
            first = time.perf_counter() - start
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                result = engine.generate(batch, params)
                seconds.append(time.perf_counter() - start)
                assert int(result[B.RESPONSE_MASK].sum()) == tokens, "every sequence must reach --tokens"
            sync = []
            if name == "vllm":
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    engine.update_weights((n, p.detach()) for n, p in model.named_parameters())
                    sync.append(time.perf_counter() - start)
            # best of the repeats: on a shared machine other jobs only ever slow a run down
            out[name] = {"first_call_s": first, "generate_s": seconds, "tokens_per_s": tokens / min(seconds),
                         "weight_sync_s": min(sync) if sync else None, "weight_sync_all_s": sync}
        finally:
            engine.shutdown()
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed batches (and syncs); the best one counts")
    parser.add_argument("--out", default="rollout_bench.json")
    args = parser.parse_args()
    vllm = import_vllm()  # fail before any measuring when vllm is missing
    pm = PluginManager(autoload=False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny-arith": "builtin:tiny-arith", "llama-20m": random_llama_20m(tmp)}
        for label, path in models.items():
            results[label] = bench_model(pm, path, args)
    print(f"{args.prompts} prompts x n={args.n} x {args.tokens} new tokens, temperature 1, {os.cpu_count()} CPUs\n")
    print("| model | parameters | hf tokens/s | vllm tokens/s | vllm engine start + first batch | weight sync |")
    print("|---|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['parameters'] / 1e6:.1f}M | {r['hf']['tokens_per_s']:.0f} | "
              f"{r['vllm']['tokens_per_s']:.0f} | {r['vllm']['first_call_s']:.1f} s | "
              f"{1000 * r['vllm']['weight_sync_s']:.0f} ms ({r['weight_bytes'] / 2**20:.0f} MiB) |")
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "vllm": vllm.__version__, "args": vars(args)}
    with open(args.out, "w") as fh:
        json.dump({**meta, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
