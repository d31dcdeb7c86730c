"""Compose the config: built-in defaults < algorithm preset < ``--config FILE`` < CLI ``key=value``.

Everything here runs before any model is loaded: unknown keys, wrong types, unknown component names and
inconsistent batch sizes fail with a message that names the key, the value and the choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from rlforge import lora, precision
from rlforge.config import schema
from rlforge.config.checks import check_model_folder, check_no_duplicates, check_resume_value, check_values
from rlforge.errors import ConfigError, did_you_mean
from rlforge.models import BUILTIN_PREFIX, resolve_model_path
from rlforge.pipeline import PIPELINES


def parse_overrides(overrides: list[str]) -> DictConfig:
    """Turn ``["actor.lr=1e-5", "logger.backends=[console]"]`` into a config (values parsed as YAML)."""
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"Override '{bad[0]}' is not of the form key=value (e.g. actor.lr=1e-5).")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Cannot parse overrides {overrides}: {exc}") from None


PRESETS = Path(__file__).parent / "presets"  # --config builtin:NAME reads NAME.yaml here (package data)


def config_file_path(path: str) -> Path:
    """The file ``--config`` names: a path, or ``builtin:NAME`` for a config shipped with rlforge."""
    if not path.startswith(BUILTIN_PREFIX):
        return Path(path)
    known = sorted(p.stem for p in PRESETS.glob("*.yaml"))
    name = path[len(BUILTIN_PREFIX):]
    if name not in known:  # a name, never a path: builtin:../x cannot leave the presets folder
        raise ConfigError(f"Unknown built-in config '{path}' (--config). Built-in configs: "
                          f"{', '.join(BUILTIN_PREFIX + k for k in known)}.")
    return PRESETS / f"{name}.yaml"


def load_file(path: str) -> DictConfig:
    p = config_file_path(path)
    if not p.is_file():
        raise ConfigError(f"Config file not found: {path} (--config).")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {path} must hold a mapping of sections, got {type(data).__name__}.")
    return OmegaConf.create(data)


def _one_item_lists(base: DictConfig, layer: DictConfig) -> DictConfig:
    """verl's habit: one value for a list key (``data.train_files=train.parquet``) is a list of that one value."""
    from rlforge.config import verl

    for key, value in verl.flatten(OmegaConf.to_container(layer)):
        if isinstance(value, (str, int, float)) and OmegaConf.is_list(OmegaConf.select(base, key, default=None)):
            OmegaConf.update(layer, key, [value], merge=False)
    return layer


def _check_bools(base: DictConfig, layer: DictConfig, source: str) -> None:
    """A number other than 0 or 1 for a true/false key is a mistake, not ``true`` (OmegaConf would take ``2``)."""
    from rlforge.config import verl

    for key, value in verl.flatten(OmegaConf.to_container(layer)):
        if (isinstance(value, (int, float)) and not isinstance(value, bool) and value not in (0, 1)
                and isinstance(OmegaConf.select(base, key, default=None), bool)):
            raise ConfigError(f"Invalid value for '{key}' (in {source}): {value!r}; it is true or false.")


def _merge(base: DictConfig, layer: Any, source: str) -> DictConfig:
    layer = OmegaConf.create(layer)
    try:
        _check_bools(base, layer, source)
        return OmegaConf.merge(base, _one_item_lists(base, layer))  # type: ignore[return-value]
    except ConfigKeyError as exc:
        key = exc.full_key or "?"
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
        from rlforge.config import verl

        leaves = [k for k, _ in verl.flatten(OmegaConf.to_container(layer))]
        full = next((k for k in leaves if k.startswith(key + ".")), key)  # the whole key, not its first unknown part
        hint = verl.hint(full) or did_you_mean(leaf, known, prefix=f"{parent}." if parent else "")
        raise ConfigError(
            f"Unknown config key '{full}' (in {source}).{hint} Run 'rlforge config show' to list every key."
        ) from None
    except OmegaConfBaseException as exc:
        section = _section_given_a_value(base, layer)
        if section:
            keys = ", ".join(f"{section}.{k}" for k in list(OmegaConf.select(base, section).keys())[:3])
            raise ConfigError(f"'{section}' (in {source}) is a section of the config, not a value: set its keys "
                              f"({keys}, ...). Run 'rlforge config show' to list every key.") from None
        key = getattr(exc, "full_key", "") or "?"
        reason = str(getattr(exc, "msg", exc)).splitlines()[0]
        raise ConfigError(f"Invalid value for '{key}' (in {source}): {reason}.") from None


