"""Vision-language models on verl's data format: images from the rows, prompts through the model's processor, and
the per-sample vision inputs of the forward passes (docs/multimodal.md).

A multimodal row is a verl row whose ``prompt`` messages carry ``<image>`` placeholders and whose image column
(``data.image_key``, ``images`` by default) holds as many images: each a ``{"bytes": ...}`` dict (PNG/JPEG bytes, as
verl's parquet files store them), ``{"path": ...}``, a path string or a PIL image; one image or a list. Each message's
content is split on the placeholders into typed parts (``{"type": "text"}`` / ``{"type": "image"}``) for the
processor's chat template; the processor expands each image into its image-pad tokens and resizes it within its
``min_pixels``/``max_pixels``.

A sample's vision inputs ride in the batch as one dict per row (``B.MULTI_MODAL_INPUTS``: ``pixel_values`` [patches,
D] and ``image_grid_thw`` [images, 3]; None for a row without images), so selecting, repeating, splitting and joining
rows keeps them with their tokens. A forward pass joins the rows' dicts in row order and computes the M-RoPE position
ids with the model's own ``get_rope_index`` on the token layout it runs (padded and trimmed), so they always match
the ids they index.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.errors import DataError, RLForgeError, first_line
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
PIXEL_VALUES = "pixel_values"
IMAGE_GRID_THW = "image_grid_thw"
IMAGES = "images"  # the row's images as RGB PIL images, for engines that run their own processor (vLLM)


# --- rows ---------------------------------------------------------------------------------------------------------
def _open_image(value: Any, where: str, key: str, n: int) -> Any:
    """One image of a row as an RGB PIL image: a PIL image, ``{"bytes": ...}``, ``{"path": ...}`` or a path."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value if value.mode == "RGB" else value.convert("RGB")  # opened once: a tool's images are passed on
    source: Any = value
    if isinstance(value, dict):
        source = value.get("bytes") or value.get("path")
        if not source:
            held = ", ".join(f"{k}={value[k]!r:.40}" for k in ("bytes", "path") if k in value)
            raise DataError(f"{where}: {key}[{n}] holds no image: " + (f"{held} (empty or null)" if held else
                                                                        f"a dict without 'bytes' or 'path' (keys: "
                                                                        f"{sorted(value)})") + ".")
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(source)
    elif isinstance(source, str):
        if not Path(source).is_file():
            raise DataError(f"{where}: {key}[{n}] names the image file {source}, which does not exist.")
    else:
        raise DataError(f"{where}: {key}[{n}] is a {type(value).__name__}; an image is {{'bytes': ...}}, "
                        f"{{'path': ...}}, a path or a PIL image.")
    try:
        with Image.open(source) as img:
            return img.convert("RGB")
    except (OSError, ValueError) as exc:
        raise DataError(f"{where}: {key}[{n}] is not a readable image ({type(exc).__name__}: {exc}).") from None


def row_images(row: dict[str, Any], image_key: str, where: str) -> list[Any]:
    """The images of a row's ``image_key`` column (none when it is missing or empty), as RGB PIL images."""
    return open_images(row.get(image_key), where, image_key)


def open_images(value: Any, where: str, key: str) -> list[Any]:
    """One image or a list of them (PIL images, ``{"bytes": ...}``, ``{"path": ...}``, paths) as RGB PIL images;
    ``where`` and ``key`` name them in errors."""
    if value is None:
        return []
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return [_open_image(v, where, key, n) for n, v in enumerate(values)]


def split_placeholders(text: str) -> list[dict[str, Any]]:
    """``text`` as typed parts: text parts, and an image part where each ``<image>`` placeholder is."""
    parts: list[dict[str, Any]] = []
    for n, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if n:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def flatten_parts(content: Any, where: str) -> Any:
    """A message content given as typed parts (TRL's and the OpenAI format: ``[{"type": "image"}, {"type": "text",
    "text": ...}]``) as the string verl's rows hold, with ``<image>`` where each image part is; any other content as
    it is."""
    if not isinstance(content, list):
        return content
    text = []
    for n, part in enumerate(content, 1):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "image":
            text.append(IMAGE_PLACEHOLDER)
        else:
            raise DataError(f"{where}: content part {n} is {part!r}; typed parts are "
                            f"{{\"type\": \"text\", \"text\": str}} or {{\"type\": \"image\"}} (the images "
                            f"themselves in data.image_key).")
    return "".join(text)


def placeholder_count(messages: list[dict[str, Any]]) -> int:
    return sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))


def refuse_video(messages: list[dict[str, Any]], where: str) -> None:
    """A ``<video>`` placeholder is an error for a vision-language model: rlforge trains on images only."""
    if any(VIDEO_PLACEHOLDER in m["content"] for m in messages if isinstance(m.get("content"), str)):
        raise DataError(f"{where}: the prompt has a {VIDEO_PLACEHOLDER} placeholder; rlforge trains on images only "
                        f"(docs/multimodal.md).")


