"""The model card of an export (``README.md``): how the model was trained, with the YAML header the Hub reads.

What it says comes from the checkpoint (its ``meta.json``: the run's config, step and data fingerprint) and its run
folder: the validations up to the checkpoint's step, from ``metrics.jsonl`` (``logger.backends`` with ``jsonl``) or
else the run's mlflow store (``mlflow``, the default). The header (``huggingface_hub.ModelCardData``) has
``library_name`` (``transformers``, or ``peft`` for an adapter), ``tags`` (``rlforge``, the algorithm, ``lora``) and
``base_model`` when the run started from a Hub model. Local paths are shown by their folder name only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlforge import checkpoint as ckpt
from rlforge.models import HUB_ID, architectures, is_local_path

CARD_FILE = "README.md"
METRICS_JSONL = "metrics.jsonl"  # the jsonl logger's file (docs/tracking.md)
FIGURES = ("val/accuracy", "val/reward")  # the validation metrics a card shows, where the run logged them


def _meta(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's ``meta.json`` (empty for a checkpoint without one), its config from the run's ``config.yaml``
    where the meta has none."""
    from omegaconf import OmegaConf

    file = checkpoint / ckpt.META_FILE
    meta = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    run_config = checkpoint.parent.parent / "config.yaml"
    if not meta.get("config") and run_config.is_file():
        meta["config"] = OmegaConf.to_container(OmegaConf.load(run_config), resolve=True)
    return meta if isinstance(meta, dict) else {}


