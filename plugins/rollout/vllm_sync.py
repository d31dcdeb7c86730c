"""Weight sync for the ``vllm`` rollout engine: named tensors -> size-bounded buckets -> the engine's loader.

The trainer side (:func:`pack_buckets`) packs ``(name, tensor)`` pairs into buckets of raw bytes plus a spec
list; each bucket crosses into the engine's worker process through ``LLM.collective_rpc`` (vLLM's own RPC
channel: no files, no engine restart) and :class:`WeightSyncExtension` (a vLLM worker extension, mixed into
the worker class) unpacks it and hands it to the model's own ``load_weights``. Raw bytes rather than tensors
because vLLM's RPC decoder keeps tensor metadata but not tensor data for untyped arguments.

A sync is a session: ``rlforge_begin_weight_sync`` puts the model into vLLM's layerwise-reload mode, every
bucket is loaded, and ``rlforge_finish_weight_sync`` re-runs each layer's post-load processing (e.g. the CPU
GEMM weight pre-packing, which replaces the checkpoint-format weights) and reports parameters that were not
updated. Nothing here imports vllm at module level: the trainer process imports this module without it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

# (name, dtype, shape, byte offset, byte length)
TensorSpec = tuple[str, str, list[int], int, int]
ALIGN = 16  # bytes; every tensor starts at a multiple of this offset in its bucket


def pack_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[tuple[list[TensorSpec], bytearray]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (a larger tensor gets its own)."""
    specs: list[TensorSpec] = []
    blob = bytearray()
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        size = t.numel() * t.element_size()
        pad = -len(blob) % ALIGN  # dtype views need aligned offsets
        if specs and len(blob) + pad + size > bucket_bytes:
            yield specs, blob
            specs, blob, pad = [], bytearray(), 0
        blob += bytes(pad)
        specs.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), len(blob), size))
        blob += memoryview(t.reshape(-1).view(torch.uint8).numpy())
    if specs:
        yield specs, blob


def unpack_bucket(specs: list[TensorSpec], blob: bytes) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one bucket, as views on ``blob`` (the loader copies them into the parameters)."""
    with warnings.catch_warnings():  # blob is read-only bytes; the views are only read
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.empty(0, dtype=torch.uint8)
    for name, dtype, shape, offset, size in specs:
        yield name, raw[offset:offset + size].view(getattr(torch, dtype)).reshape(shape)


def refresh_tied_lm_head(model: Any) -> None:
    """Re-run the post-load processing of an ``lm_head`` tied to the input embedding (Qwen2.5-0.5B, Llama 3.2 1B).

    It receives its weight through the embedding's name, so the layerwise reload never re-processes it, and on CPU
    its pre-packed GEMM copy of the weight (made at load time) would keep the old values.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if embed is not None and method is not None and getattr(head, "weight", None) is embed.weight:
        method.process_weights_after_loading(head)


def engine_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights a vLLM model computes with, in its own layout (this tensor-parallel rank's part; a tied weight
    once). vLLM's CPU backend packs linear weights into its GEMM kernel and leaves the parameter empty: those are
    read back through the kernel itself, ``y = x W^T`` with ``x = I`` (exact: one product by 1 per output)."""
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if pname == "weight" and p.numel() == 0 and hasattr(module, "cpu_linear"):
                eye = torch.eye(module.input_size_per_partition, dtype=p.dtype)
                p = module.cpu_linear(eye, None, None).t()
            yield f"{module_name}.{pname}", p.detach()


class WeightSyncExtension:
    """vLLM worker extension (``LLM(worker_extension_cls=...)``); methods run in the worker process."""

    def rlforge_set_idle_spin(self, seconds: float) -> int:
        """How long this worker busy-waits for the next message after its last one before it blocks (vLLM: 1 s).

        vLLM's workers read their work from a shared-memory queue and spin on it (``sched_yield`` in a loop) for
        ``busy_loop_s`` after every message: colocated with the trainer, that is a core taken from the actor update
        for the first second after each generation and each weight-sync call. Returns the number of queues set
        (0 when the engine runs its worker in-process and has none)."""
        import gc

        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

        # type(), not isinstance(): gc also lists weak proxies, and isinstance() on a dead one raises
        readers = [o for o in gc.get_objects() if type(o) is SpinCondition and o.is_reader]
        for reader in readers:
            reader.busy_loop_s = seconds
        return len(readers)

    def rlforge_begin_weight_sync(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            initialize_layerwise_reload,
        )

        worker: Any = self
        model = worker.model_runner.get_model()
        worker._rlforge_loaded = set()
        # layerwise reload warns "Failed to load weights" for weightless layers (rotary embeddings);
        # rlforge_finish_weight_sync reports parameters that were really left out
        logging.getLogger(initialize_layerwise_reload.__module__).setLevel(logging.ERROR)
        with set_current_vllm_config(worker.vllm_config):
            initialize_layerwise_reload(model)

    def rlforge_load_weights(self, specs: list[TensorSpec], blob: bytes) -> None:
        from vllm.config import set_current_vllm_config

        worker: Any = self
        with set_current_vllm_config(worker.vllm_config), torch.no_grad():
            loaded = worker.model_runner.get_model().load_weights(unpack_bucket(specs, blob))
        worker._rlforge_loaded.update(loaded or ())

    def rlforge_read_weights(self, bucket_bytes: int) -> list[tuple[list[TensorSpec], bytes]]:
        """This worker's weights as the engine computes with them (:func:`engine_weights`), packed in buckets."""
        worker: Any = self
        with torch.no_grad():
            weights = engine_weights(worker.model_runner.get_model())
            return [(specs, bytes(blob)) for specs, blob in pack_buckets(weights, bucket_bytes)]

    def rlforge_finish_weight_sync(self) -> list[str]:
        """Finish the session; return the engine parameters that no bucket updated."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
        )

        worker: Any = self
        model = worker.model_runner.get_model()
        with set_current_vllm_config(worker.vllm_config):
            finalize_layerwise_reload(model, worker.vllm_config.model_config)
            refresh_tied_lm_head(model)
        return sorted({name for name, _ in model.named_parameters()} - worker._rlforge_loaded)
