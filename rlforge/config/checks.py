"""Value checks that run at compose time, before any folder is made or any model is loaded.

- :func:`check_values`: every field of every section (core, algorithm, components) against its declared
  :class:`~rlforge.config.schema.Valid` rule, and every float is finite. The rules live on the fields
  (``option(default, gt=0)``), so a plugin's options are checked like the core's.
- :func:`check_device`: where a frozen model runs (``auto``, ``cpu``, ``cuda``, ``cuda:N``).
- :func:`check_sft_keys` (:func:`check_sft_layers`): keys given to ``rlforge sft`` that only ``rlforge fit`` reads;
  :func:`check_fit_keys`: ``sft.*`` set for ``rlforge fit``, which only ``rlforge sft`` reads.
- :func:`check_model_folder`: a model folder's weights are safetensors (pickles are refused) and its context
  holds ``data.max_prompt_length + rollout.max_new_tokens``, read from ``config.json`` without loading anything.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlforge.errors import ConfigError

log = logging.getLogger("rlforge")

DEVICE = r"auto|cpu|cuda(:\d+)?"  # the devices a frozen model's option names (rlforge.models.frozen_model_device)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# config.json keys that give a model's context length, most common first
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def selected(cfg: DictConfig, registry: Any) -> Iterator[tuple[str, Any]]:
    """``(config key, registry entry)`` of every component the config selects (a list key selects several)."""
    for kind, spec in registry.SPECS.items():
        if not spec.key or kind == "algorithm":
            continue
        value = OmegaConf.select(cfg, spec.key)
        for name in (value if OmegaConf.is_list(value) else [value]):
            if name is not None:
                yield spec.key, getattr(registry, kind).entry(name)


# kinds whose components a run may use without its config selecting them: each row's data_source picks its reward
# function where reward.fn is unset, its agent_name column its agent loop, its tool config its tools and interaction
ROW_CHOSEN = ("agent_loop", "tool", "interaction")
_SECTION_DEFAULTS: dict[type, Any] = {}  # a component's config class -> its default values


def warn_unread_sections(cfg: DictConfig, registry: Any, components: list[tuple[str, Any]]) -> None:
    """A warning for each option set (away from its default) in the section of a component the run does not use
    (``ray.num_cpus`` under ``trainer.controller=local``, ``rollout.vllm.*`` with ``rollout.name=hf``): nothing reads
    it. ``components``: :func:`selected`'s."""
    used = {id(entry) for _, entry in components}
    for kind, spec in registry.SPECS.items():
        if not spec.key or kind in ("algorithm", *ROW_CHOSEN) or (kind == "reward_fn" and cfg.reward.fn is None):
            continue
        for entry in getattr(registry, kind).entries():
            path = entry.config_path(spec)
            if path is None or id(entry) in used:
                continue
            if entry.config not in _SECTION_DEFAULTS:  # built once per class: a compose runs this for every section
                _SECTION_DEFAULTS[entry.config] = OmegaConf.to_container(OmegaConf.structured(entry.config))
            default = _SECTION_DEFAULTS[entry.config]
            values = OmegaConf.to_container(OmegaConf.select(cfg, path), resolve=True)
            node: dict[str, Any] = dict(values)  # type: ignore[arg-type]  # a section: a mapping
            changed = [str(key) for key in node if node[key] != default.get(key)]
            if changed:
                shown = ", ".join(f"{path}.{key}" for key in changed)
                log.warning("%s: not read, an option of %s=%s; this run's %s is %s.", shown, spec.key, entry.name,
                            spec.key, OmegaConf.select(cfg, spec.key))


def check_device(value: Any, key: str) -> None:
    """Raise a ConfigError naming ``key`` unless ``value`` is auto, cpu, cuda or cuda:N."""
    if not re.fullmatch(DEVICE, str(value)):
        raise ConfigError(f"'{key}' is '{value}'. Allowed: auto, cpu, cuda or cuda:N.")


def check_values(node: DictConfig, prefix: str = "") -> None:
    """Raise a ConfigError naming the first key whose value breaks its field's rule (or is NaN/inf)."""
    cls = OmegaConf.get_type(node)
    if not (isinstance(cls, type) and is_dataclass(cls)):
        return
    for f in fields(cls):
        key, value = f"{prefix}{f.name}", node[f.name]
        if isinstance(value, DictConfig):
            check_values(value, key + ".")
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"'{key}' must be a finite number, got {value}.")
        rule = f.metadata.get("valid")
        if rule is not None and value is not None and not rule.allows(value):
            integer = isinstance(value, int) and not isinstance(value, bool)
            why = f": {rule.why}" if rule.why else ""
            raise ConfigError(f"'{key}' must be {rule.describe(integer)}, got {value!r}{why}.")


