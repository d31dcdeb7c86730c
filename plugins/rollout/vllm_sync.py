"""Weight sync for the ``vllm`` rollout engine: named tensors -> size-bounded buckets -> the engine's loader.

The trainer side (:func:`plan_buckets`) groups ``(name, tensor)`` pairs into buckets of raw bytes plus a spec
list. A bucket is written into a file in a shared-memory folder (:func:`file_buckets`, ``/dev/shm`` by default)
whose path travels in an engine ``collective_rpc`` call (vLLM's own RPC channel; no engine restart), or, without such
a folder, travels as bytes inside the call (:func:`pack_buckets`). :class:`WeightSyncExtension` (a vLLM worker
extension, mixed into the worker class) maps or unpacks it and hands it to the model's own ``load_weights``. Raw
bytes rather than tensors because vLLM's RPC decoder keeps tensor metadata but not tensor data for untyped
arguments; files because each RPC message is copied several times on its way (trainer -> engine core -> worker).

A sync is a session: ``rlforge_begin_weight_sync`` puts the model into vLLM's layerwise-reload mode, every
bucket is loaded, and ``rlforge_finish_weight_sync`` re-runs each layer's post-load processing (e.g. the CPU
GEMM weight pre-packing, which replaces the checkpoint-format weights) and reports parameters that were not
updated. Nothing here imports vllm at module level: the trainer process imports this module without it.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

# (name, dtype, shape, byte offset, byte length)
TensorSpec = tuple[str, str, list[int], int, int]
ALIGN = 16  # bytes; every tensor starts at a multiple of this offset in its bucket
IDLE_SPIN_ENV = "RLFORGE_VLLM_IDLE_SPIN_S"  # rollout.vllm.idle_spin_s, for the engine's processes
RECHECK_MS = 20  # how often a blocked vLLM queue reader looks at its queue, with rlforge's idle spin (vLLM: 5000)


def apply_idle_spin() -> None:
    """Make ``$RLFORGE_VLLM_IDLE_SPIN_S`` the busy-wait of every vLLM message queue this process creates from now on.

    vLLM's processes read from shared-memory queues and spin on them (``sched_yield`` in a loop) for ``busy_loop_s``
    (1 s) after every message: the worker on its work queue, the engine core on the workers' replies. Colocated
    with the trainer, that is a core taken from the actor update for the first second after each generation and
    each weight-sync call. The engine calls this in the trainer's process before it starts vLLM (forked processes
    inherit it), and rlforge registers it as a ``vllm.general_plugins`` entry point, which vLLM runs in each of its
    processes before they create their queues (spawned processes). Nothing happens when the variable is unset
    (then vllm is not imported either).

    A reader that blocks waits for the writer's wake-up message, and vLLM's wake-ups can be lost (it re-checks the
    queue every 5 s in case): with a short spin, a step of the engine then stalls 5 s (measured: 3 of 12
    generations with a spin of 0). So the re-check interval becomes :data:`RECHECK_MS` as well: a lost wake-up
    costs at most that."""
    seconds = os.environ.get(IDLE_SPIN_ENV)
    if seconds is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = RECHECK_MS

    init = SpinCondition.__init__
    names = init.__code__.co_varnames[: init.__code__.co_argcount]
    defaults = list(init.__defaults__ or ())
    defaults[names.index("busy_loop_s") - (len(names) - len(defaults))] = float(seconds)
    init.__defaults__ = tuple(defaults)


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[tuple[list[TensorSpec], list[torch.Tensor]]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (a larger tensor gets its own): each bucket's
    specs (byte offsets within the bucket) and its tensors as flat bytes on the CPU."""
    specs: list[TensorSpec] = []
    parts: list[torch.Tensor] = []
    end = 0
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        size = t.numel() * t.element_size()
        offset = end + (-end % ALIGN)  # dtype views need aligned offsets
        if specs and offset + size > bucket_bytes:
            yield specs, parts
            specs, parts, offset = [], [], 0
        specs.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), offset, size))
        parts.append(t.reshape(-1).view(torch.uint8))
        end = offset + size
    if specs:
        yield specs, parts


def bucket_size(specs: list[TensorSpec]) -> int:
    return specs[-1][3] + specs[-1][4]


def pack_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[tuple[list[TensorSpec], bytearray]]:
    """The buckets of :func:`plan_buckets` as raw bytes (to travel inside vLLM's RPC messages)."""
    for specs, parts in plan_buckets(named_tensors, bucket_bytes):
        yield specs, _as_bytes(specs, parts)


def _as_bytes(specs: list[TensorSpec], parts: list[torch.Tensor]) -> bytearray:
    blob = bytearray(bucket_size(specs))
    for (_, _, _, offset, size), part in zip(specs, parts):
        blob[offset:offset + size] = memoryview(part.numpy())
    return blob


def file_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, folder: str
) -> Iterator[tuple[list[TensorSpec], str | bytearray]]:
    """The buckets of :func:`plan_buckets`, each written into a new file in ``folder`` (a tmpfs such as /dev/shm: the
    engine maps it, no bytes cross vLLM's RPC); the file is removed when the caller asks for the next bucket (the
    engine's mapping keeps its pages). A bucket the folder has no room for comes as bytes (:func:`pack_buckets`)."""
    for specs, parts in plan_buckets(named_tensors, bucket_bytes):
        size = bucket_size(specs)
        fd, path = tempfile.mkstemp(prefix="rlforge-weights-", dir=folder)
        try:
            try:
                os.posix_fallocate(fd, 0, max(size, 1))  # ENOSPC now rather than SIGBUS when writing the mapping
            except OSError:
                yield specs, _as_bytes(specs, parts)
                continue
            mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            for (_, _, _, offset, length), part in zip(specs, parts):
                mapped[offset:offset + length].copy_(part)
            del mapped
            yield specs, path
        finally:
            os.close(fd)
            os.unlink(path)


def unpack_bucket(specs: list[TensorSpec], blob: bytes | str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one bucket, as views on ``blob`` (bytes, or the path of a :func:`file_buckets` file, mapped)."""
    if isinstance(blob, str):
        raw = torch.from_file(blob, shared=True, size=max(bucket_size(specs), 1), dtype=torch.uint8)
    elif len(blob):
        with warnings.catch_warnings():  # blob is read-only bytes; the views are only read
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(blob, dtype=torch.uint8)
    else:
        raw = torch.empty(0, dtype=torch.uint8)
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
        """Change how long this running worker busy-waits for the next message after its last one before it blocks
        (see :func:`apply_idle_spin`, which sets it for queues not created yet). Returns the number of queues set
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

    def rlforge_load_weights(self, specs: list[TensorSpec], blob: bytes | str) -> None:
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

