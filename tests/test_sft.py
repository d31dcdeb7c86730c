"""``rlforge sft`` on Lightning: row formats and their loss masks (hand-checked positions), the learning-rate
schedule, resume equality, loss falls, invariance to micro-batching, mlflow read-back, validation, errors."""

from __future__ import annotations

import json
import math
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlforge import load_config
from rlforge.config.schema import SFTConfig
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.models import build_char_tokenizer, build_tiny_llama
from rlforge.sft import run_sft
from rlforge.sft.formats import (FORMATS, Example, Keys, conversation, prompt_response, row_format, truncate,
                                 turn_sequences)
from rlforge.sft.module import SFTModule
from rlforge.sft.run import apply_epochs, check_config
from rlforge.sft.order import EpochOrder, RandomOrder
from tests.tools.test_export import bf16_model, check_as_loaded  # noqa: F401 (a fixture)

FAST = ["data.arith.train_size=32", "data.arith.val_size=8", "sft.batch_size=8", "sft.steps=4", "sft.warmup_steps=1",
        "sft.progress=false", "sft.loggers=[]", "sft.save_every=0", "sft.val_accuracy=false"]

CHATML = (
    "{% if tools %}<|im_start|>system\nT:{% for t in tools %}{{ t['name'] }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool>{{ c['function']['name'] }}</tool>{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_CALL = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
CHAT = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": None, "tool_calls": TOOL_CALL},
    {"role": "tool", "content": "R"},
    {"role": "assistant", "content": "B"},
]


@pytest.fixture(scope="module")
def chatml():
    """The char tokenizer with ChatML-style turns: an end-of-turn token followed by a newline of glue."""
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


def runs(example: Example, tok) -> list[tuple[int, str]]:
    """(start, decoded text) of each run of trained positions."""
    out, start = [], None
    for i, m in enumerate([*example.mask, 0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, tok.decode(example.ids[start:i])))
            start = None
    return out


def save_small_model(folder, heads: int = 1):
    """A one-layer char-level Llama saved as a Hugging Face folder in ``folder``: SFT from a model folder, and fast."""
    tokenizer = build_char_tokenizer()
    build_tiny_llama(tokenizer, hidden=64, layers=1, heads=heads, ffn=128).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("small_model"))


@pytest.fixture
def sft_config(small_model):
    def make(out, *extra):
        return load_config(overrides=[*FAST, f"sft.init={small_model}", f"sft.output_dir={out / 'out'}", *extra])

    return make


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# --- formats -------------------------------------------------------------------------------------------------
def test_prompt_response_trains_the_response_and_eos(char_tokenizer):
    row = {"prompt": [{"role": "user", "content": "1+1"}], "response": "2"}
    ex = prompt_response(row, char_tokenizer, Keys(), "row 1")
    # <|user|>=5 '1'=24 '+'=18 '1'=24 <|end|>=2 <|assistant|>=6 | '2'=25 <|end|>=2  (char id = 7 + ord - 32)
    assert ex.ids == [5, 24, 18, 24, 2, 6, 25, 2]
    assert ex.mask == [0, 0, 0, 0, 0, 0, 1, 1]
    assert ex.trained == 2
    # a plain-string prompt is one user message
    assert prompt_response({"prompt": "1+1", "response": "2"}, char_tokenizer, Keys(), "row 1") == ex


def test_nested_keys_as_verl_extra_info(char_tokenizer):
    row = {"extra_info": {"question": "1+1", "answer": "2"}}
    ex = prompt_response(row, char_tokenizer, Keys("extra_info.question", "extra_info.answer"), "row 1")
    assert ex.ids == [5, 24, 18, 24, 2, 6, 25, 2]
    with pytest.raises(DataError, match=r"f.jsonl, row 3: missing 'extra_info.answer' \(sft.response_key\)"):
        prompt_response({"extra_info": {"question": "q"}}, char_tokenizer,
                        Keys("extra_info.question", "extra_info.answer"), "f.jsonl, row 3")


def test_messages_train_assistant_turns_only(chatml):
    ex = conversation({"messages": CHAT}, chatml, Keys(), "row 1")
    assert chatml.decode(ex.ids) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<tool>f</tool>"
        "<|im_end|>\n<|im_start|>tool\nR<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n")
    # positions: system turn 11 tokens (start, 'system\n' 7, 'S', end, '\n'), user turn 9, '<|im_start|>assistant\n' 11
    # -> the tool call starts at 31: 14 chars + <|im_end|> = 15 tokens (31..45); '\n' at 46 is glue, tool turn 47..55,
    # '<|im_start|>assistant\n' 56..66, then 'B' 67 and <|im_end|> 68 are trained, the final '\n' (69) is not
    assert runs(ex, chatml) == [(31, "<tool>f</tool><|im_end|>"), (67, "B<|im_end|>")]
    assert len(ex.ids) == 70 and ex.trained == 17


