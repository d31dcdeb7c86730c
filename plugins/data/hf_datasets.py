"""Rows through Hugging Face ``datasets`` (``data.name=hf``; ``pip install 'rlforge[datasets]'``; docs/data.md).

Where the rows come from: ``data.hf.path`` names a source with splits (a folder saved by ``DatasetDict.save_to_disk``,
a local dataset folder of data files, or a Hub dataset id), whose ``data.hf.train_split`` and ``data.hf.val_split``
are read; unset, ``data.train_files`` and ``data.val_files`` name parquet, jsonl/json or arrow files, or folders
saved by ``Dataset.save_to_disk``, each read on its own so that an error names its file and row as the ``files``
dataset's errors do; a jsonl/json file of which datasets would read a value back changed (an Arrow column holds one
type) is refused (``json_values.check_json``). ``datasets`` is imported when such a dataset is first read.

The rows stay in Arrow, memory-mapped (``ArrowRows``): the core's ``tokenize_rows`` hands them its settings
(``rlforge.data.PromptSource``) and they are tokenized by ``Dataset.map`` in ``data.hf.num_proc`` processes into
datasets' cache, where a later run with the same rows, tokenizer, settings and rlforge code finds them. The prompts
stay in Arrow too (``ArrowPrompts``): one is read when the trainer draws it. With ``data.hf.streaming`` a source is
read as a stream (``IterableDataset``), once, to its end or ``data.hf.max_train_rows``/``max_val_rows``, into a
memory-mapped file of this process that is removed when it exits; nothing of it is held in memory.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, partial
from itertools import accumulate
from pathlib import Path
from typing import Any, Optional

from rlforge.capabilities import DatasetCapabilities
from rlforge.config.schema import option
from rlforge.data import SAVED_DATASET_DICT_FILE, SAVED_DATASET_FILE, Prompt, data_file_problem
from rlforge.errors import ConfigError, DataError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import optional_import
from rlforge.models import HUB_ID
from rlforge.plugins.data.builtin import check_ground_truth, read_rows, utf8_problem
from rlforge.plugins.data.json_values import check_json

INSTALL = "pip install 'rlforge[datasets]'"
FILE_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}  # suffix -> datasets builder
READ_BATCH = 512  # rows per batch read from Arrow when rows or prompts are iterated


@dataclass
class HFDataConfig:
    """Rows read through Hugging Face ``datasets`` (``data.name=hf``; docs/data.md)."""

    path: str = ""  # a folder saved by DatasetDict.save_to_disk, a local dataset folder or a Hub dataset id (ORG/NAME); '' = data.train_files / val_files read through datasets (parquet, jsonl, json, arrow files or Dataset.save_to_disk folders)
    config_name: Optional[str] = None  # the dataset's configuration (a Hub subset, e.g. main for openai/gsm8k)
    revision: Optional[str] = None  # a Hub dataset's branch, tag or commit
    train_split: str = "train"  # the split of data.hf.path that trains
    val_split: Optional[str] = "test"  # the split of data.hf.path that validates; null = no validation
    streaming: bool = False  # read each source as a stream (IterableDataset), once, into a memory-mapped file of this run (removed at exit); a Dataset.save_to_disk folder is memory-mapped as it is
    max_train_rows: Optional[int] = option(None, ge=1)  # the first N training rows only (a stream stops reading there); None = all
    max_val_rows: Optional[int] = option(None, ge=1)  # the first N validation rows only; None = all
    num_proc: Optional[int] = option(None, ge=1)  # processes that tokenize the prompts (Dataset.map); None = this one
    cache_dir: Optional[str] = None  # datasets' cache folder (downloads, files converted to Arrow, streams); None = HF_DATASETS_CACHE


def _datasets() -> Any:
    return optional_import("datasets", "data.name=hf reads rows with Hugging Face datasets", INSTALL)


# --- rows and prompts in Arrow ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """Rows of one file or split: ``rows`` (a ``datasets.Dataset``) are named ``<label>, row <skip + i + 1>``."""

    label: str
    rows: Any
    skip: int = 0  # rows of the source before these (a slice of the rows)


def _plain(value: Any) -> Any:
    """A value read from Arrow without its nulls in mappings: Arrow gives every row every key of the column's
    schema (null where a row has none), so a row reads as the jsonl line it was, and a missing key is named as one."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _plain_rows(batch: dict[str, list[Any]]) -> list[dict[str, Any]]:
    return [_plain(dict(zip(batch, values))) for values in zip(*batch.values())]


