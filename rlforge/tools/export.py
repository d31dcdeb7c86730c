"""Checkpoints as models: find the model folder of a run or checkpoint, and ``rlforge export`` it.

A checkpoint (``<run>/checkpoints/step_N/``, see ``rlforge.checkpoint``) is exported by the strategy
that wrote it: a strategy class may define a static ``export_checkpoint(checkpoint: Path, out: Path)`` for its own
layout (e.g. sharded weights to gather; read when it is registered, ``registry.strategy.entry(name).functions``). Strategies without one write ``actor/`` as a plain Hugging Face
folder, which is copied as it is; a ``strategy.checkpoint=async`` checkpoint without one gets it first
(:func:`write_missing_actor`).

Whatever wrote it, the export is then given back what the run's model had when it was loaded
(``rlforge.as_loaded``): each weight's dtype and the tokenizer's own pad token. A LoRA run's checkpoint is its base model plus the adapter: exported merged, or as the adapter; ``eval`` and
``generate`` run it merged in a temporary folder (``model_folder``). Every export gets a model card, ``README.md``
(``rlforge.tools.model_card``); ``push_to_hub`` uploads the folder to a Hub model repo (``rlforge export
--push-to-hub``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rlforge import checkpoint as ckpt
from rlforge.diskio import DENIED, disk_errors
from rlforge.errors import RLForgeError
from rlforge.lora import ADAPTER_CONFIG  # peft's: a LoRA run's checkpoint holds an adapter
from rlforge.as_loaded import as_loaded
from rlforge.models import BUILTIN_PREFIX, HUB_ID, is_local_path, model_name, resolve_model_path
from rlforge.tools.model_card import PROCESSOR_FILES, write_model_card

ACTOR_DIR = "actor"


def write_missing_actor(checkpoint: Path) -> Path:
    """Give a checkpoint of ``strategy.checkpoint=async`` that holds no ``actor/`` (all but a run's last) one: the
    actor as its run builds it (``model.path``, LoRA, the config in ``meta.json``) with the weights of
    ``sharded/actor/``, written beside and renamed into place; the checkpoint to read from then on. A checkpoint
    with ``actor/`` is left as it is. One that this process may not write into (archived read-only, another
    user's) gets it in a temporary stand-in (:func:`_stand_in`), which is returned instead."""
    from omegaconf import OmegaConf

    from rlforge.build import Builder
    from rlforge.plugin_manager import PluginManager
    from rlforge.resume import run_config_of
    from rlforge.strategy import load_sharded_model

    shards = checkpoint / ckpt.SHARDED_DIR / ACTOR_DIR
    if ckpt.has_actor(checkpoint) or not shards.is_dir():
        return checkpoint
    found = run_config_of(checkpoint)
    if found is None:
        raise RLForgeError(f"Checkpoint {checkpoint} holds no {ACTOR_DIR}/ and no config to rebuild it from "
                           f"({ckpt.META_FILE} is missing).")
    config = OmegaConf.create(found)
    module = Builder(config, PluginManager.for_config(config)).module(roles={"actor"})
    module.configure_model()
    load_sharded_model(shards, module.actor)
    tmp = checkpoint / f".{ACTOR_DIR}_tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as exc:
        if exc.errno not in DENIED:
            raise
        checkpoint = _stand_in(checkpoint)
    tmp = checkpoint / f".{ACTOR_DIR}_tmp"
    with disk_errors(f"write {checkpoint / ACTOR_DIR} from {shards}", "Free space, or export a copy of the checkpoint.",
                     where=checkpoint):
        ckpt.write_actor(tmp, module.actor, module.tokenizer, module.processor)
        ckpt.fsync_tree(tmp)
        tmp.rename(checkpoint / ACTOR_DIR)
    return checkpoint


def _stand_in(checkpoint: Path) -> Path:
    """A writable stand-in for ``checkpoint``: a temporary run folder (removed at exit) whose entries, and those of
    its ``checkpoints/<name>/``, link to the run's and the checkpoint's own; what reads a checkpoint and its run
    (export, the model card) reads it as the original."""
    import atexit
    import tempfile

    run = Path(tempfile.mkdtemp(prefix=f"rlforge-{checkpoint.name}-"))
    atexit.register(shutil.rmtree, run, True)
    for entry in checkpoint.parent.parent.iterdir():
        if entry.name != "checkpoints":
            (run / entry.name).symlink_to(entry.resolve())
    stand_in = run / "checkpoints" / checkpoint.name
    stand_in.mkdir(parents=True)
    for entry in checkpoint.iterdir():
        (stand_in / entry.name).symlink_to(entry.resolve())
    return stand_in


def find_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a checkpoint folder; the newest checkpoint if it is a run folder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise RLForgeError(f"'{path}' does not exist or is not a folder.")
    if (folder / ckpt.STATE_FILE).is_file() or (folder / ACTOR_DIR).is_dir():
        return folder
    found = ckpt.list_checkpoints(folder)
    if found:
        return found[-1]
    raise RLForgeError(
        f"'{path}' is neither a checkpoint (no {ckpt.STATE_FILE} or {ACTOR_DIR}/) nor a run folder with "
        f"checkpoints/step_N/ in it."
    )


def model_folder(path: str) -> str:
    """The Hugging Face folder to load for ``path``: a model folder, ``builtin:NAME`` or a Hub id as given, a
    checkpoint's ``actor/``, or a run's newest checkpoint's ``actor/``; for a LoRA checkpoint (an adapter), its
    base model with the adapter merged in, written to a temporary folder that is removed when the process ends."""
    folder = Path(path).expanduser()
    hub_id = not folder.exists() and HUB_ID.fullmatch(path)
    if path.startswith(BUILTIN_PREFIX) or (folder / "config.json").is_file() or hub_id:
        return path
    if (folder / ADAPTER_CONFIG).is_file():
        actor = folder
    else:
        checkpoint = find_checkpoint(folder)
        actor = write_missing_actor(checkpoint) / ACTOR_DIR
    return str(merged_lora_folder(actor) if (actor / ADAPTER_CONFIG).is_file() else actor)


def merged_lora_folder(actor: Path) -> Path:
    """A LoRA adapter folder (a checkpoint's ``actor/``, an ``--adapter`` export) merged into its base in a new
    temporary folder (removed at exit)."""
    import atexit
    import tempfile

    out = Path(tempfile.mkdtemp(prefix=f"rlforge-lora-{actor.parent.name}-"))
    atexit.register(shutil.rmtree, out, True)
    merge_lora(actor, out)
    return out


def copy_hf_folder(checkpoint: Path, out: Path) -> None:
    """The default exporter: ``actor/`` already is a complete Hugging Face folder."""
    actor = checkpoint / ACTOR_DIR
    if not (actor / "config.json").is_file():
        raise RLForgeError(f"Checkpoint {checkpoint} has no {ACTOR_DIR}/config.json: it is incomplete.")
    shutil.copytree(actor, out, dirs_exist_ok=True)


def _run_setting(checkpoint: Path, key: str) -> Any:
    """``key`` in the config.yaml of the checkpoint's run (None when the run folder is not there)."""
    from omegaconf import OmegaConf

    run_config = checkpoint.parent.parent / "config.yaml"
    return OmegaConf.select(OmegaConf.load(run_config), key) if run_config.is_file() else None


def _strategy_of(checkpoint: Path, registry: Any) -> Any:
    """The registry entry of the strategy named by the run's config.yaml (``single`` when the run folder is not
    there)."""
    return registry.strategy.entry(_run_setting(checkpoint, "strategy.name") or "single")


def source_model(checkpoint: Path) -> str | None:
    """The model the checkpoint's run started from: a LoRA adapter's base, else the run's ``model.path``."""
    adapter = checkpoint / ACTOR_DIR / ADAPTER_CONFIG
    if adapter.is_file():
        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        return model_name(base) if base else base  # an older checkpoint's absolute builtin: or Hub cache folder
    return _run_setting(checkpoint, "model.path")


def export_checkpoint(path: str | Path, out: str | Path, registry: Any, adapter_only: bool = False,
                      warn: Callable[[str], Any] = print, repo_id: str | None = None, dtype: str = "") -> Path:
    """Write the checkpoint at ``path`` (or a run's newest one) to ``out`` as a plain Hugging Face folder. A LoRA
    run's checkpoint (an adapter) is merged into its base model, or with ``adapter_only`` copied as the adapter
    folder that peft loads (``PeftModel.from_pretrained(base, out)``). The weights' dtypes and the tokenizer's pad
    token are then those of the model the run loaded (``as_loaded``); ``warn`` says so when it cannot be found, and
    when casting to its dtype rounded most of the training's changes away. ``dtype`` (a torch dtype name, e.g.
    ``float32``): every floating weight in that dtype instead. The folder's ``README.md`` is its model card
    (``repo_id``: the Hub repo it names, where it is pushed)."""
    if adapter_only and dtype:
        raise RLForgeError(f"--dtype {dtype} applies to a merged export; --adapter writes the adapter as it trained.")
    checkpoint = find_checkpoint(path)
    target = Path(out).expanduser()
    if Path(os.path.realpath(target)).is_relative_to(os.path.realpath(checkpoint)):
        raise RLForgeError(f"Output folder {out} is inside the checkpoint {checkpoint}: export it to a folder outside.")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RLForgeError(f"Output folder {out} exists and is not empty: choose a new folder.")
    checkpoint = write_missing_actor(checkpoint)
    if ckpt.has_actor(checkpoint):  # a truncated weight file would export as a folder that does not load
        ckpt.check_actor(checkpoint)
    is_adapter = (checkpoint / ACTOR_DIR / ADAPTER_CONFIG).is_file()
    if adapter_only and not is_adapter:
        raise RLForgeError(f"{checkpoint} is not a LoRA checkpoint (no {ACTOR_DIR}/{ADAPTER_CONFIG}): --adapter "
                           f"applies to runs with model.lora.rank > 0.")
    exporter = (partial(export_lora, adapter_only=adapter_only) if is_adapter else
                _strategy_of(checkpoint, registry).functions.get("export_checkpoint", copy_hf_folder))
    staged = target.with_name(f".{target.name}.partial")  # renamed to ``out`` once complete
    shutil.rmtree(staged, ignore_errors=True)
    try:
        staged.mkdir(parents=True)
        _export_into(staged, checkpoint, exporter, adapter_only, warn, repo_id, dtype, out)
        staged.replace(target)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return target


def _export_into(target: Path, checkpoint: Path, exporter: Callable[[Path, Path], Any], adapter_only: bool,
                 warn: Callable[[str], Any], repo_id: str | None, dtype: str, out: str | Path) -> None:
    """The export of ``checkpoint`` written into the folder ``target``: the weights (``exporter``), dtypes and pad
    token as the run loaded them, the model card."""
    exporter(checkpoint, target)
    expected = ADAPTER_CONFIG if adapter_only else "config.json"
    if not (target / expected).is_file():
        raise RLForgeError(f"Exporting {checkpoint} wrote no {expected} into {out}.")
    source = source_model(checkpoint)
    if adapter_only:
        _name_base(target, source, warn)
    try:
        folder = resolve_model_path(str(source), "the run's model.path") if source is not None else None
    except RLForgeError as exc:
        warn(f"{exc} The export keeps the checkpoint's dtypes and tokenizer (pad token, padding side).")
        folder = None
    if folder is not None or dtype:  # without the run's model, --dtype still applies (the folder is its own source)
        if note := as_loaded(target, folder or target, weights=not adapter_only, dtype=dtype).warning():
            warn(note)
    write_model_card(target, checkpoint, adapter=adapter_only, base_model=source, repo_id=repo_id, name=Path(out).name)


def _name_base(adapter: Path, base: str | None, warn: Callable[[str], Any]) -> None:
    """The exported adapter's ``base_model_name_or_path`` set to ``base`` (as it loads elsewhere); ``warn`` that a
    local path loads only on this machine."""
    config = adapter / ADAPTER_CONFIG
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": base}, indent=2),
                      encoding="utf-8")
    if is_local_path(base):
        warn(f"The adapter's base model is the local path {base} (base_model_name_or_path in {ADAPTER_CONFIG}): the "
             f"adapter loads only where that folder is. Edit it to the base's Hub id before sharing the adapter.")


# --- the Hub ----------------------------------------------------------------------------------------------------
HTTP_HINTS = {  # a status the Hub answered a push with -> what to do
    401: "the token is not valid: set HF_TOKEN to a token with write access, or run `hf auth login`",
    403: "the token may not write there: a token with write access to that user or organization is needed",
    404: "no such repo or organization",
}


def hub_token(repo_id: str) -> str:
    """The token that pushes to ``repo_id`` (``HF_TOKEN``, else ``hf auth login``'s), after checking the repo id:
    both before anything is exported."""
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        said = str(exc).split(" Use `repo_type`")[0]  # the CLI pushes model repos only
        raise RLForgeError(f"--push-to-hub {repo_id!r} is not a Hub repo id: {said}") from None
    token = get_token()
    if not token:
        raise RLForgeError(f"--push-to-hub {repo_id} needs a Hugging Face token with write access: set HF_TOKEN or "
                           f"run `hf auth login` (HF_ENDPOINT names another Hub).")
    return token


def push_to_hub(folder: Path, repo_id: str, token: str, private: bool = False) -> str:
    """Create the model repo ``repo_id`` where it is missing (``private``: a new one is private; an existing repo
    keeps its visibility) and upload ``folder`` to it in one commit; the commit's URL. The Hub is ``HF_ENDPOINT``'s
    (huggingface_hub's default: huggingface.co)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    again = f"The export is complete in {folder}: upload it with `hf upload {repo_id} {folder} .` once that is fixed."
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo.repo_id, folder_path=folder,
                                   commit_message=f"rlforge export ({folder.name})")
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        said = (exc.server_message or str(exc)).strip().splitlines()[0].rstrip(".!")
        hint = f" ({HTTP_HINTS[status]})" if status in HTTP_HINTS else ""
        raise RLForgeError(f"Pushing to the Hub repo {repo_id} at {api.endpoint} failed: HTTP {status}: {said}{hint}. "
                           f"{again}") from None
    except Exception as exc:  # the HTTP client's own: no connection, a timeout
        raise RLForgeError(f"Pushing to the Hub repo {repo_id} at {api.endpoint} failed: {type(exc).__name__}: "
                           f"{exc}. {again}") from exc
    return str(commit.commit_url)


def export_lora(checkpoint: Path, out: Path, adapter_only: bool = False) -> None:
    """A LoRA checkpoint's adapter, merged into its base model (``merge_lora``), or with ``adapter_only`` as it is."""
    actor = checkpoint / ACTOR_DIR
    if adapter_only:
        shutil.copytree(actor, out, dirs_exist_ok=True)
    else:
        merge_lora(actor, out)


def merge_lora(actor: Path, out: Path) -> None:
    """The adapter folder ``actor`` merged into the base model it names (``base_model_name_or_path``), in ``out``."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    from rlforge.models import load_model

    base_path = json.loads((actor / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    merged = PeftModel.from_pretrained(load_model(str(base_path)), actor).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(actor).save_pretrained(out)
    for name in PROCESSOR_FILES:  # a vision-language model's image processor, as the checkpoint holds it
        if (actor / name).is_file():
            shutil.copy2(actor / name, out / name)
