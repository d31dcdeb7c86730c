"""Compose the config: built-in defaults < algorithm preset < ``--config FILE`` < CLI ``key=value``.

Everything here runs before any model is loaded: unknown keys, wrong types, unknown component names and
inconsistent batch sizes (``rlforge.config.batches``) fail with a message that names the key, the value and the
choices.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from rlforge import checkpoint, lora, module_checks, precision
from rlforge.config import foreign_keys, schema
from rlforge.config.batches import check_batch_sizes
from rlforge.config.checks import (
    check_chat_template, check_model_folder, check_no_duplicates, check_resume_value, check_sequence_parallel_owner,
    check_template_kwargs, check_values, selected, warn_unread_sections,
)
from rlforge.data import data_file_problem
from rlforge.errors import ConfigError, RLForgeError, did_you_mean
from rlforge.models import BUILTIN_PREFIX, resolve_model_path
from rlforge.pipeline import PIPELINES
from rlforge.resume import read_run_config, resumed_run
from rlforge.config.yaml_text import OVERRIDES, load_yaml, parse_overrides

log = logging.getLogger("rlforge")





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
    data = load_yaml(p, path) or {}
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


def _check_texts(base: DictConfig, layer: DictConfig, source: str) -> None:
    """A true/false value for a text key is YAML's reading of an unquoted yes, no, on or off (``experiment: no``
    would be the text 'False')."""
    from omegaconf.nodes import StringNode

    from rlforge.config import verl

    for key, value in verl.flatten(OmegaConf.to_container(layer)):
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent, default=None) if parent else base
        target = node._get_node(leaf) if isinstance(node, DictConfig) and leaf in node else None
        texts = isinstance(target, ListConfig) and target._metadata.element_type is str  # a list of text
        value = next((v for v in value if isinstance(v, bool)), None) if isinstance(value, list) and texts else value
        if isinstance(value, bool) and (texts or isinstance(target, StringNode)):
            raise ConfigError(f"'{key}' (in {source}) is text, and YAML read its value as the boolean {value} (an "
                              f"unquoted yes, no, on, off, true or false): it would be the text '{value}'. Quote it "
                              f"({leaf}: \"no\" in a file, {key}='\"no\"' on the command line).")


def _merge(base: DictConfig, layer: Any, source: str) -> DictConfig:
    """``layer`` (from ``source``, which errors name) merged into ``base``, in place; ``base`` returned."""
    layer = OmegaConf.create(layer)
    try:
        _check_bools(base, layer, source)
        _check_texts(base, layer, source)
        base.merge_with(_one_item_lists(base, layer))  # in place: OmegaConf.merge would copy the whole config first
        return base
    except ConfigKeyError as exc:
        key = exc.full_key or "?"
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
        from rlforge.config import verl

        leaves = [k for k, _ in verl.flatten(OmegaConf.to_container(layer))]
        full = next((k for k in leaves if k.startswith(key + ".")), key)  # the whole key, not its first unknown part
        elsewhere = [k for k, _ in verl.flatten(OmegaConf.to_container(base)) if k.rpartition(".")[2] == leaf]
        hint = (verl.hint(full) or foreign_keys.hint(full)
                or (f" '{leaf}' is a key of another section: did you mean "
                    f"{' or '.join(map(repr, elsewhere[:3]))}{' (or another)' if len(elsewhere) > 3 else ''}?"
                    if elsewhere and leaf not in known else "")
                or did_you_mean(leaf, known, prefix=f"{parent}." if parent else ""))
        raise ConfigError(
            f"Unknown config key '{full}' (in {source}).{hint} Run 'rlforge config show' to list every key."
        ) from None
    except OmegaConfBaseException as exc:
        problem = _shape_problem(base, layer, source)
        if problem:
            raise ConfigError(problem) from None
        key = getattr(exc, "full_key", "") or "?"
        reason = str(getattr(exc, "msg", exc)).splitlines()[0]
        if reason.startswith("Incompatible value 'None'"):  # `key=` with nothing after it is null in Hydra syntax
            reason = f"it needs a value ('{key}=' with nothing after the '=' sets it to null)"
        elif re.match(r"Key .* \((int|float|bool)\) is incompatible with \(str\)", reason):  # {1: x} in YAML
            reason += "; a mapping's keys are text here: quote a key YAML reads as a number or boolean ({'1': ...})"
        raise ConfigError(f"Invalid value for '{key}' (in {source}): {reason}.") from None


def _shape_problem(base: DictConfig, layer: DictConfig, source: str) -> str:
    """What is wrong where ``layer`` gives a mapping for a list key (``logger.backends={a: 1}``) or a plain value for a
    section (``trainer=5``): the key, what it takes and what was given (OmegaConf's error names neither); else ""."""
    from rlforge.config import verl

    for key, value in verl.flatten(OmegaConf.to_container(layer)):
        parts = key.split(".")
        for i in range(1, len(parts) + 1):
            path = ".".join(parts[:i])
            node = OmegaConf.select(base, path, default=None)
            if OmegaConf.is_list(node) and (i < len(parts) or isinstance(value, dict)):
                kind = node._metadata.element_type
                items = f" of {kind.__name__}" if isinstance(kind, type) and kind is not Any else ""
                example = ",".join(map(str, node)) or ("1.0,0.5" if kind in (float, int) else "a,b")
                given = OmegaConf.to_container(OmegaConf.select(layer, path))
                return (f"Invalid value for '{path}' (in {source}): it takes a list{items}, got the mapping {given!r}; "
                        f"give a list, e.g. '{path}=[{example}]'.")
            if not isinstance(node, DictConfig):
                break
            if i == len(parts) and not isinstance(value, dict):
                names = [str(k) for k in node.keys()][:3]
                keys = ", ".join(f"{path}.{k}" for k in names) + ", ..." if names else f"{path}.<name>=<value>"
                return (f"'{path}' (in {source}) is a section of the config, not a value: set its keys ({keys}), or "
                        f"give a mapping ('{path}={{name: value}}'). Run 'rlforge config show' to list every key.")
    return ""


def compose(
    registry: Any,
    algo: str | None = None,
    config_file: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> DictConfig:
    """Return the validated, read-only config. ``registry`` is the plugin manager's Registries."""
    file_cfg = load_file(config_file) if config_file else OmegaConf.create({})
    return _compose(registry, algo, [(file_cfg, config_file or ""), (parse_overrides(list(overrides)), OVERRIDES)])




def _algorithm_name(algo: str | None, layers: list[tuple[DictConfig, str]]) -> str:
    """``--algo``, else the last ``algorithm.name`` of the layers, else grpo; ``--algo`` and a different
    ``algorithm.name`` in a config file or override contradict each other."""
    named = [(n, source) for layer, source in layers if (n := OmegaConf.select(layer, "algorithm.name", default=None))]
    if algo is not None:
        other = next(((n, source) for n, source in named if n != algo), None)
        if other is not None:
            raise ConfigError(f"--algo {algo} and algorithm.name={other[0]} (in {other[1] or 'the base config'}) name "
                              f"two algorithms: give one of them.")
        return algo
    return named[-1][0] if named else "grpo"


def unresolvable(cfg: DictConfig) -> tuple[str, str, str] | None:
    """(key, its ``${...}`` text, why) of an interpolation in ``cfg`` that cannot be resolved, else None: the first
    whose text names no other failing key (the cause, e.g. ``a: x_${now:%H}`` rather than ``b: ${oc.select:a,null}``,
    which fails because ``a`` does), else the first."""
    failing = list(_failures(cfg, ""))
    keys = [key for key, _, _ in failing]
    return next((f for f in failing if not any(k != f[0] and k in f[1] for k in keys)), failing[0] if failing else None)


def _failures(cfg: DictConfig, prefix: str) -> Iterator[tuple[str, str, str]]:
    for key in list(cfg.keys()):
        full = f"{prefix}{key!s}"
        if OmegaConf.is_interpolation(cfg, str(key)):
            try:
                cfg[key]
            except OmegaConfBaseException as exc:
                text = OmegaConf.to_container(cfg, resolve=False)[key]  # type: ignore[index]
                yield full, str(text), str(getattr(exc, "msg", exc)).splitlines()[0].rstrip(".")
            continue
        node = cfg._get_node(key)  # type: ignore[union-attr]
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            yield from _failures(node, full + ".")


def _resolve(cfg: DictConfig, layers: list[tuple[DictConfig, str]]) -> None:
    """Resolve every ``${...}`` in place (a config file or override may use them); one that fails is an error that
    names the key, the interpolation and the file or overrides it came from."""
    bad = unresolvable(cfg)
    if bad is not None:
        key, text, why = bad
        origin = next((source for layer, source in reversed(layers) if _has_key(layer, key)), "")
        raise ConfigError(f"Cannot resolve '{key}: {text}'" + (f" (in {origin})" if origin else "") + f": {why}.")
    OmegaConf.resolve(cfg)


def _has_key(layer: DictConfig, key: str) -> bool:
    node: Any = OmegaConf.to_container(layer, resolve=False)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


_DEFAULTS: dict[tuple[Any, ...], DictConfig] = {}  # schema -> its defaults as a config, never handed out itself


def _defaults(registry: Any, algorithm_config: type) -> DictConfig:
    """The defaults of the schema that ``registry``'s components and ``algorithm_config`` make (``schema.build``), as
    a config of their own: built once per schema, then copied (building it is most of a compose's time)."""
    key = (algorithm_config, *((path, cls, entry.plugin) for path, (cls, entry) in
                               sorted(registry.config_sections().items())))
    if key not in _DEFAULTS:
        _DEFAULTS[key] = OmegaConf.structured(schema.build(registry, algorithm_config))
    return copy.deepcopy(_DEFAULTS[key])


def _compose(registry: Any, algo: str | None, layers: list[tuple[DictConfig, str]], files: bool = True) -> DictConfig:
    """Defaults < the algorithm's preset < each of ``layers`` (config, where it comes from), in order; ``files``:
    see :func:`validate`."""
    name = _algorithm_name(algo, layers)
    algo_cls = registry.algorithm.get(name)
    _check_other_algorithms_keys(registry, name, layers)
    cfg = _defaults(registry, algo_cls.config_class)
    cfg = _merge(cfg, OmegaConf.create(algo_cls.preset), f"the '{name}' preset")
    for layer, source in layers:
        cfg = _merge(cfg, layer, source)
    cfg.algorithm.name = name
    _resolve(cfg, layers)
    validate(cfg, registry, files)
    module_checks.validate_config(algo_cls, cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _check_other_algorithms_keys(registry: Any, name: str, layers: list[tuple[DictConfig, str]]) -> None:
    """An ``algorithm.<key>`` that algorithm ``name`` lacks but other registered algorithms have (``algorithm.gamma``
    under ``--algo grpo``) is an error naming them, before the merge's unknown-key error would call it unknown."""
    own = {f.name for f in fields(registry.algorithm.get(name).config_class)}
    for layer, source in layers:
        section = OmegaConf.select(layer, "algorithm", default=None)
        for key in [str(k) for k in section.keys()] if isinstance(section, DictConfig) else []:
            users = [] if key in own else [n for n in registry.algorithm.available() if key in
                                           {f.name for f in fields(registry.algorithm.get(n).config_class)}]
            if users:
                raise ConfigError(f"'algorithm.{key}' (in {source or 'the config file'}) is not an option of --algo "
                                  f"{name}; it is one of --algo {', '.join(sorted(users))}."
                                  + foreign_keys.hint(f"algorithm.{key}"))


def compose_with_plugins(
    algo: str | None = None, config_file: str | None = None, overrides: list[str] | tuple[str, ...] = (),
    loaded: Callable[[Any], Any] | None = None, base: tuple[DictConfig, str] | None = None,
    modules: list[str] | tuple[str, ...] = (), files: bool = True,
) -> tuple[Any, DictConfig]:
    """Load the plugins minus ``plugins.disable`` and plus ``plugins.modules`` and ``modules`` (``-p``), each read
    from the overrides, the file or ``base`` first, then compose: returns (plugin manager, config); the config's
    ``plugins.modules`` lists every module loaded, as other processes load them. ``loaded(plugin_manager)`` runs in
    between (the CLI prints warnings). ``base``: (config, its origin) merged under the file, e.g. the config of the
    run being evaluated. ``files=False``: the files and folders it names are not checked (:func:`validate`)."""
    from rlforge.plugin_manager import PluginError, PluginManager

    over = parse_overrides(list(overrides))
    file_cfg = load_file(config_file) if config_file else OmegaConf.create({})
    layers = [*([base] if base else []), (file_cfg, config_file or ""), (over, OVERRIDES)]
    disable, listed = (_plugin_list(layers, key) for key in ("disable", "modules"))
    run, recorded = _resumed_modules(layers[-2:]) if not (listed or modules) else (None, [])
    try:
        pm = PluginManager(disable=disable, modules=[*recorded, *listed, *modules])
    except PluginError as exc:
        if not recorded:
            raise
        raise PluginError(f"{exc} It is one of the plugin modules of the run that trainer.resume continues ({run}, "
                          f"plugins.modules in its config.yaml), which a continuation loads again: restore it, or give "
                          f"the plugin modules yourself with -p.") from exc
    if pm.modules:
        OmegaConf.update(over, "plugins.modules", pm.modules, merge=False)
    if loaded is not None:
        loaded(pm)
    return pm, _compose(pm.registry, algo, layers, files)


def _last(layers: list[tuple[DictConfig, str]], key: str) -> Any:
    """``key`` of the last layer that sets it, else None: what the layers say before the config is composed."""
    return next((v for layer, _ in reversed(layers)
                 if (v := OmegaConf.select(layer, key, default=None, throw_on_resolution_failure=False)) is not None),
                None)


def _resumed_modules(layers: list[tuple[DictConfig, str]]) -> tuple[Path | None, list[str]]:
    """(run, its ``plugins.modules``) of the run that the layers' ``trainer.resume`` continues (docs/plugins.md: a
    continuation loads them again, as ``rlforge eval RUN_DIR`` does); (None, []) for a new run, and where
    ``trainer.resume`` names no run (the checks after composing say so)."""
    defaults = schema.TrainerConfig()
    keys = ("resume", "run_dir", "runs_root", "experiment")
    trainer = SimpleNamespace(**{key: value if (value := _last(layers, f"trainer.{key}")) is not None
                                 else getattr(defaults, key) for key in keys})
    try:
        run, _ = resumed_run(trainer)
    except RLForgeError:
        return None, []
    saved = read_run_config(run)[0] if run is not None else None
    modules = OmegaConf.select(saved, "plugins.modules", default=None) if saved is not None else None
    return run, [str(m) for m in modules or []]


def _plugin_list(layers: list[tuple[DictConfig, str]], key: str) -> list[str]:
    """``plugins.<key>`` of the last layer that sets it (the plugins load before the config is composed)."""
    value = _last(layers, f"plugins.{key}")
    if value is not None and not OmegaConf.is_list(value):
        raise ConfigError(f"'plugins.{key}' must be a list of {'plugin' if key == 'disable' else 'module'} names, got "
                          f"{value!r}.")
    return [str(v) for v in value or []]


def validate(cfg: DictConfig, registry: Any, files: bool = True) -> None:
    """Every value against its field's rule (``schema.Valid``), the files the config names, the model's context,
    the batch arithmetic; then each selected component's own ``validate_config(cfg, registry)`` (if it has one).
    ``files=False``: the values alone (field rules, the checks between values, batch arithmetic, LoRA, the chat
    template, the pipeline's options), none of the files and folders the config names nor the components' own checks
    (which may read them): a config checked on another
    machine than the one that runs it (``rlforge config from-verl`` without ``--out``)."""
    components = list(selected(cfg, registry))
    check_values(cfg)
    if cfg.reward.fn and cfg.reward.file:
        raise ConfigError(f"reward.fn={cfg.reward.fn!r} and reward.file={cfg.reward.file!r} both name the reward "
                          f"function: set one of them.")
    if cfg.reward.fn_kwargs and not cfg.reward.file:
        raise ConfigError(f"reward.fn_kwargs ({', '.join(cfg.reward.fn_kwargs)}) go to the function of reward.file, "
                          f"which is not set: set reward.file, or give a registered function's options in its own "
                          f"section (docs/rewards.md).")
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
    check_no_duplicates(cfg, "logger.backends")
    precision.check(cfg.model.precision)
    check_batch_sizes(cfg)
    check_template_kwargs(cfg.data.apply_chat_template_kwargs)
    if cfg.model.chat_template is not None:
        check_chat_template(cfg.model.chat_template)
    lora.validate(cfg)
    checkpoint.check_mode(cfg, registry)
    PIPELINES[cfg.trainer.pipeline].validate_config(cfg)
    if files:
        check_named_files(cfg, registry)
        for _, entry in components:
            check = entry.functions.get("validate_config")
            if check is not None:
                check(cfg, registry)
    check_sequence_parallel_owner(cfg)  # after the strategy's own check, which says more
    warn_unread_sections(cfg, registry, components)


def check_named_files(cfg: DictConfig, registry: Any) -> None:
    """The files and folders the config names: the reward file, the data files, the model folders, the checkpoint
    to resume."""
    if cfg.reward.file and Path(cfg.reward.file).is_dir():
        raise ConfigError(f"Reward file {cfg.reward.file} (reward.file) is a directory; give the Python file that "
                          f"defines the reward function.")
    if cfg.reward.file and not Path(cfg.reward.file).is_file():
        raise ConfigError(f"Reward file not found: {cfg.reward.file} (reward.file).")
    check_data_files(cfg, registry)
    for key in ("model.path", "model.ref_path", "critic.path"):
        if OmegaConf.select(cfg, key):
            check_model_folder(resolve_model_path(OmegaConf.select(cfg, key), key), key, cfg)
    check_resume_value(cfg.trainer.resume)


def check_data_files(cfg: DictConfig, registry: Any) -> None:
    """``data.train_files``/``val_files`` exist, and are read: a dataset ignores them unless it declares that it reads
    them (``DatasetCapabilities(reads_data_files=True)``, as ``files`` does)."""
    caps = registry.dataset.entry(cfg.data.name).capabilities
    reads = caps.reads_data_files
    for key in ("data.train_files", "data.val_files"):
        files = list(OmegaConf.select(cfg, key))
        if files and not reads:
            raise ConfigError(f"'{key}' is set ({files[0]}{', ...' if len(files) > 1 else ''}) but data.name="
                              f"{cfg.data.name} does not read it: the run would train on data.name's rows. Set "
                              f"data.name=files to train on the files (rlforge sft: sft.train_file / sft.val_file "
                              f"for SFT rows).")
        problem = None if caps.checks_own_files else next((p for f in files if (p := data_file_problem(f))), None)
        if problem:
            raise ConfigError(f"{problem} ({key}).")
        twice = next((f for i, f in enumerate(files) if f in files[:i]), None)
        if twice is not None:
            log.warning("'%s' lists %s %d times: its rows are read that many times (an epoch holds each that many "
                        "times). List it once unless that is meant.", key, twice, files.count(twice))