@pytest.mark.parametrize("tools", ["calc", {"name": "f"}, ["f"], "[1, 2]"])
def test_tools_that_are_not_a_list_of_schemas_name_the_row(chatml, tools):
    with pytest.raises(DataError, match=r"row 7: 'tools' \(sft.tools_key\) must be a list of tool schemas"):
        conversation({"messages": CHAT[1:3], "tools": tools}, chatml, Keys(), "row 7")


def test_tools_as_a_json_string_are_read(chatml):
    as_list = conversation({"messages": CHAT[1:3], "tools": [{"name": "f"}]}, chatml, Keys(), "row 1")
    assert conversation({"messages": CHAT[1:3], "tools": '[{"name": "f"}]'}, chatml, Keys(), "row 1") == as_list


def test_messages_with_tools_and_the_tiny_template(chatml, char_tokenizer):
    ex = conversation({"messages": CHAT[1:3], "tools": [{"name": "f"}]}, chatml, Keys(), "row 1")
    assert chatml.decode(ex.ids).startswith("<|im_start|>system\nT:f<|im_end|>\n")
    assert runs(ex, chatml) == [(33, "<tool>f</tool><|im_end|>")]  # tools header 13 + user turn 9 + opener 11
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    ex = conversation({"messages": chat}, char_tokenizer, Keys(), "row 1")
    # <|user|>a<|end|><|assistant|>b<|end|><|user|>c<|end|><|assistant|>d<|end|>: no glue after <|end|>
    assert ex.mask == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1]


def test_bad_conversations_name_the_row(chatml):
    bad = {
        "no assistant message": [{"role": "user", "content": "q"}],
        "starts with an assistant": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}],
        r"role in \['system'": [{"role": "robot", "content": "q"}, {"role": "assistant", "content": "a"}],
        "needs a string 'content'": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}],
    }
    for match, messages in bad.items():
        with pytest.raises(DataError, match=f"data.jsonl, row 7: .*{match}"):
            conversation({"messages": messages}, chatml, Keys(), "data.jsonl, row 7")


def test_templates_that_rewrite_earlier_turns_or_reject_a_row():
    tok = build_char_tokenizer()  # a template that drops the content of past assistant turns
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{% if loop.last or m['role'] != 'assistant' %}"
                         "{{ m['content'] }}{% endif %}<|end|>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    # each turn against the history it is generated from: 'b' after 'a'; 'd' after 'a', an emptied 'b' and 'c'
    first, second = turn_sequences({"messages": chat}, tok, Keys(), "row 2")
    assert tok.decode(first.ids) == "<|user|>a<|end|><|assistant|>b<|end|>" and first.mask == [0, 0, 0, 0, 1, 1]
    assert tok.decode(second.ids) == "<|user|>a<|end|><|assistant|><|end|><|user|>c<|end|><|assistant|>d<|end|>"
    assert second.mask == [0] * 9 + [1, 1]
    with pytest.raises(DataError, match="row 2: the chat template renders earlier turns differently"):
        conversation({"messages": chat}, tok, Keys(), "row 2")
    tok.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(DataError, match="row 4: the chat template rejects this row: Conversation roles must alt.*"
                                        r"\(the roles it was given: user\)"):
        conversation({"messages": chat}, tok, Keys(), "row 4")


def test_truncation():
    ex = Example([1, 2, 3, 4], [0, 0, 1, 1])
    assert truncate(ex, 4, "error", "r") is ex
    assert truncate(ex, 3, "left", "r") == Example([2, 3, 4], [0, 1, 1])
    assert truncate(ex, 3, "right", "r") == Example([1, 2, 3], [0, 0, 1])
    assert truncate(ex, 3, "drop", "r") is None
    with pytest.raises(DataError, match="r: 4 tokens, over sft.max_length=3"):
        truncate(ex, 3, "error", "r")


