"""Build the tiny Qwen2-VL-shaped model (rlforge.multimodal.build_tiny_vlm) into a folder, offline, and warm it up
with supervised steps on the built-in vision task, so that GRPO has something to improve.

    python scripts/build_tiny_vlm.py rlforge/assets/tiny-vlm      # the shipped builtin:tiny-vlm
    python scripts/build_tiny_vlm.py /tmp/vlm --sft-steps 0        # random weights only

The model: 0.56M parameters, rlforge's char-level tokenizer with the vision tokens, a Qwen2-VL image processor
bounded to 56x56..112x112 pixels (4 to 16 image tokens). The warm-up: cross-entropy on "<count><|end|>" after the
prompt, through rlforge's own multimodal path (tokenize_rows with the processor, ops.response_logprobs with the rows'
pixel values), on pictures of the training seed; it prints the greedy accuracy on the held-out pictures (the
validation seed of data.name=vision) before and after. See docs/multimodal.md.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from rlforge import batch as B
from rlforge import ops
from rlforge.data import collate, tokenize_rows
from rlforge.multimodal import build_tiny_vlm, save_vlm
from rlforge.plugins.data.vision import vision_rows
from rlforge.plugins.rollout.hf_decode import Decoder
from rlforge.sampling import SamplingParams

VAL_SEED = 54321  # the vision dataset's validation seed (plugins/data/vision.py)


def _batch(prompts, tok):
    """Prompts with their answer "<count><|end|>" as the response, in the rollout layout."""
    batch = collate(prompts, tok.pad_token_id, list(range(len(prompts))))
    answers = [tok.encode(str(p.ground_truth), add_special_tokens=False) + [tok.eos_token_id] for p in prompts]
    width = max(len(a) for a in answers)
    responses = torch.full((len(prompts), width), tok.pad_token_id)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, a in enumerate(answers):
        responses[i, : len(a)], mask[i, : len(a)] = torch.tensor(a), 1
    batch[B.RESPONSES], batch[B.RESPONSE_MASK] = responses, mask
    batch[B.INPUT_IDS] = torch.cat([batch[B.PROMPTS], responses], 1)
    batch[B.ATTENTION_MASK] = torch.cat([batch[B.PROMPT_MASK], mask], 1)
    return batch


@torch.no_grad()
def accuracy(model, tok, prompts) -> float:
    """Greedy accuracy: the response (up to <|end|>) is the count."""
    model.eval()
    batch = collate(prompts, tok.pad_token_id, list(range(len(prompts))))
    decoder = Decoder(model, [tok.eos_token_id], tok.pad_token_id)
    out, _ = decoder.decode(batch[B.PROMPTS], batch[B.PROMPT_MASK], SamplingParams(temperature=0.0, max_new_tokens=4),
                            batch[B.MULTI_MODAL_INPUTS])
    texts = [tok.decode(row, skip_special_tokens=True).strip() for row in out.tolist()]
    model.train()
    return sum(t == str(p.ground_truth) for t, p in zip(texts, prompts)) / len(prompts)


def warm_up(model, tok, processor, steps: int, batch_size: int, lr: float, seed: int) -> None:
    train = tokenize_rows(vision_rows(2000, 4, seed=seed), tok, 64, False, "sft", processor=processor)
    val = tokenize_rows(vision_rows(100, 4, seed=VAL_SEED), tok, 64, False, "val", processor=processor)
    print(f"held-out greedy accuracy before: {accuracy(model, tok, val):.2f}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    for step in range(1, steps + 1):
        batch = _batch(rng.sample(train, batch_size), tok)
        logp, _ = ops.response_logprobs(model, batch[B.INPUT_IDS], batch[B.ATTENTION_MASK],
                                        batch[B.RESPONSES].shape[1], multi_modal=batch[B.MULTI_MODAL_INPUTS])
        loss = -(logp * batch[B.RESPONSE_MASK]).sum() / batch[B.RESPONSE_MASK].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps:
            print(f"step {step}: loss {loss.item():.3f}")
    print(f"held-out greedy accuracy after: {accuracy(model, tok, val):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write (created; files in it are overwritten)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and of the warm-up")
    parser.add_argument("--sft-steps", type=int, default=175, help="supervised warm-up steps (0: random weights)")
    parser.add_argument("--batch-size", type=int, default=32, help="pictures per warm-up step")
    parser.add_argument("--lr", type=float, default=5e-4, help="the warm-up's AdamW learning rate")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model, processor = build_tiny_vlm()
    if args.sft_steps:
        warm_up(model, processor.tokenizer, processor, args.sft_steps, args.batch_size, args.lr, args.seed + 1)
    save_vlm(model, processor, Path(args.out_dir))
    print(f"wrote the tiny vision-language model ({sum(p.numel() for p in model.parameters())} parameters) to "
          f"{args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
