"""What ``rlforge eval`` and ``rlforge generate`` share: a config for a model and a dataset, a rollout engine,
and the dataset's prompts in batches.

Prompts are read and checked before the model loads, so data mistakes fail fast. Everything comes from the registries, as in training: the dataset (``data.name``), the strategy that
places the model (``strategy.name``) and the rollout engine (``rollout.name``). Sampling uses the
validation settings ``rollout.val_n`` and ``rollout.val_temperature`` (greedy by default).

A run folder or checkpoint is run with the config it was trained with (data, prompt and response lengths,
reward, rollout and template settings), in one process (``strategy.name=single``, ``trainer.controller=local``,
whatever strategy trained it), under ``--config`` and ``key=value`` overrides; a plain model folder starts from the
defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlforge.batch import Batch
from rlforge.data import collate, template_kwargs, tokenize_rows
from rlforge.errors import RLForgeError
from rlforge.lora import ADAPTER_CONFIG
from rlforge.models import BUILTIN_PREFIX
from rlforge.pipeline.base import OPTIONS as PIPELINE_OPTIONS
from rlforge.tools.export import find_checkpoint, model_folder

SPLITS = ("train", "val")


def compose_for_model(
    model: str, *, data: list[str] | None = None, split: str = "val", n: int | None = None,
    temperature: float | None = None, config_file: str | None = None, overrides: list[str] | None = None,
    loaded: Any = None, modules: list[str] | None = None,
) -> tuple[Any, DictConfig]:
    """(plugin manager, config) for running ``model`` (a model, checkpoint or run folder) on a dataset split.

    ``data`` files select ``data.name=files`` for ``split``; ``n`` and ``temperature`` set ``rollout.val_n`` and
    ``rollout.val_temperature``. Later entries win, so these beat the same keys in ``overrides``. ``modules``: plugin
    modules to load (``-p``) besides the config's ``plugins.modules`` (a run's own are loaded from its config).
    """
    from rlforge.config import compose_with_plugins

    if split not in SPLITS:
        raise RLForgeError(f"Unknown split '{split}' (--split). Available: {', '.join(SPLITS)}.")
    extra = [f"model.path={json.dumps(model_folder(model))}"]  # a LoRA checkpoint: its base with the adapter merged
    base = training_config(model)
    other = next(s for s in SPLITS if s != split)
    if base is not None and "data" in base[0]:  # only the evaluated split is read: not a run's other files
        base[0].data[f"{other}_files"] = []
    if data:
        extra += ["data.name=files", f"data.{split}_files={json.dumps(list(data))}", f"data.{other}_files=[]"]
    if n is not None:
        extra.append(f"rollout.val_n={n}")
    if temperature is not None:
        extra.append(f"rollout.val_temperature={temperature}")
    return compose_with_plugins(None, config_file, [*(overrides or []), *extra], loaded=loaded,
                                base=base, modules=list(modules or []))


def training_config(model: str) -> tuple[DictConfig, str] | None:
    """(the config ``model`` was trained with, where it is) for a run folder, a checkpoint or a checkpoint's
    ``actor/`` folder; None for any other model. The keys of the training run's own bookkeeping are dropped."""
    from rlforge.resume import run_config_of

    folder = Path(model).expanduser()
    if model.startswith(BUILTIN_PREFIX) or not folder.is_dir():
        return None
    if (folder / "config.json").is_file() or (folder / ADAPTER_CONFIG).is_file():  # a checkpoint's actor/, or a model
        if folder.name != "actor" or not (folder.parent / "trainer_state.pt").is_file():
            return None
        folder = folder.parent
    checkpoint = find_checkpoint(folder)
    found = run_config_of(checkpoint)
    if found is None:
        return None
    cfg = OmegaConf.create(found)
    # the run's bookkeeping, and models that evaluation does not load (they may have moved since)
    for section, key in (("trainer", "resume"), ("trainer", "resume_force"), ("trainer", "run_dir"),
                         ("model", "ref_path"), ("critic", "path")):
        if isinstance(cfg.get(section), DictConfig):
            cfg[section].pop(key, None)
    # inference runs in this one process, whatever placed the training run's ranks (an fsdp run under ray): the
    # checkpoint's actor/ is a plain model folder
    cfg.trainer.controller, cfg.strategy.name, cfg.strategy.num_processes = "local", "single", 1
    # nor does it train: the training pipeline and its options (partial's partial_tokens, which must stay below an
    # evaluation's rollout.max_new_tokens) do not apply
    cfg.trainer.pipeline = "sync"
    for key in PIPELINE_OPTIONS:
        cfg.trainer.pop(key, None)
    return cfg, f"the training config of {checkpoint}"


def load_engine(cfg: DictConfig, pm: Any, tokenizer: Any) -> Any:
    """The rollout engine for ``model.path``, the model placed by the configured strategy."""
    from rlforge import precision
    from rlforge.build import Builder
    from rlforge.models import load_model

    m = cfg.model
    builder = Builder(cfg, pm)
    model = load_model(m.path, precision.for_config(cfg).frozen, trust_remote_code=m.trust_remote_code,
                       overrides=m.config_overrides)
    return builder.rollout(builder.strategy().setup_model(model).eval(), tokenizer)


def prompt_batches(
    cfg: DictConfig, pm: Any, tokenizer: Any, split: str, limit: int | None = None, need_reward: bool = True,
    processor: Any = None,
) -> tuple[list[Batch], int]:
    """The split's prompts (the first ``limit`` rows) with the chat template applied (rows with images through a
    vision-language model's ``processor``), in batches of ``rollout.micro_batch_size``, and the number of rows read
    (prompts over ``data.max_prompt_length`` are dropped when ``data.filter_overlong_prompts`` is on). Each prompt's
    ``uid`` is its row index."""
    from rlforge.agent.config import check_image_rows
    from rlforge.build import Builder
    from rlforge.multimodal import check_engine

    builder = Builder(cfg, pm)
    rows = builder.dataset(split)
    if not rows:
        hint = " Pass --data FILE or set data.val_files." if cfg.data.name == "files" and split == "val" else ""
        raise RLForgeError(f"Dataset '{cfg.data.name}' (data.name) has no rows in the '{split}' split.{hint}")
    if limit is not None:
        if limit <= 0:
            raise RLForgeError(f"--limit must be a positive number of prompts, got {limit}.")
        rows = rows[:limit]
    prompts = tokenize_rows(rows, tokenizer, cfg.data.max_prompt_length, cfg.data.filter_overlong_prompts,
                            f"{cfg.data.name} ({split})", need_reward=need_reward, processor=processor,
                            image_key=cfg.data.image_key, truncation=cfg.data.truncation, template=template_kwargs(cfg),
                            continue_final=cfg.data.continue_final_message)
    check_engine(prompts, builder.capabilities("rollout"), cfg.rollout.name)
    check_image_rows(prompts, builder.registry, cfg.rollout.agent.loop, f"{cfg.data.name} ({split})")
    size = cfg.rollout.micro_batch_size
    chunks = [prompts[i : i + size] for i in range(0, len(prompts), size)]
    return [collate(c, tokenizer.pad_token_id, [p.index for p in c]) for c in chunks], len(rows)
