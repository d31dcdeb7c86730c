"""Which run folder a training writes into, and from which checkpoint it continues (docs/reliability.md).

:func:`bind` takes the run's lock first, then decides; nothing is written into a folder another process holds.

- ``trainer.resume=never``: a new run folder (or the empty ``trainer.run_dir``).
- ``trainer.resume=auto``: the newest run of ``trainer.experiment`` (or ``trainer.run_dir``), never an older
  one: from its newest readable checkpoint (falling back over corrupt ones, with a warning), or from step 0
  when it has none (it was stopped before its first checkpoint); a new run when the experiment has none.
- ``trainer.resume=PATH``: that checkpoint (no fallback), or that run folder as with ``auto``.

A continuation must match the checkpoint: the same config in every key but :data:`MAY_CHANGE`, the same
training data (:func:`data_fingerprint`), the same contents of the files in :data:`CONTENT_KEYS` and the same
``RLModule`` class (a run of ``Trainer(cfg).fit(MyGRPO(cfg))`` does not continue as the built-in GRPO).
``trainer.resume_force=true`` continues anyway, with a warning. The run's ``config.yaml`` is written once, when
the run starts; each continuation appends a line to ``resumes.jsonl`` (from where, which keys changed, whether
forced).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlforge import checkpoint as ckpt
from rlforge import diskio
from rlforge import lr_schedule
from rlforge.errors import RLForgeError
from rlforge.runlock import LOCK_FILE, RunLock

CONFIG_FILE = "config.yaml"
END_MARK = "# end of rlforge config"  # written last: a config.yaml without it was cut short
RESUMES_FILE = "resumes.jsonl"
# keys that may differ between a checkpoint and its continuation: they change neither the weights nor the
# order of the training data (logging, length of the run, cadence, locations, worker counts); a longer or shorter run
# where the learning-rate schedule depends on its length continues on the new length's schedule (_schedule_note)
MAY_CHANGE = (
    "trainer.total_steps", "trainer.epoch_limit", "trainer.save_every", "trainer.keep_last_n", "trainer.val_every",
    "trainer.val_before_train", "trainer.val_at_end", "trainer.progress", "trainer.samples_to_save",
    "trainer.max_nonfinite_steps",
    "trainer.resume", "trainer.resume_force", "trainer.run_dir", "trainer.runs_root", "trainer.experiment",
    "logger.*", "reward.num_workers", "reward.max_error_share", "ray.address", "ray.num_cpus",
    "ray.placement_timeout_s",
    # how weights reach the engine, and how checkpoints are written (a checkpoint is loaded as it was written)
    "rollout.weight_sync", "strategy.checkpoint",
    # where the judge of reward.manager=generative is reached and how patiently (its model and prompt must stay)
    "reward.generative.base_url", "reward.generative.api_key_env", "reward.generative.max_concurrency",
    "reward.generative.timeout_s", "reward.generative.retries", "reward.generative.local_device",
    # how many ranks the frozen models of the reward model and opd's teacher use, and their batch (the same results)
    "reward.model.num_workers", "reward.model.batch_size", "algorithm.teacher.num_workers",
    "algorithm.teacher.batch_size",
    "data.train_files", "data.val_files",  # the data itself is compared by its fingerprint
    "sft.*",  # options of `rlforge sft`, not read by `rlforge fit`
)
# files whose contents change the result although their path stays the same (hashed into each checkpoint)
CONTENT_KEYS = ("reward.file",)
MAX_LISTED = 8
log = logging.getLogger("rlforge.run")
_MISSING = object()


@dataclass
class Binding:
    """The run folder this process writes (its lock held) and where training starts."""

    run_dir: Path
    lock: RunLock
    new: bool = False  # a run that starts now (not a continuation)
    checkpoint: Path | None = None  # None: start at step 0
    state: dict[str, Any] = field(default_factory=dict)  # the checkpoint's trainer state, already read
    changed: dict[str, list[Any]] = field(default_factory=dict)  # allowed (or forced) changes: key -> [old, new]


def bind(config: DictConfig, prints: dict[str, Any], defaults: Callable[[], DictConfig]) -> Binding:
    """Lock and return the run to write; read its checkpoint; refuse an unsound continuation.

    ``prints``: :func:`fingerprint` of the training prompts and files; ``defaults()``: the default config of
    the algorithm (keys added since a checkpoint was written pass when they hold their default).
    """
    t = config.trainer
    if t.resume == "never":
        return _new_run(config, Path(t.run_dir) if t.run_dir else None)
    run_dir, explicit = resumed_run(t)
    if run_dir is None or (t.resume == "auto" and not ckpt.holds_run(run_dir)):
        return _new_run(config, run_dir)
    if t.resume != "auto" and t.run_dir and Path(t.run_dir).resolve() != run_dir.resolve():
        raise RLForgeError(f"trainer.resume={t.resume} belongs to the run {run_dir}, not to trainer.run_dir="
                           f"{t.run_dir}. Set one of them (a new run from a checkpoint's weights: "
                           f"model.path=<checkpoint>/actor).")
    lock = RunLock(run_dir)
    try:
        ckpt.clean_temporaries(run_dir)
        return _continue(config, run_dir, lock, explicit, prints, defaults)
    except BaseException:
        lock.release()
        raise


VAL_ONLY_REPORT = "eval_report_step_"  # what verl's trainer.val_only writes into a run folder before it trains there


def _new_run(config: DictConfig, run_dir: Path | None) -> Binding:
    explicit = run_dir is not None
    if run_dir is None:
        run_dir = ckpt.new_run_dir(config.trainer.runs_root, config.trainer.experiment)
    else:
        foreign = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE  # an empty checkpoints/ is a run's
                         and not (p.name == "checkpoints" and p.is_dir() and not any(p.iterdir()))
                         ) if run_dir.is_dir() else []
        validated = any(name.startswith(VAL_ONLY_REPORT) for name in foreign)  # verl's val_only ran there first
        if foreign and not validated and not ckpt.holds_run(run_dir):
            raise RLForgeError(
                f"trainer.run_dir={run_dir} is a folder with files that are not a run's ({', '.join(foreign[:5])}"
                f"{', ...' if len(foreign) > 5 else ''}): a run writes config.yaml, metrics, samples.jsonl, "
                f"summary.json and checkpoints/ there and would overwrite or append to files of those names. "
                f"Choose a new or empty folder.")
        with diskio.disk_errors(f"create the run folder {run_dir} (trainer.run_dir)", "Choose a writable folder."):
            run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    try:
        if explicit and ckpt.holds_run(run_dir):  # checked under the lock: another process may have just started it
            raise RLForgeError(
                f"trainer.run_dir={run_dir} already holds a run (config.yaml or checkpoints): starting over in it "
                f"would overwrite that run. Continue it with trainer.resume=auto, or choose a new folder."
            )
        write_run_config(run_dir, config)
    except BaseException:
        lock.release()
        raise
    return Binding(run_dir, lock, new=True)


def resumed_run(trainer: Any) -> tuple[Path | None, Path | None]:
    """(run folder, checkpoint or None) that ``trainer.resume`` names (``trainer``: the config's section, or anything
    with its ``resume``, ``run_dir``, ``runs_root`` and ``experiment``), found without taking the run; (None, None)
    for a new run."""
    if trainer.resume == "never":
        return None, None
    if trainer.resume == "auto":
        if trainer.run_dir:
            return Path(trainer.run_dir), None
        return _newest_run(Path(trainer.runs_root) / trainer.experiment), None
    return resume_target(Path(trainer.resume).expanduser())


def resumed_checkpoint(config: DictConfig) -> Path | None:
    """The checkpoint ``trainer.resume`` would continue from, found without taking the run (None: a run would start
    anew). verl's ``trainer.val_only`` validates it: verl loads the checkpoint before its validation."""
    run_dir, explicit = resumed_run(config.trainer)
    return None if run_dir is None else _pick_checkpoint(run_dir, explicit)[0]  # the newest readable one, as a run