def test_schedule_and_betas_reach_the_optimizer():
    # warm-up 2 of 6 steps from 0: 0/2, 1/2; then 0.1 + 0.9 * (1 + cos(pi * (step - 2) / 4)) / 2 (sft's defaults)
    s = OmegaConf.structured(SFTConfig(steps=6, warmup_steps=2, lr=1.0, betas=[0.9, 0.95]))
    configured = SFTModule(torch.nn.Linear(2, 2), s, ranks=1).configure_optimizers()
    opt, sched = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    assert opt.defaults["betas"] == (0.9, 0.95)
    rates = []
    for _ in range(7):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    cos = [0.1 + 0.45 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert rates == pytest.approx([0.0, 0.5, *cos])


def test_epochs_set_the_steps_from_the_examples():
    s = OmegaConf.structured(SFTConfig(epochs=3, batch_size=8))
    OmegaConf.set_readonly(s, True)
    assert apply_epochs(s, 50) == 3 * (50 // 8) and s.steps == 3 * (50 // 8)
    # epoch_limit ends the run after that many passes where it comes first; the schedule keeps sft.steps
    limited = OmegaConf.structured(SFTConfig(steps=12, epoch_limit=1, batch_size=4))
    assert apply_epochs(limited, 40) == 10 and limited.steps == 12
    assert apply_epochs(OmegaConf.structured(SFTConfig(steps=8, epoch_limit=1, batch_size=4)), 40) == 8
    with pytest.raises(ConfigError, match=r"sft.betas must be two numbers in \[0, 1\)"):
        check_config(OmegaConf.structured(SFTConfig(betas=[0.9, 1.5])))


def test_batch_orders_answer_any_step():
    epoch = EpochOrder(10, 3, seed=5)
    perm = [torch.randperm(10, generator=torch.Generator().manual_seed(5 + e)).tolist() for e in (0, 1)]
    # 3 batches per epoch from the permutation seeded with seed + epoch; the tenth example waits for a later epoch
    assert [epoch.batch(s) for s in range(4)] == [perm[0][0:3], perm[0][3:6], perm[0][6:9], perm[1][0:3]]
    assert epoch.batch(1) == perm[0][3:6]
    rng = random.Random(5)
    expected = [rng.sample(range(10), 3) for _ in range(4)]  # the old loop's draws: one stream, step after step
    order = RandomOrder(10, 3, seed=5)
    assert [order.batch(s) for s in range(4)] == expected
    assert order.batch(3) == expected[3] and order.batch(1) == expected[1]
    assert RandomOrder(10, 3, seed=5).batch(2) == expected[2]  # a resumed run replays the stream


# --- TRL's four dataset formats, TRL's column names and masks --------------------------------------------------
def test_trl_language_modelling_text_trains_every_token_and_eos(char_tokenizer):
    (ex,) = FORMATS["text"]({"text": "ab"}, char_tokenizer, Keys(), "row 1")
    assert ex.ids == [72, 73, 2] and ex.mask == [1, 1, 1]  # 'a' 'b' <|end|>: no template; EOS appended
    assert FORMATS["text"]({"text": "ab<|end|>"}, char_tokenizer, Keys(), "row 1") == [ex]  # not twice
    with pytest.raises(DataError, match=r"row 4: 'text' \(sft.text_key\) must be a non-empty string"):
        FORMATS["text"]({"text": ["ab"]}, char_tokenizer, Keys(), "row 4")


def test_trl_prompt_completion_strings_are_plain_text_with_completion_only_loss(char_tokenizer):
    (ex,) = FORMATS["prompt_completion"]({"prompt": "1+1=", "completion": "2"}, char_tokenizer, Keys(), "row 1")
    # '1' '+' '1' '=' as plain text (no chat template, unlike prompt/response), then '2' and EOS, trained
    assert ex.ids == [24, 18, 24, 36, 25, 2] and ex.mask == [0, 0, 0, 0, 1, 1]


def test_trl_conversational_prompt_completion_masks_what_the_completion_adds(chatml):
    row = {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
           "completion": [{"role": "assistant", "content": "B"}]}
    (ex,) = FORMATS["prompt_completion"](row, chatml, Keys(), "row 1")
    # TRL: mask = 0 over the prompt rendered with its generation prompt, 1 over the rest of the whole rendering
    head = chatml.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"]
    assert ex.ids[: len(head)] == list(head)
    assert chatml.decode(ex.ids) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                                     "<|im_start|>assistant\nB<|im_end|>\n")
    assert runs(ex, chatml) == [(len(head), "B<|im_end|>\n")]


def test_trl_columns_pick_the_format_and_mixed_rows_name_the_row(chatml):
    keys = Keys()
    assert row_format({"text": "x"}, "auto", keys) == "text"
    assert row_format({"prompt": "x", "completion": "y"}, "auto", keys) == "prompt_completion"
    assert row_format({"prompt": [], "completion": []}, "auto", keys) == "prompt_completion"
    assert row_format({"messages": []}, "auto", keys) == "messages"
    assert row_format({"prompt": "x", "response": "y", "text": "z"}, "auto", keys) == "prompt_response"
    with pytest.raises(DataError, match=r"f.jsonl, row 2: 'prompt' \(sft.prompt_key\) and 'completion' "
                                        r"\(sft.completion_key\) must both be strings or both be lists"):
        FORMATS["prompt_completion"]({"prompt": "Q", "completion": [{"role": "assistant", "content": "B"}]},
                                     chatml, keys, "f.jsonl, row 2")
    moody = build_char_tokenizer()  # a template that renders the prompt differently once a reply follows
    moody.chat_template = ("{% if messages[-1]['role'] == 'assistant' %}!{% endif %}{% for m in messages %}"
                           "{{ m['content'] }}{% endfor %}")
    with pytest.raises(DataError, match=r"row 3: the prompt's tokens are not the start .*the chat template renders"):
        FORMATS["prompt_completion"]({"prompt": [{"role": "user", "content": "Q"}],
                                      "completion": [{"role": "assistant", "content": "B"}]}, moody, keys, "row 3")


TRL_ROWS = {
    "text": lambda i: {"text": f"{i}+1={i + 1}"},
    "prompt_completion": lambda i: {"prompt": f"{i}+1=", "completion": str(i + 1)},
    "messages": lambda i: {"messages": [{"role": "user", "content": f"{i}+1"},
                                        {"role": "assistant", "content": str(i + 1)}]},
    "conversational_prompt_completion": lambda i: {"prompt": [{"role": "user", "content": f"{i}+1"}],
                                                   "completion": [{"role": "assistant", "content": str(i + 1)}]},
}


@pytest.mark.parametrize("fmt", list(TRL_ROWS))
def test_trl_dataset_files_train_as_they_are(tmp_path, pm, sft_config, fmt):
    path = write_jsonl(tmp_path / f"{fmt}.jsonl", [TRL_ROWS[fmt](i) for i in range(8)])
    m = run_sft(sft_config(tmp_path, f"sft.train_file={path}", "sft.steps=1"), pm)  # sft.format=auto
    assert math.isfinite(m["train/loss"])


class Rates(Callback):
    """The learning rate of each optimizer step."""

    def __init__(self):
        self.values = []

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.values.append(optimizer.param_groups[0]["lr"])


def test_an_epoch_limit_ends_the_run_and_the_schedule_keeps_sft_steps(tmp_path, pm, sft_config):
    """verl's SFT loop ends after total_epochs passes where total_training_steps would run longer: 8 rows in batches
    of 4 are 2 steps per epoch, so one epoch ends a 6-step run after 2 steps, its linear decay still over 6."""
    path = write_jsonl(tmp_path / "rows.jsonl", [TRL_ROWS["prompt_completion"](i) for i in range(8)])
    rates = Rates()
    run_sft(sft_config(tmp_path, f"sft.train_file={path}", "sft.batch_size=4", "sft.steps=6", "sft.epoch_limit=1",
                       "sft.lr=0.6", "sft.lr_scheduler=linear", "sft.warmup_steps=0"), pm, callbacks=[rates])
    assert rates.values == pytest.approx([0.6, 0.5])


# --- files: jsonl, verl parquet (single- and multi-turn), bad rows ----------------------------------------------
def test_verl_parquet_formats_train(tmp_path, pm, sft_config):
    single = tmp_path / "single.parquet"
    pq.write_table(pa.Table.from_pylist([{"extra_info": {"question": f"{i}+1", "answer": str(i + 1)}}
                                         for i in range(8)]), single)
    multi = tmp_path / "multi.parquet"  # parquet fills absent struct fields (tool_calls) with None
    pq.write_table(pa.Table.from_pylist([{"messages": CHAT[1:2] + [{"role": "assistant", "content": "B"}]}] * 8),
                   multi)
    m = run_sft(sft_config(tmp_path, f"sft.train_file={single}", "sft.prompt_key=extra_info.question",
                           "sft.response_key=extra_info.answer", "sft.steps=1"), pm)
    assert math.isfinite(m["train/loss"])
    m = run_sft(sft_config(tmp_path, f"sft.train_file={multi}", "sft.format=messages", "sft.steps=1"), pm)
    assert math.isfinite(m["train/loss"])


def test_the_output_has_the_dtypes_and_the_tokenizer_of_sft_init(tmp_path, pm, bf16_model):
    cfg = load_config(overrides=[*FAST, f"sft.init={bf16_model}", f"sft.output_dir={tmp_path / 'out'}", "sft.steps=1"])
    run_sft(cfg, pm)  # trains in fp32 on the CPU, with pad = EOS
    check_as_loaded(tmp_path / "out")  # bf16 weights and config, no pad token: as sft.init has them


def test_an_output_that_rounds_the_training_away_warns_and_sft_output_dtype_keeps_it(tmp_path, pm, bf16_model, caplog):
    from safetensors.torch import load_file

    def run(name, *extra):
        caplog.clear()
        run_sft(load_config(overrides=[*FAST, f"sft.init={bf16_model}", f"sft.output_dir={tmp_path / name}",
                                       "sft.steps=2", "sft.lr=1e-6", *extra]), pm)
        return load_file(str(tmp_path / name / "model.safetensors")), caplog.text

    weights, said = run("bf16")  # steps of ~1e-6 on weights of ~1e-2: below bf16's resolution
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert "round back to the source model's values in bfloat16, the dtype it was loaded in" in said, said
    assert "Set sft.output_dtype=float32 to keep every change" in said
    weights, said = run("fp32", "sft.output_dtype=float32")
    assert {t.dtype for t in weights.values()} == {torch.float32} and "round back" not in said
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["dtype"] == "float32"


def test_bad_row_names_file_and_row(tmp_path, pm, sft_config):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "response": "a"}, {"prompt": "q"}])
    with pytest.raises(DataError, match=r"d.jsonl, row 2: missing 'response' \(sft.response_key\)"):
        run_sft(sft_config(tmp_path, f"sft.train_file={path}"), pm)


