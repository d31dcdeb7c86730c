"""Whole GRPO steps on a heavy-tailed batch against a uniform batch of the same token count, rlforge and TRL on the
same work (``grpo_vs_trl.py``'s model folder, runners and fresh-process rounds).

    .venv/bin/python benchmarks/long_tail_step.py --size 20m --prompts 8 --short 32 --long 512 \\
        --trl-python .venv-bench/bin/python --out benchmarks/results/long_tail_step_20m.json

Work: P prompts x G samples per step, one optimizer step per batch, fp32, no KL term (as ``grpo_vs_trl.py``).

- heavy: the responses of ``round(P x long_share)`` prompts of every step run to ``long`` tokens, the others stop at
  ``short`` tokens (85% / 15% by default, as in issue #31; with P = 16 or 8 that is 7/8 and 1/8 of the rows);
- uniform: every response has the heavy batch's mean length: the same response tokens. All its prompts are short
  (the heavy batch's long-response prompts carry ``short`` more characters, see below: slightly more work there).

Both cap ``max_new_tokens`` at ``long`` and leave ``min_new_tokens`` at 0. The lengths are forced through the
positions (``long_tail.force_lengths``, installed on every Llama the round's process loads; for ``--engines vllm``,
whose model runs in vLLM's own processes, the logits processor ``vllm_lengths.ForcedLengths`` does the same there,
through ``rollout.vllm.engine_kwargs``): the model's next token is the stop token at the positions where a response
must end, never elsewhere. A long-response prompt is ``short``
characters longer than the others, so the position where the short responses end falls inside it. Prompts are
``What is a+b?`` with one-digit operands (one length for all). Each round checks that the tokens generated are the
ones asked for. Prompts are taken in order (no shuffling: every step has the same mix).

The contenders alternate (rlforge heavy, rlforge uniform, TRL heavy, TRL uniform, then again), each round in a fresh
process; per contender the median seconds per step after 2 warm-up steps of each round, and for rlforge the median
of its stages (``timing_s/*``: gen, log_prob = old + ref, update). Reported: heavy / uniform per contender and
rlforge's speed-up over TRL on each batch. ``--baseline-decoder FILE`` adds the contender ``rlforge-hf-baseline``:
the hf engine decoding with another version of ``hf_decode.py`` (e.g. ``git show main:plugins/rollout/hf_decode.py``),
to measure a change of the decoding loop in the same alternating run.

``--engines hf_ray_one_step_off`` (and ``hf_ray_sync``, the same layout without the overlap): the rollout on a Ray
worker of its own core, generating the next batch while the actor trains on the other (``grpo_vs_trl.ENGINES``); the
worker process forces the lengths through ``forced_lengths_plugin.py`` (an rlforge plugin module every process of the
run loads). One-step-off recomputes the old log-probs (they are one update old), as verl's recipe does.

``--partial-tokens T`` adds the contender ``rlforge-hf-partial`` on the heavy batch only: ``trainer.pipeline=partial
trainer.partial_tokens=T`` (a long response continues over ``ceil(long / T)`` steps). Its first steps train only
the short groups (the long ones have not ended yet), so it skips ``ceil(long / T) - 1`` more warm-up steps than the
others: from then on every step trains the same response tokens (the short groups of its prompts and the long group
of the prompts ``ceil(long / T) - 1`` steps before), which the round checks as for the others. Give it ``--steps``
above its warm-up. Against the uniform batch of the sync pipeline, which reuses the engine's log-probs, it also
recomputes the old log-probs (a forward pass: the lag makes them differ).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_vs_trl import (ENGINES, SIZES, build_model, filler, prompt_tokens, rlforge_history, round_output,  # noqa: E402
                         step_timer, trl_trainer)
from decode_step import load_decoder  # noqa: E402
from long_tail import force_lengths  # noqa: E402
from step_breakdown import RLFORGE_TIMINGS  # noqa: E402

DISTRIBUTIONS = ("heavy", "uniform")
WARMUP = 2


def lengths(args: argparse.Namespace) -> dict[str, Any]:
    """Long-response prompts per step, the heavy batch's response tokens and the uniform batch's length."""
    long_prompts = max(1, round(args.prompts * args.long_share))
    tokens = args.samples * ((args.prompts - long_prompts) * args.short + long_prompts * args.long)
    uniform = tokens / (args.prompts * args.samples)
    if uniform != int(uniform):
        raise SystemExit(f"The heavy batch's mean response length {uniform:.2f} is not a whole number: choose "
                         "--short/--long/--prompts so that the uniform batch has exactly the same tokens.")
    return {"long_prompts": long_prompts, "tokens": tokens, "uniform_length": int(uniform)}


def tail_rows(p: int, steps: int, long_prompts: int, extra: int) -> list[dict]:
    """The prompts of ``steps + 1`` steps in the order they are used: the last ``long_prompts`` of every ``p`` get
    ``extra`` more characters."""
    from rlforge.plugins.data.builtin import arith_rows

    rows = arith_rows(p * (steps + 1), 9, seed=1)
    for i, row in enumerate(rows):
        if i % p >= p - long_prompts:
            row["prompt"][0]["content"] = filler(extra) + row["prompt"][0]["content"]
    return rows


def force_on_load(stop_id: int, ends: set[int]) -> None:
    """Every ``LlamaForCausalLM`` built in this process from now on gets ``force_lengths(model, stop_id, ends)``
    (once per process: ``forced_lengths_plugin`` calls it too)."""
    from transformers import LlamaForCausalLM

    init = LlamaForCausalLM.__init__
    if getattr(init, "forced", False):
        return

    def forced_init(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        force_lengths(self, stop_id, ends)

    forced_init.forced = True  # type: ignore[attr-defined]
    LlamaForCausalLM.__init__ = forced_init


def run_round(spec: dict) -> list[dict]:
    """One round (a fresh process): ``spec['who']`` on ``spec['dist']``; per step its seconds, the response tokens it
    generated and, for rlforge, its stages."""
    from transformers import AutoTokenizer

    p, g, steps, folder = spec["p"], spec["g"], spec["steps"], spec["folder"]
    heavy = spec["dist"] == "heavy"
    long_prompts = spec["long_prompts"] if heavy else 0
    rows = tail_rows(p, steps, long_prompts, spec["short"])
    sizes = prompt_tokens(folder, rows)
    short_len = sizes[0]
    long_len = sizes[p - 1] if heavy else short_len
    if {n for i, n in enumerate(sizes) if i % p < p - long_prompts} != {short_len}:
        raise SystemExit(f"The short prompts have several lengths: {sorted(set(sizes))}")
    # input position q predicts the token at q + 1; response token t sits at position prompt + t
    ends = {short_len + spec["short"] - 2, long_len + spec["long"] - 2} if heavy else {short_len + spec["uniform"] - 2}
    stop_id = AutoTokenizer.from_pretrained(folder).eos_token_id
    force_on_load(stop_id, ends)
    cap = spec["long"]
    if spec["who"] == "trl":
        timer = step_timer()
        with tempfile.TemporaryDirectory() as trl_out:
            trainer = trl_trainer(Path(folder), p, g, cap, steps, trl_out, timer, rows=rows, generation_kwargs={},
                                  shuffle_dataset=False)
            trainer.train()
        logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
        return [{"step": s, "tokens": h["completions/mean_length"] * p * g} for s, h in zip(timer.times, logs)]
    engine = spec["who"].split("-", 1)[1]
    extra: tuple[str, ...] = ()
    if engine == "vllm":  # vLLM runs its own model in its own processes: a logits processor there forces the lengths
        here = str(Path(__file__).resolve().parent)
        os.environ.update(LONG_TAIL_ENDS=",".join(map(str, sorted(ends))), LONG_TAIL_STOP=str(stop_id),
                          PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        extra = ("rollout.vllm.engine_kwargs={logits_processors: ['vllm_lengths:ForcedLengths']}",)
    if engine.startswith("hf_ray"):  # the rollout worker is another process: the plugin forces the lengths there
        os.environ.update(LONG_TAIL_ENDS=",".join(map(str, sorted(ends))), LONG_TAIL_STOP=str(stop_id))
        extra = (f"plugins.modules=[{Path(__file__).resolve().parent / 'forced_lengths_plugin.py'}]",)
    if engine.endswith("-partial"):
        in_flight = p * g * math.ceil(spec["long"] / spec["partial_tokens"])  # the most rows a segment decodes
        extra = ("trainer.pipeline=partial", f"trainer.partial_tokens={spec['partial_tokens']}",
                 f"rollout.micro_batch_size={in_flight}")  # one decoding batch, as the others
        engine = engine.removesuffix("-partial")
    if engine.endswith("-baseline"):  # before the engine's module imports it
        sys.modules["rlforge.plugins.rollout.hf_decode"] = load_decoder(Path(spec["decoder"]))
        engine = engine.removesuffix("-baseline")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        history = rlforge_history(Path(folder), p, g, cap, steps, engine, overrides=(
            "data.name=files", f"data.train_files=[{data}]", "data.shuffle=false", "rollout.min_new_tokens=0",
            f"data.max_prompt_length={max(sizes)}", *extra))
    out: list[dict] = []
    for h in history:
        row = {phase: sum(h.get(f"timing_s/{k}", 0.0) for k in keys) for phase, keys in RLFORGE_TIMINGS.items()}
        out.append({"step": h["timing_s/step"], "tokens": h["response_length/mean"] * p * g, **row})
    return out


def update_pass(args: argparse.Namespace, folder: Path, repeats: int = 3) -> dict[str, list[float]]:
    """Seconds of the update's forward and backward (``ops.response_logprobs``, prompts shared as the trainer does) on
    the heavy batch, rows grouped by length (``microbatch.length_groups``, now) and in one padded pass (before),
    alternating in this process."""
    import torch
    from transformers import AutoModelForCausalLM

    import rlforge.ops as ops

    plan, p, g = lengths(args), args.prompts, args.samples
    prompt, width = 17, 17 + args.short
    torch.manual_seed(0)
    ids = torch.randint(10, 60, (p, width)).repeat_interleave(g, 0)
    prompt_mask = torch.ones_like(ids)
    long_rows = torch.arange(p * g) >= (p - plan["long_prompts"]) * g
    prompt_mask[~long_rows, : width - prompt] = 0
    resp_mask = (torch.arange(args.long)[None] < torch.where(long_rows, args.long, args.short)[:, None]).long()
    mask = torch.cat([prompt_mask, resp_mask], 1)
    ids = torch.cat([ids, torch.randint(10, 60, (p * g, args.long))], 1) * mask
    model = AutoModelForCausalLM.from_pretrained(folder)
    ops.share_prompts(model, ops.SHARE_REPEATED)
    grouped = ops.length_groups

    def one_pass(lengths: Sequence[int], overhead: int = 0) -> list[list[int]]:
        return [list(range(len(lengths)))]

    seconds: dict[str, list[float]] = {"grouped": [], "one_pass": []}
    for _ in range(repeats):
        for name in seconds:
            ops.length_groups = grouped if name == "grouped" else one_pass
            start = time.perf_counter()
            logp, _ = ops.response_logprobs(model, ids, mask, args.long)
            logp.sum().backward()
            seconds[name].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    ops.length_groups = grouped
    return seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--short", type=int, default=64, help="response tokens of the short rows")
    parser.add_argument("--long", type=int, default=1024, help="response tokens of the long rows (and the cap)")
    parser.add_argument("--long-share", type=float, default=0.15, help="share of the prompts with long responses")
    parser.add_argument("--steps", type=int, default=5, help="steps per round; the first 2 of each are warm-up")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="hf", help=f"rlforge variants, comma-separated: {','.join(ENGINES)}")
    parser.add_argument("--no-trl", action="store_true", help="time rlforge only")
    parser.add_argument("--baseline-decoder", type=Path, help="another hf_decode.py: adds rlforge-hf-baseline")
    parser.add_argument("--partial-tokens", type=int, help="adds rlforge-hf-partial (heavy batch only): "
                        "trainer.pipeline=partial with this trainer.partial_tokens")
    parser.add_argument("--update-pass", action="store_true", help="only time the update's forward and backward on "
                        "the heavy batch, grouped by length and in one padded pass")
    parser.add_argument("--trl-python", default=sys.executable, help="interpreter of the environment with TRL")
    parser.add_argument("--round", help=argparse.SUPPRESS)  # internal: run one round, print its result as JSON
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.round:
        print(json.dumps(run_round(json.loads(args.round))))
        return
    plan = lengths(args)
    who_all = [f"rlforge-{e}" for e in args.engines.split(",")] + ([] if args.no_trl else ["trl"])
    if args.baseline_decoder:
        who_all.insert(1, "rlforge-hf-baseline")
    if args.partial_tokens:
        who_all.insert(1, "rlforge-hf-partial")
    rows: dict[str, dict[str, list[dict]]] = {who: {d: [] for d in DISTRIBUTIONS} for who in who_all}
    for who in who_all:
        if who.endswith("-partial"):
            del rows[who]["uniform"]
    load_before, started = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, args.size)
        config = json.loads((folder / "config.json").read_text())  # room for the long rows (default rotary: no limit)
        config["max_position_embeddings"] = max(config["max_position_embeddings"], 2 * (args.short + args.long))
        (folder / "config.json").write_text(json.dumps(config))
        if args.update_pass:
            seconds = update_pass(args, folder)
            result = {"size": args.size, "params": params, "P": args.prompts, "G": args.samples, "short": args.short,
                      "long": args.long, **plan, "started": started, "update_pass_seconds": seconds,
                      "best": {k: min(v) for k, v in seconds.items()}}
            print(json.dumps(result, indent=1))
            if args.out:
                args.out.write_text(json.dumps(result, indent=1) + "\n")
            return
        for _ in range(args.rounds):
            for who in who_all:
                warmup = WARMUP + (math.ceil(args.long / args.partial_tokens) - 1 if who.endswith("-partial") else 0)
                for dist in DISTRIBUTIONS[:1] if who.endswith("-partial") else DISTRIBUTIONS:
                    spec = {"who": who, "dist": dist, "folder": str(folder), "p": args.prompts, "g": args.samples,
                            "steps": args.steps, "short": args.short, "long": args.long,
                            "long_prompts": plan["long_prompts"], "uniform": plan["uniform_length"],
                            "decoder": str(args.baseline_decoder), "partial_tokens": args.partial_tokens}
                    got = round_output(args.trl_python if who == "trl" else sys.executable, __file__, spec)[warmup:]
                    if not got:
                        raise SystemExit(f"{who}: --steps {args.steps} leaves no step after its {warmup} warm-up")
                    bad = [r["tokens"] for r in got if round(r["tokens"]) != plan["tokens"]]
                    if bad:
                        raise SystemExit(f"{who} {dist}: generated {bad} response tokens per step, not "
                                         f"{plan['tokens']}: the forced lengths did not hold.")
                    rows[who][dist] += got
                    print(f"{who} {dist}: " + " ".join(f"{r['step']:.3f}" for r in got) + " s/step",
                          flush=True)
    median = {who: {d: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "tokens"}
                    for d, rs in by.items()} for who, by in rows.items()}
    # the partial pipeline's heavy steps against the sync pipeline's uniform ones (it runs no uniform batch)
    heavy_over_uniform = {who: m["heavy"]["step"] / median[who.removesuffix("-partial")]["uniform"]["step"]
                          for who, m in median.items()}
    result = {
        "size": args.size, "params": params, "P": args.prompts, "G": args.samples, "short": args.short,
        "long": args.long, **plan, "started": started, "load_average_before": load_before,
        "load_average_after": os.getloadavg(), "median": median, "heavy_over_uniform": heavy_over_uniform,
        "rows": rows,
    }
    if "trl" in median:
        result["speedup_vs_trl"] = {who: {d: median["trl"][d]["step"] / m[d]["step"] for d in m}
                                    for who, m in median.items() if who != "trl"}
    print(json.dumps({k: result[k] for k in ("median", "heavy_over_uniform", "speedup_vs_trl") if k in result},
                     indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
