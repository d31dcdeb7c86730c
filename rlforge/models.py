"""Model and tokenizer loading (builtin names, local folders, Hub ids), stop tokens, and the project's own tiny
char-level Llama (no model hub needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.errors import ConfigError, RLForgeError, first_line
from rlforge.lazy import lazy_import
from rlforge.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from rlforge.weight_files import check_weights, safetensors_problem

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

BUILTIN_PREFIX = "builtin:"
ASSETS = Path(__file__).parent / "assets"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # ORG/NAME, as the Hub spells model ids
# weights in other formats than safetensors (and Meta's original checkpoints) are not downloaded
CHECKPOINT_ACTOR = "actor"  # a checkpoint's model folder (rlforge.checkpoint)
HUB_IGNORE = ["original/*", "*.pth", "*.pt", "*.bin", "*.gguf", "*.onnx", "*.h5", "*.msgpack", "*.ot"]

SPECIAL_TOKENS = ["<pad>", "<s>", "<|end|>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
# Plain messages render as "<|role|>content<|end|>" (the shipped model's format, unchanged). With ``tools=`` a
# system turn lists their names; an assistant message's ``tool_calls`` render as Hermes calls after its content;
# a tool reply is a "<|tool|>...<|end|>" turn. Kept short: the model reads characters.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>tools: {% for t in tools %}{{ (t.function or t).name }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] if m['content'] is string else '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def resolve_model_path(path: str, key: str = "model.path") -> Path:
    """The model folder that ``path`` names; ``key`` is the config key named in errors.

    - ``builtin:NAME``: the shipped folder ``rlforge/assets/NAME`` (only names of folders there);
    - an existing local folder, which must hold a ``config.json``;
    - otherwise a Hugging Face Hub id ``ORG/NAME``: its snapshot in the hub's cache, downloaded on first use
      (``huggingface_hub.snapshot_download``; ``HF_HUB_CACHE``/``HF_HOME``, ``HF_HUB_OFFLINE`` and ``HF_TOKEN``
      apply). Weight files in other formats than safetensors are not downloaded (``HUB_IGNORE``);
    - a LoRA adapter folder (peft's ``adapter_config.json``, no ``config.json``: a LoRA run's checkpoint ``actor/``,
      ``rlforge export --adapter``, a peft adapter on the Hub): the folder of the base model it names
      (``base_model_name_or_path``), whose config and weights ``load_model`` loads before applying the adapter.
    """
    folder = _local_folder(path, key)
    if (folder / "config.json").is_file():
        return folder
    if adapter_folder(path, key) is None:
        from rlforge.checkpoint import list_checkpoints

        hint = (f" It holds {CHECKPOINT_ACTOR}/: a checkpoint's model is its {CHECKPOINT_ACTOR}/ folder "
                f"({key}={Path(path) / CHECKPOINT_ACTOR})." if (folder / CHECKPOINT_ACTOR).is_dir() else "")
        latest = list_checkpoints(folder)[-1:]
        if latest and not hint:
            hint = (f" It is a run folder: its latest checkpoint's model is {key}="
                    f"{Path(path) / latest[0].relative_to(folder) / CHECKPOINT_ACTOR}.")
        raise RLForgeError(f"Model path '{path}' has no config.json: not a Hugging Face model folder, and no "
                           f"{ADAPTER_CONFIG}: not a LoRA adapter ({key}).{hint}")
    problem = safetensors_problem(folder / ADAPTER_WEIGHTS) if (folder / ADAPTER_WEIGHTS).exists() else None
    if problem:
        raise RLForgeError(f"Cannot load the LoRA adapter '{path}' ({key}): {problem}. Copy the folder again.")
    base = adapter_base(folder, key)
    found = _local_folder(base, f"the base model of {key}={path}")
    if not (found / "config.json").is_file():
        raise RLForgeError(f"The base model '{base}' of the LoRA adapter '{path}' ({key}, base_model_name_or_path in "
                           f"{ADAPTER_CONFIG}) has no config.json: the base must be a Hugging Face model folder, "
                           f"builtin:NAME or a Hub id, not another adapter.")
    return found


def model_name(folder: str) -> str:
    """How a model folder is named where it is loaded elsewhere: ``builtin:NAME`` for a shipped model, ``ORG/NAME``
    for a snapshot in the Hub's cache (``models--ORG--NAME/snapshots/REV``), else ``folder`` as it is."""
    path = Path(folder).expanduser()
    if path.parent.resolve() == ASSETS.resolve() and (path / "config.json").is_file():
        return f"{BUILTIN_PREFIX}{path.name}"
    cached = re.fullmatch(r"models--(.+?)--(.+)", path.parent.parent.name) if path.parent.name == "snapshots" else None
    return f"{cached[1]}/{cached[2]}" if cached else folder