def typed_messages(messages: list[dict[str, Any]], images: int, where: str, image_key: str) -> list[dict[str, Any]]:
    """``messages`` whose string contents are split on ``<image>`` into typed parts, in order; the count of
    placeholders must be ``images`` (a DataError naming the row otherwise). ``<video>`` is refused."""
    refuse_video(messages, where)
    found = placeholder_count(messages)
    if found != images:
        raise DataError(f"{where}: the prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) but column "
                        f"'{image_key}' (data.image_key) holds {images} image(s): they must be equal, one placeholder "
                        f"where each image goes.")
    return [{**m, "content": split_placeholders(m["content"])} if isinstance(m.get("content"), str) else m
            for m in messages]


def encode_prompt(processor: Any, messages: list[dict[str, Any]], images: list[Any], where: str, **template: Any
                  ) -> tuple[list[int], dict[str, Any]]:
    """(prompt ids with each image expanded into its image-pad tokens, the row's vision inputs) of typed
    ``messages`` through the processor's chat template (``template``: its keyword arguments,
    ``data.apply_chat_template_kwargs``, and how the render ends, ``rlforge.data.render_ending``: the generation
    prompt added unless given) and the processor itself."""
    try:
        text = processor.apply_chat_template(messages, tokenize=False, **{"add_generation_prompt": True, **template})
    except Exception as exc:  # a template that refuses the row
        raise DataError(f"{where}: the processor cannot encode this row ({type(exc).__name__}: {first_line(exc)}).") \
            from None
    return encode_text(processor, text, images, where)



def encode_text(processor: Any, text: str, images: list[Any], where: str, what: str = "this row"
                ) -> tuple[list[int], dict[str, Any]]:
    """(ids of rendered ``text`` with each image's pad expanded into its image-pad tokens, the vision inputs of
    ``images``) from the processor; no special tokens added. ``what`` names the input in an error."""
    try:
        encoded = processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
    except Exception as exc:  # a processor that refuses the images or the text
        refused = _refused_image(processor, images, where)
        raise DataError(refused or f"{where}: the processor cannot encode {what} ({type(exc).__name__}: "
                                   f"{first_line(exc)}).") from None
    return encoded["input_ids"][0].tolist(), {PIXEL_VALUES: encoded[PIXEL_VALUES],
                                               IMAGE_GRID_THW: encoded[IMAGE_GRID_THW], IMAGES: list(images)}


def _refused_image(processor: Any, images: list[Any], where: str) -> str:
    """What is wrong with the first of ``images`` that the processor's image processor refuses on its own (e.g.
    Qwen2-VL's ``smart_resize``: an aspect ratio of 200 or more): its number, its size and what to do; ``""`` when
    each image passes alone (the processor refused something else)."""
    image_processor = getattr(processor, "image_processor", None)
    for n, image in enumerate(images if image_processor is not None else [], 1):
        try:
            image_processor(images=[image], return_tensors="pt")
        except Exception as exc:
            width, height = image.size
            return (f"{where}: image {n} of {len(images)} is {width} x {height} pixels (aspect ratio "
                    f"{max(width, height) / max(min(width, height), 1):.0f}:1), which the model's image processor "
                    f"refuses ({type(exc).__name__}: {first_line(exc)}). Resize or pad the image in the data (or "
                    f"in the tool that returns it; Qwen2-VL-style processors refuse an aspect ratio of 200:1 or "
                    f"more); the processor then scales it to between its min_pixels and max_pixels (the model "
                    f"folder's preprocessor_config.json; rlforge has no key for them).")
    return ""


