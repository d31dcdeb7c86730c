"""Run folders and atomic checkpoints.

A checkpoint is ``<run_dir>/checkpoints/step_NNNNNN/`` holding ``actor/`` (a plain HF folder: weights in
safetensors, config, tokenizer) and ``trainer_state.pt`` (optimizer, scheduler, RNG states, data cursor,
step; loaded with ``weights_only=True``). It is written to a temporary folder and renamed only when
complete, so a half-written checkpoint is never picked up.

With ``strategy.checkpoint=sharded`` the ranks of each role also write their model and optimizer shards
(torch.distributed.checkpoint) into ``staging_dir`` before ``save``; ``save`` moves that folder into the
checkpoint as ``sharded/<role>/``, so it is renamed into place together with the rest. ``actor/`` is
always the full, gathered model: any checkpoint exports and serves as it is.
"""

from __future__ import annotations

import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from rlforge.errors import RLForgeError

STEP_DIR = re.compile(r"^step_(\d+)$")
# keys that must not change between a checkpoint and its resumption: the model and the batch shapes
RESUME_KEYS = (
    "model.path", "algorithm.name", "data.name", "data.train_batch_size", "rollout.n", "actor.ppo_mini_batch_size",
    "actor.ppo_epochs", "trainer.seed",
)
STATE_FILE = "trainer_state.pt"
SHARDED_DIR = "sharded"


def step_dir(run_dir: Path, step: int) -> Path:
    """The folder of the checkpoint of ``step``."""
    return run_dir / "checkpoints" / f"step_{step:06d}"


def staging_dir(run_dir: Path, step: int) -> Path:
    """Where the ranks write the sharded state of ``step`` before ``save`` moves it into the checkpoint."""
    return run_dir / "checkpoints" / f".staged_step_{step:06d}"


def new_run_dir(root: str, experiment: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / experiment / stamp
    suffix = 1
    while path.exists():
        path = Path(root) / experiment / f"{stamp}-{suffix}"
        suffix += 1
    path.mkdir(parents=True)
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def find_latest(root: str, experiment: str) -> Path | None:
    """The newest complete checkpoint of any run of ``experiment`` (by modification time of the run)."""
    base = Path(root) / experiment
    if not base.is_dir():
        return None
    runs = sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True)
    for run in runs:
        ckpts = list_checkpoints(run)
        if ckpts:
            return ckpts[-1]
    return None


def check_resumable(saved_config: Path, config: Any) -> None:
    """Refuse to resume when the model or the batch shape differ from the run's saved config."""
    from omegaconf import OmegaConf

    if not saved_config.is_file():
        return
    saved = OmegaConf.load(saved_config)
    changed = [
        f"{key}: {OmegaConf.select(saved, key)!r} -> {OmegaConf.select(config, key)!r}"
        for key in RESUME_KEYS
        if OmegaConf.select(saved, key) != OmegaConf.select(config, key)
    ]
    if changed:
        raise RLForgeError(
            f"Cannot resume {saved_config.parent}: the config changed in ways that make resuming unsound "
            f"({'; '.join(changed)}). Start a new run (trainer.resume=never or another trainer.experiment), "
            f"or force it with trainer.resume_force=true."
        )


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run_dir: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep_last_n: int) -> Path:
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    final = step_dir(run_dir, step)
    tmp = folder / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp / "actor", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "actor")
    staged = staging_dir(run_dir, step)
    if staged.is_dir():
        staged.rename(tmp / SHARDED_DIR)
    for stale in folder.glob(".staged_step_*"):  # left by a run killed between staging and saving
        shutil.rmtree(stale, ignore_errors=True)
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep_last_n > 0:
        for old in list_checkpoints(run_dir)[:-keep_last_n]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path, model: Any) -> dict[str, Any]:
    """Load the actor weights into ``model`` in place and return the trainer state. A LoRA run's checkpoint holds
    the adapter only (``actor/adapter_model.safetensors``, what peft's ``save_pretrained`` writes)."""
    from rlforge import lora

    adapter = lora.is_lora(model)
    weights = path / "actor" / (lora.ADAPTER_WEIGHTS if adapter else "model.safetensors")
    state_file = path / STATE_FILE
    if not weights.is_file() or not state_file.is_file():
        raise RLForgeError(f"Checkpoint {path} is incomplete: expected actor/{weights.name} and {STATE_FILE}.")
    try:
        tensors = load_file(str(weights))
        state = torch.load(state_file, weights_only=True)
    except Exception as exc:
        raise RLForgeError(f"Checkpoint {path} is corrupted and cannot be read: {exc}") from None
    if adapter:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, tensors)
        if result.unexpected_keys:
            raise RLForgeError(f"Checkpoint {path}'s adapter does not match model.lora: unexpected "
                               f"{result.unexpected_keys[:3]}.")
        return state
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:
        raise RLForgeError(f"Checkpoint {path} does not match model.path: {str(exc).splitlines()[0]}") from None
    # tied weights are saved once; anything else missing means a different model
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RLForgeError(
            f"Checkpoint {path} does not match model.path: missing {missing[:3]}, unexpected {unexpected[:3]}."
        )
    return state
