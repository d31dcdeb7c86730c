"""GPU checks on one device, in one short run: actor update throughput and MFU, the hf rollout engine against
plain ``generate``, weight sync against the copy bound, a full GRPO step (issue #8) and the same step with the
one-step-off and async pipelines (issue #16), the first steps of docs/gpu-recipe.md (``recipe``), and the distributed sections
of ``gpu_check_dist.py``: Megatron TP=1/PP=1 numerics against HF and the conversion on the device, the ``tp``
strategy against one process, vLLM inside a Ray worker (docs/distributed.md); the vllm engine's weight-sync backends
(``weight_sync``: file buckets against vLLM's CUDA IPC transfer, and a LoRA adapter sync; issue #31).

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json      # one GPU, all sections
    python benchmarks/gpu_check.py --only megatron,tp,vllm_ray --out $OUT/dist.json   # the distributed ones
    python benchmarks/gpu_check.py --smoke --out /tmp/smoke.json   # the same code on CPU with tiny sizes

Estimated on one H200 (not measured yet): the issue-#8 sections ~7 minutes, megatron ~1, tp ~1, vllm_ray ~3
(Ray start, engine start, 4 steps), weight_sync ~2 (three engine starts); a run longer than one device call can be
split with --only.

Models are random, with Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, ffn 4864):
- update and weight sync: the full 151,936-token vocabulary; the actor on the ``fsdp`` strategy with one
  rank (NCCL, bf16 compute, fp32 master weights): the hybrid-engine path, whose replica receives the weights;
  then again with ``model.compile=true`` (torch.compile'd forward passes) and with
  ``strategy.offload_optimizer=true`` (GPU memory held between updates, against the first);
- generation: the same model in bf16, 256 prompts x 256 new tokens, plain ``model.generate`` against the hf
  engine, plain and with ``rollout.hf.compile=true``;
- GRPO step: the 0.5B body with rlforge's character vocabulary (as the TRL reference in BENCHMARKS.md),
  64 prompts x 8 samples x exactly 256 new tokens, micro-batches of 64, bf16.
MFU counts 6 x parameters x tokens per update (2 x for a forward pass) against ``--peak-tflops``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
from gpu_check_dist import check_megatron, check_tp, check_vllm_ray

SHAPES = {
    "qwen2.5-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936},
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1024},
}
FULL = {"update_seqs": 16, "prompt_len": 512, "resp_len": 512, "micro": 16, "gen_prompts": 256, "gen_tokens": 256,
        "grpo_prompts": 64, "grpo_n": 8, "grpo_tokens": 256, "grpo_micro": 64, "grpo_steps": 4}
SECTIONS = ("update", "update_compiled", "update_offload", "generation", "grpo", "grpo_one_step_off", "grpo_async",
            "recipe", "megatron", "tp", "vllm_ray", "weight_sync")
PIPELINES = {"grpo_one_step_off": ("trainer.pipeline=one_step_off",),  # docs/pipelines.md: step time against "grpo"
             "grpo_async": ("trainer.pipeline=async", "trainer.max_staleness=2")}
SMOKE = {"update_seqs": 4, "prompt_len": 16, "resp_len": 16, "micro": 2, "gen_prompts": 8, "gen_tokens": 8,
         "grpo_prompts": 4, "grpo_n": 2, "grpo_tokens": 8, "grpo_micro": 4, "grpo_steps": 3}


def build(folder: Path, shape: str, char_vocab: bool) -> int:
    """A random Qwen2 model (and rlforge's character tokenizer) saved to ``folder``; returns its parameters."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlforge.models import build_char_tokenizer

    tok = build_char_tokenizer()
    dims = dict(SHAPES[shape])
    if char_vocab:
        dims["vocab_size"] = len(tok)
    torch.manual_seed(0)
    config = Qwen2Config(**dims, max_position_embeddings=2048, tie_word_embeddings=True,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def timed(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Median seconds of ``fn`` after one warm-up call."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    seconds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def random_batch(seqs: int, prompt_len: int, resp_len: int, vocab: int) -> Any:
    from rlforge import batch as B

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (seqs, prompt_len), generator=g)
    responses = torch.randint(3, vocab, (seqs, resp_len), generator=g)
    ones_p, ones_r = torch.ones_like(prompts), torch.ones_like(responses)
    return B.Batch({
        B.PROMPTS: prompts, B.PROMPT_MASK: ones_p, B.RESPONSES: responses, B.RESPONSE_MASK: ones_r,
        B.INPUT_IDS: torch.cat([prompts, responses], 1), B.ATTENTION_MASK: torch.cat([ones_p, ones_r], 1),
        B.ADVANTAGES: torch.randn(seqs, resp_len, generator=g),
    })


def check_update_and_sync(folder: Path, params: int, s: dict, device: str, peak: float, extra: list[str]) -> dict:
    """Actor forward and update on fsdp (one rank), then the weight stream into the rollout replica."""
    from rlforge import batch as B
    from rlforge import load_config
    from rlforge.plugin_manager import PluginManager
    from rlforge.worker import ActorWorker

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    pm = PluginManager(autoload=False)
    seqs = s["update_seqs"]
    cfg = load_config("grpo", [
        f"model.path={folder}", "strategy.name=fsdp", f"strategy.device={device}", f"data.train_batch_size={seqs}",
        "trainer.controller=ray",  # validation only: the worker runs here, on one rank
        "rollout.n=1", f"actor.ppo_mini_batch_size={seqs}", f"actor.ppo_micro_batch_size={s['micro']}",
        f"data.max_prompt_length={s['prompt_len']}", f"rollout.max_new_tokens={s['resp_len']}", "actor.lr=1e-7",
        *extra,
    ], plugins=pm)
    module = pm.registry.algorithm.get("grpo")(cfg)
    module.configure_model()
    strategy = pm.registry.strategy.get("fsdp")(cfg)
    worker = ActorWorker(cfg, module, strategy)
    batch = random_batch(seqs, s["prompt_len"], s["resp_len"], module.actor.config.vocab_size)
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch)
    worker.update(batch)  # warm-up (compiles with model.compile)
    tokens = seqs * (s["prompt_len"] + s["resp_len"])
    fwd = timed(lambda: worker.compute_log_probs(batch), strategy.device)
    upd = timed(lambda: worker.update(batch), strategy.device)
    allocated_gb = torch.cuda.memory_allocated() / 1e9 if strategy.device.type == "cuda" else None  # between updates
    engine = pm.registry.rollout.get("hf")(cfg, worker.rollout_model, module.tokenizer)
    sync = timed(lambda: engine.update_weights(worker.named_weights()), strategy.device)
    replica = list(worker.rollout_model.parameters())
    copies = [p.detach().clone() for p in replica]

    def copy_all() -> None:
        with torch.no_grad():
            for dst, src in zip(replica, copies):
                dst.copy_(src)

    copy = timed(copy_all, strategy.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in replica)
    torch.distributed.destroy_process_group()
    return {
        "parameters": params, "tokens_per_update": tokens,
        "forward_s": fwd, "forward_tokens_per_s": tokens / fwd, "forward_mfu": 2 * params * tokens / fwd / peak,
        "update_s": upd, "update_tokens_per_s": tokens / upd, "update_mfu": 6 * params * tokens / upd / peak,
        "allocated_gb_between_updates": allocated_gb,
        "weight_sync_s": sync, "copy_bound_s": copy, "weight_bytes": weight_bytes, "sync_over_copy": sync / copy,
    }


def check_generation(folder: Path, s: dict, device: str, dtype: str) -> dict:
    """Plain ``generate`` against the hf engine (plain and compiled) on the same model, exactly N new tokens."""
    from rlforge import batch as B
    from rlforge import load_config
    from rlforge.models import load_model
    from rlforge.plugin_manager import PluginManager
    from rlforge.sampling import SamplingParams

    pm = PluginManager(autoload=False)
    dev = torch.device(device)
    model = load_model(str(folder), dtype).to(dev).eval()
    vocab, n, new = model.config.vocab_size, s["gen_prompts"], s["gen_tokens"]
    prompt_len = 32 if n > 8 else 8
    prompts = torch.randint(3, vocab, (n, prompt_len), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompts)
    never_eos = SimpleNamespace(pad_token_id=0, eos_token_id=vocab)  # no sequence stops early

    def plain() -> None:
        with torch.no_grad():
            model.generate(input_ids=prompts.to(dev), attention_mask=mask.to(dev), do_sample=True,
                           max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=vocab)

    batch = B.Batch({B.PROMPTS: prompts, B.PROMPT_MASK: mask})
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=new, min_new_tokens=new)
    out = {"tokens": n * new, "plain_generate_s": timed(plain, dev, repeats=2)}
    for label, extra in (("hf_engine", []), ("hf_engine_compiled", ["rollout.hf.compile=true"])):
        cfg = load_config("grpo", [f"data.max_prompt_length={prompt_len}", f"rollout.max_new_tokens={new}",
                                   f"rollout.micro_batch_size={n}", *extra], plugins=pm)
        engine = pm.registry.rollout.get("hf")(cfg, model, never_eos)
        out[f"{label}_s"] = timed(lambda: engine.generate(batch, params), dev, repeats=2)
    for key in ("plain_generate", "hf_engine", "hf_engine_compiled"):
        out[f"{key}_tokens_per_s"] = out["tokens"] / out[f"{key}_s"]
    out["compiled_over_plain_generate"] = out["hf_engine_compiled_tokens_per_s"] / out["plain_generate_tokens_per_s"]
    return out


