"""rlforge.models: model paths (builtin names, local folders, Hugging Face Hub ids through the hub's cache) and
the tiny Qwen2 chat model of rlforge.tools.tiny_chat; model.config_overrides."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlforge.errors import RLForgeError
from rlforge.models import ASSETS, resolve_model_path

REV = "0123456789abcdef0123456789abcdef01234567"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "content": '{"celsius": 21}'},
    {"role": "tool", "content": '{"celsius": 4}'},
    {"role": "assistant", "content": "21 and 4 degrees."},
]


# --- builtin: names -------------------------------------------------------------------------------------------
def test_builtin_names_resolve_to_asset_folders():
    assert resolve_model_path("builtin:tiny-arith") == ASSETS / "tiny-arith"


@pytest.mark.parametrize("path", ["builtin:../../..", "builtin:..", "builtin:", "builtin:tiny-arith/../tiny-arith",
                                  "builtin:/etc", "builtin:tiny-arith/"])
def test_builtin_paths_cannot_leave_the_assets_folder(path):
    with pytest.raises(RLForgeError, match=rf"Unknown built-in model '{path}' \(model.path\). Built-in models: "
                                           rf"\['tiny-agent', 'tiny-arith', 'tiny-vlm'\]"):
        resolve_model_path(path)


# --- Hugging Face Hub ids -------------------------------------------------------------------------------------
def _cache_model(cache: Path, repo_id: str, source: Path) -> Path:
    """Put ``source``'s files into ``cache`` the way huggingface_hub stores a download: content-addressed blobs,
    a snapshot folder of symlinks to them, and refs/main naming the snapshot's revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REV
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    return snapshot


RESOLVE = """
import json, sys
from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.models import load_tokenizer, resolve_model_path
args = json.loads(sys.argv[1])
out = {"generate": main(["generate", *args["generate"]]) if args["generate"] else None}
for repo_id in args["ids"]:
    try:
        out[repo_id] = str(resolve_model_path(repo_id))
        out[repo_id + " tokens"] = load_tokenizer(repo_id)("What is 1+2?")["input_ids"]
    except RLForgeError as exc:
        out[repo_id] = "error: " + str(exc)
print(json.dumps(out))
"""