def _section_given_a_value(base: DictConfig, layer: DictConfig) -> str | None:
    """The first key of ``layer`` that gives a plain value where ``base`` has a section (``trainer=5``)."""
    from rlforge.config import verl

    for key, value in verl.flatten(OmegaConf.to_container(layer)):
        if not isinstance(value, dict) and isinstance(OmegaConf.select(base, key, default=None), DictConfig):
            return key
    return None


def compose(
    registry: Any,
    algo: str | None = None,
    config_file: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> DictConfig:
    """Return the validated, read-only config. ``registry`` is the plugin manager's Registries."""
    file_cfg = load_file(config_file) if config_file else OmegaConf.create({})
    return _compose(registry, algo, [(file_cfg, config_file or ""), (parse_overrides(list(overrides)), OVERRIDES)])


OVERRIDES = "command-line overrides"


def _compose(registry: Any, algo: str | None, layers: list[tuple[DictConfig, str]]) -> DictConfig:
    """Defaults < the algorithm's preset < each of ``layers`` (config, where it comes from), in order."""
    name = algo or next((n for layer, _ in reversed(layers) if (n := OmegaConf.select(layer, "algorithm.name"))), None)
    name = name or "grpo"
    algo_cls = registry.algorithm.get(name)
    cfg = OmegaConf.structured(schema.build(registry, algo_cls.config_class))
    cfg = _merge(cfg, OmegaConf.create(algo_cls.preset), f"the '{name}' preset")
    for layer, source in layers:
        cfg = _merge(cfg, layer, source)
    cfg.algorithm.name = name
    validate(cfg, registry)
    algo_cls.validate_config(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def compose_with_plugins(
    algo: str | None = None, config_file: str | None = None, overrides: list[str] | tuple[str, ...] = (),
    loaded: Callable[[Any], Any] | None = None, base: tuple[DictConfig, str] | None = None,
) -> tuple[Any, DictConfig]:
    """Load the plugins minus ``plugins.disable`` (read from the overrides, the file or ``base`` first), then
    compose: returns (plugin manager, config). ``loaded(plugin_manager)`` runs in between (the CLI prints
    warnings). ``base``: (config, its origin) merged under the file, e.g. the config of the run being evaluated."""
    from rlforge.plugin_manager import PluginManager

    over = parse_overrides(list(overrides))
    file_cfg = load_file(config_file) if config_file else OmegaConf.create({})
    layers = [*([base] if base else []), (file_cfg, config_file or ""), (over, OVERRIDES)]
    disable = next((d for layer, _ in reversed(layers)
                    if (d := OmegaConf.select(layer, "plugins.disable", default=None)) is not None), None)
    if disable is not None and not OmegaConf.is_list(disable):
        raise ConfigError(f"'plugins.disable' must be a list of plugin names, got {disable!r}.")
    pm = PluginManager(disable=list(disable or []))
    if loaded is not None:
        loaded(pm)
    return pm, _compose(pm.registry, algo, layers)


def selected(cfg: DictConfig, registry: Any) -> Iterator[tuple[str, Any]]:
    """``(config key, registry entry)`` of every component the config selects (a list key selects several)."""
    for kind, spec in registry.SPECS.items():
        if not spec.key or kind == "algorithm":
            continue
        value = OmegaConf.select(cfg, spec.key)
        for name in (value if OmegaConf.is_list(value) else [value]):
            if name is not None:
                yield spec.key, getattr(registry, kind).entry(name)


def validate(cfg: DictConfig, registry: Any) -> None:
    """Every value against its field's rule (``schema.Valid``), the files the config names, the model's context,
    the batch arithmetic; then each selected component's own ``validate_config(cfg, registry)`` (if it has one)."""
    components = list(selected(cfg, registry))
    check_values(cfg)
    if cfg.reward.file and not Path(cfg.reward.file).is_file():
        raise ConfigError(f"Reward file not found: {cfg.reward.file} (reward.file).")
    for key in ("data.train_files", "data.val_files"):
        missing = [f for f in OmegaConf.select(cfg, key) if not Path(f).is_file()]
        if missing and cfg.data.name == "files":
            raise ConfigError(f"Data file not found: {missing[0]} ({key}).")
    for key in ("model.path", "model.ref_path", "critic.path"):
        if OmegaConf.select(cfg, key):
            check_model_folder(resolve_model_path(OmegaConf.select(cfg, key), key), key, cfg)
    check_resume_value(cfg.trainer.resume)
    check_no_duplicates(cfg, "logger.backends")
    if cfg.rollout.val_n > 1 and cfg.rollout.val_temperature == 0:
        raise ConfigError(
            f"{cfg.rollout.val_n} samples per prompt (rollout.val_n) at temperature 0 are {cfg.rollout.val_n} "
            f"identical greedy answers: set rollout.val_temperature, e.g. 1.0 (--temperature 1.0 in rlforge eval)."
        )
    if cfg.rollout.min_new_tokens > cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"'rollout.min_new_tokens' ({cfg.rollout.min_new_tokens}) must be between 0 and 'rollout.max_new_tokens' "
            f"({cfg.rollout.max_new_tokens})."
        )
    precision.check(cfg.model.precision)
    lora.validate(cfg)
    check_batch_sizes(cfg)
    PIPELINES[cfg.trainer.pipeline].validate_config(cfg)
    for _, entry in components:
        check = getattr(entry.obj, "validate_config", None)
        if check is not None:
            check(cfg, registry)


def micro_batch_size(cfg: DictConfig, section: str = "actor") -> int:
    """``<section>.ppo_micro_batch_size`` in samples; unset means the whole mini-batch (no accumulation)."""
    micro = cfg[section].ppo_micro_batch_size
    return int(micro) if micro is not None else cfg[section].ppo_mini_batch_size * cfg.rollout.n


def check_batch_sizes(cfg: DictConfig, section: str = "actor") -> None:
    """The mini-batch (prompts) divides the batch and the micro-batch (samples) divides the mini-batch.

    The core checks ``actor``; algorithms with a critic check ``critic`` in their ``validate_config``.
    """
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    mini, micro = cfg[section].ppo_mini_batch_size, micro_batch_size(cfg, section)
    if mini <= 0 or micro <= 0:
        raise ConfigError(f"'{section}.ppo_mini_batch_size' and '{section}.ppo_micro_batch_size' must be positive.")
    if prompts % mini:
        raise ConfigError(
            f"'{section}.ppo_mini_batch_size' ({mini} prompts) must divide 'data.train_batch_size' ({prompts} prompts)."
        )
    budget, longest = cfg[section].max_tokens_per_micro_batch, cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    if budget:
        if cfg[section].ppo_micro_batch_size is not None:
            raise ConfigError(
                f"Set one of '{section}.ppo_micro_batch_size' ({cfg[section].ppo_micro_batch_size} samples) and "
                f"'{section}.max_tokens_per_micro_batch' ({budget} tokens): micro-batches are cut by count or by tokens."
            )
        if budget < longest:
            raise ConfigError(
                f"'{section}.max_tokens_per_micro_batch' ({budget}) must hold the longest sequence: "
                f"data.max_prompt_length + rollout.max_new_tokens = {longest} tokens (or 0 = off)."
            )
    elif (mini * n) % micro:
        raise ConfigError(
            f"'{section}.ppo_micro_batch_size' ({micro} samples) must divide the mini-batch of "
            f"{mini} prompts x rollout.n={n} = {mini * n} samples."
        )


def explain_batch_sizes(cfg: DictConfig, words: tuple[str, str, str]) -> str:
    """The batch-size arithmetic in words (printed by ``rlforge config show``); ``words``: the algorithm's
    ``RLModule.batch_words()`` (an offline algorithm reads pairs of rows instead of sampling responses)."""
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    mini, micro = cfg.actor.ppo_mini_batch_size, micro_batch_size(cfg, "actor")
    verb, unit, rows = words
    return (
        f"Each step {verb} {prompts} {unit} x {n} {rows} = {prompts * n} sequences.\n"
        f"The actor update runs {cfg.actor.ppo_epochs} epoch(s) of {prompts // mini} mini-batch(es) of "
        f"{mini} {unit} ({mini * n} sequences) = {cfg.actor.ppo_epochs * prompts // mini} optimizer step(s) per "
        f"training step;\n" + (
            f"each mini-batch is split into micro-batches of at most {cfg.actor.max_tokens_per_micro_batch} tokens "
            f"(actor.max_tokens_per_micro_batch; their number varies with the sequence lengths)."
            if cfg.actor.max_tokens_per_micro_batch else
            f"each mini-batch is split into {mini * n // micro} micro-batch(es) of {micro} "
            f"sequences (gradient accumulation steps)."
        )
    )
