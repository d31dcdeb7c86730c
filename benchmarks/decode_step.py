"""One decoding step of the hf engine (``plugins/rollout/hf_decode.py``) at a few batch sizes, against its bounds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_step.py [--size 20m] [--rows 1 8 64] [--prompt 40]
        [--new 96] [--repeats 5] [--profile] [--baseline OLD_hf_decode.py] [--out result.json]

Per batch size B (rows): milliseconds per new token of ``Decoder.decode`` on B rows of ``--prompt`` left-padded
prompt tokens (one row padded), ``--new`` tokens sampled with a seed and no stop token (best of ``--repeats`` calls;
the prompt's forward pass is timed alone and subtracted), against:

- ``linears``: every linear layer and the output head applied once to B rows (``F.linear``, best of 5): the
  matrix products of one step as transformers runs them;
- ``read_bound``: the same at one row (``torch.mv``): the time to read every weight once, what any step costs at
  least (a step reads the weights once, whatever B);
- ``flop_bound``: 2 x linear parameters x B at this thread count's 1024 x 1024 fp32 matmul speed
  (``scripts/machine_speed.matmul_gflops``);
- ``kv_read_ms``: the KV cache a step's attention reads (keys and values of every layer and row at the mean filled
  length) at the bandwidth of ``read_bound`` (the weights, read again and again, stay in the processor's cache: an
  optimistic rate for a cache of hundreds of MB);
- ``attention_ms``: that attention measured as the loop runs it: ``scaled_dot_product_attention`` for one query per
  row and head over each layer's own keys and values (slices of distinct per-layer buffers, as the decoder's cache
  hands them, so no layer finds the previous one's in the processor's cache), with the loop's boolean mask; mean
  of 5 steps after a warm-up, and ``attention_gb_s``, the rate it reads them at.

``--baseline FILE`` also times another version of ``hf_decode.py`` (e.g. ``git show main:plugins/rollout/hf_decode.py
> /tmp/old.py``), alternating with the installed one call by call, and reports new / old per batch size: on a loaded
machine compare only these paired ratios, from several fresh processes. ``--profile`` prints the ``torch.profiler``
table of one decoding call per batch size (operator self times).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "scripts"))
from grpo_vs_trl import SIZES  # noqa: E402
from machine_speed import matmul_gflops  # noqa: E402


def load_decoder(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("hf_decode_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(size: str) -> torch.nn.Module:
    from rlforge.models import build_char_tokenizer, build_tiny_llama

    torch.manual_seed(0)
    hidden, layers, heads, ffn = SIZES[size]
    model = build_tiny_llama(build_char_tokenizer(), hidden=hidden, layers=layers, heads=heads, ffn=ffn)
    model.config.max_position_embeddings = 4096
    return model.eval()


def best_of(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def decode_ms(decoders: dict[str, ModuleType], model: torch.nn.Module, rows: int, args: argparse.Namespace
              ) -> dict[str, float]:
    """Milliseconds per new token of each decoder's ``decode`` on ``rows`` rows (the prompt's forward subtracted),
    the decoders alternating call by call; best of ``--repeats``."""
    from rlforge.sampling import SamplingParams

    ids = torch.randint(10, 60, (rows, args.prompt))
    mask = torch.ones_like(ids)
    mask[0, : args.prompt // 4] = 0
    best = {(name, new): float("inf") for name in decoders for new in (1, args.new)}
    for repeat in range(args.repeats + 1):  # round 0 warms up
        for new in (1, args.new):
            for name, module in decoders.items():
                decoder = module.Decoder(model, [], 0)
                start = time.perf_counter()
                with torch.no_grad():
                    decoder.decode(ids, mask, SamplingParams(n=1, temperature=1.0, max_new_tokens=new, seed=0))
                if repeat:
                    best[name, new] = min(best[name, new], time.perf_counter() - start)
    out = {f"{name}_step_ms": (best[name, args.new] - best[name, 1]) / (args.new - 1) * 1e3 for name in decoders}
    if "baseline" in decoders:
        out["new_over_baseline"] = out["new_step_ms"] / out["baseline_step_ms"]
    return out


def bounds(model: torch.nn.Module, rows: int, gflops: float, args: argparse.Namespace) -> dict[str, float]:
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    x = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    linears = best_of(lambda: [F.linear(x[w.shape[1]], w) for w in weights], 5)
    read = best_of(lambda: [torch.mv(w, x[w.shape[1]][0]) for w in weights], 5)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv_bytes = (2 * config.num_hidden_layers * rows * config.num_key_value_heads * head_dim * 4
                * (args.prompt + args.new / 2))
    attention = attention_s(model, rows, args)
    return {"linears_ms": linears * 1e3, "read_bound_ms": read * 1e3, "attention_ms": attention * 1e3,
            "attention_gb_s": kv_bytes / attention / 1e9,
            "flop_bound_ms": 2 * sum(w.numel() for w in weights) * rows / (gflops * 1e9) * 1e3,
            "kv_read_ms": kv_bytes / (weight_bytes / read) * 1e3, "weight_read_gb_s": weight_bytes / read / 1e9}


def attention_s(model: torch.nn.Module, rows: int, args: argparse.Namespace) -> float:
    """Seconds of one decoding step's attention over every layer at the mean filled length (see ``attention_ms``)."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    filled, capacity = args.prompt + args.new // 2, args.prompt + args.new
    caches = [tuple(torch.randn(rows, kv_heads, capacity, head_dim)[:, :, :filled] for _ in range(2))
              for _ in range(config.num_hidden_layers)]
    query = torch.randn(rows, heads, 1, head_dim)
    mask = torch.ones(rows, 1, 1, filled, dtype=torch.bool)
    mask[0, :, :, : args.prompt // 4] = False

    def step() -> None:
        for keys, values in caches:
            F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=heads != kv_heads)

    step()
    start = time.perf_counter()
    for _ in range(5):
        step()
    return (time.perf_counter() - start) / 5


def profile(hf_decode: ModuleType, model: torch.nn.Module, rows: int, args: argparse.Namespace) -> None:
    from torch.profiler import profile as torch_profile

    from rlforge.sampling import SamplingParams

    ids = torch.randint(10, 60, (rows, args.prompt))
    decoder = hf_decode.Decoder(model, [], 0)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new, seed=0)
    with torch.no_grad(), torch_profile() as prof:
        decoder.decode(ids, torch.ones_like(ids), params)
    print(f"--- {rows} rows, {args.new} new tokens ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="20m")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--baseline", type=Path, help="a hf_decode.py to time against the installed one")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import rlforge.plugins.rollout.hf_decode as hf_decode

    decoders = {"new": hf_decode} | ({"baseline": load_decoder(args.baseline)} if args.baseline else {})
    gflops = matmul_gflops(torch.get_num_threads())
    model = build(args.size)
    result: dict[str, Any] = {"size": args.size, "baseline": str(args.baseline),
                              "threads": torch.get_num_threads(), "matmul_gflops": round(gflops, 1),
                              "prompt": args.prompt, "new": args.new, "rows": {}}
    for rows in args.rows:
        if args.profile:
            profile(hf_decode, model, rows, args)
        result["rows"][rows] = {**decode_ms(decoders, model, rows, args), **bounds(model, rows, gflops, args)}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