def check_grpo_step(folder: Path, shape: str, s: dict, device: str, dtype: str, extra: tuple[str, ...] = ()) -> dict:
    """A full GRPO step on a model of ``shape`` with the character vocabulary: per-stage medians after step 1;
    ``extra`` overrides, e.g. a pipeline (``trainer.pipeline=async``: generation ahead, beside the update)."""
    from rlforge import Trainer, load_config

    build(folder, shape, char_vocab=True)
    p, g, t = s["grpo_prompts"], s["grpo_n"], s["grpo_tokens"]
    with tempfile.TemporaryDirectory() as runs:
        cfg = load_config("grpo", [
            f"model.path={folder}", f"model.precision={'32-true' if dtype == 'float32' else 'bf16-mixed'}", f"strategy.device={device}", f"trainer.runs_root={runs}",
            f"trainer.total_steps={s['grpo_steps']}", f"data.train_batch_size={p}", f"rollout.n={g}",
            f"rollout.max_new_tokens={t}", f"rollout.min_new_tokens={t}", f"rollout.micro_batch_size={p * g}",
            f"actor.ppo_mini_batch_size={p}", f"actor.ppo_micro_batch_size={s['grpo_micro']}", "actor.lr=1e-7",
            "trainer.val_before_train=false", "trainer.val_every=0", "trainer.save_every=0", "data.arith.val_size=1",
            "trainer.progress=false", "logger.backends=[]", "trainer.samples_to_save=0", *extra,
        ])
        trainer = Trainer(cfg)
        trainer.fit()
    hist = trainer.history[1:]
    keys = sorted({k for h in hist for k in h if k.startswith("timing_s/")})  # some stages skip some steps
    return {"P": p, "G": g, "T": t, **{k.removeprefix("timing_s/"): statistics.median(h[k] for h in hist if k in h)
                                       for k in keys}}