def _batch_rows(batch: dict[str, list[Any]], names: Iterator[str]) -> list[dict[str, Any]]:
    rows = _plain_rows(batch)
    for row in rows:
        row.setdefault("_origin", next(names))
    return rows


class ArrowRows(Sequence[dict[str, Any]]):
    """Rows of some segments, as the ``files`` dataset gives them (dicts, ``_origin`` naming the file or split and
    the row); a :class:`rlforge.data.PromptSource`, tokenized with ``Dataset.map``."""

    def __init__(self, segments: list[Segment], num_proc: int | None) -> None:
        self.segments, self.num_proc = segments, num_proc
        self._starts = list(accumulate([len(s.rows) for s in segments], initial=0))

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._slice(range(len(self))[index])
        position = range(len(self))[index]
        n = next(n for n in range(len(self.segments)) if position < self._starts[n + 1])
        seg, local = self.segments[n], position - self._starts[n]
        return _batch_rows({k: [v] for k, v in seg.rows[local].items()},
                           iter([f"{seg.label}, row {seg.skip + local + 1}"]))[0]

    def _slice(self, positions: range) -> Any:
        if positions.step != 1:
            return [self[i] for i in positions]
        segments = []
        for seg, start in zip(self.segments, self._starts):
            lo, hi = max(positions.start - start, 0), min(positions.stop - start, len(seg.rows))
            if lo < hi:
                segments.append(Segment(seg.label, seg.rows.select(range(lo, hi)), seg.skip + lo))
        return ArrowRows(segments, self.num_proc)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for seg in self.segments:
            names = (f"{seg.label}, row {seg.skip + i}" for i in range(1, len(seg.rows) + 1))
            for batch in seg.rows.iter(batch_size=READ_BATCH):
                yield from _batch_rows(batch, names)

    def tokenize_prompts(self, encode: Callable[[list[dict[str, Any]], list[int], list[str]], list[Prompt]]
                         ) -> Sequence[Prompt]:
        """The prompts, by ``Dataset.map`` of ``encode`` over each segment (cached by datasets: the cache key is the
        segment, ``encode`` with its tokenizer and settings, and the digest of the code that tokenizes)."""
        datasets = _datasets()
        parts = []
        for seg, offset in zip(self.segments, self._starts):
            size = len(seg.rows)
            procs = min(self.num_proc, size) if self.num_proc and size > 1 else None
            parts.append(seg.rows.map(
                encode_batch, batched=True, with_indices=True, remove_columns=seg.rows.column_names,
                features=_prompt_features(datasets), num_proc=procs, desc=f"Tokenizing {seg.label}",
                fn_kwargs={"encode": encode, "label": seg.label, "skip": seg.skip, "offset": offset,
                           "code": code_digest()}))
        if not parts:
            return []
        return ArrowPrompts(parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts))


def _prompt_features(datasets: Any) -> Any:
    """The prompts' columns: token ids, the other fields as JSON, the row's position."""
    return datasets.Features({"ids": datasets.List(datasets.Value("int32")), "fields": datasets.Value("string"),
                              "index": datasets.Value("int64")})


@cache
def code_digest() -> str:
    """SHA-256 of the code that turns rows into prompts (rlforge.data, rlforge.multimodal, the ``files`` dataset's
    row checks and this module): datasets keys its cache on a module function's name, not its code, so a changed
    rlforge does not read stale prompts."""
    from rlforge import data, multimodal
    from rlforge.plugins.data import builtin

    digest = hashlib.sha256()
    for module in (data, multimodal, builtin):
        digest.update(Path(module.__file__ or "").read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def encode_batch(batch: dict[str, list[Any]], indices: list[int], *, encode: Callable[..., list[Prompt]], label: str,
                 skip: int, offset: int, code: str) -> dict[str, list[Any]]:
    """One batch of a segment's rows as prompt columns: ``ids``, ``fields`` (JSON of the messages, data source,
    ground truth and extra info) and ``index`` (the row's position in all the rows). ``code`` only keys the cache."""
    rows = _plain_rows(batch)  # without _origin, which a "Columns present" would list: ``wheres`` name them
    wheres = [f"{label}, row {skip + i + 1}" for i in indices]
    for row, origin in zip(rows, wheres):
        check_ground_truth(row, origin)
    prompts = encode(rows, [offset + i for i in indices], wheres)
    where = dict(zip((offset + i for i in indices), wheres))
    return {"ids": [p.ids for p in prompts], "fields": [_fields(p, where[p.index]) for p in prompts],
            "index": [p.index for p in prompts]}


def _fields(prompt: Prompt, where: str) -> str:
    try:
        return json.dumps({"messages": prompt.messages, "data_source": prompt.data_source,
                           "ground_truth": prompt.ground_truth, "extra_info": prompt.extra_info,
                           **({"agent_name": prompt.agent_name} if prompt.agent_name is not None else {})})
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: its messages, data_source, ground_truth or extra_info hold a value JSON cannot "
                        f"keep ({exc}); data.name=hf stores the prompts' fields as JSON.") from None


