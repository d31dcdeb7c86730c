"""``rlforge generate``: batch generation for a dataset, one JSON line per sample, with any rollout engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlforge import batch as B
from rlforge import diskio
from rlforge.agent.config import SINGLE_TURN
from rlforge.sampling import SamplingParams, derived_seed
from rlforge.models import load_tokenizer_and_processor
from rlforge.tools.inference import load_engine, prompt_batches


def generate(
    cfg: DictConfig, pm: Any, out: str | Path, *, split: str = "val", limit: int | None = None,
    log: Callable[[str], Any] = print,
) -> int:
    """Write ``rollout.val_n`` samples per prompt of ``split`` to ``out`` (JSONL); return the number of lines.

    Each line: ``index`` (the row), ``sample`` (0..n-1), ``data_source``, ``prompt`` (chat messages),
    ``response`` (decoded, special tokens removed), ``response_tokens``, ``ground_truth`` and ``extra_info``.
    Rows need only a ``prompt``.
    """
    if cfg.rollout.agent.loop != SINGLE_TURN:
        log(f"note: rlforge generate runs the engine's single-turn generate; rollout.agent.loop="
            f"{cfg.rollout.agent.loop} is not run (rlforge eval runs it)")
    params = SamplingParams.from_config(cfg.rollout, validation=True)
    tokenizer, processor = load_tokenizer_and_processor(cfg)
    batches, _ = prompt_batches(cfg, pm, tokenizer, split, limit, need_reward=False, processor=processor)
    engine = load_engine(cfg, pm, tokenizer)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")  # renamed to ``out`` once complete: a failure leaves ``out`` be
    lines = 0
    try:
        with diskio.disk_errors(f"write {path}", "Give --out a path in a writable folder with space.",
                                where=path.parent), diskio.open_text(partial) as fh:
            for i, prompts in enumerate(batches, 1):
                done = engine.generate(prompts, replace(params, seed=derived_seed(cfg.trainer.seed, i)))
                texts = tokenizer.batch_decode(done[B.RESPONSES], skip_special_tokens=True)
                lengths = done[B.RESPONSE_MASK].sum(-1).tolist()
                for j, text in enumerate(texts):
                    fh.write(json.dumps({
                        "index": done[B.UID][j],
                        "sample": j % params.n,
                        "data_source": done[B.DATA_SOURCE][j],
                        "prompt": done[B.RAW_PROMPT][j],
                        "response": text,
                        "response_tokens": int(lengths[j]),
                        "ground_truth": done[B.GROUND_TRUTH][j],
                        "extra_info": done[B.EXTRA_INFO][j],
                    }, default=str) + "\n")
                lines += len(texts)
                log(f"generate: {i}/{len(batches)} batches, {lines} samples")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
        engine.shutdown()
    return lines
