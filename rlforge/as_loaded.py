"""Give a saved model folder back what its source model had when it was loaded: weight dtypes and tokenizer.

Training changes both in memory: a bf16 model trains in fp32 on the CPU (``model.precision``), and a tokenizer
without a pad token pads with EOS, on the left (``rlforge.models.load_tokenizer``). ``rlforge export`` and
``rlforge sft``'s output folder call :func:`as_loaded` on what they wrote, so a bf16 model comes out in bf16 (half
the size of fp32) and the tokenizer keeps its own pad token. ``rlforge export --dtype`` writes another dtype instead,
and the export warns where casting down rounded most of the training's changes back to the source's values
(:class:`Rounding`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.weight_files import safetensors_files

SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


@dataclass
class Rounding:
    """What casting trained weights into a narrower dtype rounded away: of ``changed`` weights (elements that differ
    from the source model's), ``lost`` are back at the source's value after the cast."""

    changed: int = 0
    lost: int = 0
    dtype: str = ""  # the dtype written (as_loaded)
    chosen: bool = False  # ``dtype`` was asked for (else the source model's)

    def __add__(self, other: Rounding) -> Rounding:
        return Rounding(self.changed + other.changed, self.lost + other.lost)

    def warning(self, remedy: str = "Export with --dtype float32") -> str:
        """A warning where the cast to :attr:`dtype` rounded away most of the training's changes (more than half),
        else "". ``remedy``: how to write float32 instead."""
        if not self.changed or self.lost * 2 <= self.changed:
            return ""
        dtype, why = self.dtype, "" if self.chosen else ", the dtype it was loaded in"
        return (f"Of the {self.changed:,} weights training changed, {self.lost:,} ({self.lost / self.changed:.0%}) "
                f"round back to the source model's values in {dtype}{why}: the saved model keeps little of the "
                f"training (a small learning rate or few steps move weights less than {dtype} can show). {remedy} to "
                f"keep every change (twice the size of a 16-bit model).")


def as_loaded(out: Path, source: Path, weights: bool = True, dtype: str = "") -> Rounding:
    """Give the saved folder ``out`` what the model folder ``source`` has: with ``weights``, each floating weight in
    the source's dtype for that name (``dtype``: in that torch dtype instead, e.g. ``float32``) and the config's
    ``dtype``; the tokenizer's pad token and padding side. Returns what casting to a narrower dtype rounded away, and
    the dtype written."""
    rounding = Rounding()
    if weights:
        index = _weight_index(source)
        # a weight the source lacks (a reward model's new score head) takes the dtype the source's config names
        added = _config_dtype(json.loads((source / "config.json").read_text()))
        dtypes = {name: dtype or (index[name][1] if name in index else added) for name in _weight_index(out)}
        grown = 0
        for shard in safetensors_files(out):
            more, lost = _cast_shard(shard, dtypes, index)
            grown, rounding = grown + more, rounding + lost
        index_file = out / "model.safetensors.index.json"
        if grown and index_file.is_file():  # the total size it records changes with the weights' dtypes
            data = json.loads(index_file.read_text())
            meta = data.setdefault("metadata", {})
            if "total_size" in meta:
                meta["total_size"] += grown
                index_file.write_text(json.dumps(data, indent=2) + "\n")
        _copy_config_dtype(source / "config.json", out / "config.json", dtype)
        rounding.dtype, rounding.chosen = dtype or added or "its dtype", bool(dtype)
    _restore_tokenizer(source, out)
    return rounding


def _weight_index(folder: Path) -> dict[str, tuple[Path, str]]:
    """Weight name -> (its shard, its torch dtype name), read from the safetensors headers (no tensor is loaded)."""
    from safetensors import safe_open

    found = {}
    for shard in safetensors_files(folder):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                found[name] = (shard, SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype(), ""))
    return found


def _cast_shard(shard: Path, dtypes: dict[str, str], source: dict[str, tuple[Path, str]]) -> tuple[int, Rounding]:
    """Rewrite ``shard`` with its floating weights in ``dtypes``; returns how many bytes the weights grew by and,
    for weights cast to a narrower dtype, what the cast rounded away against the ``source`` model's values."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(shard))
    changed = {name: t.to(getattr(torch, dtypes[name])) for name, t in tensors.items()
               if t.is_floating_point() and dtypes.get(name) and str(t.dtype) != f"torch.{dtypes[name]}"}
    rounding = sum((_rounded(tensors[name], cast, source[name][0], name) for name, cast in changed.items()
                    if name in source and cast.element_size() < tensors[name].element_size()), Rounding())
    if changed:  # after reading the source: it may be this very folder (an export without its model, rlforge.tools.export)
        save_file({**tensors, **changed}, str(shard), metadata={"format": "pt"})
    return sum(t.numel() * (t.element_size() - tensors[name].element_size()) for name, t in changed.items()), rounding


def _rounded(trained: Any, cast: Any, shard: Path, name: str) -> Rounding:
    """Elements of ``trained`` that differ from the source's weight ``name`` (in ``shard``), and how many of them
    ``cast`` (``trained`` in a narrower dtype) puts at the source's value in that dtype."""
    from safetensors import safe_open

    with safe_open(str(shard), framework="pt") as f:
        source = f.get_tensor(name)
    if source.shape != trained.shape:
        return Rounding()
    moved = trained != source.to(trained.dtype)
    return Rounding(int(moved.sum()), int((moved & (cast == source.to(cast.dtype))).sum()))


def _config_dtype(config: dict[str, Any]) -> str:
    """The torch dtype a model config names (``dtype``, or ``torch_dtype`` in older configs), or ""."""
    named = config.get("dtype") or config.get("torch_dtype")
    return named if named in SAFETENSORS_DTYPES.values() else ""


def _copy_config_dtype(source: Path, out: Path, dtype: str = "") -> None:
    src, dst = json.loads(source.read_text()), json.loads(out.read_text())
    dtype = dtype or _config_dtype(src)
    if dtype and dtype != _config_dtype(dst):
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
