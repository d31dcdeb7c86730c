"""Run folders and atomic checkpoints.

A checkpoint is ``<run_dir>/checkpoints/step_NNNNNN/`` holding ``actor/`` (a plain HF folder: weights in
safetensors, config, tokenizer), ``trainer_state.pt`` (optimizer, scheduler, RNG states, data cursor, step;
loaded with ``weights_only=True``) and ``meta.json`` (the config it was trained with and the fingerprint of its
training data, read before resuming). It is written to a temporary folder, flushed to disk, and renamed only
when complete, so a half-written checkpoint is never picked up; a failed write (a full disk) removes the
temporary folder and leaves the previous checkpoints as they were.

With ``strategy.checkpoint=sharded`` the ranks of each role also write their model and optimizer shards
(torch.distributed.checkpoint) into ``staging_dir`` before ``save``; ``save`` moves that folder into the
checkpoint as ``sharded/<role>/``, so it is renamed into place together with the rest. ``actor/`` is
the full, gathered model: any checkpoint exports and serves as it is.

With ``strategy.checkpoint=async`` the ranks write that sharded state in the background while training goes on
(``BaseStrategy.save_sharded_async``); ``save`` runs, with ``model=None``, only once the writes are complete, so
the checkpoint still appears whole or not at all. Those checkpoints hold no ``actor/`` (the run's last one does;
``rlforge export`` writes it from ``sharded/actor/``, see :func:`write_actor`).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.diskio import disk_errors, fsync_dir, open_binary, open_text, tensor_bytes
from rlforge.errors import ConfigError, RLForgeError
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

STEP_DIR = re.compile(r"^step_(\d+)$")
RUN_NAME = re.compile(r"^(\d{8}-\d{6})(?:-(\d+))?$")  # <runs_root>/<experiment>/<timestamp>[-N]
STATE_FILE = "trainer_state.pt"
META_FILE = "meta.json"
SHARDED_DIR = "sharded"
SET_ASIDE_DIR = "set_aside"  # checkpoints that a resume did not continue from (corrupt, or newer than it)
TEMPORARY = (".tmp_step_*", ".staged_step_*", ".deleting_*")


class CorruptCheckpoint(RLForgeError):
    """A checkpoint that cannot be read: the message names the file and the reason."""


def step_dir(run_dir: Path, step: int) -> Path:
    """The folder of the checkpoint of ``step``."""
    return run_dir / "checkpoints" / f"step_{step:06d}"


def staging_dir(run_dir: Path, step: int) -> Path:
    """Where the ranks write the sharded state of ``step`` before ``save`` moves it into the checkpoint."""
    return run_dir / "checkpoints" / f".staged_step_{step:06d}"


def staged_actor(staging: Path) -> Path:
    """Where a controller whose driver holds no model (``ray``, ``torchrun``) writes ``actor/`` of the checkpoint whose
    sharded state goes to ``staging``, before ``save`` moves it into the checkpoint."""
    return staging.with_name(f"{staging.name}_actor")


def step_of(checkpoint: Path) -> int:
    m = STEP_DIR.match(checkpoint.name)
    return int(m.group(1)) if m else -1


# --- run folders ----------------------------------------------------------------------------------
def run_order(name: str) -> tuple[str, int] | None:
    """Sort key of a run folder name made by :func:`new_run_dir` (None for other names)."""
    m = RUN_NAME.match(name)
    return (m.group(1), int(m.group(2) or 0)) if m else None


def runs_of(experiment_dir: Path) -> list[Path]:
    """The run folders rlforge made under ``<runs_root>/<experiment>``, oldest first."""
    if not experiment_dir.is_dir():
        return []
    found = [(key, p) for p in experiment_dir.iterdir() if p.is_dir() and (key := run_order(p.name))]
    return [p for _, p in sorted(found)]


def new_run_dir(root: str, experiment: str) -> Path:
    """A new folder ``<root>/<experiment>/<timestamp>[-N]`` whose name sorts after every existing run's, even
    if the clock went back, so that name order is creation order."""
    base = Path(root) / experiment
    with disk_errors(f"create a run folder in {base} (trainer.runs_root={root})", "Choose a writable trainer.runs_root.",
                     where=base):
        base.mkdir(parents=True, exist_ok=True)
        runs = runs_of(base)
        newest = (run_order(runs[-1].name) if runs else None) or ("", -1)
        stamp, suffix = max(time.strftime("%Y%m%d-%H%M%S"), newest[0]), 0
        while True:
            if (stamp, suffix) > newest:
                path = base / (f"{stamp}-{suffix}" if suffix else stamp)
                try:
                    path.mkdir()
                    return path
                except FileExistsError:
                    pass
            suffix += 1


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` already holds a run (its config or a checkpoint)."""
    return (folder / "config.yaml").exists() or bool(list_checkpoints(folder))