def check_model_folder(folder: Path, key: str, cfg: DictConfig) -> None:
    """Refuse pickle-only weights; check the context length against the longest sequence of ``cfg``."""
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles and not any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        raise ConfigError(
            f"Model folder '{folder}' ({key}) holds its weights only as a pickle ({', '.join(pickles[:3])}), no "
            f"safetensors. rlforge does not load pickles: unpickling an untrusted file can run code, and torch's "
            f"weights_only loader has had bypasses. If you trust the file, convert it once: python -c \"from "
            f"transformers import AutoModelForCausalLM as M, AutoTokenizer as T; p, o = '{folder}', "
            f"'{folder}-safetensors'; M.from_pretrained(p).save_pretrained(o); T.from_pretrained(p).save_pretrained(o)\" "
            f"and set {key}={folder}-safetensors."
        )
    overrides = cfg.model.config_overrides if key == "model.path" else {}
    found = model_context(folder / "config.json", OmegaConf.to_container(overrides) if overrides else {})
    if found is None:
        return
    context, source = found
    prompt, new = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
    if prompt + new > context:
        raise ConfigError(
            f"data.max_prompt_length ({prompt}) + rollout.max_new_tokens ({new}) = {prompt + new} tokens exceed the "
            f"context of {key}: {source} = {context} in {folder / 'config.json'}. Lower one of them."
        )


