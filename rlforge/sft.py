"""``rlforge sft``: supervised fine-tuning on prompt/response pairs (loss on response tokens only).

Rows are verl-style prompt rows plus a ``response`` string; with ``sft.train_file`` unset, the built-in
dataset (``data.name``) is used with its ground truth as the response. ``sft.init=tiny-arith`` starts
from a freshly initialised tiny char-level Llama, which is how the shipped base model is built
(see scripts/build_base_model.sh).
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from rlforge.data import collate, tokenize_rows
from rlforge.errors import DataError
from rlforge.models import (
    build_char_tokenizer,
    build_tiny_llama,
    load_model,
    load_tokenizer,
)
from rlforge.protocols import SamplingParams


def sft_rows(config: DictConfig, registry: Any) -> list[dict[str, Any]]:
    s = config.sft
    if s.train_file:
        rows = registry.dataset.get("files")(_with_files(config, s.train_file), "train")
        for i, row in enumerate(rows):
            if not isinstance(row.get("response"), str):
                raise DataError(f"{row.get('_origin', f'row {i + 1}')}: SFT rows need a 'response' string.")
        return rows
    rows = registry.dataset.get(config.data.name)(config, "train")
    return [{**r, "response": str(r["reward_model"]["ground_truth"])} for r in rows]


def _with_files(config: DictConfig, path: str) -> DictConfig:
    from omegaconf import OmegaConf

    cfg: Any = OmegaConf.to_container(config)
    cfg["data"]["train_files"] = [path]
    return OmegaConf.create(cfg)


def build_examples(rows: list[dict[str, Any]], tokenizer: Any, max_prompt: int) -> list[tuple[list[int], int]]:
    """(prompt + response + EOS token ids, prompt length) per row; rows with overlong prompts are dropped."""
    prompts = tokenize_rows(rows, tokenizer, max_prompt, True, "sft data", need_reward=False)
    examples = []
    for p in prompts:
        resp = tokenizer(rows[p.index]["response"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((p.ids + resp, len(p.ids)))
    return examples


def _pad(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (seq, plen) in enumerate(examples):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        labels[i, plen : len(seq)] = torch.tensor(seq[plen:])
    return ids, attn, labels


def run_sft(config: DictConfig, plugins: Any, log: Any = print) -> dict[str, float]:
    s = config.sft
    random.seed(s.seed)
    torch.manual_seed(s.seed)
    if s.init == "tiny-arith":
        tokenizer = build_char_tokenizer()
        model = build_tiny_llama(tokenizer)
    else:
        tokenizer = load_tokenizer(s.init)
        model = load_model(s.init)
    examples = build_examples(sft_rows(config, plugins.registry), tokenizer, config.data.max_prompt_length)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < s.warmup_steps:
            return (step + 1) / s.warmup_steps
        frac = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(s.seed)
    model.train()
    start = time.perf_counter()
    loss_ema = None
    for step in range(s.steps):
        ids, attn, labels = _pad(rng.sample(examples, min(s.batch_size, len(examples))), tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_ema = loss.item() if loss_ema is None else 0.9 * loss_ema + 0.1 * loss.item()
        if (step + 1) % 50 == 0 or step + 1 == s.steps:
            log(f"sft step {step + 1}/{s.steps} | loss {loss_ema:.4f} | {time.perf_counter() - start:.0f} s")
    out = Path(s.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    acc = greedy_accuracy(config, plugins, model, tokenizer)
    log(f"saved {out} | greedy validation accuracy {100 * acc:.1f}%")
    return {"loss": float(loss_ema or 0.0), "val_accuracy": acc}


def greedy_accuracy(config: DictConfig, plugins: Any, model: Any, tokenizer: Any) -> float:
    """Greedy accuracy of ``model`` on the validation split of ``data.name`` (through the registries)."""
    reg = plugins.registry
    rows = reg.dataset.get(config.data.name)(config, "val")
    prompts = tokenize_rows(rows, tokenizer, config.data.max_prompt_length, True, "validation")
    engine = reg.rollout.get("hf")(config, model, tokenizer)
    batch = engine.generate(collate(prompts, tokenizer.pad_token_id, list(range(len(prompts)))),
                            SamplingParams.from_config(config.rollout, validation=True))
    batch = reg.reward_manager.get(config.reward.manager)(config, tokenizer, reg).score(batch)
    return float(batch["acc"].mean())
