"""Give a saved model folder back what its source model had when it was loaded: weight dtypes and tokenizer.

Training changes both in memory: a bf16 model trains in fp32 on the CPU (``model.precision``), and a tokenizer
without a pad token pads with EOS, on the left (``rlforge.models.load_tokenizer``). ``rlforge export`` and
``rlforge sft``'s output folder call :func:`as_loaded` on what they wrote, so a bf16 model comes out in bf16 (half
the size of fp32) and the tokenizer keeps its own pad token.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlforge.weight_files import safetensors_files

SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def as_loaded(out: Path, source: Path, weights: bool = True) -> None:
    """Give the saved folder ``out`` what the model folder ``source`` has: with ``weights``, each floating weight in
    the source's dtype for that name and the config's ``dtype``; the tokenizer's pad token and padding side."""
    if weights:
        dtypes = _weight_dtypes(source)
        grown = sum(_cast_shard(shard, dtypes) for shard in safetensors_files(out))
        index = out / "model.safetensors.index.json"
        if grown and index.is_file():  # the total size it records changes with the weights' dtypes
            data = json.loads(index.read_text())
            meta = data.setdefault("metadata", {})
            if "total_size" in meta:
                meta["total_size"] += grown
                index.write_text(json.dumps(data, indent=2) + "\n")
        _copy_config_dtype(source / "config.json", out / "config.json")
    _restore_tokenizer(source, out)


def _weight_dtypes(folder: Path) -> dict[str, str]:
    """Weight name -> torch dtype name, read from the safetensors headers (no tensor is loaded)."""
    from safetensors import safe_open

    found = {}
    for shard in safetensors_files(folder):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                found[name] = SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype(), "")
    return found


def _cast_shard(shard: Path, dtypes: dict[str, str]) -> int:
    """Rewrite ``shard`` with its floating weights in ``dtypes``; returns how many bytes the weights grew by."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(shard))
    changed = {name: t.to(getattr(torch, dtypes[name])) for name, t in tensors.items()
               if t.is_floating_point() and dtypes.get(name) and str(t.dtype) != f"torch.{dtypes[name]}"}
    if changed:
        save_file({**tensors, **changed}, str(shard), metadata={"format": "pt"})
    return sum(t.numel() * (t.element_size() - tensors[name].element_size()) for name, t in changed.items())


def _copy_config_dtype(source: Path, out: Path) -> None:
    src, dst = json.loads(source.read_text()), json.loads(out.read_text())
    dtype = src.get("dtype") or src.get("torch_dtype")
    if dtype and dtype != (dst.get("dtype") or dst.get("torch_dtype")):
        dst.pop("torch_dtype", None)
        dst["dtype"] = dtype
        out.write_text(json.dumps(dst, indent=2, sort_keys=True) + "\n")


def _restore_tokenizer(source: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    try:
        original, exported = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(out)
    except (OSError, ValueError):  # a folder without a tokenizer: nothing to restore
        return
    if (original.pad_token, original.padding_side) != (exported.pad_token, exported.padding_side):
        exported.pad_token = original.pad_token
        exported.padding_side = original.padding_side
        exported.save_pretrained(out)
