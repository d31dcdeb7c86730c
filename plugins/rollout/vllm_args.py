"""The ``vllm`` engine's arguments: the checks of ``rollout.vllm.*`` (run when the config is composed, before any model
loads), the placement and KV-cache size rlforge sets before vLLM starts, and the arguments passed to vLLM as they are
(``rollout.vllm.engine_kwargs``, verl's ``actor_rollout_ref.rollout.engine_kwargs.vllm``).

``engine_kwargs`` holds fields of vLLM's ``AsyncEngineArgs`` (the ``vllm serve`` options with ``_`` for ``-``), e.g.
``{async_scheduling: true, compilation_config: {cudagraph_mode: PIECEWISE}}``. They are added to the arguments
rlforge builds; an argument rlforge sets itself is refused with the key that sets it, an unknown one with the closest
of vLLM's names (read from the installed vLLM, which is imported for it only when ``engine_kwargs`` is set).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import math
import os
from typing import TYPE_CHECKING, Any

from rlforge.config.schema import plain
from rlforge.errors import ConfigError, RLForgeError
from rlforge.heads import Heads
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")
KEY = "rollout.vllm.engine_kwargs"
# the engine arguments rlforge builds itself, and what sets each one: engine_kwargs may not override them
SET_BY_RLFORGE = {
    "model": "model.path", "dtype": "rollout.vllm.dtype", "trust_remote_code": "model.trust_remote_code",
    "seed": "trainer.seed", "max_model_len": "rollout.vllm.max_model_len",
    "tensor_parallel_size": "rollout.vllm.tensor_parallel_size", "max_num_seqs": "rollout.vllm.max_num_seqs",
    "enable_chunked_prefill": "rollout.vllm.enable_chunked_prefill",
    "max_num_batched_tokens": "rollout.vllm.max_num_batched_tokens",
    "enable_prefix_caching": "rollout.vllm.enable_prefix_caching", "enable_sleep_mode": "rollout.vllm.sleep",
    "gpu_memory_utilization": "rollout.vllm.gpu_memory_utilization", "enforce_eager": "rollout.vllm.enforce_eager",
    "enable_lora": "model.lora.rank", "max_lora_rank": "model.lora.rank", "max_loras": "model.lora.rank",
    "weight_transfer_config": "rollout.weight_sync", "hf_overrides": "model.config_overrides",
}
# the engine arguments rlforge fixes, and why
FIXED_BY_RLFORGE = {
    "logprobs_mode": "processed_logprobs: the log-probs the trainer compares with the actor's",
    "worker_extension_cls": "its weight-sync extension", "disable_log_stats": "no periodic throughput lines in the log",
}


@functools.cache
def engine_arg_names() -> frozenset[str]:
    """The fields of the installed vLLM's ``AsyncEngineArgs`` (importing vLLM takes a few seconds)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))


def _plain(value: Any) -> dict[str, Any]:
    return dict(plain(value) or {})


def engine_kwargs(config: Any) -> dict[str, Any]:
    """``rollout.vllm.engine_kwargs`` as plain Python values."""
    return _plain(config.rollout.vllm.engine_kwargs)


def model_overrides(config: Any) -> dict[str, Any]:
    """``model.config_overrides`` as vLLM's ``hf_overrides`` (the engine's model config as the trainer's)."""
    overrides = _plain(config.model.config_overrides)
    return {"hf_overrides": overrides} if overrides else {}


def check_engine_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse an argument rlforge sets itself (naming the key that sets it) and one vLLM does not have (naming the
    closest of vLLM's); without vLLM installed only the first (the engine's start reports the missing package)."""
    for name in kwargs:
        if name in SET_BY_RLFORGE:
            raise ConfigError(f"{KEY}.{name}: vLLM's '{name}' is set by {SET_BY_RLFORGE[name]}; set it there "
                              f"instead (engine_kwargs adds arguments rlforge does not set).")
        if name in FIXED_BY_RLFORGE:
            raise ConfigError(f"{KEY}.{name}: rlforge fixes vLLM's '{name}' ({FIXED_BY_RLFORGE[name]}).")
    if not kwargs or importlib.util.find_spec("vllm") is None:
        return
    names = engine_arg_names()
    for name in kwargs:
        if name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ConfigError(f"{KEY}.{name}: '{name}' is not an engine argument of the installed vLLM "
                              f"(a field of vllm.engine.arg_utils.AsyncEngineArgs, as `vllm serve --help` lists them "
                              f"with '-' for '_').{hint}")


def validate(config: Any) -> None:
    """The checks of ``rollout.vllm.*`` (``VLLMRollout.validate_config``)."""
    v = config.rollout.vllm
    if v.dtype not in ENGINE_DTYPES:
        raise ConfigError(f"rollout.vllm.dtype='{v.dtype}'. Allowed: {', '.join(ENGINE_DTYPES)}.")
    longest = config.data.max_prompt_length + config.rollout.max_new_tokens
    if v.max_model_len is not None and v.max_model_len < longest:
        raise ConfigError(f"rollout.vllm.max_model_len={v.max_model_len} must hold the longest sequence: "
                          f"data.max_prompt_length + rollout.max_new_tokens = {longest} tokens (or null).")
    context = v.max_model_len or longest
    if v.max_num_batched_tokens is not None and v.max_num_batched_tokens < context and not v.enable_chunked_prefill:
        raise ConfigError(f"rollout.vllm.max_num_batched_tokens={v.max_num_batched_tokens} is below the engine's "
                          f"context of {context} tokens: without rollout.vllm.enable_chunked_prefill a whole "
                          f"prompt is prefilled in one step.")
    check_engine_kwargs(engine_kwargs(config))


# --- placement and sizing of the engine (what rlforge sets before vLLM starts) -----------------------------------
def kv_cache_gib(model_config: Any, max_len: int, max_seqs: int, dtype: torch.dtype) -> int:
    """Whole GiB that hold the K and V of ``max_seqs`` sequences of ``max_len`` tokens (with a 25% margin for
    vLLM's block rounding), at least 1."""
    heads, layers = Heads.of(model_config), model_config.get_text_config().num_hidden_layers
    need = 2 * layers * heads.kv_heads * heads.head_dim * dtype.itemsize * max_len * max_seqs
    return max(1, math.ceil(1.25 * need / 2**30))


def cpu_groups(parts: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``parts`` engine workers on this process's CPUs: disjoint core groups
    (``0|1``). vLLM binds one worker per NUMA node by itself and refuses more workers than nodes."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < parts:
        raise RLForgeError(f"rollout.vllm.tensor_parallel_size={parts} needs at least {parts} CPUs on this machine "
                           f"(one core group per engine worker); this process may use {len(cpus)}.")
    size = len(cpus) // parts
    groups = [cpus[i * size:(i + 1) * size] for i in range(parts)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def rank_gpus(visible: str | None, local_rank: int, tp: int) -> str:
    """The GPUs of the engine of local rank ``local_rank``: its ``tp`` devices among those visible (all of the
    machine's under torchrun, the ones Ray assigned to the worker under Ray), as ``CUDA_VISIBLE_DEVICES``."""
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    mine = ids[local_rank * tp:(local_rank + 1) * tp]
    if len(mine) < tp:
        raise RLForgeError(f"rollout.vllm.tensor_parallel_size={tp}: local rank {local_rank} needs GPUs "
                           f"{local_rank * tp}..{(local_rank + 1) * tp - 1} of the {len(ids)} visible ({visible}).")
    return ",".join(mine)
