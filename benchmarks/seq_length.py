"""Cost of one GRPO update against response length, with and without Ulysses sequence parallelism (issue #28), on CPU.

    python benchmarks/seq_length.py [--size tiny] [--lengths 256 1024 4096 8192] [--tokens 8192] [--sp 1 2]

Every point is one process group of its own (``torch.multiprocessing``, gloo, one thread per rank): the ``fsdp``
strategy on ``sp`` ranks with ``strategy.fsdp.sequence_parallel_size=sp`` (sp=1: one rank; sp=2: two ranks that
share every sequence, one data-parallel group), packed rows (``model.remove_padding=true``), the random char-level
Llama of ``grpo_vs_trl.SIZES``, fp32, SDPA attention. The batch is random: prompts of ``--prompt`` tokens, responses of
exactly L tokens, ``--tokens // L`` rows (at least 1), so every length runs about the same number of tokens. The token
budget per rank is ``ceil((prompt + L) / sp)``: one sequence per micro-batch in both layouts, split over the sp ranks.

Per point: a warm-up update on a short batch (optimizer state allocated), then the timed phases on the batch:
``log_probs`` (the old log-probs, no gradient) and ``update`` (one optimizer step over every row). Memory: rank 0's
resident set (RSS, /proc) just before each phase and the process's peak RSS (``ru_maxrss``) after it; the difference
is the phase's peak memory on top of what was resident (activations, logits, gradients and, for sp=2, the exchange
buffers). Each rank runs with ``MALLOC_MMAP_THRESHOLD_=65536``: glibc gives every block above 64 KiB pages of its own
and returns them when the block is freed (its default threshold grows with the blocks freed, after which freed
tensors stay resident and the RSS no longer follows the live memory), so the RSS follows the live tensors and the
peak delta is the phase's peak live memory, to within the allocator's small blocks. The price is a page fault per
page of every new block, which slows the phases: ``--mmap-threshold 0`` keeps glibc's default for timing runs
(``seq_length_<size>_default_malloc.json``). Generation is not measured (the hf engine's decode is a separate question).
Writes ``seq_length_<size>.json`` to ``--out``; ``--plot results/seq_length_*.json`` draws docs/img/seq_length.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from grpo_vs_trl import build_model  # noqa: E402


MMAP_THRESHOLD = 64 * 1024  # bytes: every larger block gets pages of its own, returned to the OS when freed


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batch(rows: int, prompt: int, length: int, vocab: int, seed: int = 0):
    import torch

    from rlforge import batch as B

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(7, vocab, (rows, prompt), generator=g)
    responses = torch.randint(7, vocab, (rows, length), generator=g)
    ones = torch.ones(rows, prompt + length, dtype=torch.long)
    return B.Batch({B.PROMPTS: prompts, B.PROMPT_MASK: ones[:, :prompt], B.RESPONSES: responses,
                    B.RESPONSE_MASK: ones[:, prompt:], B.INPUT_IDS: torch.cat([prompts, responses], 1),
                    B.ATTENTION_MASK: ones, B.ADVANTAGES: torch.randn(rows, length, generator=g)})


def _rank(rank: int, sp: int, port: int, spec: dict, out: str) -> None:
    import torch

    from rlforge import batch as B
    from rlforge import load_config
    from rlforge.algorithms.grpo import GRPO
    from rlforge.plugin_manager import PluginManager
    from rlforge.worker import ActorWorker

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(sp), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    prompt, length = spec["prompt"], spec["length"]
    rows = max(1, spec["tokens"] // length)
    cfg = load_config("grpo", [
        f"model.path={spec['model']}", "model.remove_padding=true", "strategy.name=fsdp", "strategy.device=cpu",
        f"strategy.num_processes={sp}", f"strategy.fsdp.sequence_parallel_size={sp}", "trainer.controller=ray",
        f"data.train_batch_size={rows}", "rollout.n=1", f"actor.ppo_mini_batch_size={rows}",
        f"actor.max_tokens_per_micro_batch={math.ceil((prompt + length) / sp)}", f"data.max_prompt_length={prompt}",
        f"rollout.max_new_tokens={length}", "actor.lr=1e-6", "trainer.progress=false",
    ], plugins=PluginManager(autoload=False))
    module = GRPO(cfg)
    module.configure_model()
    worker = ActorWorker(cfg, module, PluginManager(autoload=False).registry.strategy.get("fsdp")(cfg))
    vocab = module.actor.config.vocab_size
    warm = _batch(1, prompt, 16, vocab, seed=1)
    warm[B.OLD_LOG_PROBS] = worker.compute_log_probs(warm)
    worker.update(warm)
    batch = _batch(rows, prompt, length, vocab)
    result: dict = {"sp": sp, "length": length, "rows": rows, "tokens": rows * (prompt + length),
                    "load_average_1min": os.getloadavg()[0]}  # other processes on the machine (CPU contention)
    for phase in ("log_probs", "update"):
        torch.distributed.barrier()
        before = rss_mb()
        start = time.perf_counter()
        if phase == "log_probs":
            batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch) + 0.01
        else:
            worker.update(batch)
        torch.distributed.barrier()
        result[phase] = {"s": time.perf_counter() - start, "rss_before_mb": before, "peak_mb": peak_mb()}
        result[phase]["peak_delta_mb"] = result[phase]["peak_mb"] - before
        result[phase]["us_per_token"] = 1e6 * result[phase]["s"] / result["tokens"]
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


def point(model: str, sp: int, length: int, args: argparse.Namespace) -> dict:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {"model": model, "prompt": args.prompt, "length": length, "tokens": args.tokens}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        mp.spawn(_rank, args=(sp, port, spec, f.name), nprocs=sp, join=True)
        result = json.loads(Path(f.name).read_text())
    lp, up = result["log_probs"], result["update"]
    print(f"sp={sp} L={length:>5} rows={result['rows']:>3}: log-probs {lp['us_per_token']:8.1f} us/token "
          f"(+{lp['peak_delta_mb']:.0f} MB), update {up['us_per_token']:8.1f} us/token (+{up['peak_delta_mb']:.0f} MB)",
          flush=True)
    return result


def plot(results: list[dict], path: Path) -> None:
    """Per-token time of each phase and peak memory per rank against length, one line per (model, sp)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for res in results:
        for sp in sorted({p["sp"] for p in res["points"]}):
            pts = sorted((p for p in res["points"] if p["sp"] == sp), key=lambda p: p["length"])
            xs = [p["length"] for p in pts]
            label = f"{res['size']} ({res['params'] / 1e6:.2g}M), sp={sp}"
            style = "o-" if sp == 1 else "s--"
            for ax, phase in zip(axes[:2], ("log_probs", "update")):
                ax.plot(xs, [p[phase]["us_per_token"] for p in pts], style, label=label)
            axes[2].plot(xs, [p["update"]["peak_delta_mb"] for p in pts], style, label=label)
    for ax, title in zip(axes, ("old log-probs: us per token", "update: us per token",
                                "update: peak memory per rank above resident (MB)")):
        ax.set(xlabel="response tokens per sequence", title=title, xscale="log", yscale="log")
        ax.minorticks_off()
        lengths = sorted({p["length"] for res in results for p in res["points"]})
        ax.set_xticks(lengths, [str(x) for x in lengths])
        ax.legend(fontsize=7)
    fig.suptitle("one GRPO update against response length, CPU, gloo, 1 thread per rank (contended machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    parser.add_argument("--sp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, default=8192, help="response tokens per step (rows = tokens // L)")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--mmap-threshold", type=int, default=MMAP_THRESHOLD,
                        help="MALLOC_MMAP_THRESHOLD_ of the ranks (0: glibc's default, faster, RSS not exact)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--plot", nargs="*", metavar="JSON", help="only draw docs/img/seq_length.png from these results")
    args = parser.parse_args()
    if args.plot:
        plot([json.loads(Path(f).read_text()) for f in args.plot], Path("docs/img/seq_length.png"))
        return
    if args.mmap_threshold:  # read by each rank's C library when it starts
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, args.size)
        config = json.loads((folder / "config.json").read_text())
        config["max_position_embeddings"] = args.prompt + max(args.lengths)
        (folder / "config.json").write_text(json.dumps(config))
        points = [point(str(folder), sp, length, args) for length in args.lengths for sp in args.sp]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.mmap_threshold else "_default_malloc"
    (out / f"seq_length_{args.size}{suffix}.json").write_text(json.dumps(
        {"size": args.size, "params": params, "prompt": args.prompt, "tokens": args.tokens,
         "mmap_threshold": args.mmap_threshold, "points": points}, indent=2))


if __name__ == "__main__":
    main()