def append_inputs(first: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    """The vision inputs of ``first``'s images followed by ``more``'s (a sequence whose later turns add images)."""
    if first is None:
        return dict(more)
    return {PIXEL_VALUES: torch.cat([first[PIXEL_VALUES], more[PIXEL_VALUES]]),
            IMAGE_GRID_THW: torch.cat([first[IMAGE_GRID_THW], more[IMAGE_GRID_THW]]),
            IMAGES: [*first.get(IMAGES, []), *more.get(IMAGES, [])]}


def engine_prompt(ids: list[int], inputs: dict[str, Any] | None, image_token: int | None) -> dict[str, Any]:
    """A prompt for an engine that runs the model's own processor (vLLM's ``TokensPrompt`` fields): the token ids
    with each run of image-pad tokens collapsed back to the one pad the chat template wrote (the engine expands it
    again from the image), and the row's images as ``multi_modal_data``; a text row's ids as they are."""
    if inputs is None:
        return {"prompt_token_ids": ids}
    collapsed = [t for i, t in enumerate(ids) if t != image_token or i == 0 or ids[i - 1] != image_token]
    return {"prompt_token_ids": collapsed, "multi_modal_data": {"image": inputs[IMAGES]}}


def check_engine(prompts: list[Any], capabilities: Any, name: str) -> None:
    """Rows with images need a rollout engine that declares ``supports_images`` (``hf``, ``vllm``; ``capabilities``:
    the engine's ``RolloutCapabilities``): another would generate from the image tokens without the pixels."""
    if not capabilities.supports_images and any(p.multi_modal is not None for p in prompts):
        raise RLForgeError(f"The data has images, but the rollout engine '{name}' (rollout.name) does not take them: "
                           f"use rollout.name=hf or vllm (docs/multimodal.md).")


# --- processor ------------------------------------------------------------------------------------------------------
def _expose_video_mixin() -> None:
    """transformers exports ``VideoProcessorMixin`` only with torchvision installed, and its processor check looks it up
    there even for a processor without a video processor: give the check the mixin (or None) so an image-only processor
    builds without torchvision."""
    import transformers.processing_utils as pu
    from transformers.video_processing_utils import VideoProcessorMixin

    if not hasattr(pu.transformers_module, "VideoProcessorMixin"):
        pu.transformers_module.VideoProcessorMixin = (VideoProcessorMixin, type(None))


def build_processor(processor_class: type, image_processor: Any, tokenizer: Any, chat_template: str | None) -> Any:
    """An image-only processor of ``processor_class`` (no video processor), without torchvision."""
    _expose_video_mixin()
    return processor_class(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                           chat_template=chat_template)


def load_processor(folder: Path, tokenizer: Any, trust_remote_code: bool = False) -> Any:
    """The processor of a model folder that has an image processor (``preprocessor_config.json``), else None.
    ``AutoProcessor``; without torchvision (which transformers needs for the video processor of Qwen2-VL-style
    processors) the same processor class is built from ``AutoImageProcessor`` and ``tokenizer``, images only."""
    from transformers import AutoImageProcessor, AutoProcessor

    if not (Path(folder) / "preprocessor_config.json").is_file():
        return None
    try:
        return AutoProcessor.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    processor_class = PROCESSOR_MAPPING.get(type(config), None)
    if processor_class is None:
        raise RLForgeError(f"No processor class for the model type '{config.model_type}' in {folder} (model.path).")
    image_processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=trust_remote_code)
    return build_processor(processor_class, image_processor, tokenizer, tokenizer.chat_template)


# --- models ---------------------------------------------------------------------------------------------------------
def _base(model: torch.nn.Module) -> Any:
    """The module that has ``get_rope_index`` (``model.model`` of a ``...ForConditionalGeneration``, also inside a
    PEFT wrapper), or None."""
    return next((m for m in model.modules() if callable(getattr(m, "get_rope_index", None))), None)


def is_multimodal(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a vision-language model with M-RoPE positions (Qwen2-VL, Qwen2.5-VL, ...)."""
    return _base(model) is not None


def placeholder_token_ids(model: torch.nn.Module) -> list[int]:
    """The tokens a vision-language model's forward replaces by image or video features (none for a text model):
    generation must not sample them."""
    base = _base(model)
    if base is None:
        return []
    return [i for i in (getattr(base.config, "image_token_id", None), getattr(base.config, "video_token_id", None))
            if i is not None]


def _tower(model: torch.nn.Module) -> torch.nn.Module | None:
    base = _base(model)
    return getattr(base, "visual", None) if base is not None else None


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    tower = _tower(model)
    if tower is None:
        raise RLForgeError(f"model.freeze_vision_tower=true, but {type(model).__name__} has no vision tower "
                           f"(a text-only model: set it to false).")
    return tower


def lora_excluded(model: torch.nn.Module) -> str | None:
    """A regular expression of the vision tower's module names (PEFT's ``exclude_modules``), so that LoRA on
    ``all-linear`` adapts the language model only; None for a text model."""
    tower = _tower(model)
    if tower is None:
        return None
    prefix = next(name for name, module in model.named_modules() if module is tower)
    return rf"{re.escape(prefix)}(\..*)?"


def freeze_vision_tower(model: torch.nn.Module) -> None:
    """No gradients (and no optimizer state) for the vision encoder and its merger: only the language model trains."""
    vision_tower(model).requires_grad_(False)


def join(rows: list[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor] | None:
    """The vision inputs of rows in row order (``pixel_values`` and ``image_grid_thw`` concatenated), or None when
    no row has images."""
    present = [r for r in rows if r is not None]
    if not present:
        return None
    return {key: torch.cat([r[key] for r in present]) for key in (PIXEL_VALUES, IMAGE_GRID_THW)}


def rope_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   image_grid_thw: torch.Tensor | None) -> torch.Tensor:
    """M-RoPE position ids (3, B, L) of (padded) rows from the model's own ``get_rope_index``; 0 at padding."""
    base = _base(model)
    image_token = base.config.image_token_id
    types = (input_ids == image_token).int()
    positions, _ = base.get_rope_index(input_ids, mm_token_type_ids=types, image_grid_thw=image_grid_thw,
                                       attention_mask=attention_mask)
    return positions