class ArrowPrompts(Sequence[Prompt]):
    """Tokenized prompts in a memory-mapped Arrow table: each is read when it is drawn."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        row = self.table[range(len(self))[index]]
        return _as_prompt(row["ids"], row["fields"], row["index"])

    def __iter__(self) -> Iterator[Prompt]:
        for batch in self.table.iter(batch_size=READ_BATCH):
            yield from map(_as_prompt, batch["ids"], batch["fields"], batch["index"])


def _as_prompt(ids: list[int], fields: str, index: int) -> Prompt:
    f = json.loads(fields)
    return Prompt(list(ids), f["messages"], f["data_source"], f["ground_truth"], f["extra_info"], index,
                  agent_name=f.get("agent_name"))


# --- sources ----------------------------------------------------------------------------------------------------


def _typed(rows: Any) -> None:
    """Nothing to check: a typed source (parquet, arrow, a saved dataset, a split) is read back as it was written."""


@dataclass(frozen=True)
class Source:
    """A file or split to read: ``open()`` gives a ``Dataset`` (or a stream: an ``IterableDataset``); a failure to
    read it becomes ``unreadable(exc)``, an error in words naming it; ``check(rows)`` refuses rows not read as
    written (a ``Dataset``: the stream read into a file, the rows kept)."""

    label: str
    open: Callable[[], Any]
    unreadable: Callable[[Exception], Exception]
    check: Callable[[Any], None] = _typed


def _root_cause(exc: BaseException) -> str:
    """The innermost exception of a chain, as ``Type: first line``."""
    for _ in range(20):
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc = inner
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _cannot_read(label: str, how: str, exc: Exception) -> Exception:
    return DataError(f"{label}: datasets cannot read it{how} ({_root_cause(exc)}).")


def _json_unreadable(path: str, exc: Exception) -> Exception:
    """A JSON file datasets cannot read, named by the ``files`` dataset's reader (file and line) where it can tell."""
    try:
        read_rows(path)
    except DataError as named:
        return named
    return _cannot_read(path, " as json", exc)


def _load_saved(path: str) -> Any:
    """A folder saved by ``Dataset.save_to_disk``; one saved from an empty Dataset (no Arrow files, which datasets
    cannot load) is named as 0 rows."""
    state = json.loads((Path(path) / SAVED_DATASET_FILE).read_text(encoding="utf-8"))
    if isinstance(state, dict) and state.get("_data_files") == []:
        raise DataError(f"{path}: 0 rows (a folder saved by Dataset.save_to_disk from an empty Dataset).")
    return _datasets().load_from_disk(path)


def _file_source(path: str, h: Any) -> Source:
    """A data file (by its suffix, ``FILE_FORMATS``) or a folder saved by ``Dataset.save_to_disk``."""
    problem = data_file_problem(path)
    if problem:
        raise DataError(f"{problem}.")
    if (Path(path) / SAVED_DATASET_FILE).is_file():
        return Source(path, partial(_load_saved, path), partial(_cannot_read, path, ""))
    builder = FILE_FORMATS.get(Path(path).suffix)
    if builder is None:
        raise DataError(f"Data file {path}: unsupported extension '{Path(path).suffix}' (data.name=hf reads "
                        f"{', '.join(FILE_FORMATS)} files and folders saved by Dataset.save_to_disk).")
    if builder == "json":
        return Source(path, partial(_load_json, path, h), partial(_json_unreadable, path), partial(check_json, path))
    return Source(path, lambda: _datasets().load_dataset(builder, data_files=[path], split="train",
                                                         cache_dir=h.cache_dir, streaming=h.streaming),
                  partial(_cannot_read, path, f" as {builder}"))


def _load_json(path: str, h: Any) -> Any:
    """A jsonl/json file through datasets' json builder, once it is known to be UTF-8 text (pyarrow does not check:
    a bad byte would stop the run where its row is read, with a UnicodeDecodeError)."""
    problem = utf8_problem(path)
    if problem:
        raise DataError(f"{problem}.")
    return _datasets().load_dataset("json", data_files=[path], split="train", cache_dir=h.cache_dir,
                                    streaming=h.streaming)


