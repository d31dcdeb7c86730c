"""LoRA adapters through ``peft`` (``model.lora.*``), shared by RL, SFT and the offline algorithms.

With ``model.lora.rank > 0`` the actor is the base model wrapped by ``peft.get_peft_model``: only the adapter
weights train (they alone are in the optimizer and in checkpoints), and the reference policy is the same
model with the adapter disabled, so no second copy of the weights is held. Rollout engines that keep their
own copy of the weights (vLLM) receive the merged weights under the base model's names (``merged_weights``).

A LoRA adapter folder as the model (``model.path``: a LoRA run's checkpoint ``actor/``, an ``rlforge export
--adapter`` folder, any peft LoRA adapter) is its base model plus the adapter: merged in (``merge_adapter``) for
full fine-tuning (``model.lora.rank=0``) and wherever a model is only run; with ``model.lora.*`` as the adapter
was made, the adapter itself goes on training (``wrap(..., adapter=folder)``); other ``model.lora`` values are
refused, naming each difference.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rlforge.errors import ConfigError, RLForgeError

if TYPE_CHECKING:
    import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # what peft's save_pretrained writes for an adapter
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."  # peft's name prefix over the base model's parameters


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (``model.lora.rank > 0``); the reference is the base model."""

    rank: int = 0  # adapter rank r; 0 = no LoRA (full fine-tuning)
    alpha: int = 16  # scaling alpha (the update is alpha / r x B A)
    dropout: float = 0.0  # dropout on the adapter's input
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])  # module names, or [all-linear]
    exclude_modules: Optional[str] = None  # a regular expression of module names to leave without adapters, matched against the whole name (peft's exclude_modules), e.g. '.*visual.*' (verl: model.exclude_modules); a vision tower is left out of all-linear anyway


def enabled(config: Any) -> bool:
    return int(config.model.lora.rank) > 0


def validate(config: Any) -> None:
    lora = config.model.lora
    if lora.rank and config.strategy.num_processes > 1:
        raise ConfigError(
            f"LoRA (model.lora.rank={lora.rank}) runs on one device so far: set strategy.num_processes=1 "
            f"(got {config.strategy.num_processes}). LoRA with FSDP is not supported yet (docs/models.md)."
        )
    if lora.rank < 0:
        raise ConfigError(f"'model.lora.rank' must be >= 0 (0 = off), got {lora.rank}.")
    if lora.rank and lora.alpha <= 0:
        raise ConfigError(f"'model.lora.alpha' must be > 0, got {lora.alpha}.")
    if not 0.0 <= lora.dropout < 1.0:
        raise ConfigError(f"'model.lora.dropout' must be in [0, 1), got {lora.dropout}.")
    if lora.rank and not lora.target_modules:
        raise ConfigError("'model.lora.target_modules' is empty: name modules (e.g. [q_proj,v_proj]) or [all-linear].")
    if lora.exclude_modules is not None:
        try:
            re.compile(lora.exclude_modules)
        except re.error as exc:
            raise ConfigError(f"'model.lora.exclude_modules' ({lora.exclude_modules!r}) is not a regular expression: "
                              f"{exc}.") from None


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError("LoRA (model.lora.rank > 0, or a LoRA adapter as the model) needs the peft package: "
                          "pip install peft.") from None
    return peft


def wrap(model: torch.nn.Module, config: Any, adapter: Path | None = None,
         key: str = "model.path") -> torch.nn.Module:
    """``model`` with LoRA adapters as ``model.lora`` says (``peft.get_peft_model``); the base weights are frozen.
    The adapters are fresh, or with ``adapter`` (a peft adapter folder made for ``model``) that adapter's trained
    weights, which must be what ``model.lora`` makes (``check_continues``; ``key``: the config key that named it)."""
    peft = _peft()
    from rlforge.multimodal import lora_excluded

    lora = config.model.lora
    targets = list(lora.target_modules)
    every = targets == ["all-linear"]
    # the user's exclusion, and with all-linear a vision tower's: peft full-matches each module name against it
    excluded = [p for p in (lora.get("exclude_modules"), lora_excluded(model) if every else None) if p]
    spec = peft.LoraConfig(
        r=int(lora.rank), lora_alpha=int(lora.alpha), lora_dropout=float(lora.dropout),
        target_modules="all-linear" if every else targets, task_type="CAUSAL_LM",
        exclude_modules=(excluded[0] if len(excluded) == 1 else "|".join(f"(?:{p})" for p in excluded)) if excluded
        else None,
    )
    try:
        wrapped = peft.get_peft_model(model, spec)
    except ValueError as exc:  # e.g. a target module that the model does not have
        raise ConfigError(f"LoRA cannot be applied (model.lora.target_modules={targets}): {exc}") from None
    if adapter is not None:
        peft.set_peft_model_state_dict(wrapped, check_continues(wrapped, adapter, key))
    from rlforge.models import model_name

    spec = wrapped.peft_config["default"]  # saved adapters name their base as it loads elsewhere (builtin:, a Hub id)
    if spec.base_model_name_or_path:
        spec.base_model_name_or_path = model_name(spec.base_model_name_or_path)
    return wrapped