def _newest_run(experiment_dir: Path) -> Path | None:
    """The newest run folder of the experiment that was started (it has a config or a checkpoint)."""
    runs = [r for r in ckpt.runs_of(experiment_dir) if ckpt.holds_run(r)]
    return runs[-1] if runs else None


def resume_target(path: Path) -> tuple[Path, Path | None]:
    """``trainer.resume=PATH``: (run folder, the checkpoint) for a checkpoint; (run folder, None) for a run."""
    if ckpt.STEP_DIR.match(path.name) and path.parent.name == "checkpoints":
        return path.parent.parent, path
    if ckpt.holds_run(path):
        return path, None
    raise RLForgeError(
        f"trainer.resume={path}: neither a checkpoint (<run>/checkpoints/step_N) nor a run folder (with config.yaml "
        f"or checkpoints/)."
    )


def _continue(config: DictConfig, run_dir: Path, lock: RunLock, explicit: Path | None,
              prints: dict[str, Any], defaults: Callable[[], DictConfig]) -> Binding:
    force = bool(config.trainer.resume_force)
    saved, damage = read_run_config(run_dir)
    if damage and not force:
        raise RLForgeError(f"{damage} The run's record is damaged; to continue and rewrite it from the current "
                           f"config, set trainer.resume_force=true.")
    checkpoint, state, meta, aside = _pick_checkpoint(run_dir, explicit)
    reference = meta.get("config") or (_plain(saved) if saved is not None else None)
    blocking, changed = compare_configs(reference, _plain(config), lambda: _plain(defaults()))
    if checkpoint is not None:
        blocking += compare_fingerprints(meta, prints)
    where = f"{run_dir} from {checkpoint.name}" if checkpoint else f"{run_dir} (it has no checkpoint: from step 0)"
    if blocking:
        listed = listing(blocking)
        if not force:
            modules = (reference or {}).get("plugins", {}).get("modules") or []
            missing = [m for m in modules if m not in (config.plugins.modules or [])]
            hint = (f" It loaded plugin modules this command does not: give them again (-p "
                    f"{' -p '.join(missing)})." if missing else "")
            raise RLForgeError(
                f"Cannot resume {where}: it was trained with a different config or data ({listed}).{hint} Continuing "
                f"would mix two setups in one run. Start a new run (trainer.resume=never, or another "
                f"trainer.experiment), or continue anyway with trainer.resume_force=true."
            )
        log.warning("Resuming %s although it changed (trainer.resume_force=true): %s", where, listed)
    if note := _schedule_note(config, changed, int(state.get("step", 0))):
        log.warning(note)
    _set_aside(*aside)  # only now: a refused resume leaves the run folder as it was
    if damage:
        log.warning("%s Rewriting it from the current config (trainer.resume_force=true).", damage)
        write_run_config(run_dir, config)
    _record(run_dir, checkpoint, int(state.get("step", 0)), changed, blocking if force else [])
    return Binding(run_dir, lock, False, checkpoint, state, changed)


