"""The ``vllm_native`` weight-sync backend of the ``vllm`` engine: vLLM 0.32's weight-transfer API (``auto`` picks it
where it runs: CUDA, one GPU per engine, no LoRA).

The engine starts with ``weight_transfer_config={"backend": "ipc"}``; each sync hands the actor's tensors, on the GPU
the engine shares with this process, to vLLM's trainer-side IPC engine (``WeightTransferTrainerFactory.trainer_init``
with ``IPCTrainerInitInfo``, packed into buffers of ``rollout.vllm.weight_bucket_mb``), which sends CUDA IPC handles
through the engine's ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` (``AsyncLLM``'s own
methods): the engine's worker maps the buffers and loads them with vLLM's layerwise reload. No copy to the CPU, no
file. The IPC handles carry torch types, which vLLM's message encoder sends only with
``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (set for the engine's processes: they are this run's own, on this machine).

A rollout worker group (``ray.rollout_workers``) uses it too: each worker's engine shares that worker's GPU, and the
worker receives the gathered weights through Ray's object store first. vLLM's NCCL transfer from the actor's GPU to
engines on other GPUs is not wired in.

Runs only on a GPU: ``benchmarks/gpu_check.py`` (weight-sync section) checks it there; on CPU the test is skipped.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from rlforge.plugins.rollout.vllm_weights import VLLMSync
from rlforge.weight_sync import tensor_bytes

if TYPE_CHECKING:
    import torch


class NativeSync(VLLMSync):
    """vLLM's CUDA IPC weight transfer into the engine that shares this process's GPU."""

    preference = 20

    def __init__(self, config: Any, engine: Any) -> None:
        super().__init__(config, engine)
        self._sender: Any = None  # vLLM's trainer-side IPC engine, made at the first sync

    @classmethod
    def unusable(cls, config: Any) -> str:
        import torch

        from rlforge import lora

        if not torch.cuda.is_available():
            return "vLLM's weight transfer uses CUDA IPC, and this process sees no CUDA GPU"
        if lora.enabled(config):
            return (f"a LoRA run (model.lora.rank={config.model.lora.rank}) syncs only its adapter, which vLLM's "
                    f"weight transfer does not carry (rollout.weight_sync=files loads it as a vLLM LoRA adapter)")
        if config.rollout.vllm.tensor_parallel_size > 1:
            return (f"CUDA IPC hands tensors to engine workers on this process's GPU; with rollout.vllm."
                    f"tensor_parallel_size={config.rollout.vllm.tensor_parallel_size} the other workers are on others")
        try:
            import vllm.distributed.weight_transfer  # noqa: F401
        except ImportError as exc:
            return f"vLLM's weight-transfer API cannot be imported ({exc}); it needs vllm >= 0.32"
        return ""

    def engine_args(self) -> dict[str, Any]:
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the IPC handles (see the module doc)
        return {"weight_transfer_config": {"backend": "ipc"}}

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        source = _stream_class()(named_tensors)
        if self._sender is None:
            info = IPCTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=self.rollout.bucket_bytes)
            self._sender = WeightTransferTrainerFactory.trainer_init(info, client=_EngineClient(self.rollout._llm),
                                                                     source=source)
        self._sender.source = source
        self._sender.send_weights()
        return source.bytes

    def close(self) -> None:
        if self._sender is not None:
            self._sender.shutdown()
            self._sender = None


@functools.cache
def _stream_class() -> type:
    """vLLM's ``WeightSource`` over one sync's tensors (vllm is imported only when a sync runs)."""
    import torch
    from vllm.distributed.weight_transfer import WeightSource

    class Stream(WeightSource):
        """The tensors moved to this process's GPU where they are not on it, counted as they go. IPC's packed sender
        only iterates it, once."""

        def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
            self.named_tensors = named_tensors
            self.bytes = 0

        def metadata(self) -> list[Any]:
            raise NotImplementedError("the IPC sender iterates the weights only; no metadata is declared ahead")

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            device = torch.device("cuda", torch.cuda.current_device())
            for name, tensor in self.named_tensors:
                self.bytes += tensor_bytes(tensor)
                yield name, tensor.detach().to(device)

    return Stream


class _EngineClient:
    """vLLM's ``VLLMWeightSyncClient`` over rlforge's ``AsyncEngine`` (the ``AsyncLLM`` of this process)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self.llm.call("init_weight_transfer_engine", WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self) -> None:
        self.llm.call("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self.llm.call("update_weights", WeightTransferUpdateRequest(update_info=update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.call("finish_weight_update", weight_version)