def _split_key(split: str) -> str:
    return "data.hf.train_split" if split == "train" else "data.hf.val_split"


def _no_split(h: Any, key: str, name: str, have: list[str]) -> ConfigError:
    none = ", or null for no validation" if key == "data.hf.val_split" else ""
    return ConfigError(f"{key}='{name}': data.hf.path={h.path} has no such split; its splits: {have}. Set {key} to one "
                       f"of them{none}.")


def _open_saved_dict(h: Any, key: str, name: str) -> Any:
    splits = _datasets().load_from_disk(h.path)
    if name not in splits:
        raise _no_split(h, key, name, list(splits))
    return splits[name]


def _load(h: Any, key: str, name: str) -> Any:
    """``load_dataset`` of a local dataset folder or a Hub id, its mistakes in words."""
    datasets = _datasets()
    try:
        return datasets.load_dataset(h.path, h.config_name, split=name, revision=h.revision, cache_dir=h.cache_dir,
                                     streaming=h.streaming)
    except ConnectionError as exc:
        raise _unreachable(h, exc) from None
    except datasets.exceptions.DatasetNotFoundError:
        raise ConfigError(f"Dataset '{h.path}' (data.hf.path) is not a local folder, and the Hugging Face Hub has no "
                          f"dataset by that name that you can access (a gated or private one needs `hf auth login` or "
                          f"HF_TOKEN).") from None
    except ValueError as exc:  # an unknown split or configuration: datasets' message lists the ones there are
        raise ConfigError(f"data.hf.path={h.path}: {str(exc).strip().splitlines()[0]} ({key}, data.hf.config_name)."
                          ) from None


def _unreachable(h: Any, exc: Exception) -> ConfigError:
    from huggingface_hub import constants

    why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE  # datasets then says only "not cached in <dir>"
           else f"the Hub ({constants.ENDPOINT}) cannot be reached ({_root_cause(exc)})")
    subset = f", '{h.config_name}'" if h.config_name else ""
    return ConfigError(
        f"Dataset '{h.path}' (data.hf.path) is not a local folder and not in datasets' cache, and {why}. "
        f"Where the Hub is reachable, save it to a folder: python -c \"import datasets; "
        f"datasets.load_dataset('{h.path}'{subset}).save_to_disk('DIR')\", copy DIR here and set data.hf.path=DIR "
        f"(docs/data.md).")


def _load_splits(h: Any) -> list[str]:
    try:
        return list(_datasets().get_dataset_split_names(h.path, h.config_name, revision=h.revision))
    except ConnectionError as exc:
        raise _unreachable(h, exc) from None