# peft LoraConfig fields that change what an adapter computes -> the model.lora key that sets them (None: peft's
# default, which model.lora has no key for)
SAME_AS_MODEL_LORA = {"peft_type": None, "r": "rank", "lora_alpha": "alpha", "lora_dropout": "dropout",
                      "use_rslora": None, "use_dora": None, "bias": None, "modules_to_save": None,
                      "rank_pattern": None, "alpha_pattern": None, "layers_to_transform": None,
                      "target_parameters": None, "trainable_token_indices": None}


def check_continues(wrapped: Any, adapter: Path, key: str = "model.path") -> dict[str, torch.Tensor]:
    """The weights of the peft adapter folder ``adapter``, checked to be those of ``wrapped`` (fresh adapters as
    ``model.lora`` makes them): the same settings (``SAME_AS_MODEL_LORA``) and the same tensors (names and shapes:
    the same target modules and rank).

    :raises ConfigError: naming each setting that differs (the ``model.lora`` key, its value and the adapter's), or
        the tensors the adapter lacks or has in excess.
    """
    from safetensors.torch import load_file

    peft = _peft()
    saved = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    fresh = wrapped.peft_config["default"].to_dict()
    differ = [f"{f'model.lora.{ours}' if ours else f'peft {field} (no model.lora key)'}="
              f"{fresh.get(field)!r} but the adapter's {field} is {saved.get(field)!r}"
              for field, ours in SAME_AS_MODEL_LORA.items() if _setting(fresh.get(field)) != _setting(saved.get(field))]
    hint = ("Set model.lora.* as the adapter was made to go on training it, or model.lora.rank=0 to train the "
            "merged model in full; to train new adapters on the merged model, write it merged (`rlforge export` of "
            f"the run or checkpoint, or peft's merge_and_unload().save_pretrained) and give that folder as {key} "
            "(docs/models.md).")
    if differ:
        raise ConfigError(f"The LoRA adapter {adapter} ({key}) is not what model.lora makes: "
                          f"{'; '.join(differ)}. {hint}")
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ConfigError(f"The LoRA adapter {adapter} ({key}) has no {ADAPTER_WEIGHTS}: its weights must be in "
                          f"safetensors (peft's save_pretrained writes them so).")
    tensors = load_file(str(weights))
    expected = {k: tuple(v.shape) for k, v in peft.get_peft_model_state_dict(wrapped).items()}
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != found:
        found_only = sorted(set(found) - set(expected))
        expected_only = sorted(set(expected) - set(found))
        shapes = sorted(f"{k} {found[k]}, model.lora makes {expected[k]}" for k in expected.keys() & found.keys()
                        if expected[k] != found[k])
        what = [f"{label} {names[:3]}{' and more' if len(names) > 3 else ''}" for label, names in (
            ("the adapter has", found_only), ("model.lora makes", expected_only), ("shapes differ:", shapes)) if names]
        raise ConfigError(
            f"The LoRA adapter {adapter} ({key}) does not adapt the modules that model.lora.target_modules="
            f"{_setting(fresh.get('target_modules'))} does (the adapter's target_modules: "
            f"{_setting(saved.get('target_modules'))}): {'; '.join(what)}. {hint}")
    return tensors


def _setting(value: Any) -> Any:
    """A setting as compared: peft writes an unset one as None, {}, [] or False alike; sets as lists."""
    if not value:
        return None
    return sorted(value) if isinstance(value, (list, set, tuple)) else value


def merge_adapter(model: torch.nn.Module, adapter: Path, what: str) -> torch.nn.Module:
    """``model`` (the base) with the peft adapter of the folder ``adapter`` merged in: a plain model again. Loaded
    as a task-less ``PeftModel``, so that a causal LM's adapter merges into the same body under another head (the
    value model that starts from the policy). The parameters train as they did before (peft freezes them)."""
    peft = _peft()
    trains = {name: p.requires_grad for name, p in model.named_parameters()}
    try:
        spec = peft.PeftConfig.from_pretrained(adapter)
        spec.task_type = None
        merged = peft.PeftModel.from_pretrained(model, adapter, config=spec).merge_and_unload()
    except (ValueError, RuntimeError, KeyError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RLForgeError(f"The LoRA adapter {adapter} ({what}) does not fit its base model "
                           f"{getattr(model, 'name_or_path', '')}: {type(exc).__name__}: {first}") from None
    for name, p in merged.named_parameters():
        p.requires_grad_(trains.get(name, True))
    return merged


def is_lora(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def base_model_context(model: Any) -> Any:
    """The context in which ``model`` computes as its base (the adapter off): the LoRA run's reference."""
    return model.disable_adapter() if is_lora(model) else contextlib.nullcontext()


def merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights with the adapter merged in, under the base model's parameter names (for an engine that holds
    a plain copy of the model). The adapter is merged for the iteration and unmerged after it."""
    import torch

    with torch.no_grad():
        model.merge_adapter()
        try:
            for name, param in model.named_parameters():
                if "lora_" in name:
                    continue
                yield name.removeprefix(PEFT_PREFIX).replace(".base_layer.", "."), param.detach()
        finally:
            model.unmerge_adapter()


def merged_model(model: Any) -> torch.nn.Module:
    """A plain model with the adapter merged in, leaving ``model`` (the adapter model) as it is."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold: all of them, or only the adapter's with LoRA."""
    return [p for p in model.parameters() if p.requires_grad]
