"""The safetensors files of a model folder: the ones ``from_pretrained`` reads, and whether each is complete (read
from its header, no weights loaded)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rlforge.errors import RLForgeError

SAFETENSORS_INDEX = "model.safetensors.index.json"


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads from ``folder``: the shards its index lists, else
    ``model.safetensors`` (empty when the folder has neither).

    :raises RLForgeError: when the index itself cannot be read.
    """
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        try:
            return [folder / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            raise RLForgeError(f"{index} cannot be read: it is truncated or corrupted.") from None
    single = folder / "model.safetensors"
    return [single] if single.exists() else []


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file, or None when it is complete: its header parses and the file is as
    long as the header says (a truncated or overwritten file shows). Reads the header only."""
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size == 0:
        return f"{path} is empty (0 bytes)"
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n)) if 0 < n <= size - 8 else None
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, TypeError, KeyError, AttributeError, IndexError):
        header, end = None, 0
    if header is None or size != 8 + n + end:
        return f"{path} cannot be read: it is truncated or corrupted ({size} bytes)"
    return None


def check_weights(folder: Path, path: str, key: str) -> None:
    """Every safetensors file of a model folder is complete, checked before ``from_pretrained`` so a damaged file
    is one error naming it instead of a ``SafetensorError`` from deep in the loader."""
    for weights in safetensors_files(folder):
        problem = safetensors_problem(weights)
        if problem:
            raise RLForgeError(f"Cannot load the model '{path}' ({key}): {problem}. Copy the model folder again, "
                               f"or point {key} at an intact one.")