def _refuse(why: str) -> Callable[..., Any]:
    def refuse(h: Any, *_: Any) -> Any:
        raise ConfigError(f"data.hf.path={h.path} {why.format(path=h.path)}")

    return refuse


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` or a folder in it holds a file (hidden ones aside)."""
    return any(f.is_file() and not f.name.startswith(".") for f in folder.rglob("*"))


@dataclass(frozen=True)
class PathKind:
    """What ``data.hf.path`` can name: the first kind that ``matches`` it opens a split (``open(h, key, name)``) and
    lists them (``splits(h)``)."""

    matches: Callable[[str], bool]
    open: Callable[[Any, str, str], Any]
    splits: Callable[[Any], list[str]]

    @classmethod
    def refused(cls, matches: Callable[[str], bool], why: str) -> PathKind:
        """A kind of path that is a mistake: opening it or listing its splits says ``why``."""
        return cls(matches, _refuse(why), _refuse(why))


PATH_KINDS = (
    PathKind(lambda p: (Path(p) / SAVED_DATASET_DICT_FILE).is_file(), _open_saved_dict,
             lambda h: list(_datasets().load_from_disk(h.path))),
    PathKind.refused(lambda p: (Path(p) / SAVED_DATASET_FILE).is_file(), (
        "is a folder saved by Dataset.save_to_disk (one split, without a name): pass it as data.train_files=[{path}] "
        "(the validation set's folder as data.val_files) with data.hf.path unset.")),
    PathKind.refused(lambda p: Path(p).is_dir() and not _holds_files(Path(p)), (
        "is an empty folder: it holds no dataset files. data.hf.path takes a folder saved by DatasetDict.save_to_disk, "
        "a folder of data files (parquet, jsonl, json, csv, arrow; train/test in their names or folders) or a Hub "
        "dataset id (ORG/NAME).")),
    PathKind(lambda p: Path(p).is_dir(), _load, _load_splits),  # data files, maybe a README.md naming configurations
    PathKind.refused(lambda p: Path(p).exists(), (
        "is a file; data.hf.path names a source with splits. Pass data files as data.train_files=[{path}] "
        "(and data.val_files) with data.hf.path unset.")),
    PathKind(lambda p: bool(HUB_ID.fullmatch(p)), _load, _load_splits),
    PathKind.refused(lambda p: True, "does not exist, and is not a Hub dataset id (ORG/NAME)."),
)


def _split_source(h: Any, split: str) -> list[Source]:
    key = _split_key(split)
    name = h.train_split if split == "train" else h.val_split
    if name is None:
        return []
    kind = next(k for k in PATH_KINDS if k.matches(h.path))
    label = f"{h.path} ({name})"
    return [Source(label, partial(kind.open, h, key, name), partial(_cannot_read, label, ""))]


def _stream_rows(stream: Any) -> Iterator[dict[str, Any]]:
    yield from stream


@cache
def _spool_folder(root: str | None) -> Path:
    """This process's folder of streamed rows (and their prompts), under datasets' cache; removed at exit."""
    base = Path(root or _datasets().config.HF_DATASETS_CACHE).expanduser()
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="rlforge-stream-", dir=base))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _spool(stream: Any, h: Any) -> Any:
    """A stream's rows written once into a memory-mapped ``Dataset`` in :func:`_spool_folder`."""
    return _datasets().Dataset.from_generator(partial(_stream_rows, stream), features=stream.features,
                                              cache_dir=str(_spool_folder(h.cache_dir)), fingerprint=uuid.uuid4().hex)


def _segment(source: Source, left: int | None, h: Any) -> Segment:
    """The rows of ``source``, at most ``left`` of them; a stream is read into a file first."""
    datasets = _datasets()
    try:
        rows = source.open()
        if not isinstance(rows, datasets.Dataset):  # an IterableDataset: data.hf.streaming
            rows = _spool(rows if left is None else rows.take(left), h)
    except (DataError, ConfigError):
        raise
    except Exception as exc:
        raise source.unreadable(exc) from None
    if left is not None and len(rows) > left:
        rows = rows.select(range(left))
    if not len(rows):
        raise DataError(f"{source.label}: 0 rows.")
    source.check(rows)
    return Segment(source.label, rows)


class HFDataset:
    """``data.name=hf``: a split's rows as :class:`ArrowRows` (see the module doc)."""

    # reads data.train_files / data.val_files, when data.hf.path is unset (rlforge.config.compose)
    capabilities = DatasetCapabilities(reads_data_files=True)

    def __call__(self, config: Any, split: str) -> Sequence[dict[str, Any]]:
        h = config.data.hf
        segments: list[Segment] = []
        left = h.max_train_rows if split == "train" else h.max_val_rows
        for source in self.sources(config, split):
            if left is not None and left <= 0:
                break
            segments.append(_segment(source, left, h))
            left = None if left is None else left - len(segments[-1].rows)
        return ArrowRows(segments, h.num_proc) if segments else []

    def sources(self, config: Any, split: str) -> list[Source]:
        """The files or the split that ``split`` (train or val) reads."""
        h, d = config.data.hf, config.data
        files = list(d.train_files if split == "train" else d.val_files)
        if h.path and (d.train_files or d.val_files):
            raise ConfigError(f"data.hf.path={h.path} and data.train_files / data.val_files are both set: data.name=hf "
                              f"reads one or the other. Unset one.")
        if h.path:
            return _split_source(h, split)
        if not files and split == "train":
            raise DataError("'data.train_files' is empty and data.hf.path is unset: give data files (parquet, jsonl, "
                            "json, arrow) or folders saved by Dataset.save_to_disk, or data.hf.path (data.name=hf, "
                            "docs/data.md).")
        return [_file_source(path, h) for path in files]

    def splits(self, config: Any) -> list[str]:
        """The split names of ``data.hf.path``."""
        h = config.data.hf
        return next(k for k in PATH_KINDS if k.matches(h.path)).splits(h)


@hookimpl
def rlforge_register(registry):
    registry.dataset.register("hf", HFDataset(), config=HFDataConfig,
                              description="rows through Hugging Face datasets: save_to_disk folders, parquet/jsonl/arrow "
                                          "files, Hub ids (pip install 'rlforge[datasets]')")
