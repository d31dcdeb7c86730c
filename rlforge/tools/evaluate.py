"""``rlforge eval``: score a model on a dataset with the reward functions; mean reward, accuracy and pass@k.

pass@k uses the unbiased estimator of Chen et al. (2021): with ``n`` samples of a prompt of which ``c`` are
correct, ``pass@k = 1 - C(n-c, k) / C(n, k)``, averaged over prompts. A sample is correct when its
accuracy (the reward function's ``acc``, else ``score >= 1``) is at least 0.5.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, read_write

from rlforge import batch as B
from rlforge import diskio
from rlforge.build import Builder
from rlforge.errors import RLForgeError
from rlforge.evaluation import FAULT_METRICS
from rlforge.sampling import SamplingParams, derived_seed
from rlforge.models import load_tokenizer_and_processor
from rlforge.tools.inference import load_engine, prompt_batches


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n`` (``c`` correct) is correct."""
    if not 0 < k <= n:
        raise ValueError(f"k must be in 1..n={n}, got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def parse_ks(text: str | None, n: int) -> list[int]:
    """``"1,4"`` -> [1, 4]; by default 1 and n. Every k must be in 1..n."""
    if not text:
        return sorted({1, n})
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise RLForgeError(f"--k must be comma-separated integers like 1,4,8, got '{text}'.") from None
    bad = [k for k in ks if not 0 < k <= n]
    if bad or not ks:
        raise RLForgeError(f"--k {text}: each k must be between 1 and the samples per prompt n={n} (--n).")
    return ks


def summarize(groups: dict[Any, list[tuple[float, float]]], ks: list[int]) -> dict[str, float]:
    """Metrics over prompts: ``groups`` maps a prompt to its samples' (score, accuracy)."""
    samples = [s for g in groups.values() for s in g]
    out = {
        "reward/mean": sum(score for score, _ in samples) / len(samples),
        "accuracy": sum(acc for _, acc in samples) / len(samples),
    }
    for k in ks:
        per_prompt = [pass_at_k(len(g), sum(acc >= 0.5 for _, acc in g), k) for g in groups.values()]
        out[f"pass@{k}"] = sum(per_prompt) / len(per_prompt)
    return out


def evaluate(
    cfg: DictConfig, pm: Any, *, split: str = "val", ks: str | None = None, limit: int | None = None,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Generate ``rollout.val_n`` samples per prompt (through the agent loop when ``rollout.agent.loop`` is set),
    score them with ``reward.manager``; return the report."""
    params = SamplingParams.from_config(cfg.rollout, validation=True)
    k_list = parse_ks(ks, params.n)
    tokenizer, processor = load_tokenizer_and_processor(cfg)
    batches, rows = prompt_batches(cfg, pm, tokenizer, split, limit, processor=processor)
    builder = Builder(cfg, pm)
    reward = builder.reward(tokenizer)
    engine = load_engine(cfg, pm, tokenizer)
    evaluate = builder.evaluator(engine, tokenizer, reward, processor=processor)
    groups: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    extras: dict[Any, list[dict[str, Any]]] = defaultdict(list)  # the reward function's other keys, per sample
    source: dict[Any, str] = {}
    start = time.perf_counter()
    try:
        for i, prompts in enumerate(batches, 1):
            scored = evaluate(prompts, replace(params, seed=derived_seed(cfg.trainer.seed, i)))
            if B.ACC not in scored:
                raise RLForgeError(f"Reward manager '{cfg.reward.manager}' (reward.manager) sets no 'acc' column.")
            extra_rows = scored.lists.get(B.REWARD_EXTRA_INFO) or [{}] * len(scored)
            for uid, src, score, acc, extra in zip(scored[B.UID], scored[B.DATA_SOURCE], B.reported_scores(scored),
                                                   scored[B.ACC].tolist(), extra_rows):
                groups[uid].append((score, acc))
                extras[uid].append(extra)
                source[uid] = src
            log(f"eval: {i}/{len(batches)} batches, {len(groups)} prompts")
    finally:
        evaluate.close()
        engine.shutdown()
        reward.close()
    by_source = {
        src: {"prompts": len(sub), **summarize(sub, k_list)}
        for src in sorted(set(source.values()))
        if (sub := {u: g for u, g in groups.items() if source[u] == src})
    }
    found = evaluate.metrics()
    faults = {key: found.pop(key) for key in FAULT_METRICS if key in found}  # samples scored reward.fallback_score
    return {
        "model": cfg.model.path,
        "dataset": cfg.data.name,
        "split": split,
        "rows": rows,
        "prompts": len(groups),
        "samples_per_prompt": params.n,
        "temperature": params.temperature,
        "max_new_tokens": params.max_new_tokens,
        "rollout": cfg.rollout.name,
        "reward_manager": cfg.reward.manager,
        "metrics": summarize(groups, k_list),
        "by_data_source": by_source,
        "validation_metrics": _validation_metrics(groups, source, extras),
        **({"agent": found} if evaluate.agent is not None else {}),
        **({"reward_failures": faults} if faults else {}),
        "seconds": round(time.perf_counter() - start, 3),
    }


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """``report`` as JSON in ``path`` (all or nothing: ``diskio.write_atomic``)."""
    out = Path(path)
    with diskio.disk_errors(f"write the report {out}", "Give --out a path in a writable folder with space.",
                            where=out.parent):
        out.parent.mkdir(parents=True, exist_ok=True)
        diskio.write_atomic(out, json.dumps(report, indent=2) + "\n")
    return out


def evaluate_launch(cfg: DictConfig, pm: Any, log: Callable[[str], Any] = print) -> Path:
    """verl's ``trainer.val_only``: validate what a training launch of the same keys continues from (the checkpoint
    ``trainer.resume`` finds, which verl loads before validating; else ``model.path``), write
    ``eval_report_step_<step>.json`` into the run folder (verl's ``default_local_dir``; ``_2``, ``_3``, ... when that step
    was validated before) and log the metrics to the launch's loggers
    (``logger.backends``) at that checkpoint's step (0 for the model), as verl logs its validation there."""
    from rlforge.checkpoint import step_of
    from rlforge.resume import VAL_ONLY_REPORT, resumed_checkpoint
    from rlforge.tools.export import model_folder

    found = resumed_checkpoint(cfg)
    if found is not None:  # its actor/ (written from the shards where it has none; a LoRA one merged)
        cfg = cfg.copy()
        with read_write(cfg):
            cfg.model.path = model_folder(str(found))
        log(f"validating {found}: the checkpoint a training launch of these keys resumes from (as verl does)")
    else:
        log(f"validating model.path={cfg.model.path}: no checkpoint for trainer.resume={cfg.trainer.resume} to "
            "continue from")
    folder = Path(cfg.trainer.run_dir or Path(cfg.trainer.runs_root) / cfg.trainer.experiment)
    report = evaluate(cfg, pm, split="val", ks=None, log=log)
    step = step_of(found) if found is not None else 0
    path = folder / f"{VAL_ONLY_REPORT}{step:06d}.json"
    repeat = 1
    while path.exists():  # the same step validated again: a report of its own, none overwritten
        repeat += 1
        path = folder / f"{VAL_ONLY_REPORT}{step:06d}_{repeat}.json"
    write_report(report, path)
    loggers = Builder(cfg, pm).loggers(str(folder))
    try:
        for logger in loggers:
            logger.log_params(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]  # a dict
            logger.log_metrics(report["validation_metrics"], step)
    finally:
        for logger in loggers:
            logger.close()
    return path


def _validation_metrics(groups: dict[Any, list[tuple[float, float]]], source: dict[Any, str],
                        extras: dict[Any, list[dict[str, Any]]]) -> dict[str, float]:
    """The samples' metrics (``groups``: a prompt's (score, accuracy) per sample; ``source``: its data source;
    ``extras``: the reward function's other keys per sample) under the names a training run's validation logs
    (``val/reward``, ``val/accuracy``, and verl's ``val-core/<data_source>/acc/mean@N``, ...:
    ``module.generation_metrics``)."""
    import torch

    from rlforge.module import generation_metrics

    samples = [(uid, source[uid], score, acc, extra) for uid, group in groups.items()
               for (score, acc), extra in zip(group, extras[uid])]
    uids, sources, scores, accs, rows = zip(*samples) if samples else ((), (), (), (), ())
    return generation_metrics(B.Batch({B.SCORES: torch.tensor(scores), B.ACC: torch.tensor(accs)},
                                      {B.DATA_SOURCE: list(sources), B.UID: list(uids),
                                       B.REWARD_EXTRA_INFO: list(rows)}))
