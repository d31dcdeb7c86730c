"""The hf engine's decoding loop on a heavy-tailed batch against a uniform batch of the same token count.

    .venv/bin/python benchmarks/long_tail.py [--size 20m] [--rows 64] [--short 64] [--long 1024] [--long-share 0.15]
                                             [--repeats 3] [--out benchmarks/results/long_tail.json]

Reasoning RL batches are heavy-tailed: most responses end early, a few run to the length limit. Here ``rows`` responses
are forced to end (the stop token's logit raised above all others) at ``short`` tokens for (1 - long_share) of the
rows and at ``long`` tokens for the others; the uniform batch gives every row the mean length, so both generate the
same number of tokens. Three runs alternate ``repeats`` times: heavy-tailed with finished rows dropped from the
computed batch (``COMPACT_BELOW``, the default), heavy-tailed keeping every row (the loop before the change), uniform.
The lengths are forced through the rows' positions, so the forcing does not depend on which rows are still computed:
short rows have prompts of ``prompt`` tokens, long rows of ``prompt + short`` tokens (left-padded to one width).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_vs_trl import SIZES, build_model  # noqa: E402


def force_lengths(model: torch.nn.Module, stop_id: int, end_positions: set[int]):
    """Make the model's next token the stop token wherever the input's position is in ``end_positions``, and never
elsewhere. Only in forward passes without autograd (generation; training forwards are left alone)."""
    ends = sorted(end_positions)

    def hook(module, args, kwargs, output):
        if torch.is_grad_enabled() or kwargs.get("position_ids") is None:
            return output
        # the positions' tensor made here, not when the hook is set: inside from_pretrained (benchmarks/
        # long_tail_step.py sets it in the model's __init__) new tensors are on the meta device, without values
        position = kwargs["position_ids"][:, -1]
        force = torch.isin(position, torch.tensor(ends, device=position.device))
        logits = output.logits[:, -1]
        logits[:, stop_id] = torch.where(force, logits.max(-1).values + 100.0, float("-inf"))
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def batch(rows: int, prompt: int, short: int, long_rows: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: the last ``long_rows`` rows have ``prompt + short`` tokens, the others ``prompt``."""
    width = prompt + short
    ids = torch.randint(10, 60, (rows, width))
    mask = torch.ones_like(ids)
    mask[: rows - long_rows, : width - prompt] = 0
    ids[mask == 0] = pad_id
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="20m")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--short", type=int, default=64)
    parser.add_argument("--long", type=int, default=1024)
    parser.add_argument("--long-share", type=float, default=0.15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import rlforge.plugins.rollout.hf_decode as hf_decode
    from rlforge.plugins.rollout.hf_decode import Decoder
    from rlforge.sampling import SamplingParams
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    long_rows = max(1, round(args.rows * args.long_share))
    tokens = (args.rows - long_rows) * args.short + long_rows * args.long
    mean = tokens / args.rows
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp), args.size)
        model = AutoModelForCausalLM.from_pretrained(tmp).eval()
    stop, pad = 1, 0
    # input positions whose next token is a row's last (the stop token): response token t sits at position P + t
    p_short, p_long = args.prompt, args.prompt + args.short
    heavy_ends = {p_short + args.short - 2, p_long + args.long - 2}
    uniform_ends = {p_long + round(mean) - 2}
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=args.long, seed=0)
    heavy_batch = batch(args.rows, args.prompt, args.short, long_rows, pad)
    uniform_batch = batch(args.rows, args.prompt, args.short, args.rows, pad)
    runs = {"heavy_compacted": (heavy_batch, heavy_ends, hf_decode.COMPACT_BELOW),
            "heavy_all_rows": (heavy_batch, heavy_ends, -1.0),
            "uniform": (uniform_batch, uniform_ends, hf_decode.COMPACT_BELOW)}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    generated: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, ((ids, mask), ends, compact) in runs.items():
            handle = force_lengths(model, stop, ends)
            hf_decode.COMPACT_BELOW = compact
            decoder = Decoder(model, [stop], pad)
            start = time.perf_counter()
            with torch.no_grad():
                out, _ = decoder.decode(ids, mask, params)
            seconds[name].append(time.perf_counter() - start)
            handle.remove()
            generated[name] = int(((out != pad).sum()))
    best = {name: min(v) for name, v in seconds.items()}
    result = {
        "size": args.size, "rows": args.rows, "short": args.short, "long": args.long, "long_rows": long_rows,
        "tokens": tokens, "uniform_length": round(mean), "generated": generated, "seconds": seconds, "best": best,
        "heavy_over_uniform": best["heavy_compacted"] / best["uniform"],
        "heavy_over_uniform_before": best["heavy_all_rows"] / best["uniform"],
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