def forward_inputs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   rows: list[dict[str, torch.Tensor] | None] | None) -> dict[str, Any] | None:
    """The keyword arguments a padded forward of a vision-language model needs beside the ids and mask: its M-RoPE
    ``position_ids`` and the rows' joined ``pixel_values``/``image_grid_thw``; None for a text-only model or batch."""
    joined = join(rows) if rows else None
    if joined is None or not is_multimodal(model):
        if joined is not None:
            raise RLForgeError(f"The batch has images but {type(model).__name__} is not a vision-language model "
                               f"(model.path).")
        return None
    device = input_ids.device
    grid = joined[IMAGE_GRID_THW].to(device)
    return {"position_ids": rope_positions(model, input_ids, attention_mask, grid),
            PIXEL_VALUES: joined[PIXEL_VALUES].to(device), IMAGE_GRID_THW: grid}


# --- the project's tiny vision-language model ---------------------------------------------------------------------
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
# the char-level chat format of rlforge.models.CHAT_TEMPLATE, with typed content parts: an image part renders as
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad), a text part as its text
VLM_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PATCH, MERGE = 14, 2  # Qwen2-VL's patch size and spatial merge: one image token per 28 x 28 pixels


def _vision_config(family: str, hidden: int, vision_dim: int) -> dict[str, Any]:
    """The vision tower of a tiny model: Qwen2-VL's one block, Qwen2.5-VL's two (a windowed one, a full one), or
    Qwen3-VL's two (learned positions, a deepstack layer)."""
    shared = {"patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": 2, "num_heads": 2}
    if family == "qwen2_vl":
        return {**shared, "depth": 1, "embed_dim": vision_dim, "hidden_size": hidden, "mlp_ratio": 2}
    if family == "qwen3_vl":  # learned position embeddings on an 8 x 8 grid, one deepstack layer
        return {**shared, "depth": 2, "hidden_size": vision_dim, "out_hidden_size": hidden,
                "intermediate_size": 2 * vision_dim, "num_position_embeddings": 64, "deepstack_visual_indexes": [0]}
    return {**shared, "depth": 2, "hidden_size": vision_dim, "out_hidden_size": hidden,
            "intermediate_size": 2 * vision_dim, "window_size": 2 * PATCH * MERGE, "fullatt_block_indexes": [1]}


TINY_FAMILIES = {  # family -> (config, model, processor) class names in transformers
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor"),
}


def build_tiny_vlm(hidden: int = 128, layers: int = 2, vision_dim: int = 64, min_side: int = 56, max_side: int = 112,
                   family: str = "qwen2_vl") -> tuple[Any, Any]:
    """(a random Qwen2-VL-, Qwen2.5-VL- or Qwen3-VL-shaped model (``family``, see :data:`TINY_FAMILIES`), its
    processor): rlforge's char-level tokenizer with the vision tokens added, a Qwen2-VL image processor bounded to
    ``min_side**2 .. max_side**2`` pixels, a vision tower of one or two blocks."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlforge.models import build_char_tokenizer

    config_class, model_class, processor_class = (getattr(transformers, n) for n in TINY_FAMILIES[family])
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tok.chat_template = VLM_CHAT_TEMPLATE
    ids = dict(zip(VISION_TOKENS, tok.convert_tokens_to_ids(VISION_TOKENS)))
    head_dim = 64
    config = config_class(
        text_config=dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // head_dim, num_key_value_heads=hidden // head_dim,
                         max_position_embeddings=512, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                         "mrope_section": [8, 12, 12]}),
        vision_config=_vision_config(family, hidden, vision_dim),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
    )
    model = model_class(config)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_side**2, max_pixels=max_side**2, patch_size=PATCH,
                                               merge_size=MERGE, temporal_patch_size=2)
    return model, build_processor(processor_class, image_processor, tok, VLM_CHAT_TEMPLATE)


def save_vlm(model: Any, processor: Any, folder: Path) -> None:
    """Save a vision-language model with its tokenizer, image processor and chat template (``from_pretrained``
    folders; ``save_pretrained`` of a processor without a video processor fails, so its parts are saved)."""
    model.save_pretrained(folder)
    processor.tokenizer.save_pretrained(folder)
    processor.image_processor.save_pretrained(folder)
