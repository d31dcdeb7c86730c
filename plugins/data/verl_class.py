"""``verl_class`` dataset: a verl dataset class by path (verl's ``data.custom_cls.path`` / ``.name``), unchanged.

verl 0.9.1 builds its training data as ``cls(data_files=..., tokenizer=..., processor=..., config=<verl's data
section>, max_samples=...)``, usually a subclass of its ``RLHFDataset`` that reads other file formats or maps rows
(``_read_files_and_tokenize``), and each item it returns carries the chat messages of its prompt (``raw_prompt``),
``data_source``, ``reward_model`` and ``extra_info``. This dataset loads the class with verl's own loader
(``verl.utils.import_utils.load_extern_object``), builds it the same way from ``data.train_files`` /
``data.val_files``, the model's tokenizer and ``data.verl_class.config`` (verl's data section: verl 0.9.1's defaults
for the keys it does not give), and hands its items to rlforge as verl-format rows. verl must be importable (the
class imports it). A vision-language model's processor is passed to the class as verl passes it, and an item's
image content parts become the row's images (``data.image_key``); video and audio are refused."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from rlforge.capabilities import DatasetCapabilities
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.verl_code import INSTALL, search_working_directory

log = logging.getLogger(__name__)
MAX_SAMPLES = {"train": "train_max_samples", "val": "val_max_samples"}  # verl's data keys of each split's limit


@dataclass
class VerlClassConfig:
    """``data.name=verl_class``: a verl dataset class (docs/data.md#a-verl-dataset-class)."""

    path: Optional[str] = None  # the Python file that defines the class (verl's data.custom_cls.path)
    name: Optional[str] = None  # the class's name in it (verl's data.custom_cls.name)
    config: dict[str, Any] = field(default_factory=dict)  # verl's data section the class reads; verl 0.9.1's defaults for the rest


def data_section(config: Any) -> Any:
    """verl's data section as the class sees it: verl 0.9.1's defaults, the rlforge run's files, lengths, filter and
    image column, then ``data.verl_class.config``."""
    from omegaconf import OmegaConf

    from rlforge.config.verl_hydra import load_default

    base = {k: v for k, v in load_default("ppo_trainer")["data"].items() if not (isinstance(v, str) and "${" in v)}
    run = {"train_files": list(config.data.train_files), "val_files": list(config.data.val_files),
           "max_prompt_length": int(config.data.max_prompt_length),
           "filter_overlong_prompts": bool(config.data.filter_overlong_prompts),
           "image_key": str(config.data.image_key)}
    own = config.data.verl_class.config
    own = dict(OmegaConf.to_container(own, resolve=True)) if own else {}  # type: ignore[arg-type]  # a mapping
    return OmegaConf.create({**base, **run, **own, "custom_cls": {"path": config.data.verl_class.path,
                                                                    "name": config.data.verl_class.name}})


def _load_class(v: Any) -> Any:
    where = f"data.verl_class.path={v.path} data.verl_class.name={v.name}"
    try:
        from verl.utils.import_utils import load_extern_object
    except ImportError as exc:
        raise RLForgeError(f"{where}: verl dataset classes are loaded with verl's own loader, and verl cannot be "
                           f"imported ({exc}). The class imports verl too: {INSTALL} (docs/data.md).") from None
    search_working_directory()
    try:
        cls = load_extern_object(v.path, v.name)
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        why = f" (caused by {type(cause).__name__}: {cause})" if cause is not None else ""
        raise RLForgeError(f"verl could not load the dataset class of {where}: {type(exc).__name__}: {exc}{why}"
                           ) from None
    from torch.utils.data import Dataset

    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise RLForgeError(f"{where}: {cls!r} is not a torch.utils.data.Dataset class (verl requires one too).")
    return cls


def _row(item: Any, i: int, label: str, image_key: str) -> dict[str, Any]:
    where = f"{label}, item {i}"
    if not isinstance(item, dict) or "raw_prompt" not in item or "data_source" not in item:
        keys = sorted(item) if isinstance(item, dict) else type(item).__name__
        raise DataError(f"{where}: an item must be a dict with 'raw_prompt' (the prompt's chat messages) and "
                        f"'data_source', as verl's RLHFDataset returns; got {keys}.")
    prompt = item["raw_prompt"]
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if not isinstance(prompt, (str, list)) or not all(isinstance(m, dict) for m in prompt):
        raise DataError(f"{where}: 'raw_prompt' must be chat messages (a list of dicts with 'role' and 'content'), as "
                        f"verl's RLHFDataset builds them; got {type(prompt).__name__}.")
    images: list[Any] = []
    prompt = prompt if isinstance(prompt, str) else [_text_message(m, where, images) for m in prompt]
    row = {"data_source": item["data_source"], "prompt": prompt, "reward_model": item.get("reward_model"),
           "extra_info": item.get("extra_info"), "_origin": where, **({image_key: images} if images else {})}
    if "agent_name" in item:  # verl's per-row agent loop: checked against the run's (rlforge.agent.config)
        row["agent_name"] = item["agent_name"]
    return row


def _text_message(message: dict[str, Any], where: str, images: list[Any]) -> dict[str, Any]:
    """A message as rlforge's rows hold it: content parts (what verl's ``_build_messages`` writes) joined into text,
    each image part as an ``<image>`` placeholder, its image (a PIL image, a path, or ``{"bytes"}``/``{"path"}``)
    appended to ``images``."""
    from rlforge.multimodal import IMAGE_PLACEHOLDER

    content = message.get("content")
    if isinstance(content, str):
        return message
    if not isinstance(content, list):
        raise DataError(f"{where}: a message's content is {type(content).__name__}; verl's messages hold text or a "
                        f"list of content parts.")
    text = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text.append(str(part.get("text", "")))
        elif kind == "image":
            image = part.get("image")
            image = image if image is not None else {k: part[k] for k in ("bytes", "path") if part.get(k) is not None}
            if not image:
                raise DataError(f"{where}: an image content part without its image ('image', 'bytes' or 'path'): "
                                f"{sorted(part)}.")
            images.append(image)
            text.append(IMAGE_PLACEHOLDER)
        else:
            raise DataError(f"{where}: a message's content has a {kind or type(part).__name__} part; rlforge reads "
                            f"text and images from data.name=verl_class (video and audio: not yet).")
    return {**message, "content": "".join(text)}


class VerlClassDataset:
    """A verl dataset class by path (verl's data.custom_cls), on data.train_files / val_files."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        v = config.data.verl_class
        for key in ("path", "name"):
            if not v[key]:
                raise ConfigError(f"data.name=verl_class needs 'data.verl_class.{key}' (verl's data.custom_cls.{key}).")

    def __call__(self, config: Any, split: str) -> list[dict[str, Any]]:
        return verl_class_rows(config, split)


def verl_class_rows(config: Any, split: str) -> list[dict[str, Any]]:
    """The items of the verl dataset class, built on ``split``'s files, as verl-format rows."""
    from rlforge.models import load_tokenizer_and_processor

    files = list(config.data.train_files if split == "train" else config.data.val_files)
    if not files:
        if split == "val":
            return []
        raise DataError("'data.train_files' is empty: give the files the verl dataset class reads (data.name="
                        "verl_class).")
    v = config.data.verl_class
    cls = _load_class(v)
    section = data_section(config)
    tokenizer, processor = load_tokenizer_and_processor(config)  # processor None: a text model
    label = f"{v.name} ({v.path}) on {', '.join(files)}"
    unmeasured = (processor is not None and section.get("filter_overlong_prompts")
                  and importlib.util.find_spec("qwen_vl_utils") is None)
    if unmeasured:
        log.warning("%s: verl's filter of overlong prompts measures prompts with images through qwen_vl_utils, which "
                    "is not installed: it drops every prompt with images (pip install qwen-vl-utils, which needs "
                    "torchvision, or data.filter_overlong_prompts=false).", label)
    step = "building it"
    try:
        dataset = cls(data_files=files, tokenizer=tokenizer, processor=processor, config=section,
                      max_samples=int(section.get(MAX_SAMPLES[split], -1) or -1))
        items = []
        for i in range(len(dataset)):
            step = f"reading item {i}"
            items.append(dataset[i])
    except (DataError, RLForgeError):
        raise
    except Exception as exc:
        raise DataError(f"The verl dataset class {label} failed {step}: {type(exc).__name__}: {exc}") from None
    if not items:
        hint = ""
        if unmeasured:
            hint = (" verl's filter of overlong prompts drops every prompt it cannot measure, and with a processor it "
                    "measures them with qwen_vl_utils, which is not installed (pip install qwen-vl-utils; it needs "
                    "torchvision), or set data.filter_overlong_prompts=false")
        raise DataError(f"The verl dataset class {label} has no items.{hint}")
    return [_row(item, i, label, str(config.data.image_key)) for i, item in enumerate(items)]


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.dataset.register("verl_class", VerlClassDataset(), config=VerlClassConfig,
                              description="a verl dataset class by path (verl's data.custom_cls), on data.train_files",
                              capabilities=DatasetCapabilities(reads_data_files=True, checks_own_files=True))