def _resolve_in_fresh_process(env: dict[str, str], ids: list[str], generate: list[str] | None = None) -> dict:
    """Resolve ``ids`` (and run ``rlforge generate`` with the ``generate`` arguments) in a fresh interpreter:
    huggingface_hub reads its environment once, at import."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    args = json.dumps({"ids": ids, "generate": generate})
    done = subprocess.run([sys.executable, "-c", RESOLVE, args], env={**clean, **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hub_ids_resolve_from_the_cache_offline(tiny_chat_model, tmp_path):
    from transformers import AutoTokenizer

    snapshot = _cache_model(tmp_path / "home" / "hub", "tiny-org/Tiny-Chat-Instruct", tiny_chat_model)
    env = {"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    prompts, samples = tmp_path / "prompts.jsonl", tmp_path / "samples.jsonl"
    prompts.write_text('{"prompt": "What is 1+2?"}\n')
    out = _resolve_in_fresh_process(env, ["tiny-org/Tiny-Chat-Instruct", "tiny-org/Not-Cached"],
                                    ["tiny-org/Tiny-Chat-Instruct", "--data", str(prompts), "--out", str(samples)])
    assert out["generate"] == 0 and json.loads(samples.read_text())["prompt"] == [
        {"role": "user", "content": "What is 1+2?"}]
    assert out["tiny-org/Tiny-Chat-Instruct"] == str(snapshot)
    assert out["tiny-org/Tiny-Chat-Instruct tokens"] == AutoTokenizer.from_pretrained(tiny_chat_model)("What is 1+2?")[
        "input_ids"]
    error = out["tiny-org/Not-Cached"]
    assert error.startswith("error: Model 'tiny-org/Not-Cached' (model.path) is not a local folder and not in the "
                            f"Hugging Face cache {tmp_path / 'home' / 'hub'}")
    assert "HF_HUB_OFFLINE is set" in error and "hf download tiny-org/Not-Cached" in error


def test_hub_ids_when_the_hub_is_unreachable(tiny_chat_model, tmp_path):
    snapshot = _cache_model(tmp_path / "cache", "tiny-org/Tiny-Chat-Instruct", tiny_chat_model)
    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2",
           "HF_HUB_DOWNLOAD_TIMEOUT": "2"}
    out = _resolve_in_fresh_process(env, ["tiny-org/Tiny-Chat-Instruct", "tiny-org/Not-Cached"])
    assert out["tiny-org/Tiny-Chat-Instruct"] == str(snapshot)  # the cached copy serves
    error = out["tiny-org/Not-Cached"]
    assert f"is not a local folder and not in the Hugging Face cache {tmp_path / 'cache'}" in error
    assert "the Hub (http://127.0.0.1:9) cannot be reached" in error


def test_local_folders_win_over_hub_ids(tmp_path, monkeypatch):
    (tmp_path / "org" / "model").mkdir(parents=True)
    (tmp_path / "org" / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("org/model") == Path("org/model")
    with pytest.raises(RLForgeError, match="Model path '/no/such/model' does not exist"):
        resolve_model_path("/no/such/model")  # not an ORG/NAME id: never sent to the hub


# --- the tiny chat model ----------------------------------------------------------------------------------------
def test_tiny_chat_model_loads_with_auto_classes(tiny_chat_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from rlforge.tools.tiny_chat import build_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_chat_model)
    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    assert type(model).__name__ == "Qwen2ForCausalLM" and type(tok).__name__ == "Qwen2Tokenizer"
    c = model.config
    assert c.hidden_size // c.num_attention_heads == 64 and c.vocab_size % 64 == 0 and c.vocab_size >= len(tok)
    assert c.num_key_value_heads < c.num_attention_heads and c.tie_word_embeddings  # GQA, tied: as Qwen2.5-0.5B
    text = 'Hi <|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<tool_call>\n{"name": "f"}\n</tool_call> é'
    assert tok(text)["input_ids"] == build_tokenizer()(text)["input_ids"]  # the ids built are the ids loaded
    eot, eos = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>"
    assert GenerationConfig.from_pretrained(tiny_chat_model).eos_token_id == [eot, eos]
    ids = tok(text)["input_ids"]
    for token in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]:
        assert tok.convert_tokens_to_ids(token) in ids  # one token each
    # ChatML markers are special (dropped when decoding), tool tags stay in the text (parsable tool calls)
    assert tok.decode(ids, skip_special_tokens=True) == 'Hi user\nWhat is 12 + 7?\n<tool_call>\n{"name": "f"}\n' \
                                                        '</tool_call> é'


def test_tiny_chat_template_renders_tools_calls_and_responses(tiny_chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    system, user, call, response, answer, prompt = text.split("<|im_start|>")[1:]
    assert system.startswith("system\nYou are a helpful assistant.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in system and system.endswith("</tool_call><|im_end|>\n")
    assert user == "user\nWeather in Paris and Oslo?<|im_end|>\n"
    assert call == ('assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                    '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                    "</tool_call><|im_end|>\n")
    assert response == ('user\n<tool_response>\n{"celsius": 21}\n</tool_response>\n<tool_response>\n{"celsius": 4}\n'
                        "</tool_response><|im_end|>\n")
    assert answer == "assistant\n21 and 4 degrees.<|im_end|>\n" and prompt == "assistant\n"
    plain = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                    tokenize=False)
    assert plain == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_tiny_chat_model_is_deterministic(tiny_chat_model, tmp_path):
    from rlforge.tools.tiny_chat import build_tiny_chat_model

    again = build_tiny_chat_model(tmp_path / "again")
    for name in ["tokenizer.json", "model.safetensors", "generation_config.json", "chat_template.jinja"]:
        assert (again / name).read_bytes() == (tiny_chat_model / name).read_bytes(), name


def test_build_script(tmp_path):
    script = Path(__file__).resolve().parent.parent / "scripts" / "build_tiny_chat_model.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote the tiny chat model to {tmp_path / 'm'}" in done.stdout
    assert (tmp_path / "m" / "config.json").is_file()


def test_a_reward_model_is_refused_as_a_policy(tmp_path):
    from rlforge.models import load_model

    config = json.loads((resolve_model_path("builtin:tiny-arith") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(RLForgeError, match="is a LlamaForSequenceClassification: a reward or value model scores"):
        load_model(str(tmp_path))


def test_config_overrides_reach_the_policy_and_the_context_check(pm):
    from rlforge import load_config
    from rlforge.errors import ConfigError
    from rlforge.models import load_model

    with pytest.raises(ConfigError, match="exceed the context of model.path: max_position_embeddings = 256"):
        load_config("grpo", ["rollout.max_new_tokens=300"], plugins=pm)
    cfg = load_config("grpo", ["rollout.max_new_tokens=300", "model.config_overrides.max_position_embeddings=512"],
                      plugins=pm)  # verl's model.override_config.max_position_embeddings
    assert load_model(cfg.model.path, overrides=cfg.model.config_overrides).config.max_position_embeddings == 512
    with pytest.raises(ConfigError, match=r"exceed the context of model.path: max_position_embeddings "
                                          r"\(model.config_overrides\) = 320"):
        load_config("grpo", ["rollout.max_new_tokens=300", "model.config_overrides.max_position_embeddings=320"],
                    plugins=pm)
    with pytest.raises(ConfigError, match=r"model.config_overrides.max_position_embedding: the model's config "
                                          r"\(LlamaConfig\) has no field 'max_position_embedding'"):
        load_model(cfg.model.path, overrides={"max_position_embedding": 512})


def test_model_chat_template_replaces_the_tokenizers_and_the_processors(pm):
    """``model.chat_template`` (verl's model.custom_chat_template): what every prompt and agent turn is rendered with."""
    from rlforge import load_config
    from rlforge.config import verl
    from rlforge.models import load_tokenizer_and_processor

    template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if tools %}[tools]{% endif %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    messages = [{"role": "user", "content": "hi"}]
    for path in ("builtin:tiny-arith", "builtin:tiny-vlm"):
        cfg = load_config("grpo", [f"model.path={path}", f'model.chat_template="{template}"'], plugins=pm)
        tok, proc = load_tokenizer_and_processor(cfg)
        for renderer in [tok, *([proc] if proc is not None else [])]:
            assert renderer.apply_chat_template(messages, tools=[{"type": "function", "function": {"name": "f"}}],
                                                tokenize=False, add_generation_prompt=True) == "[user]hi[tools][assistant]"
    from tests.tools.test_from_verl import tr

    assert tr(f'actor_rollout_ref.model.custom_chat_template="{template}"').overrides["model.chat_template"] == template


def test_the_char_tokenizer_keeps_every_newline() -> None:  # a run of newlines was one unknown token
    from transformers import AutoTokenizer

    from rlforge.models import build_char_tokenizer, resolve_model_path

    for tok in (build_char_tokenizer(), AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-arith"))):
        ids = tok("a\n\nb")["input_ids"]
        assert len(ids) == 4 and tok.decode(ids) == "a\n\nb"