def clean_temporaries(run_dir: Path) -> None:
    """Remove what a killed writer left half-done (only call it while holding the run's lock)."""
    folder = run_dir / "checkpoints"
    for pattern in TEMPORARY if folder.is_dir() else ():
        for stale in folder.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def set_aside(checkpoints: list[Path]) -> Path | None:
    """Move checkpoints out of the resume path into ``checkpoints/set_aside/`` (kept for inspection)."""
    if not checkpoints:
        return None
    target = checkpoints[0].parent / SET_ASIDE_DIR
    target.mkdir(exist_ok=True)
    for ckpt in checkpoints:
        dest, n = target / ckpt.name, 1
        while dest.exists():
            dest, n = target / f"{ckpt.name}-{n}", n + 1
        ckpt.rename(dest)
    return target


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


# --- writing --------------------------------------------------------------------------------------
def fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` to disk, so a rename after it never exposes empty files."""
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(folder)


def save(
    run_dir: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep_last_n: int,
    meta: dict[str, Any] | None = None, processor: Any = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically; keep the newest ``keep_last_n`` (0 = all). A vision-language
    model's ``processor`` adds its image processor's ``preprocessor_config.json`` to ``actor/``, which is then a
    complete model folder like the text models'. ``model=None``: ``actor/`` as the controller staged it
    (:func:`staged_actor`), or none (the weights are in the staged ``sharded/`` folder)."""
    folder = run_dir / "checkpoints"
    final = step_dir(run_dir, step)
    tmp = folder / f".tmp_step_{step:06d}"
    previous = list_checkpoints(run_dir)
    kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) if hasattr(model, "parameters") else 0
    sizes = {"actor/": weights, STATE_FILE: tensor_bytes(state)}
    current = [str(tmp / "actor")]  # the file being written, named when a native writer does not say
    try:
        with disk_errors(f"write checkpoint step {step} into {folder}",
                         f"{kept[0].upper()}{kept[1:]}: free space, then continue with trainer.resume=auto.",
                         where=folder, needed=sum(sizes.values()), largest=max(sizes.values()), current=current):
            folder.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            staged = staging_dir(run_dir, step)
            if model is not None:
                write_actor(tmp / "actor", model, tokenizer, processor)
            elif staged_actor(staged).is_dir():  # written by the controller (its driver holds no model)
                staged_actor(staged).rename(tmp / "actor")
            if staged.is_dir():
                staged.rename(tmp / SHARDED_DIR)
            current[0] = str(tmp / STATE_FILE)
            with open_binary(tmp / STATE_FILE) as fh:  # a file object: torch's writer then chains the OSError
                torch.save(state, fh)
            current[0] = str(tmp / META_FILE)
            with open_text(tmp / META_FILE) as fh:
                fh.write(json.dumps({"step": step, **(meta or {})}, indent=1, default=str))
            current[0] = ""
            fsync_tree(tmp)
            if final.exists():
                _delete(final)
            tmp.rename(final)
            fsync_dir(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stale in folder.glob(".staged_step_*"):  # left by a run killed between staging and saving
        shutil.rmtree(stale, ignore_errors=True)
    if keep_last_n > 0:
        for old in list_checkpoints(run_dir)[:-keep_last_n]:
            _delete(old)
    return final


def write_actor(folder: Path, model: Any, tokenizer: Any, processor: Any = None) -> None:
    """``actor/``: the model as a plain Hugging Face folder (a LoRA model: its adapter), with its tokenizer (and a
    vision-language model's image processor)."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    if processor is not None:
        processor.image_processor.save_pretrained(folder)


def check_mode(config: Any, registry: Any) -> None:
    """``strategy.checkpoint=async`` needs a strategy whose sharded saves can run in the background."""
    if config.strategy.checkpoint != "async":
        return
    entry = registry.strategy.entry(config.strategy.name)
    if not entry.capabilities.async_checkpoint:
        able = ", ".join(e.name for e in registry.strategy.entries() if e.capabilities.async_checkpoint)
        raise ConfigError(f"strategy.checkpoint=async: strategy.name={config.strategy.name} cannot write its sharded "
                          f"state in the background (it declares no async_checkpoint capability; these do: {able}). "
                          f"Use strategy.checkpoint=sharded or full.")


def _delete(checkpoint: Path) -> None:
    """Rename first, then remove: a process killed half-way never leaves a partial ``step_N`` folder."""
    doomed = checkpoint.with_name(f".deleting_{checkpoint.name}")
    shutil.rmtree(doomed, ignore_errors=True)
    checkpoint.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


# --- reading --------------------------------------------------------------------------------------
def has_actor(checkpoint: Path) -> bool:
    """Whether the checkpoint holds ``actor/`` (all but the intermediate ones of ``strategy.checkpoint=async``)."""
    return (checkpoint / "actor").is_dir()


def weight_files(checkpoint: Path) -> list[Path]:
    """The actor's safetensors files (one file, or the shards an index lists; a LoRA run's adapter)."""
    actor = checkpoint / "actor"
    from rlforge import lora
    from rlforge.weight_files import safetensors_files

    if (actor / lora.ADAPTER_CONFIG).is_file():
        return [actor / lora.ADAPTER_WEIGHTS]
    try:
        return safetensors_files(actor) or [actor / "model.safetensors"]
    except RLForgeError as exc:
        raise CorruptCheckpoint(str(exc)) from None


def _check_safetensors(path: Path) -> None:
    """The file is complete: its header parses and its size is what the header says (truncation shows)."""
    from rlforge.weight_files import safetensors_problem

    problem = safetensors_problem(path)
    if problem:
        raise CorruptCheckpoint(f"{problem}{': the checkpoint is incomplete' if not path.is_file() else ''}.")


def check_actor(checkpoint: Path) -> None:
    """The actor's weight files are complete (:func:`_check_safetensors`) and its config (``config.json``, or a LoRA
    adapter's) is JSON; else a CorruptCheckpoint naming the file."""
    for weights in weight_files(checkpoint):
        _check_safetensors(weights)
    from rlforge import lora

    for name in ("config.json", lora.ADAPTER_CONFIG):
        config = checkpoint / "actor" / name
        if config.is_file():
            try:
                json.loads(config.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise CorruptCheckpoint(f"{config} cannot be read: it is not JSON ({exc}).") from None


def read(checkpoint: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(trainer state, meta)`` of a checkpoint, after checking that it is one rlforge wrote (its ``meta.json``
    names its step) and that its weights are complete.

    :raises CorruptCheckpoint: naming the file and what is wrong with it.
    """
    meta = _read_meta(checkpoint)
    state_file = checkpoint / STATE_FILE
    if not state_file.is_file():
        raise CorruptCheckpoint(f"{state_file} is missing: the checkpoint is incomplete.")
    if state_file.stat().st_size == 0:
        raise CorruptCheckpoint(f"{state_file} is empty (0 bytes).")
    roles = sorted((checkpoint / SHARDED_DIR).glob("*/")) if (checkpoint / SHARDED_DIR).is_dir() else []
    if has_actor(checkpoint):
        check_actor(checkpoint)
    elif not roles:  # strategy.checkpoint=async: the shards only
        raise CorruptCheckpoint(f"{checkpoint} holds neither actor/ nor {SHARDED_DIR}/: it is incomplete.")
    from rlforge.strategy import sharded_problem

    for role in roles:
        problem = sharded_problem(role)
        if problem:
            raise CorruptCheckpoint(f"{problem}.")
    try:
        state = torch.load(state_file, weights_only=True)
    except pickle.UnpicklingError as exc:  # whole, but holding an object the safe loader refuses (saved before the check)
        raise CorruptCheckpoint(f"{state_file} holds a value torch.load(weights_only=True) refuses "
                                f"({unsafe_detail(exc)}): rlforge loads checkpoints only that way.") from None
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CorruptCheckpoint(f"{state_file} cannot be read: it is truncated or corrupted ({detail}).") from None
    if isinstance(state, dict) and state.get("step", meta.get("step")) != meta.get("step"):
        raise CorruptCheckpoint(f"{state_file} holds the trainer state of step {state.get('step')}, not of step "
                                f"{meta.get('step')} (meta.json): it was copied from another checkpoint.")
    return state, meta


def unsafe_detail(exc: Exception) -> str:
    """What torch's safe loader said it refused (after ``WeightsUnpickler error:``, e.g. ``Unsupported global: GLOBAL
    numpy...``; torch words the rest of the message differently by case), else its first line, without terminal
    colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)  # on its line, or after blank lines
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (found.group(1).split(" Please use")[0].strip() if found else lines[0] if lines else type(exc).__name__)[:200]


def check_loadable(state: dict[str, Any], what: str) -> None:
    """Each entry of ``state`` loads with ``torch.load(weights_only=True)``, as a resume loads it; else a
    :class:`RLForgeError` naming the entry (``what``: where it comes from) before a checkpoint that could not be
    resumed is written."""
    if not isinstance(state, dict):
        raise RLForgeError(f"{what} returned {type(state).__name__}: return a dict of what to keep across a resume "
                           f"(an empty dict for nothing), as its counterpart load_state_dict gets it back.")
    for key, value in state.items():
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            buffer.seek(0)
            torch.load(buffer, weights_only=True)
        except Exception as exc:
            raise RLForgeError(f"checkpoint entry {key!r} ({what}) does not load with torch.load(weights_only=True) "
                               f"({unsafe_detail(exc)}), which resuming uses: store tensors, numbers, strings, "
                               f"and lists or dicts of them (e.g. torch.as_tensor(array) or array.tolist()).") from None


def _read_meta(checkpoint: Path) -> dict[str, Any]:
    """``meta.json``, which rlforge writes into every checkpoint: a folder without it, or whose step is not the
    folder's, was not written by this run (copied in, or by another tool) and is never resumed."""
    meta_file = checkpoint / META_FILE
    if not meta_file.is_file():
        raise CorruptCheckpoint(f"{meta_file} is missing: {checkpoint} is not a checkpoint rlforge wrote (every one "
                                f"holds its step and config there), or it is incomplete.")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise CorruptCheckpoint(f"{meta_file} cannot be read: it is truncated or corrupted.") from None
    if not isinstance(meta, dict) or meta.get("step") != step_of(checkpoint):
        step = meta.get("step") if isinstance(meta, dict) else None
        raise CorruptCheckpoint(f"{meta_file} names step {step!r}, not {step_of(checkpoint)}: {checkpoint} is not "
                                f"a checkpoint rlforge wrote there (a renamed or foreign folder).")
    return meta


def load_weights(checkpoint: Path, model: Any) -> None:
    """Load the actor weights of ``checkpoint`` into ``model`` in place (a LoRA run's: its adapter only)."""
    from safetensors.torch import load_file

    from rlforge import lora

    tensors: dict[str, Any] = {}
    for path in weight_files(checkpoint):
        try:
            tensors.update(load_file(str(path)))
        except Exception as exc:
            raise CorruptCheckpoint(f"{path} cannot be read: {str(exc).splitlines()[0]}") from None
    if lora.is_lora(model) != (checkpoint / "actor" / lora.ADAPTER_CONFIG).is_file():
        raise RLForgeError(f"Checkpoint {checkpoint} {'holds' if not lora.is_lora(model) else 'does not hold'} a "
                           f"LoRA adapter but model.lora.rank is {'0' if not lora.is_lora(model) else '> 0'}.")
    if lora.is_lora(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, tensors)
        if result.unexpected_keys:
            raise RLForgeError(f"Checkpoint {checkpoint}'s adapter does not match model.lora: unexpected "
                               f"{result.unexpected_keys[:3]}.")
        return
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        if (missing or unexpected) and (checkpoint / "actor" / "config.json").is_file():
            # transformers writes some architectures under their original key names and renames them as it loads
            # them (Qwen2-VL: visual.* is model.visual.*): the folder as the model class itself reads it
            loaded = type(model).from_pretrained(str(checkpoint / "actor"), dtype="auto")
            missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    except RuntimeError as exc:
        raise RLForgeError(f"Checkpoint {checkpoint} does not match model.path: {str(exc).splitlines()[0]}") from None
    # tied weights are saved once; anything else missing means a different model
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RLForgeError(
            f"Checkpoint {checkpoint} does not match model.path: missing {missing[:3]}, unexpected {unexpected[:3]}."
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
