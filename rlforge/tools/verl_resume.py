"""verl's own checkpoints met by a verl launch: rlforge cannot read their format, so a launch that would resume from
them stops, saying what to do instead (``rlforge verl`` and ``rlforge verl --print`` call :func:`check_verl_checkpoints`)."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig

from rlforge.checkpoint import holds_run
from rlforge.errors import ConfigError
from rlforge.resume import resume_target

VERL_STEP = re.compile(r"global_step_\d+")  # a checkpoint folder of verl's trainers, in trainer.default_local_dir


def check_verl_checkpoints(cfg: DictConfig, sft: bool) -> None:
    """A launch that resumes from verl's own checkpoints stops: rlforge cannot read their format. With
    resume_mode=auto, a folder holding none of rlforge's where verl would continue from one of its own
    (:func:`verl_latest`) and rlforge would start over; with resume_mode=resume_path, a ``global_step_N`` path."""
    resume, folder = (cfg.sft.resume, cfg.sft.output_dir) if sft else (cfg.trainer.resume, cfg.trainer.run_dir)
    merge = ("to start from their weights, merge the actor into a Hugging Face folder (verl's `python -m "
             "verl.model_merger merge`) and set actor_rollout_ref.model.path (SFT: model.path) to it")
    if resume not in ("auto", "never") and any(VERL_STEP.fullmatch(part) for part in Path(resume).parts):
        raise ConfigError(f"trainer.resume_from_path={resume} is a checkpoint of verl's, whose format rlforge cannot "
                          f"read; {merge}.")
    if resume not in ("auto", "never"):  # a path: a checkpoint or run folder of rlforge's, checked as the run checks it
        if sft:
            from rlforge.sft.run import resume_from  # Lightning: imported for SFT launches only

            resume_from(cfg.sft)
        else:
            resume_target(Path(resume).expanduser())
    if resume != "auto" or not folder or _holds_own(cfg, sft):
        return
    newest = verl_latest(Path(folder))
    if newest is not None:
        raise ConfigError(
            f"{folder} (verl: trainer.default_local_dir) holds verl's own checkpoints, and resume_mode=auto would "
            f"continue from {newest.name} in verl (its latest_checkpointed_iteration.txt names it); rlforge cannot read "
            f"verl's checkpoint format and would start over there. Point trainer.default_local_dir at a new folder, or "
            f"set trainer.resume_mode=disable to start over beside them; {merge}.")


def verl_latest(folder: Path) -> Path | None:
    """The checkpoint verl's resume_mode=auto continues from in ``folder``, as verl 0.9.1 finds it
    (find_latest_ckpt_path): the ``global_step_N`` its tracker file names, where both exist (None: verl starts anew)."""
    tracker = folder / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        return None
    try:  # as verl reads it: int() of the decoded bytes ('+5', ' 5\n' and '0_5' are 5)
        number = int(tracker.read_bytes().decode())
    except (ValueError, UnicodeDecodeError):
        text = tracker.read_bytes()[:40]
        raise ConfigError(f"{tracker} holds {text!r}, not a step: verl 0.9.1 stops reading it with resume_mode=auto "
                          f"(set trainer.resume_mode=disable, or remove the file)") from None
    step = folder / f"global_step_{number}"
    return step if step.exists() else None

def _holds_own(cfg: DictConfig, sft: bool) -> bool:
    """Whether the run folder holds rlforge's own run to continue (SFT: a Lightning checkpoint to resume)."""
    if not sft:
        return holds_run(Path(cfg.trainer.run_dir))
    from rlforge.sft.run import resume_from  # Lightning: imported for SFT launches only

    return resume_from(cfg.sft) is not None