def is_local_path(path: str | None) -> bool:
    """Whether ``path`` names a folder of this machine (not ``builtin:NAME`` or a Hub id): it loads only here."""
    return bool(path) and not path.startswith(BUILTIN_PREFIX) and not (HUB_ID.fullmatch(path)
                                                                        and not Path(path).exists())


def _local_folder(path: str, key: str) -> Path:
    """The local folder ``path`` names (``builtin:NAME``, a folder, a Hub id's snapshot), which must exist."""
    if path.startswith(BUILTIN_PREFIX):
        return _builtin_folder(path, key)
    folder = Path(path).expanduser()
    if not folder.exists() and HUB_ID.fullmatch(path):
        folder = hub_snapshot(path, key)
    if not folder.exists():
        raise RLForgeError(f"Model path '{path}' does not exist ({key}).")
    if not folder.is_dir():
        raise RLForgeError(f"Model path '{path}' ({key}) is a file; give the model's folder (config.json, weights, "
                           "tokenizer), a builtin:NAME or a Hub id.")
    return folder


def adapter_folder(path: str, key: str = "model.path") -> Path | None:
    """The LoRA adapter folder that ``path`` names (``adapter_config.json`` and no ``config.json``), else None."""
    folder = _local_folder(path, key)
    return folder if (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file() else None


def adapter_base(folder: Path, key: str = "model.path") -> str:
    """The base model (``base_model_name_or_path``) that the adapter folder's ``adapter_config.json`` names."""
    config = folder / ADAPTER_CONFIG
    try:
        found = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise RLForgeError(f"{config} cannot be read as JSON ({key}): the adapter folder is damaged.") from None
    base = found.get("base_model_name_or_path") if isinstance(found, dict) else None
    if not isinstance(base, str) or not base:
        raise RLForgeError(f"{config} names no base model (base_model_name_or_path) ({key}): set it to the base "
                           f"model's folder or Hub id, the model the adapter was trained on.")
    return base


def _builtin_folder(path: str, key: str) -> Path:
    known = sorted(p.name for p in ASSETS.iterdir() if p.is_dir()) if ASSETS.is_dir() else []
    name = path[len(BUILTIN_PREFIX):]
    if name not in known:  # a name, never a path: builtin:../x cannot leave the assets folder
        raise RLForgeError(f"Unknown built-in model '{path}' ({key}). Built-in models: {known}.")
    return ASSETS / name


def hub_snapshot(repo_id: str, key: str = "model.path") -> Path:
    """The local snapshot folder of the Hub model ``repo_id``, from the cache or downloaded into it."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    where = f"the Hugging Face cache {constants.HF_HUB_CACHE} (HF_HUB_CACHE, HF_HOME)"
    try:
        return Path(snapshot_download(repo_id, ignore_patterns=HUB_IGNORE))
    except LocalEntryNotFoundError:
        why = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
               else f"the Hub ({constants.ENDPOINT}) cannot be reached")
        raise RLForgeError(
            f"Model '{repo_id}' ({key}) is not a local folder and not in {where}, and {why}. Download it where "
            f"the Hub is reachable (`hf download {repo_id}`) with the same cache folder, or set {key} to a "
            f"local model folder."
        ) from None
    except RepositoryNotFoundError:  # also gated and private models without a token
        raise RLForgeError(
            f"Model '{repo_id}' ({key}) is not a local folder, and the Hugging Face Hub has no model by that name "
            f"that you can access (a gated or private model needs `hf auth login` or HF_TOKEN)."
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise RLForgeError(f"Model '{repo_id}' ({key}) could not be downloaded into {where}: "
                           f"{type(exc).__name__}: {exc}") from None


def build_char_tokenizer() -> Any:
    """A character-level fast tokenizer over printable ASCII, with a chat template and EOS ``<|end|>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character, newlines too
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|end|>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_llama(tokenizer: Any, hidden: int = 128, layers: int = 4, heads: int = 2, ffn: int = 512) -> Any:
    """A randomly initialised Llama-style causal LM (head_dim = hidden / heads; 64 by default)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


EOT_PROBE = "rlforge end-of-turn probe"  # an assistant message rendered to find the token that closes it


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template closes an assistant message with (``<|im_end|>`` in ChatML,
    ``<|eot_id|>`` in Llama 3), or None when the template has none or cannot render such a conversation."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": EOT_PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # any template error: a template that needs other messages still stops at its EOS
        return None
    _, probe, tail = text.rpartition(EOT_PROBE)
    if not probe:
        return None
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return next((i for i in tokenizer.encode(tail, add_special_tokens=False) if i in special), None)


def stop_token_ids(tokenizer: Any, model: Any = None, generation_config: Any = None) -> list[int]:
    """Every token id that ends a response: ``model.generation_config.eos_token_id`` (an id or a list; or that of
    ``generation_config``), the tokenizer's EOS and the chat template's end-of-turn token (``end_of_turn_id``),
    without repeats.

    Chat models often end a turn with a token that is not the tokenizer's ``eos_token`` (Llama 3's
    ``<|eot_id|>``, ChatML's ``<|im_end|>``) and list it in ``generation_config.json`` only.
    """
    eos = getattr(generation_config or getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    ids += [tokenizer.eos_token_id, end_of_turn_id(tokenizer)]
    found = list(dict.fromkeys(int(i) for i in ids if i is not None))
    if not found:
        raise RLForgeError(
            "The model has no stop token: its tokenizer has no eos_token, generation_config.json no eos_token_id, "
            "and its chat template closes an assistant message with no special token (model.path)."
        )
    return found


def rollout_stop_ids(config: Any, tokenizer: Any, model: Any) -> list[int]:
    """The tokens that end a rollout engine's responses: :func:`stop_token_ids`, none with ``rollout.ignore_eos``
    (the responses run to ``rollout.max_new_tokens``, as verl's ``ignore_eos``)."""
    return [] if config.rollout.ignore_eos else stop_token_ids(tokenizer, model)


def generation_stop_ids(tokenizer: Any, path: str, trust_remote_code: bool = False) -> list[int]:
    """:func:`stop_token_ids` of the model at ``path`` without loading its weights: from the generation config it
    loads with (``generation_config.json``, else the one transformers derives from ``config.json``)."""
    from transformers import AutoConfig, GenerationConfig

    folder = resolve_model_path(path)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:  # no generation_config.json
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(
            folder, trust_remote_code=trust_remote_code))
    return stop_token_ids(tokenizer, generation_config=generation)


def model_stop_ids(config: Any, tokenizer: Any) -> set[int]:
    """:func:`generation_stop_ids` of ``config.model`` (its path and ``trust_remote_code``): the tokens that end
    the run's responses, read without loading the weights."""
    return set(generation_stop_ids(tokenizer, config.model.path, config.model.trust_remote_code))


def quiet_transformers() -> None:
    """No per-file progress bars from transformers: rlforge prints its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_tokenizer(path: str, trust_remote_code: bool = False, key: str = "model.path",
                   chat_template: str | None = None) -> Any:
    """The tokenizer of a model folder (left padding, a pad token), checked to fit the model's vocabulary. A LoRA
    adapter folder's own tokenizer when it holds one (a LoRA checkpoint does), else its base model's.
    ``chat_template`` (``model.chat_template``) replaces the folder's chat template, or gives one to a folder
    without any."""
    from transformers import AutoTokenizer

    folder = resolve_model_path(path, key)
    adapter = adapter_folder(path, key)
    source = adapter if adapter is not None and (adapter / "tokenizer_config.json").is_file() else folder
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise RLForgeError(f"Cannot load a tokenizer from '{path}' ({key}): {type(exc).__name__}: {first_line(exc)}. "
                           "The folder needs the tokenizer files (tokenizer.json or the model's vocabulary files and "
                           "tokenizer_config.json) beside config.json.") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if chat_template:  # checked when the config composed (rlforge.config.checks.check_chat_template)
        tok.chat_template = chat_template
    if not getattr(tok, "chat_template", None):
        raise RLForgeError(
            f"The tokenizer in '{path}' has no chat template ({key}); rlforge applies the chat template to "
            f"every prompt. Add one to tokenizer_config.json, or set model.chat_template."
        )
    tok.padding_side = "left"
    check_vocabulary(folder, tok, path, key)
    return tok


def load_tokenizer_and_processor(config: Any) -> tuple[Any, Any]:
    """The tokenizer of ``model.path`` and its processor (a vision-language model's; None for a text model), both
    with ``model.chat_template`` in place of the model's own chat template when it is set."""
    m = config.model
    tokenizer = load_tokenizer(m.path, trust_remote_code=m.trust_remote_code, chat_template=m.chat_template)
    processor = load_processor(m.path, tokenizer, trust_remote_code=m.trust_remote_code)
    if m.chat_template and processor is not None:
        processor.chat_template = m.chat_template
    return tokenizer, processor


def load_processor(path: str, tokenizer: Any, trust_remote_code: bool = False, key: str = "model.path") -> Any:
    """The processor of a vision-language model folder (one with ``preprocessor_config.json``), else None."""
    from rlforge.multimodal import load_processor as load

    return load(resolve_model_path(path, key), tokenizer, trust_remote_code)


def frozen_model_device(name: str) -> torch.device:
    """Where a frozen model (a reward model, a teacher, a local judge) runs: ``auto`` is the GPU when there is one,
    else the CPU; other names (``cpu``, ``cuda``, ``cuda:N``; ``rlforge.config.checks.check_device``) as given."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def model_vocab_size(folder: Path) -> int | None:
    """The embedding rows ``config.json`` declares (``vocab_size``, or its ``text_config``'s), or None."""
    config = model_config(folder)
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) else None


def check_vocabulary(folder: Path, tokenizer: Any, path: str, key: str = "model.path",
                     tokenizer_key: str | None = None) -> None:
    """The model has an embedding row for every token id its tokenizer can produce: else the first such token
    stops the run with an ``IndexError`` deep in the forward pass. Read from ``config.json``: no model loaded.
    ``tokenizer_key``: where ``tokenizer`` comes from when it is another model's (PRIME's PRM scores the policy's
    tokens: ``model.path``); None: the model's own."""
    size = model_vocab_size(folder)
    if size is not None and len(tokenizer) > size:
        if tokenizer_key:
            raise RLForgeError(
                f"The model in '{path}' ({key}) has a vocabulary of {size} tokens (config.json vocab_size) but the "
                f"tokenizer of {tokenizer_key} has {len(tokenizer)}: token ids {size} to {len(tokenizer) - 1} would "
                f"have no embedding. {key} scores the tokens of {tokenizer_key}: give a model with its vocabulary."
            )
        raise RLForgeError(
            f"The model in '{path}' ({key}) has a vocabulary of {size} tokens (config.json vocab_size) but its "
            f"tokenizer has {len(tokenizer)}: token ids {size} to {len(tokenizer) - 1} have no embedding. Resize the "
            f"embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer)), then save_pretrained), or "
            f"use the tokenizer the model was trained with."
        )


SCORING_HEADS = ("ForSequenceClassification", "ForTokenClassification")  # reward and value models: no LM head


def model_config(folder: Path) -> dict[str, Any]:
    """A model folder's ``config.json`` as a dict (empty when it has none or it is not a JSON object)."""
    config = Path(folder) / "config.json"
    try:
        found = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except ValueError:
        raise RLForgeError(f"{config} is not valid JSON: the model folder is damaged.") from None
    return found if isinstance(found, dict) else {}


def architectures(folder: Path) -> list[str]:
    """The ``architectures`` of a model folder's ``config.json`` (empty when it has none)."""
    return list(model_config(folder).get("architectures") or [])


def _load_failure(what: str, path: str, key: str, exc: Exception) -> RLForgeError:
    """The one-line error for a model ``from_pretrained`` could not load (the first line of its message)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return RLForgeError(f"Cannot load {what} from '{path}' ({key}): {type(exc).__name__}: {first}")


def _loader_errors() -> tuple[type[Exception], ...]:
    """What ``from_pretrained`` raises for a damaged or foreign folder (safetensors' own error included)."""
    from safetensors import SafetensorError

    return (OSError, ValueError, SafetensorError)


def override_config(config: Any, overrides: Any, key: str = "model.config_overrides") -> None:
    """Set ``overrides`` (a dict) on a transformers config; a dict given for a sub-config (``text_config``)
    updates it. A field the config does not have is an error naming it (a misspelt name would change nothing)."""
    for name, value in overrides.items():
        current = getattr(config, name, None)
        if not hasattr(config, name):
            raise ConfigError(f"{key}.{name}: the model's config ({type(config).__name__}) has no field '{name}'. "
                               f"Its fields: {', '.join(sorted(config.to_dict()))}.")
        if isinstance(value, dict) and hasattr(current, "to_dict"):
            override_config(current, value, f"{key}.{name}")
        else:
            setattr(config, name, value)


def load_model(path: str, dtype: str = "float32", trust_remote_code: bool = False,
               with_adapter: bool = True, key: str = "model.path", overrides: Any = None) -> torch.nn.Module:
    """The causal LM (or vision-language model) of ``path``. A LoRA adapter folder is its base model with the
    adapter merged in; with ``with_adapter=False`` the base model alone, for ``lora.wrap`` to go on training the
    adapter (``RLModule.configure_model``). ``key``: the config key that gave ``path``, named in errors.
    ``overrides``: fields of its config set before the model is built (``model.config_overrides``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    quiet_transformers()
    folder = resolve_model_path(path, key)
    scoring = [a for a in architectures(folder) if a.endswith(SCORING_HEADS)]
    if scoring:
        raise RLForgeError(f"'{path}' ({key}) is a {scoring[0]}: a reward or value model scores sequences and cannot "
                           f"give token log-probs. Give a causal LM as {key}; use a reward model as reward.model.path "
                           f"(reward.manager=model).")
    check_weights(folder, path, key)
    # a vision-language model (a vision_config: docs/multimodal.md) loads with its vision tower
    auto = AutoModelForImageTextToText if "vision_config" in model_config(folder) else AutoModelForCausalLM
    try:
        extra: dict[str, Any] = {}
        if overrides:
            from omegaconf import OmegaConf

            extra["config"] = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
            override_config(extra["config"], OmegaConf.to_container(OmegaConf.create(overrides), resolve=True))
        model = auto.from_pretrained(folder, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, **extra)
    except _loader_errors() as exc:
        raise _load_failure("a causal LM", path, key, exc) from None
    return _merged_adapter(model, path, key) if with_adapter else model


def _merged_adapter(model: torch.nn.Module, path: str, key: str) -> torch.nn.Module:
    """``model`` with the LoRA adapter of ``path`` merged in, when ``path`` is an adapter folder (else as it is)."""
    from rlforge import lora

    adapter = adapter_folder(path, key)
    return model if adapter is None else lora.merge_adapter(model, adapter, f"{key}={path}")


def load_value_model(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> torch.nn.Module:
    """A value model: the causal LM's body with a fresh scalar head (``...ForTokenClassification``, 1 label)."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    quiet_transformers()
    folder = resolve_model_path(path, "critic.path")
    check_weights(folder, path, "critic.path")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh value head is expected: no "newly initialized" report
    try:
        from transformers import AutoConfig

        # classifier_dropout=0: transformers' token-classification head drops 10% of its input by default, which in the
        # critic's train mode makes every value (and the value loss) random; verl's critic sets it to 0 as well
        config = AutoConfig.from_pretrained(folder, num_labels=1, trust_remote_code=trust_remote_code)
        config.classifier_dropout = 0.0
        model = AutoModelForTokenClassification.from_pretrained(
            folder, config=config, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        )
    except _loader_errors() as exc:
        raise _load_failure("a value model", path, "critic.path", exc) from None
    finally:
        hf_logging.set_verbosity(level)
    return _merged_adapter(model, path, "critic.path")  # a LoRA policy's adapter: the critic starts from the policy


def load_reward_model(path: str, pad_token_id: int, dtype: str = "float32", trust_remote_code: bool = False,
                      key: str = "model.path") -> torch.nn.Module:
    """A reward model: ``...ForSequenceClassification`` with one label. From a causal LM's folder the head is new
    (reward-model training); from a reward model's folder it is the trained one. ``pad_token_id`` is set in the
    model's config: the model pools its score at each row's last token that is not padding."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    quiet_transformers()
    folder = resolve_model_path(path, key)
    check_weights(folder, path, key)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a fresh score head is expected when starting from a causal LM
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            folder, num_labels=1, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        )
    except _loader_errors() as exc:
        raise _load_failure("a sequence-classification reward model", path, key, exc) from None
    finally:
        hf_logging.set_verbosity(level)
    model = _merged_adapter(model, path, key)
    model.config.pad_token_id = pad_token_id
    return model
