"""``rlforge data gsm8k|math|geometry3k``: turn a local copy of the source data into verl-compatible parquet.

The rows are the ones verl's ``examples/data_preprocess/gsm8k.py``, ``math_dataset.py`` and ``geo3k.py`` write, so
rlforge and verl read each other's files: ``data_source`` (``openai/gsm8k``, ``DigitalLearningGmbH/MATH-lighteval``
or ``hiyouga/geometry3k``), ``prompt`` (one user message: the question plus an instruction suffix), ``ability``
("math"), ``reward_model`` ``{style: rule, ground_truth}``, ``extra_info`` ``{split, index, ...}`` and, for
Geometry3K, the ``images`` column as it is (docs/multimodal.md). Inputs are the dataset's own jsonl or parquet
files, or (read through Hugging Face ``datasets``, the ``hf`` dataset) a folder saved by ``save_to_disk``, a local
dataset folder or a Hub id (see docs/cli.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge import diskio
from rlforge.errors import DataError, RLForgeError
from rlforge.models import HUB_ID

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
# the format the geo3k reward grades (<think>...</think>, then a boxed answer), as verl's preprocessing asks for it
GEO3K_INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
                     "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer "
                     "MUST BE put in \\boxed{}.")
_GSM8K_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
SPLITS = ("train", "test")


def gsm8k_answer(solution: str) -> str | None:
    """The number after ``####`` with thousands separators removed (verl's ``extract_solution``)."""
    found = _GSM8K_ANSWER.search(solution)
    return found.group(1).replace(",", "") if found else None


def last_boxed(solution: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x$``) in a MATH solution."""
    if "\\boxed " in solution:
        return solution.split("\\boxed ")[-1].split("$")[0]
    start = max(solution.rfind("\\boxed{"), solution.rfind("\\fbox{"))
    if start < 0:
        return None
    opening = solution.index("{", start)
    depth = 0
    for i in range(opening, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[i], 0)
        if depth == 0:
            return solution[opening + 1 : i]
    return None  # unbalanced braces


@dataclass(frozen=True)
class Source:
    data_source: str
    question: str  # input column of the question
    solution: str  # input column of the worked solution
    instruction: str  # appended to the question after a space
    extract: Callable[[str], str | None]  # worked solution -> ground truth
    keep_raw: bool  # verl's gsm8k rows keep the raw question and answer in extra_info
    images: str = ""  # the input column of the row's images, kept as the rows' ``images`` ("" = a text dataset)
    subset: str | None = None  # the Hub dataset's configuration verl's script reads (None: its default)


SOURCES: dict[str, Source] = {
    "gsm8k": Source("openai/gsm8k", "question", "answer", GSM8K_INSTRUCTION, gsm8k_answer, True, subset="main"),
    "math": Source("DigitalLearningGmbH/MATH-lighteval", "problem", "solution", MATH_INSTRUCTION, last_boxed, False),
    # the answer column is the final answer itself; each problem has an <image> placeholder per image
    "geometry3k": Source("hiyouga/geometry3k", "problem", "answer", GEO3K_INSTRUCTION, str.strip, True, "images"),
}


def convert_row(source: Source, raw: dict[str, Any], split: str, index: int, where: str) -> dict[str, Any]:
    missing = [c for c in (source.question, source.solution) if not isinstance(raw.get(c), str)]
    if missing:
        present = sorted(k for k in raw if k != "_origin")
        raise DataError(f"{where}: text column(s) {missing} missing or not text. Columns present: {present}.")
    question, solution = raw[source.question], raw[source.solution]
    truth = source.extract(solution)
    if not truth:  # None: not found; '': an empty answer
        raise DataError(f"{where}: cannot find the final answer in '{source.solution}': {solution[-80:]!r}.")
    extra: dict[str, Any] = {"split": split, "index": index}
    if source.keep_raw:
        extra.update(answer=solution, question=question)
    row = {
        "data_source": source.data_source,
        "prompt": [{"role": "user", "content": f"{question} {source.instruction}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra,
    }
    return {**row, "images": _images(source, raw, question, where)} if source.images else row


def _images(source: Source, raw: dict[str, Any], question: str, where: str) -> list[Any]:
    """The row's images as the input holds them; one ``<image>`` in the question per image (checked here, so a
    mismatch is named before any training run reads the file)."""
    from rlforge.multimodal import IMAGE_PLACEHOLDER

    if source.images not in raw:
        present = sorted(k for k in raw if k != "_origin")
        raise DataError(f"{where}: no image column '{source.images}'. Columns present: {present}.")
    images = raw.get(source.images)
    images = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
    if not images or question.count(IMAGE_PLACEHOLDER) != len(images):
        raise DataError(f"{where}: '{source.question}' has {question.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} "
                        f"placeholder(s) and column '{source.images}' holds {len(images)} image(s): each row needs "
                        f"an image and one placeholder per image.")
    return images


def split_of(path: str, given: str | None) -> str:
    if given:
        if given not in SPLITS:
            raise RLForgeError(f"Unknown split '{given}' (--split). Available: {', '.join(SPLITS)}.")
        return given
    named = [s for s in SPLITS if s in Path(path).name.lower()]
    if len(named) != 1:
        raise RLForgeError(f"Cannot tell the split of {path} from its name: pass --split train or --split test.")
    return named[0]


def _file_rows(registry: Any, path: str, split: str | None, subset: str | None) -> list[tuple[str, Any]]:
    """A jsonl/json/parquet file, read by the ``files`` dataset: [(split, rows)]."""
    from omegaconf import OmegaConf

    return [(split_of(path, split), registry.dataset.get("files")(
        OmegaConf.create({"data": {"train_files": [path]}}), "train"))]


def _hf_config(registry: Any, files: list[str], **hf: Any) -> Any:
    """A config that the ``hf`` dataset reads: its section's defaults with ``hf`` over them, no validation split."""
    from omegaconf import OmegaConf

    overrides: dict[str, Any] = {"val_split": None, **hf}
    section = OmegaConf.merge(OmegaConf.structured(registry.dataset.entry("hf").config), overrides)
    return OmegaConf.create({"data": {"hf": section, "train_files": files, "val_files": []}})