def test_config_errors_name_key_and_choices(tmp_path, pm, sft_config):
    with pytest.raises(ConfigError, match="'model.precision' must be one of auto, 32-true"):
        run_sft(sft_config(tmp_path, "model.precision=bf17"), pm)
    with pytest.raises(ConfigError, match="sft.resume=nowhere.ckpt: no such checkpoint"):
        run_sft(sft_config(tmp_path, "sft.resume=nowhere.ckpt"), pm)
    (tmp_path / "plain").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="plain: a folder without checkpoints/last.ckpt or last.ckpt"):
        run_sft(sft_config(tmp_path, f"sft.resume={tmp_path / 'plain'}"), pm)  # was Lightning's IsADirectoryError
    (tmp_path / "fake.ckpt").write_text("not a checkpoint")
    for name in ("notes.txt", "fake.ckpt"):  # the second was a traceback from Lightning's loader
        with pytest.raises(ConfigError, match=f"{name}: not a checkpoint"):
            run_sft(sft_config(tmp_path, f"sft.resume={tmp_path / name}"), pm)


# --- training -----------------------------------------------------------------------------------------------
class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class Losses(Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, *args):
        self.values.append(float(trainer.callback_metrics["train/loss"]))


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_resume_gives_the_weights_of_an_uninterrupted_run_and_logs_are_readable(tmp_path, pm, sft_config):
    # 32 examples / batch 8 = 4 steps per epoch: the 6 steps cross an epoch boundary after the resume
    val = write_jsonl(tmp_path / "val.jsonl", [{"prompt": f"What is {i}+1?", "response": str(i + 1)} for i in range(4)])
    common = ["sft.steps=6", "sft.save_every=3", "sft.log_every=1", f"sft.val_file={val}"]
    whole = run_sft(sft_config(tmp_path / "a", *common), pm)
    logged = [*common, "sft.loggers=[mlflow,tensorboard]"]
    run_sft(sft_config(tmp_path / "b", *logged), pm, callbacks=[StopAt(3)])
    out = tmp_path / "b" / "out"
    assert (out / "checkpoints" / "last.ckpt").resolve().name == "step_3.ckpt"
    resumed = run_sft(sft_config(tmp_path / "b", *logged, "sft.resume=auto"), pm)
    assert resumed["train/loss"] == whole["train/loss"] and resumed["val/loss"] == whole["val/loss"]
    a, b = weights(tmp_path / "a" / "out"), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # one mlflow run across the interruption, with every step's loss, the validation loss and the config
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rlforge").experiment_id])
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted({h.step for h in history}) == list(range(6))
    assert history[-1].value == pytest.approx(whole["train/loss"])
    assert client.get_metric_history(run.info.run_id, "val/loss")[-1].value == pytest.approx(whole["val/loss"])
    assert run.data.params["sft/steps"] == "6"  # Lightning flattens nested params with "/"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    import os  # Lightning's logger calls mlflow.set_tracking_uri, which exports the store: not kept after the run

    assert not {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID"} & set(os.environ)


def test_wandb_logger_names_project_and_run_and_starts_nothing(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    from rlforge.sft.outputs import LOGGERS

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = OmegaConf.create({"trainer": {"project": "p"}, "sft": {"run_name": None}})
    logger = LOGGERS["wandb"](config, tmp_path / "out", False)
    assert isinstance(logger, WandbLogger) and logger.name == "p" and logger._experiment is None
    assert logger._wandb_init["name"] == "sft/out" and logger._wandb_init["dir"] == str(tmp_path / "out")
    config.sft.run_name = "qwen-sft-1"  # verl's trainer.experiment_name
    assert LOGGERS["wandb"](config, tmp_path / "out", False)._wandb_init["name"] == "qwen-sft-1"
    assert LOGGERS["mlflow"](config, tmp_path / "out", False)._run_name == "qwen-sft-1"


def test_loss_falls(tmp_path, pm, sft_config):
    val = write_jsonl(tmp_path / "val.jsonl", [{"prompt": f"What is {i}+1?", "response": str(i + 1)} for i in range(4)])
    losses = Losses()
    m = run_sft(sft_config(tmp_path, "sft.steps=30", "sft.lr=3e-3", f"sft.val_file={val}"), pm, callbacks=[losses])
    assert len(losses.values) == 30
    assert sum(losses.values[-5:]) / 5 < 0.6 * sum(losses.values[:5]) / 5
    assert m["val/loss"] < losses.values[0]


class Gradients(Callback):
    """The gradient of the first optimizer step, before clipping."""

    def on_before_optimizer_step(self, trainer, module, optimizer):
        if trainer.global_step == 0:
            self.value = torch.cat([p.grad.flatten() for p in module.parameters()]).clone()


def test_micro_batches_give_the_same_gradient(tmp_path, pm, sft_config):
    # the loss of each micro-batch is divided by the trained tokens of the whole batch: the accumulated gradient
    # equals the whole batch's, although the micro-batches hold different numbers of trained tokens
    whole, micro = Gradients(), Gradients()
    m1 = run_sft(sft_config(tmp_path / "whole", "sft.steps=1"), pm, callbacks=[whole])
    m2 = run_sft(sft_config(tmp_path / "micro", "sft.steps=1", "sft.micro_batch_size=2"), pm, callbacks=[micro])
    assert m1["train/loss"] == pytest.approx(m2["train/loss"], rel=1e-6)
    assert torch.allclose(whole.value, micro.value, rtol=1e-4, atol=1e-7)


# --- greedy validation accuracy (data.name's validation split) --------------------------------------------
def test_accuracy_with_files_and_without_val_files(tmp_path, pm, sft_config):
    rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": f"What is {i}+1?"}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(8)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    m = run_sft(sft_config(tmp_path, "data.name=files", f"data.train_files=[{train}]", "sft.val_accuracy=true",
                           "sft.steps=1", "sft.init=tiny-arith"), pm)
    assert "val/accuracy" not in m  # no data.val_files: nothing to measure, and no crash
    m = run_sft(sft_config(tmp_path, "data.name=files", f"data.train_files=[{train}]", f"data.val_files=[{train}]",
                           "sft.val_accuracy=true", "sft.steps=1"), pm)
    assert 0.0 <= m["val/accuracy"] <= 1.0


def test_unscorable_validation_rows_fail_before_training(tmp_path, pm, sft_config):
    rows = [{"data_source": "mytask", "prompt": "q", "reward_model": {"ground_truth": "a"}, "response": "a"}] * 8
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(RLForgeError, match="No reward function for data_source 'mytask'.*sft.val_accuracy=false"):
        run_sft(sft_config(tmp_path, "data.name=files", f"data.train_files=[{path}]", f"data.val_files=[{path}]",
                           "sft.val_accuracy=true"), pm)
    assert not (tmp_path / "out" / "model.safetensors").exists()