def _jsonl_validations(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    file = run_dir / METRICS_JSONL
    if not file.is_file():
        return []
    records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_step = {int(r["step"]): r for r in records if any(name in r for name in FIGURES)}  # a resumed step: the later
    return [(step, {k: float(v) for k, v in r.items() if k in FIGURES and v is not None}) for step, r in by_step.items()]


def _mlflow_validations(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    id_file = run_dir / "mlflow_run_id"
    if not id_file.is_file():
        return []
    from mlflow.tracking import MlflowClient

    from rlforge.tools.plots import recorded_store

    client, run_id = MlflowClient(tracking_uri=recorded_store(run_dir)), id_file.read_text().strip()
    steps: dict[int, dict[str, float]] = {}
    for name in FIGURES:
        for point in client.get_metric_history(run_id, name):
            steps.setdefault(int(point.step), {})[name] = float(point.value)
    return list(steps.items())


VALIDATION_SOURCES: tuple[Callable[[Path], list[tuple[int, dict[str, float]]]], ...] = (
    _jsonl_validations, _mlflow_validations)


def validations(run_dir: Path, step: int) -> list[tuple[int, dict[str, float]]]:
    """(step, figures) of each validation up to ``step``, from the first source that has any."""
    for source in VALIDATION_SOURCES:
        found = sorted((s, m) for s, m in source(run_dir) if s <= step and m)
        if found:
            return found
    return []


def _hub_id(path: str | None) -> str | None:
    """``path`` if it names a Hub repo (not a local path), else None."""
    return path if path and HUB_ID.fullmatch(path) and not Path(path).exists() else None


def _shown(path: str | None) -> str:
    """A model or data location as a card shows it: a Hub id or ``builtin:NAME`` as it is, a local path by its name."""
    if path is None:
        return "unknown"
    if not is_local_path(path):
        return f"`{path}`"
    return f"a local folder `{Path(path).name}`"


def _data(config: dict[str, Any], meta: dict[str, Any]) -> str:
    d = config.get("data") or {}
    parts = [f"`data.name={d.get('name')}`"]
    files = [Path(f).name for f in d.get("train_files") or []]
    if files:
        parts.append("files " + ", ".join(f"`{f}`" for f in files))
    hf = d.get("hf") or {}
    if hf.get("path"):
        subset = f" ({hf['config_name']})" if hf.get("config_name") else ""
        parts.append(f"{_shown(hf['path'])}{subset}, split `{hf.get('train_split')}`")
    prompts = (meta.get("data") or {}).get("prompts")
    if prompts is not None:
        parts.append(f"{prompts} training examples")
    return "; ".join(parts)


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # a vision-language model's image processor
# what an exported model folder is -> the transformers Auto class that loads it (first match; else a causal LM)
AUTO_CLASSES: tuple[tuple[Callable[[Path], bool], str], ...] = (
    (lambda f: any(a.endswith("ForSequenceClassification") for a in architectures(f)),
     "AutoModelForSequenceClassification"),  # a reward model (--algo rm)
    (lambda f: any((f / name).is_file() for name in PROCESSOR_FILES), "AutoModelForImageTextToText"),  # with images
)


def auto_class(folder: Path) -> str:
    """The transformers Auto class that loads the model folder ``folder``."""
    return next((cls for matches, cls in AUTO_CLASSES if matches(folder)), "AutoModelForCausalLM")


def _loader(folder: Path, adapter: bool) -> tuple[str, str]:
    """(library, how the card loads it) for the export in ``folder``."""
    if adapter:
        return "peft", "from peft import AutoPeftModelForCausalLM\nmodel = AutoPeftModelForCausalLM.from_pretrained({repo!r})"
    cls = auto_class(folder)
    return "transformers", (f"from transformers import {cls}, AutoTokenizer\nmodel = {cls}.from_pretrained({{repo!r}})\n"
                            f"tokenizer = AutoTokenizer.from_pretrained({{repo!r}})")


def _figure(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4f}"


def model_card(folder: Path, checkpoint: Path, *, adapter: bool, base_model: str | None, repo_id: str | None,
               name: str | None = None) -> str:
    """The card's text for the export of ``checkpoint`` in ``folder`` (``repo_id``: where it is pushed; ``name``: the
    folder's name where it is written elsewhere first)."""
    import rlforge
    from huggingface_hub import ModelCard, ModelCardData

    meta = _meta(checkpoint)
    config = meta.get("config") or {}
    algo = (config.get("algorithm") or {}).get("name", "unknown")
    lora = adapter or bool(((config.get("model") or {}).get("lora") or {}).get("rank"))
    step = int(meta.get("step", ckpt.step_of(checkpoint)))
    library, how = _loader(folder, adapter)
    header = ModelCardData(library_name=library, tags=["rlforge", algo, *(["lora"] if lora else [])],
                           base_model=_hub_id(base_model))
    name = repo_id or name or folder.name
    rows = [("base model", _shown(base_model)), ("algorithm", f"`{algo}` (rlforge's `algorithm.name`)"),
            ("data", _data(config, meta)), ("steps", str(step)), ("rlforge", rlforge.__version__)]
    if lora:
        rows.append(("LoRA", "the adapter only (peft)" if adapter else "merged into the base model"))
    lines = [f"# {name}", "", f"Trained with rlforge from {_shown(base_model)} by `{algo}` for {step} "
             f"step{'' if step == 1 else 's'}.", ""]
    if adapter and is_local_path(base_model):
        lines += [f"The adapter's base model (`base_model_name_or_path`) is a path on the machine that trained it "
                  f"({_shown(base_model)}): it loads only where that folder is. Set it to the base's Hub id to "
                  "share the adapter.", ""]
    lines += ["## Training", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    found = validations(checkpoint.parent.parent, step)
    if found:
        shown = [m for m in FIGURES if any(m in figures for _, figures in found)]
        lines += ["## Validation", "", "| step | " + " | ".join(f"`{m}`" for m in shown) + " |",
                  "|---|" + "---|" * len(shown),
                  *(f"| {s}{' (before training)' if s == 0 else ''} | " + " | ".join(_figure(f.get(m)) for m in shown)
                    + " |" for s, f in found), ""]
    lines += ["## Use", "", "```python", how.format(repo=name), "```", ""]
    return str(ModelCard(f"---\n{header.to_yaml()}\n---\n\n" + "\n".join(lines)))


def write_model_card(folder: Path, checkpoint: Path, *, adapter: bool, base_model: str | None,
                     repo_id: str | None = None, name: str | None = None) -> Path:
    """``README.md`` in ``folder``: :func:`model_card` (it replaces the card peft writes into an adapter folder)."""
    path = folder / CARD_FILE
    path.write_text(model_card(folder, checkpoint, adapter=adapter, base_model=base_model, repo_id=repo_id,
                               name=name), encoding="utf-8")
    return path
