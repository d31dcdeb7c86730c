"""Model and tokenizer loading, and the project's own tiny char-level Llama (no model hub needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge.errors import RLForgeError
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

BUILTIN_PREFIX = "builtin:"
ASSETS = Path(__file__).parent / "assets"

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
    """``builtin:NAME`` -> the shipped asset folder; otherwise the folder itself, which must exist.

    ``key`` is the config key named in errors.
    """
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        folder = ASSETS / name
        if not folder.is_dir():
            known = sorted(p.name for p in ASSETS.iterdir() if p.is_dir()) if ASSETS.is_dir() else []
            raise RLForgeError(f"Unknown built-in model '{path}' ({key}). Built-in models: {known}.")
        return folder
    folder = Path(path).expanduser()
    if not folder.exists():
        raise RLForgeError(f"Model path '{path}' does not exist ({key}).")
    if not (folder / "config.json").is_file():
        raise RLForgeError(f"Model path '{path}' has no config.json: not a Hugging Face model folder ({key}).")
    return folder


def build_char_tokenizer() -> Any:
    """A character-level fast tokenizer over printable ASCII, with a chat template and EOS ``<|end|>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
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


def quiet_transformers() -> None:
    """No per-file progress bars from transformers: rlforge prints its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    folder = resolve_model_path(path)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        raise RLForgeError(
            f"The tokenizer in '{path}' has no chat template (model.path); rlforge applies the chat template to "
            f"every prompt. Add one to tokenizer_config.json."
        )
    tok.padding_side = "left"
    return tok


def load_model(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    folder = resolve_model_path(path)
    try:
        return AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise RLForgeError(f"Cannot load a causal LM from '{path}' (model.path): {exc}") from None


def load_value_model(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> torch.nn.Module:
    """A value model: the causal LM's body with a fresh scalar head (``...ForTokenClassification``, 1 label)."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    quiet_transformers()
    folder = resolve_model_path(path, "critic.path")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh value head is expected: no "newly initialized" report
    try:
        return AutoModelForTokenClassification.from_pretrained(
            folder, num_labels=1, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise RLForgeError(f"Cannot load a value model from '{path}' (critic.path): {exc}") from None
    finally:
        hf_logging.set_verbosity(level)
