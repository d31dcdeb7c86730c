"""Build the tiny Qwen2-VL-shaped model (rlforge.multimodal.build_tiny_vlm) into a folder, offline, in seconds.

    python scripts/build_tiny_vlm.py rlforge/assets/tiny-vlm      # the shipped builtin:tiny-vlm

Random weights (seeded): 0.56M parameters, rlforge's char-level tokenizer with the vision tokens, a Qwen2-VL image
processor bounded to 56x56..112x112 pixels (4 to 16 image tokens). See docs/multimodal.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from rlforge.multimodal import build_tiny_vlm, save_vlm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write (created; files in it are overwritten)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model, processor = build_tiny_vlm()
    save_vlm(model, processor, Path(args.out_dir))
    print(f"wrote the tiny vision-language model ({sum(p.numel() for p in model.parameters())} parameters) to "
          f"{args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
