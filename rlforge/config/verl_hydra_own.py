"""Hydra's own settings in a verl launch (``hydra.run.dir=...``, ``hydra/job_logging=disabled``): composed by Hydra
itself, so that a launch verl's Hydra refuses is refused with Hydra's reason; ``verl_hydra`` composes the rest."""

from __future__ import annotations

from typing import Any

from rlforge.config.verl_rules import merge_into, nest


def is_hydra_own(o: Any) -> bool:
    """An override of Hydra's own settings (``hydra.run.dir=...``, ``hydra/job_logging=disabled``): they configure
    Hydra (its output folder, its logging), not the job's config."""
    return o.key_or_group == "hydra" or o.key_or_group.startswith(("hydra.", "hydra/"))


def hydra_settings(overrides: list[Any]) -> tuple[dict[str, Any], list[str]]:
    """Hydra's own overrides as Hydra composes them (its ``HydraConf`` and its ``hydra/`` config groups, on an empty
    job config), so that what verl's Hydra refuses (``+hydra.run.dir``, ``~hydra.run.dir``, an unknown
    ``hydra/job_logging`` option, a mistyped value) is refused with Hydra's reason. Returns the keys they set, for
    the report (a group choice ``hydra/GROUP=OPTION`` as ``GROUP: OPTION``), and Hydra's refusals: of each override
    alone, then of all together."""
    if not overrides:
        return {}, []
    import tempfile

    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    def refusal(lines: list[str]) -> str:
        try:
            with initialize_config_dir(config_dir=empty, version_base=None):
                compose(overrides=lines, return_hydra_config=True)
        except HydraException as exc:  # its reason: the first lines, and the first line of what caused it
            text = [line.strip() for line in str(exc).split("Config search path:")[0].splitlines() if line.strip()]
            cause = str(exc.__cause__).splitlines()[0] if exc.__cause__ is not None else ""
            why = " ".join(text) + (f": {cause}" if cause else "")
            return f"{why} (Hydra's own settings: verl 0.9.1's Hydra refuses it too)"
        return ""

    with tempfile.TemporaryDirectory() as empty:  # each alone (all of them listed), then together
        errors = [e for o in overrides if (e := refusal([o.input_line]))] or [
            e for e in [refusal([o.input_line for o in overrides])] if e]
    given: dict[str, Any] = {}
    for o in overrides:
        key = o.key_or_group.removeprefix("hydra").lstrip("./").replace("/", ".")
        if not o.is_delete() and key:
            merge_into(given, nest({key: o.value()}))
    return given, errors
