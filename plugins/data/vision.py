"""Built-in vision task ``vision`` (``data.name=vision``): "How many squares?" over a picture drawn with Pillow.

Each row is a verl multimodal row: the prompt ``<image>How many squares?``, the picture as PNG bytes in the
``images`` column (``{"bytes": ...}``, as verl's parquet files hold images), the count as the ground truth and the
data source ``vision_count`` (scored like ``arith``: the whole response must be the number). The squares sit in
distinct cells of a 3 x 3 grid, one cell per 28 x 28 image token of the built-in ``tiny-vlm`` (84 x 84 pixels), in
random colours with a random offset inside the cell; the count cannot be read from the text (docs/multimodal.md).
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from typing import Any

from rlforge.config.schema import option
from rlforge.hookspecs import hookimpl
from rlforge.plugins.reward.functions import arith_score

VISION_SOURCE = "vision_count"
QUESTION = "<image>How many squares?"
CELL = 28  # pixels per grid cell: one image token of Qwen2-VL (patch 14, spatial merge 2)
GRID = 3
COLORS = [(220, 30, 30), (30, 160, 30), (30, 60, 220), (200, 120, 0), (150, 0, 170)]


@dataclass
class VisionConfig:
    """The built-in counting task (``data.name=vision``)."""

    train_size: int = option(4000, ge=1)  # training pictures
    val_size: int = option(100, ge=0)  # held-out pictures (another seed)
    max_count: int = option(4, ge=1, le=GRID * GRID)  # squares per picture: 1..max_count


def draw_squares(count: int, rng: random.Random) -> bytes:
    """PNG bytes of an 84 x 84 white picture with ``count`` filled squares in distinct cells of the 3 x 3 grid."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (CELL * GRID, CELL * GRID), "white")
    draw = ImageDraw.Draw(img)
    for cell in rng.sample(range(GRID * GRID), count):
        side = rng.randint(12, 20)
        x = cell % GRID * CELL + rng.randint(0, CELL - side)
        y = cell // GRID * CELL + rng.randint(0, CELL - side)
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=rng.choice(COLORS))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def vision_rows(size: int, max_count: int, seed: int) -> list[dict[str, Any]]:
    """``size`` counting rows in verl's multimodal format, drawn with a generator seeded by ``seed``."""
    rng = random.Random(seed)
    rows = []
    for i in range(size):
        count = rng.randint(1, max_count)
        rows.append({
            "data_source": VISION_SOURCE,
            "prompt": [{"role": "user", "content": QUESTION}],
            "images": [{"bytes": draw_squares(count, rng)}],
            "reward_model": {"style": "rule", "ground_truth": str(count)},
            "extra_info": {"index": i, "count": count},
        })
    return rows


def vision_dataset(config: Any, split: str) -> list[dict[str, Any]]:
    """Train/val splits of the counting task (validation pictures from another seed)."""
    d = config.data.vision
    if split == "val":
        return vision_rows(d.val_size, d.max_count, seed=54321)
    return vision_rows(d.train_size, d.max_count, seed=config.trainer.seed)


@hookimpl
def rlforge_register(registry):
    registry.dataset.register("vision", vision_dataset, config=VisionConfig,
                              description="built-in 'How many squares?' over a drawn picture (a vision-language model)")
    registry.reward_fn.register(VISION_SOURCE, arith_score,
                                description="the vision task: the whole response is the count of squares")