def check_recipe(tmp: Path, smoke: bool) -> dict:
    """The first steps of docs/gpu-recipe.md's commands (GRPO on GSM8K-format parquet, bf16-mixed, full and LoRA)
    with what this machine can reach: a random chat model of Qwen2.5-0.5B's shape and ChatML tokenizer, and GSM8K
    rows made up here (``rlforge data gsm8k`` on them). Checks the path runs and records step time and peak memory;
    the accuracy curve needs the real model and data."""
    import json as _json

    from rlforge import Trainer, load_config
    from rlforge.plugin_manager import PluginManager
    from rlforge.tools.data_prep import prepare
    from rlforge.tools.tiny_chat import build_tiny_chat_model

    dims = ({"hidden": 128, "layers": 2, "heads": 2, "kv_heads": 1, "ffn": 256} if smoke else
            {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "ffn": 4864})
    model = build_tiny_chat_model(tmp / "chat", **dims)
    raw = tmp / "gsm8k_raw"
    raw.mkdir()
    for split, count in (("train", 256), ("test", 32)):
        rows = [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have?",
                 "answer": f"{i} + {i + 3} = {2 * i + 3}\n#### {2 * i + 3}"} for i in range(count)]
        (raw / f"{split}.jsonl").write_text("".join(_json.dumps(r) + "\n" for r in rows))
    prepare("gsm8k", [str(raw / "train.jsonl"), str(raw / "test.jsonl")], tmp / "gsm8k", PluginManager().registry)
    device = "cpu" if smoke else "cuda"
    common = [f"model.path={model}", "data.name=files", f"data.train_files=[{tmp}/gsm8k/train.parquet]",
              f"data.val_files=[{tmp}/gsm8k/test.parquet]", f"strategy.device={device}",
              f"model.precision={'32-true' if smoke else 'bf16-mixed'}", "data.max_prompt_length=128",
              f"rollout.max_new_tokens={16 if smoke else 256}", f"data.train_batch_size={4 if smoke else 32}",
              f"rollout.n={2 if smoke else 5}", f"actor.ppo_mini_batch_size={4 if smoke else 16}",
              f"actor.ppo_micro_batch_size={4 if smoke else 16}", "trainer.total_steps=3", "trainer.val_every=0",
              "trainer.val_before_train=true", "trainer.save_every=0", "trainer.progress=false", "logger.backends=[]"]
    out: dict[str, Any] = {}
    for name, extra in (("full", ["actor.lr=1e-6"]), ("lora", ["model.lora.rank=32", "model.lora.alpha=32",
                                                                 "actor.lr=3e-5"])):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with tempfile.TemporaryDirectory() as runs:
            trainer = Trainer(load_config("grpo", [*common, *extra, f"trainer.runs_root={runs}"]))
            summary = trainer.fit()
        out[name] = {"step_s": [h["timing_s/step"] for h in trainer.history],
                     "accuracy_before": summary["accuracy_before"],
                     "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}
    return out


def check_weight_sync(folder: Path, smoke: bool) -> dict:
    """The vllm engine's weight-sync backends (``rollout.weight_sync``, docs/rollout.md) on the same bf16 weights:
    ``files`` (CPU buckets through /dev/shm) and ``vllm_native`` (vLLM's CUDA IPC transfer): bytes, seconds of 3
    syncs, GB/s, and whether greedy answers after the sync agree between them; then a LoRA run's sync (rank 16,
    all linear layers): the adapter alone, loaded as a vLLM LoRA adapter. --smoke: files only, on CPU."""
    from rlforge import batch as B
    from rlforge import load_config, lora
    from rlforge.build import Builder
    from rlforge.models import load_model, load_tokenizer
    from rlforge.plugin_manager import PluginManager
    from rlforge.sampling import SamplingParams
    from rlforge.weight_sync import adapter_weights
    from rlforge.weight_sync import timed as sync_timed

    pm, device = PluginManager(autoload=False), "cpu" if smoke else "cuda"
    tok = load_tokenizer(str(folder))
    prompts = B.Batch({B.PROMPTS: torch.randint(3, 1000, (8, 16), generator=torch.Generator().manual_seed(0)),
                       B.PROMPT_MASK: torch.ones(8, 16, dtype=torch.long)})
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    base = [f"model.path={folder}", "rollout.name=vllm", "rollout.vllm.gpu_memory_utilization=0.3",
            "rollout.max_new_tokens=16", "data.max_prompt_length=16", "rollout.vllm.dtype=bfloat16"]
    out: dict[str, Any] = {}
    answers = {}
    runs = [("files", []), ("lora_files", ["model.lora.rank=16", "model.lora.alpha=32"])]
    if not smoke:
        runs.insert(1, ("vllm_native", []))
    for name, extra in runs:
        cfg = load_config("grpo", [*base, f"rollout.weight_sync={name.removeprefix('lora_')}", *extra], plugins=pm)
        actor = load_model(str(folder)).to(device, torch.bfloat16)
        with torch.no_grad():
            actor.model.norm.weight.mul_(1.5)  # weights the engine cannot have from model.path
        if extra:
            actor = lora.wrap(actor, cfg)
        weights = (lambda: adapter_weights(actor)) if extra else (lambda: ((n, p.detach()) for n, p in
                                                                           actor.named_parameters()))
        engine = Builder(cfg, pm).rollout(actor, tok)
        try:
            engine.generate(prompts, greedy)  # the engine starts and gets the weights once
            syncs = [sync_timed(engine.update_weights, weights()) for _ in range(3)]
            best = min(syncs, key=lambda r: r.seconds)
            answers[name] = engine.generate(prompts, greedy)[B.RESPONSES].tolist()
        finally:
            engine.shutdown()
        out[name] = {"bytes": best.bytes, "seconds": [r.seconds for r in syncs],
                     "gb_per_s": best.bytes / best.seconds / 1e9, "backend": type(engine.weight_sync).__name__}
    if "vllm_native" in answers:
        out["native_answers_equal_files"] = answers["vllm_native"] == answers["files"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes, on CPU in float32")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200: 989)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="checks to run, comma-separated")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    dtype = "float32" if args.smoke else "bfloat16"
    shape, sizes = ("tiny", SMOKE) if args.smoke else ("qwen2.5-0.5b", FULL)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                              "torch": torch.__version__, "shape": shape, "sizes": sizes}
    only = set(args.only.split(","))
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        full, char = Path(tmp) / "full_vocab", Path(tmp) / "char_vocab"
        params = build(full, shape, char_vocab=False)
        peak = args.peak_tflops * 1e12
        for name, run in (("update", lambda: check_update_and_sync(full, params, sizes, device, peak, [])),
                          ("update_compiled", lambda: check_update_and_sync(full, params, sizes, device, peak,
                                                                            ["model.compile=true"])),
                          ("update_offload", lambda: check_update_and_sync(full, params, sizes, device, peak,
                                                                           ["strategy.offload_optimizer=true"])),
                          ("generation", lambda: check_generation(full, sizes, device, dtype)),
                          ("grpo", lambda: check_grpo_step(char, shape, sizes, device, dtype)),
                          *((name, lambda extra=extra: check_grpo_step(char, shape, sizes, device, dtype, extra))
                            for name, extra in PIPELINES.items()),
                          ("recipe", lambda: check_recipe(Path(tmp), args.smoke)),
                          ("megatron", lambda: check_megatron(full, device, sizes["update_seqs"],
                                                              sizes["prompt_len"] + sizes["resp_len"], timed)),
                          ("tp", lambda: check_tp(device)),
                          ("vllm_ray", lambda: check_vllm_ray(sizes["grpo_steps"], device)),
                          ("weight_sync", lambda: check_weight_sync(full, args.smoke))):
            if name not in only:
                continue
            start = time.perf_counter()
            try:
                result[name] = run()
            except Exception as exc:  # record and go on: one failed check must not lose the others' numbers
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            result[name]["check_s"] = time.perf_counter() - start
            print(name, json.dumps(result[name]), flush=True)
            out.write_text(json.dumps(result, indent=2))  # partial results survive a timeout


if __name__ == "__main__":
    main()
