"""Generation of a GRPO batch (every prompt repeated ``--samples`` times) by the hf engine's decoding loop, three ways.

    .venv/bin/python benchmarks/repeated_prompts.py [--size 20m] [--prompts 16] [--samples 8] [--prompt 17 256]
        [--new 64] [--rounds 3] [--threads 2] [--baseline OLD_hf_decode.py] [--out result.json]

Per prompt length (``--prompt``, tokens, no padding): seconds per ``Decoder.decode`` call on ``--prompts`` random
prompts x ``--samples`` rows each (repeated as ``repeat_interleave`` does), ``--new`` tokens sampled with a seed and
no stop token, for:

- ``per_row``: each distinct prompt prefilled once, the keys and values copied to its rows (``hf_cascade`` kept off);
- ``cascade``: the same prefill, then the cache holds each prompt once and the attention reads it once per step
  (``plugins/rollout/hf_cascade.py``, where it applies: printed as ``cascade_used``);
- ``baseline`` (with ``--baseline FILE``, e.g. ``git show <commit>:plugins/rollout/hf_decode.py > /tmp/old.py``): that
  version of the loop, which prefilled every row.

The variants alternate call by call, ``--rounds`` times, after one warm-up call each; medians. Every call's tokens are
checked against the first variant's (seeded sampling: the same draws where the probabilities agree to rounding).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "scripts"))
from decode_step import build, load_decoder  # noqa: E402
from grpo_vs_trl import SIZES  # noqa: E402
from machine_speed import matmul_gflops  # noqa: E402

import rlforge.plugins.rollout.hf_cascade as hf_cascade  # noqa: E402
from rlforge.plugins.rollout import hf_decode  # noqa: E402
from rlforge.sampling import SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="20m")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt", type=int, nargs="+", default=[17, 256])
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="a hf_decode.py to time beside the installed one")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build(args.size)
    threshold = hf_cascade.MIN_SAVED_BYTES
    variants = {"per_row": (hf_decode, 2**62), "cascade": (hf_decode, threshold)}
    if args.baseline:
        variants["baseline"] = (load_decoder(args.baseline), 2**62)
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new, seed=1)
    result: dict = {"size": args.size, "prompts": args.prompts, "samples": args.samples, "new": args.new,
                    "threads": args.threads, "gflops_start": round(matmul_gflops(args.threads), 1), "by_prompt": {}}
    for width in args.prompt:
        torch.manual_seed(0)
        prompts = torch.randint(5, 60, (args.prompts, width)).repeat_interleave(args.samples, 0)
        mask = torch.ones_like(prompts)
        config = model.config.get_text_config(decoder=True)
        hf_cascade.MIN_SAVED_BYTES = threshold
        used = hf_cascade.worth_it(len(prompts), args.prompts, width, config) and hf_cascade.supported(model, config)
        times: dict[str, list[float]] = {name: [] for name in variants}
        reference = None
        for round_ in range(args.rounds + 1):
            for name, (module, least) in variants.items():
                hf_cascade.MIN_SAVED_BYTES = least
                decoder = module.Decoder(model, [], 0)
                start = time.perf_counter()
                with torch.no_grad():
                    tokens, _ = decoder.decode(prompts, mask, params)
                seconds = time.perf_counter() - start
                reference = tokens if reference is None else reference
                if not torch.equal(tokens, reference):
                    print(f"  {name}: tokens differ from the first variant's at prompt {width}")
                if round_:
                    times[name].append(seconds)
        row = {name: round(statistics.median(t), 3) for name, t in times.items()}
        row |= {f"{name}_all": [round(x, 3) for x in t] for name, t in times.items()}
        row["cascade_used"] = used
        result["by_prompt"][str(width)] = row
        print(f"prompt {width}: " + ", ".join(f"{name} {row[name]} s" for name in variants) + f" (cascade used: {used})")
    result["gflops_end"] = round(matmul_gflops(args.threads), 1)
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
