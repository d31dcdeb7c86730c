"""``tensorboard`` logger: event files in ``<run_dir>/tensorboard`` (``tensorboard --logdir <run_dir>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlforge.capabilities import LoggerCapabilities
from rlforge.hookspecs import hookimpl


class TensorBoardLogger:
    """Scalars under the same names as every other logger; the config as text; PNG artifacts as images."""

    capabilities = LoggerCapabilities(shows_generations=True)  # log_generations

    def __init__(self, config: Any, run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log_params(self, params: dict[str, Any]) -> None:
        import yaml

        self.writer.add_text("config", "```\n" + yaml.safe_dump(params, sort_keys=False) + "```")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, float(value), global_step=step)

    def log_artifact(self, path: str) -> None:
        if path.endswith(".png"):
            from matplotlib.image import imread

            self.writer.add_image(f"plots/{Path(path).stem}", imread(path)[..., :3], dataformats="HWC")

    def log_generations(self, rows: list[dict[str, Any]], step: int) -> None:
        """``trainer.log_val_generations`` as verl's tensorboard logger shows them: markdown text ``val/generations``."""
        text = f"**Generation Results - Step {step}**\n\n" + "".join(
            f"### Sample {i + 1}\n**Input:** {r['input']}\n\n**Output:** {r['output']}\n\n**Score:** {r['score']}\n\n"
            "---\n\n" for i, r in enumerate(rows))
        self.writer.add_text("val/generations", text, step)

    def close(self) -> None:
        self.writer.close()


@hookimpl
def rlforge_register(registry):
    registry.logger.register("tensorboard", TensorBoardLogger, description="tensorboard event files in the run folder")