def _saved_rows(registry: Any, path: str, split: str | None, subset: str | None) -> list[tuple[str, Any]]:
    """A folder saved by ``Dataset.save_to_disk`` (one split), read by the ``hf`` dataset: [(split, rows)]."""
    return [(split_of(path, split), registry.dataset.get("hf")(_hf_config(registry, [path]), "train"))]


def _split_rows(registry: Any, path: str, split: str | None, subset: str | None) -> list[tuple[str, Any]]:
    """A dataset with splits (``DatasetDict.save_to_disk`` folder, local dataset folder, Hub id), read by the ``hf``
    dataset: [(split, rows)] of the splits in ``SPLITS`` that it has, or only ``split``."""
    read = registry.dataset.get("hf")
    have = read.splits(_hf_config(registry, [], path=path, config_name=subset))
    wanted = [split_of(path, split)] if split else [s for s in SPLITS if s in have]
    missing = [s for s in wanted if s not in have]
    if missing or not wanted:
        raise RLForgeError(f"{path} has no split {missing[0] if missing else ' or '.join(SPLITS)}; its splits: "
                           f"{have} (--split).")
    return [(s, read(_hf_config(registry, [], path=path, config_name=subset, train_split=s), "train")) for s in wanted]


def _missing(registry: Any, path: str, split: str | None, subset: str | None) -> list[tuple[str, Any]]:
    raise DataError(f"Input file not found: {path} (--input).")


# what an --input is, first match: (test, reader of its rows)
INPUTS: tuple[tuple[Callable[[Path], bool], Callable[[Any, str, str | None, str | None], list[tuple[str, Any]]]], ...] = (
    (Path.is_file, _file_rows),
    (lambda p: not p.exists() and not HUB_ID.fullmatch(str(p)), _missing),
    (lambda p: (p / "state.json").is_file(), _saved_rows),  # datasets' Dataset.save_to_disk
    (lambda p: True, _split_rows),
)


def prepare(name: str, inputs: list[str], out_dir: str | Path, registry: Any, split: str | None = None,
            subset: str | None = None) -> list[Path]:
    """Convert each input to ``<out_dir>/<split>.parquet``; return the files written.

    An input is a jsonl/parquet file (read by the ``files`` dataset), or, read by the ``hf`` dataset (Hugging Face
    ``datasets``), a folder saved by ``Dataset.save_to_disk`` (one split) or a dataset with splits: a folder saved by
    ``DatasetDict.save_to_disk``, a local dataset folder or a Hub id (its train and test splits, or ``split``;
    ``subset``: its configuration, by default the one verl's script reads). Errors name the file or split and row.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if name not in SOURCES:
        raise RLForgeError(f"Unknown dataset '{name}'. Available: {', '.join(SOURCES)}.")
    source = SOURCES[name]
    parts = [part for path in inputs
             for part in next(read for test, read in INPUTS if test(Path(path)))(
                 registry, path, split, subset or source.subset)]
    splits = [part for part, _ in parts]
    if len(set(splits)) < len(splits):
        raise RLForgeError(f"Two inputs map to the same split ({splits}): give one file per split.")
    converted = {}
    for part, raw_rows in parts:  # everything is checked before anything is written
        converted[part] = [convert_row(source, r, part, i, r["_origin"]) for i, r in enumerate(raw_rows)]
    out = Path(out_dir)
    for part in converted:  # an input file written over would lose the rows it holds
        diskio.output_file(out / f"{part}.parquet", inputs, "--out")
    for part, rows in converted.items():
        pq.write_table(pa.Table.from_pylist(rows), out / f"{part}.parquet")
    return [out / f"{part}.parquet" for part in converted]