def listing(differences: list[str]) -> str:
    """A refused resume's differences as its message lists them: the first :data:`MAX_LISTED`, then how many more."""
    more = len(differences) - MAX_LISTED
    return "; ".join(differences[:MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def _schedule_note(config: DictConfig, changed: dict[str, list[Any]], step: int) -> str:
    """The warning for a resume from ``step`` whose ``trainer.total_steps`` changed where a learning-rate schedule
    (the actor's, the critic's) depends on the run's length (``lr_schedule.depends_on_length``): the steps still to
    run follow the new length's schedule (``lr_schedule.continue_at_step``); "" where nothing changes or none is left."""
    if "trainer.total_steps" not in changed or config.trainer.get("schedule_steps"):
        return ""
    old, new = changed["trainer.total_steps"]
    schedules = [_schedule_words(role, config[role]) for role in ("actor", "critic")
                 if role in config and lr_schedule.depends_on_length(config[role])]
    if not schedules or int(new) <= step:
        return ""
    return (f"trainer.total_steps {old} -> {new} changes the learning-rate schedule ({'; '.join(schedules)}): steps "
            f"{step + 1}-{new} run at the rates a run of {new} steps has at them, as after verl's resume, not at those "
            f"of the {old}-step schedule.")


def _schedule_words(role: str, section: Any) -> str:
    """How :func:`_schedule_note` names what makes ``role``'s schedule depend on the run's length."""
    parts = [f"{role}.lr_scheduler={section.lr_scheduler}"] if section.lr_scheduler != "constant" else []
    if int(section.warmup_steps) <= 0 and float(section.warmup_ratio) > 0:
        parts.append(f"{role}.warmup_ratio={section.warmup_ratio}")
    return ", ".join(parts)


Aside = tuple[list[Path], str]  # checkpoints to set aside once the resume is accepted, and why


def _pick_checkpoint(run_dir: Path, explicit: Path | None
                     ) -> tuple[Path | None, dict[str, Any], dict[str, Any], Aside]:
    """The checkpoint to continue from, read: ``explicit`` (no fallback), else the newest readable one; and the
    checkpoints to set aside (``checkpoints/set_aside/``) once the resume is accepted: the corrupt ones newer than
    it, and with ``explicit`` every newer one. Nothing is moved here."""
    found = ckpt.list_checkpoints(run_dir)
    if explicit is not None:
        if not explicit.is_dir():
            raise RLForgeError(f"trainer.resume={explicit}: no such checkpoint.")
        state, meta = ckpt.read(explicit)
        newer = [c for c in found if ckpt.step_of(c) > ckpt.step_of(explicit)]
        return explicit, state, meta, (newer, f"they are newer than trainer.resume={explicit.name}")
    problems: list[str] = []
    for candidate in reversed(found):
        try:
            state, meta = ckpt.read(candidate)
        except ckpt.CorruptCheckpoint as exc:
            problems.append(str(exc))
            continue
        if problems:
            log.warning("Skipping corrupt checkpoint(s): %s Resuming from the newest good one, %s.",
                        " ".join(problems), candidate)
        return candidate, state, meta, (found[found.index(candidate) + 1:], "they cannot be read")
    if problems:
        raise RLForgeError(f"No readable checkpoint in {run_dir / 'checkpoints'}: {' '.join(problems)} Start a new "
                           f"run with trainer.resume=never.")
    return None, {}, {}, ([], "")


def _set_aside(checkpoints: list[Path], why: str) -> None:
    target = ckpt.set_aside(checkpoints)
    if target is not None:
        log.warning("Moved %s to %s: %s.", ", ".join(c.name for c in checkpoints), target, why)


# --- the run's config --------------------------------------------------------------------------------
def write_run_config(run_dir: Path, config: DictConfig) -> None:
    """``<run>/config.yaml``, atomically, ending with :data:`END_MARK`."""
    with diskio.disk_errors(f"write {run_dir / CONFIG_FILE}", "Free space or choose a writable trainer.runs_root.",
                            where=run_dir):
        diskio.write_atomic(run_dir / CONFIG_FILE, OmegaConf.to_yaml(config) + END_MARK + "\n")


@contextlib.contextmanager
def starting(binding: Binding) -> Iterator[None]:
    """Around a new run's start-up (models, reward file, loggers): when it fails, nothing was trained, so the
    run's ``config.yaml`` is removed and the same ``trainer.run_dir`` can start again with the mistake fixed
    (what the start logged stays)."""
    try:
        yield
    except BaseException:
        if binding.new and not ckpt.list_checkpoints(binding.run_dir):
            (binding.run_dir / CONFIG_FILE).unlink(missing_ok=True)
        raise


def read_run_config(run_dir: Path) -> tuple[DictConfig | None, str]:
    """(the run's config, '') or (None, what is wrong with its config.yaml)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None, f"{path} is missing."
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        return None, f"{path} is empty ({path.stat().st_size} bytes)."
    if text.rstrip().splitlines()[-1].strip() != END_MARK:
        return None, f"{path} is truncated: it does not end with the line '{END_MARK}' that rlforge writes last."
    try:
        loaded = OmegaConf.create(text)
    except Exception as exc:
        return None, f"{path} is not valid YAML ({str(exc).splitlines()[0]})."
    if not isinstance(loaded, DictConfig):
        return None, f"{path} does not hold a mapping of config sections."
    return loaded, ""


def run_config_of(checkpoint: Path) -> dict[str, Any] | None:
    """The config a checkpoint was trained with (its ``meta.json``, else its run's ``config.yaml``); None when
    it has neither. A damaged ``config.yaml`` is an error that says so."""
    meta = checkpoint / ckpt.META_FILE
    if meta.is_file():
        try:
            cfg = json.loads(meta.read_text(encoding="utf-8")).get("config")
        except (OSError, ValueError, AttributeError):
            raise ckpt.CorruptCheckpoint(f"{meta} cannot be read: it is truncated or corrupted.") from None
        if isinstance(cfg, dict):
            return cfg
    run_dir = checkpoint.parent.parent
    if not (run_dir / CONFIG_FILE).exists():
        return None
    saved, damage = read_run_config(run_dir)
    if damage:
        raise RLForgeError(damage)
    return _plain(saved)


# --- comparing ---------------------------------------------------------------------------------------
def _plain(config: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]  # the root is a mapping


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value})
    return out


def may_change(key: str, patterns: tuple[str, ...] = MAY_CHANGE) -> bool:
    """Whether ``key`` matches one of ``patterns`` (``fnmatch``; by default the keys a resume may change)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)


def compare_configs(saved: dict[str, Any] | None, current: dict[str, Any], defaults: Callable[[], dict[str, Any]],
                    allowed: tuple[str, ...] = MAY_CHANGE) -> tuple[list[str], dict[str, list[Any]]]:
    """(blocking differences in words, allowed differences ``key -> [old, new]``: keys matching a pattern of
    ``allowed``, by default :data:`MAY_CHANGE`) between a checkpoint's config and the current one. A key the
    checkpoint lacks (added since) passes when it holds its default."""
    if saved is None:
        return [], {}
    old, new = flatten(saved), flatten(current)
    base: dict[str, Any] | None = None
    blocking: list[str] = []
    changed: dict[str, list[Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if a == b:
            continue
        if a is _MISSING:
            base = base if base is not None else flatten(defaults())
            if base.get(key, _MISSING) == b:
                continue
        if may_change(key, allowed):
            changed[key] = [None if a is _MISSING else a, None if b is _MISSING else b]
        else:
            blocking.append(f"{key}: {_show(a)} -> {_show(b)}")
    return blocking, changed


def _show(value: Any) -> str:
    return "(absent)" if value is _MISSING else repr(value)


# --- the data ----------------------------------------------------------------------------------------
def fingerprint(prompts: list[Any], config: DictConfig) -> dict[str, Any]:
    """What a checkpoint records besides its config: ``data`` (:func:`data_fingerprint` of the training
    prompts) and ``files`` (SHA-256 of the files in :data:`CONTENT_KEYS` that the config names)."""
    files = {key: _sha256(Path(path)) for key in CONTENT_KEYS if (path := OmegaConf.select(config, key))}
    return {"data": data_fingerprint(prompts), "files": files}


def compare_fingerprints(meta: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The differences in words between a checkpoint's fingerprints (its meta.json) and the current ones."""
    out = []
    if meta.get("module") and now.get("module") and meta["module"] != now["module"]:  # Trainer(cfg).fit(MyGRPO(cfg))
        out.append(f"the algorithm's class: {meta['module']} then, {now['module']} now")
    if meta.get("data") and meta["data"] != now["data"]:
        out.append(f"the training data: {_describe(meta['data'])} then, {_describe(now['data'])} now")
    then = meta.get("files") or {}
    for key in sorted(set(then) & set(now["files"])):
        if then[key] != now["files"][key]:
            out.append(f"the contents of {key}: sha256 {then[key][:12]} then, {now['files'][key][:12]} now")
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(examples: list[Any]) -> dict[str, Any]:
    """What the training trains on, in a few bytes: the number of examples and a SHA-256 over each example's
    fields (a prompt's token ids, messages, data source, ground truth and extra info; a preference example's
    prompt, completions and labels), in order. Any change to the rows, their order, the chat template or the
    prompt filter changes it; moving or renaming the files does not."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps(example, sort_keys=True, default=_jsonable).encode() + b"\n")
    return {"prompts": len(examples), "sha256": digest.hexdigest()}


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # its fields, one level at a time (the JSON of ``dataclasses.asdict``, without its deep copy of every list:
        # the copy was 90% of the fingerprint's cost)
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if callable(getattr(value, "is_floating_point", None)) and value.is_floating_point():
        # a float tensor (a vision row's pixel values): the digest of its bytes, not a JSON list of every float
        return hashlib.sha256(value.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
    image_class = getattr(sys.modules.get("PIL.Image"), "Image", None)  # loaded wherever a row has an image
    if image_class is not None and isinstance(value, image_class):  # a vision row's image: its pixels' digest
        return hashlib.sha256(value.tobytes()).hexdigest()
    return value.tolist() if hasattr(value, "tolist") else repr(value)


def _describe(fp: dict[str, Any]) -> str:
    return f"{fp.get('prompts')} examples (sha256 {str(fp.get('sha256'))[:12]})"  # prompts, pairs or SFT examples


def _record(run_dir: Path, checkpoint: Path | None, step: int, changed: dict[str, list[Any]],
            forced: list[str]) -> None:
    line = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "pid": os.getpid(),
            "checkpoint": checkpoint.name if checkpoint else None, "step": step, "changed": changed, "forced": forced}
    with diskio.disk_errors(f"write {run_dir / RESUMES_FILE}", "Free space, then resume again.", where=run_dir):
        with diskio.open_text(run_dir / RESUMES_FILE, append=True) as fh:
            fh.write(json.dumps(line, default=str) + "\n")
