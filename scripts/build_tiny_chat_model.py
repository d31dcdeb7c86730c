"""Build the tiny Qwen2 chat model (rlforge.tools.tiny_chat) into a folder, offline, in about a second.

    python scripts/build_tiny_chat_model.py /tmp/tiny-chat
    rlforge generate /tmp/tiny-chat --data prompts.jsonl --out samples.jsonl

Random weights: it is for wiring checks (tokenizer, chat template with tools, stop tokens, engines), not answers.
"""

from __future__ import annotations

import argparse

from rlforge.tools.tiny_chat import build_tiny_chat_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write (created; files in it are overwritten)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the tokenizer corpus and the weights")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (head_dim = hidden / 2 heads)")
    args = parser.parse_args(argv)
    folder = build_tiny_chat_model(args.out_dir, seed=args.seed, layers=args.layers, hidden=args.hidden)
    print(f"wrote the tiny chat model to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
