"""verl's own checkpoints met by a verl launch: rlforge cannot read their format, so a launch that would resume from
them stops, saying what to do instead (``rlforge verl`` and ``rlforge verl --print`` call :func:`check_verl_checkpoints`)."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig

from rlforge.checkpoint import holds_run
from rlforge.errors import ConfigError

VERL_STEP = re.compile(r"global_step_\d+")  # a checkpoint folder of verl's trainers, in trainer.default_local_dir


def check_verl_checkpoints(cfg: DictConfig, sft: bool) -> None:
    """A launch that resumes from verl's own checkpoints stops: rlforge cannot read their format. With
    resume_mode=auto, a folder holding verl's (``global_step_N``, ``latest_checkpointed_iteration.txt``) and none of
    rlforge's, where verl would continue from the newest and rlforge would start over; with resume_mode=resume_path,
    a ``global_step_N`` folder."""
    resume, folder = (cfg.sft.resume, cfg.sft.output_dir) if sft else (cfg.trainer.resume, cfg.trainer.run_dir)
    merge = ("to start from their weights, merge the actor into a Hugging Face folder (verl's `python -m "
             "verl.model_merger merge`) and set actor_rollout_ref.model.path (SFT: model.path) to it")
    if resume not in ("auto", "never") and VERL_STEP.fullmatch(Path(resume).name):
        raise ConfigError(f"trainer.resume_from_path={resume} is a checkpoint of verl's, whose format rlforge cannot "
                          f"read; {merge}.")
    if resume != "auto" or not folder or _holds_own(cfg, sft):
        return
    steps = sorted((p for p in Path(folder).glob("global_step_*") if VERL_STEP.fullmatch(p.name) and p.is_dir()),
                   key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if steps or (Path(folder) / "latest_checkpointed_iteration.txt").is_file():
        newest = f" (the newest: {steps[-1].name})" if steps else ""
        raise ConfigError(
            f"{folder} (verl: trainer.default_local_dir) holds verl's own checkpoints{newest}, which resume_mode=auto "
            f"would continue from in verl; rlforge cannot read verl's checkpoint format and would start over there. "
            f"Point trainer.default_local_dir at a new folder, or set trainer.resume_mode=disable to start over "
            f"beside them; {merge}.")


def _holds_own(cfg: DictConfig, sft: bool) -> bool:
    """Whether the run folder holds rlforge's own run to continue (SFT: a Lightning checkpoint to resume)."""
    if not sft:
        return holds_run(Path(cfg.trainer.run_dir))
    from rlforge.sft.run import resume_from  # Lightning: imported for SFT launches only

    return resume_from(cfg.sft) is not None