def model_context(config_json: Path, overrides: Any = None) -> tuple[int, str] | None:
    """(context length, where it came from) of a Hugging Face ``config.json``, with ``overrides`` (the fields
    ``model.config_overrides`` sets) over it; None when it does not say.

    RoPE scaling that extends the context (YaRN, linear, dynamic: a ``factor`` over
    ``original_max_position_embeddings``) counts; a nested ``text_config`` (multimodal models) is read too.
    """
    try:
        data = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the model loader reports an unreadable config.json with its own message
    if not isinstance(data, dict):
        return None
    data = _merged(data, overrides or {})
    section = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    key = next((k for k in CONTEXT_KEYS if isinstance(section.get(k), int) and section[k] > 0), None)
    if key is None:
        return None
    context = section[key]
    given = (overrides or {}).get("text_config") if section is not data else overrides
    key += " (model.config_overrides)" if isinstance(given, dict) and key in given else ""
    rope = section.get("rope_scaling") or section.get("rope_parameters") or {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if isinstance(factor, (int, float)) and factor > 1:
        original = rope.get("original_max_position_embeddings") or context
        if context <= original:  # the scaled context is not already the stated one (as in Llama 3.1's config)
            return int(original * factor), f"{key} x rope factor {factor}"
    return context, key


def _merged(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with ``overrides`` over it (a dict over a dict is merged the same way)."""
    out = dict(data)
    for key, value in overrides.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def check_resume_value(value: str) -> None:
    """``trainer.resume`` is never, auto, or an existing folder (a checkpoint or a run: checked when resuming)."""
    if value in ("never", "auto"):
        return
    path = Path(value).expanduser()
    if not path.is_dir():
        what = "a file, not a folder" if path.exists() else "no such folder"
        raise ConfigError(
            f"trainer.resume='{value}': {what}. Use never, auto (the newest run of trainer.experiment), a "
            f"checkpoint folder (<run>/checkpoints/step_N) or a run folder."
        )


# apply_chat_template's own parameters: rlforge passes them itself, or they change what a render returns
TEMPLATE_CALL_KEYS = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                      "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                      "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


def check_chat_template(template: Any) -> None:
    """``model.chat_template`` compiles as transformers compiles chat templates (its extensions and tags)."""
    from jinja2 import TemplateSyntaxError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    if not isinstance(template, str):
        raise ConfigError(f"'model.chat_template' must be a Jinja template (a string), got {type(template).__name__}.")
    if not template.strip():
        raise ConfigError("'model.chat_template' is empty: leave it unset (null) for the model's own template.")
    try:
        _compile_jinja_template(template)
    except TemplateSyntaxError as exc:
        raise ConfigError(f"'model.chat_template' is not a valid Jinja chat template: {exc.message} (line "
                          f"{exc.lineno}).") from None


def check_template_kwargs(value: Any) -> None:
    """``data.apply_chat_template_kwargs`` holds the template's own variables (``enable_thinking``, ...), none of
    ``apply_chat_template``'s parameters."""
    taken = sorted(set(value or {}) & set(TEMPLATE_CALL_KEYS))
    if taken:
        hint = " (a template of your own: model.chat_template)" if "chat_template" in taken else ""
        raise ConfigError(f"'data.apply_chat_template_kwargs' sets {', '.join(taken)}: a parameter of "
                          f"apply_chat_template or a name the render itself passes to the template{hint}. Give it the "
                          f"template's own variables only, e.g. {{enable_thinking: false}}.")


def check_no_duplicates(cfg: DictConfig, key: str) -> None:
    values = list(OmegaConf.select(cfg, key))
    dupes = sorted({v for v in values if values.count(v) > 1})
    if dupes:
        raise ConfigError(f"'{key}' names {dupes[0]!r} more than once: {values}.")


def check_sequence_parallel_owner(cfg: DictConfig) -> None:
    """A ``strategy.<other>.sequence_parallel_size`` > 1 (or ``offload_params``) of a strategy this run does not use
    is refused: nothing would read it, and the run would hold whole sequences (or its parameters) on each rank's
    device without saying so."""
    for name, section in cfg.strategy.items():
        if name == cfg.strategy.name or not isinstance(section, DictConfig):  # the run's own, or a plain value
            continue
        sp = section.get("sequence_parallel_size", 1)
        if int(sp or 1) > 1:
            raise ConfigError(f"strategy.{name}.sequence_parallel_size={sp} is read by strategy.name={name}, but this "
                              f"run's strategy is strategy.name={cfg.strategy.name}: set strategy.name={name} (and "
                              f"strategy.num_processes) or strategy.{name}.sequence_parallel_size=1.")
        offload = list(section.get("offload_params", []) or [])
        if offload:  # likewise parameter offload: nothing else would offload
            raise ConfigError(f"strategy.{name}.offload_params={offload} is read by strategy.name={name}, but this "
                              f"run's strategy is strategy.name={cfg.strategy.name}: set strategy.name={name} or "
                              f"strategy.{name}.offload_params=[].")


# rlforge fit's keys that `rlforge sft` does not read, and the sft key for each where there is one (docs/sft.md)
SFT_SPELLING = {
    **{f"actor.{k}": f"sft.{k}" for k in ("lr", "weight_decay", "betas", "warmup_steps", "warmup_ratio", "lr_scheduler",
                                          "min_lr_ratio", "num_cycles", "grad_clip")},
    "actor.ppo_micro_batch_size": "sft.micro_batch_size", "data.train_batch_size": "sft.batch_size",
    "data.truncation": "sft.truncation", "data.shuffle": "sft.sampling", "model.path": "sft.init",
    "trainer.total_steps": "sft.steps", "trainer.total_epochs": "sft.epochs", "trainer.seed": "sft.seed",
    "trainer.save_every": "sft.save_every", "trainer.resume": "sft.resume", "trainer.resume_force": "sft.resume_force",
    "trainer.val_every": "sft.val_every",
    "trainer.run_dir": "sft.output_dir", "logger.backends": "sft.loggers", "strategy.name": "sft.strategy",
    "strategy.num_processes": "sft.devices",
}
# what `rlforge sft` reads of the sections it shares with `rlforge fit` (a plugin's own sections are not checked)
SFT_READS = ("sft.", "data.", "rollout.", "reward.", "plugins.", "model.lora.", "model.precision",
             "model.trust_remote_code", "model.chat_template", "trainer.project")
# verl's SFT keys translated together (rlforge.config.verl_sft's Derived rules) -> rlforge's keys for them
SFT_DERIVED = {
    "chat_template": "data.apply_chat_template_kwargs", "sft_chat_template": "model.chat_template",
    "sft_columns": "sft.format with sft.prompt_key / sft.response_key / sft.messages_key",
    "sft_files": "sft.train_file / sft.val_file", "sft_loggers": "sft.loggers",
    "sft_multiturn_keys": "sft.messages_key / sft.tools_key", "sft_resume": "sft.resume",
    "sft_schedule": "sft.lr_scheduler", "sft_steps": "sft.steps / sft.epochs",
    "sft_freq": "sft.save_every / sft.val_every",
    "sft_thinking": "sft.enable_thinking_key / sft.enable_thinking_default",
    "sft_warmup": "sft.warmup_steps / sft.warmup_ratio",
}
FIT_SECTIONS = ("model", "data", "algorithm", "actor", "critic", "strategy", "trainer", "logger", "ray")


def check_sft_keys(keys: list[str], source: str, known: set[str]) -> None:
    """Keys given to ``rlforge sft`` that only ``rlforge fit`` reads are an error (they would go unread), naming the
    sft key where there is one; so are verl's SFT keys that are not rlforge's (``known``: rlforge's keys)."""
    unread = [k for k in keys if k in SFT_SPELLING or k in known and k.split(".")[0] in FIT_SECTIONS
              and not k.startswith(SFT_READS)]
    if unread:
        lines = [f"'{k}'" + (f" (SFT's is '{SFT_SPELLING[k]}')" if k in SFT_SPELLING else "") for k in unread]
        raise ConfigError(f"rlforge sft does not read {', '.join(lines)} (in {source}): rlforge fit's key(s). SFT "
                          f"reads sft.*, data.* (the built-in dataset), model.precision, "
                          f"model.lora.*, model.trust_remote_code, model.chat_template, trainer.project, and reward.* "
                          f"and rollout.* for its greedy accuracy (docs/sft.md).")
    said = [f"'{k}' {_verl_sft_key(k)}" for k in keys if k not in known and _verl_sft_key(k)]
    if said:  # verl's SFT keys typed where rlforge's go
        raise ConfigError(f"{'; '.join(said)} (in {source}; 'rlforge verl --sft ARGS' takes verl's keys, "
                          f"docs/sft.md).")


def _verl_sft_key(key: str) -> str:
    """What verl's SFT key ``key`` is to rlforge sft (empty: not one of verl's SFT keys)."""
    from rlforge.config.verl_rules import Derived, Ignore, Keep, Map
    from rlforge.config.verl_sft import TABLE

    rule = TABLE.rule(key)
    if isinstance(rule, Map) and rule.target:
        return f"is verl's SFT key, rlforge's is '{rule.target}'"
    if isinstance(rule, Derived):
        return f"is verl's SFT key; rlforge's is {SFT_DERIVED.get(rule.owner, 'decided with other keys')}"
    if isinstance(rule, Keep):
        return f"is verl's SFT key: rlforge sft always uses {rule.does or 'what verl does by default'}"
    if isinstance(rule, Ignore):
        return f"is verl's SFT key, with no rlforge counterpart needed: {rule.why}"
    return ""


def check_sft_layers(layers: list[tuple[Any, str]]) -> None:
    """rlforge fit's keys and verl's SFT keys given to ``rlforge sft`` are an error (:func:`check_sft_keys`);
    ``layers``: (config, its source), e.g. the parsed overrides and a config file."""
    from rlforge.config import compose_with_plugins
    from rlforge.config.verl_fates import flatten

    given = [([k for k, _ in flatten(OmegaConf.to_container(layer))], source) for layer, source in layers]
    if any(keys for keys, _ in given):
        # rlforge's keys, with the plugins the layers disable left out as the run leaves them out
        disable = [str(n) for layer, _ in layers for n in OmegaConf.select(layer, "plugins.disable", default=[]) or []]
        over = [f"plugins.disable=[{','.join(disable)}]"] if disable else []
        known = {k for k, _ in flatten(OmegaConf.to_container(compose_with_plugins(overrides=over)[1]))}
        for keys, source in given:
            check_sft_keys(keys, source, known)


def check_fit_keys(cfg: DictConfig) -> None:
    """``sft.*`` set for ``rlforge fit``, which never reads it, is an error (as fit's keys are for ``rlforge sft``); a
    saved run config repeats the section's defaults, which is not setting it."""
    from rlforge.config.schema import SFTConfig
    from rlforge.config.verl_fates import flatten

    default = dict(flatten(OmegaConf.to_container(OmegaConf.structured(SFTConfig))))
    changed = [f"sft.{k}" for k, v in flatten(OmegaConf.to_container(cfg.sft)) if default.get(k, v) != v]
    if changed:
        raise ConfigError(f"rlforge fit does not read {', '.join(changed)}: rlforge sft's key(s). A fit's length is "
                          f"trainer.total_steps (or trainer.total_epochs); `rlforge sft` fine-tunes (docs/sft.md).")


def check_cuda_present(cfg: DictConfig) -> None:
    """A CUDA ``strategy.device`` (verl's default ``trainer.device=cuda``) on a machine without one stops before the
    run folder is taken or a worker starts, as the strategy would stop placing the model; not for a Ray cluster one
    connects to (``ray.address``), whose workers may hold the GPUs."""
    device = str(cfg.strategy.device)
    if not device.startswith("cuda") or (cfg.trainer.controller == "ray" and cfg.get("ray", {}).get("address")):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"strategy.device='{device}' (verl: trainer.device) but this machine has no CUDA device. "
                          f"Use auto or cpu.")
