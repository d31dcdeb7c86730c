"""Multi-turn SFT rows with chat templates that are not prefix-preserving: each assistant turn rendered against its
own history, turns sharing a sequence where the template allows it. The templates below behave like the real
Qwen3, Phi-3, Mistral and Gemma ones (written here: no hub access), on the char tokenizer with their special tokens
(which reads a blank line as one unknown token, so the templates' "\\n\\n" is written "\\n" here)."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from rlforge import load_config
from rlforge.errors import DataError
from rlforge.models import build_char_tokenizer, build_tiny_llama
from rlforge.sft import run_sft
from rlforge.sft.data import build_examples
from rlforge.sft.formats import Example, Keys, conversation, render, turn_sequences
from tests.test_sft import CHAT, FAST, chatml, runs  # noqa: F401 (a fixture)

# Qwen3: reasoning (``reasoning_content``, or ``<think>...</think>`` in the content) is rendered only for assistant
# messages after the last user message; the last message always gets a think block, empty if it has none.
QWEN3 = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set content = m['content'] or '' -%}{%- set reasoning = '' -%}"
    "{%- if m['reasoning_content'] is string -%}{%- set reasoning = m['reasoning_content'] -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n' + content -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}{%- endif -%}"
    "{%- for c in m['tool_calls'] or [] -%}<tool_call>{{ c['function']['name'] }}</tool_call>{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>' + m['content'] + '</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# Phi-3: without the generation prompt the conversation ends with EOS (<|endoftext|>), after the last <|end|>\n.
PHI3 = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ '<|system|>\\n' + m['content'] + '<|end|>\\n' }}"
    "{% elif m['role'] == 'user' %}{{ '<|user|>\\n' + m['content'] + '<|end|>\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ '<|assistant|>\\n' + m['content'] + '<|end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
ALTERNATE = "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
# Mistral v0.1: strictly alternating user/assistant, no system role, no generation prompt.
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}" + ALTERNATE +
    "{% endif %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
)
# Mistral v0.3: the system message goes into the last user message, and only when that message ends the conversation.
MISTRAL_V3 = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}{{ bos_token }}"
    "{% for m in loop_messages %}{% if m['role'] == 'user' %}{% if loop.last and system is defined %}"
    "{{ '[INST] ' + system + '\\n' + m['content'] + '[/INST]' }}{% else %}{{ '[INST] ' + m['content'] + '[/INST]' }}"
    "{% endif %}{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}"
)
# Gemma 3: no system role (a system message is folded into the first user turn), 'model' turns, alternation.
GEMMA3 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for m in loop_messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}" + ALTERNATE +
    "{% endif %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# Gemma 2: a system message is refused outright.
GEMMA2 = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" + GEMMA3


def tokenizer(template: str, special: tuple[str, ...] = (), eos: str | None = None):
    tok = build_char_tokenizer()
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if eos:
        tok.eos_token = eos
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def qwen3():
    return tokenizer(QWEN3, ("<|im_start|>", "<|im_end|>"))


def chat(*contents: str, system: str | None = None) -> list[dict]:
    """user, assistant, user, assistant, ... with these contents (after an optional system message)."""
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": ("user", "assistant")[i % 2], "content": c} for i, c in enumerate(contents)]


def text(tok, ex: Example) -> str:
    return tok.decode(ex.ids)


# --- Qwen3: earlier reasoning dropped -----------------------------------------------------------------------
def test_qwen3_each_turn_trains_against_the_history_it_is_generated_from(qwen3):
    row = {"messages": chat("Q1", "<think>r1</think>A1", "Q2", "<think>r2</think>A2")}
    first, second = turn_sequences(row, qwen3, Keys(), "row 1")
    # turn 1 with its reasoning, as generated after Q1
    assert text(qwen3, first) == ("<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n"
                                  "<think>\nr1\n</think>\nA1<|im_end|>\n")
    # after '<|im_start|>user\nQ1<|im_end|>\n' (10 tokens) and '<|im_start|>assistant\n' (11)
    assert runs(first, qwen3) == [(21, "<think>\nr1\n</think>\nA1<|im_end|>")]
    # turn 2 after the history as Qwen3 renders it then: turn 1's reasoning gone, and turn 1 not trained again
    assert text(qwen3, second) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\nA2<|im_end|>\n")
    opened = render(qwen3, row["messages"][:3], True, "row 1", {})
    assert text(qwen3, Example(opened, [])).endswith("Q2<|im_end|>\n<|im_start|>assistant\n")
    assert runs(second, qwen3) == [(len(opened), "<think>\nr2\n</think>\nA2<|im_end|>")]
    with pytest.raises(DataError, match="row 1: the chat template renders earlier turns differently .* 2 sequences"):
        conversation(row, qwen3, Keys(), "row 1")


def test_qwen3_tool_steps_of_one_query_share_a_sequence(qwen3):
    call = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "Q"},
                {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": call},
                {"role": "tool", "content": "R"},
                {"role": "assistant", "content": "<think>s</think>A"}]
    (ex,) = turn_sequences({"messages": messages}, qwen3, Keys(), "row 1")  # no user message in between: kept
    assert [t for _, t in runs(ex, qwen3)] == ["<think>\nr\n</think>\n<tool_call>f</tool_call><|im_end|>",
                                               "<think>\ns\n</think>\nA<|im_end|>"]


def test_prefix_preserving_templates_keep_one_sequence_equal_to_each_turn_against_its_history(chatml):
    # the fast path: ChatML renders the beginning alike whatever follows, so the turns share one sequence, the whole
    # conversation's rendering, with today's mask (hand-checked in test_sft); each turn rendered against its own
    # history is a prefix of it with the same trained tokens, so the loss is the same either way
    (whole,) = turn_sequences({"messages": CHAT}, chatml, Keys(), "row 1")
    assert whole.ids == render(chatml, CHAT, False, "row 1", {})
    assert runs(whole, chatml) == [(31, "<tool>f</tool><|im_end|>"), (67, "B<|im_end|>")]
    for i, trained in ((2, (31, "<tool>f</tool><|im_end|>")), (4, (67, "B<|im_end|>"))):
        opened = render(chatml, CHAT[:i], True, "r", {})
        (own,) = turn_sequences({"messages": CHAT[: i + 1]}, chatml, Keys(), "r")  # the conversation up to turn i
        assert whole.ids[: len(own.ids)] == own.ids and whole.mask[: len(own.ids)] == own.mask
        assert own.ids[: len(opened)] == opened and runs(own, chatml)[-1] == trained == (len(opened), trained[1])
    assert conversation({"messages": CHAT}, chatml, Keys(), "row 1") == whole


def test_each_sequence_of_a_row_is_truncated_and_counted_on_its_own(qwen3):
    rows = [{"messages": chat("Q1", "<think>r1</think>A1", "Q2", "<think>r2</think>A2")}]
    s = OmegaConf.create({"format": "auto", "max_length": 50, "truncation": "drop"})
    examples, dropped = build_examples(rows, qwen3, s, Keys(), "f.jsonl")
    assert dropped == 1 and [len(e.ids) for e in examples] == [45]  # the second turn's sequence: 70 tokens


# --- Phi-3: EOS after the last turn --------------------------------------------------------------------------
def test_phi3_end_of_conversation_eos_is_not_blamed_on_earlier_turns():
    tok = tokenizer(PHI3, ("<|endoftext|>",), eos="<|endoftext|>")
    (ex,) = turn_sequences({"messages": chat("Q1", "A1", "Q2", "A2", system="S")}, tok, Keys(), "row 1")
    assert text(tok, ex) == ("<|system|>\nS<|end|>\n<|user|>\nQ1<|end|>\n<|assistant|>\nA1<|end|>\n"
                             "<|user|>\nQ2<|end|>\n<|assistant|>\nA2<|end|>\n<|endoftext|>")
    # each turn up to its <|end|>; the '\n<|endoftext|>' that closes the conversation is the template's glue
    assert runs(ex, tok) == [(13, "A1<|end|>"), (25, "A2<|end|>")]
    assert ex.ids[-1] == tok.eos_token_id and ex.mask[-2:] == [0, 0]


# --- Mistral: alternation, system messages -------------------------------------------------------------------
def test_mistral_alternating_rows_train_and_a_system_message_is_named_as_the_cause():
    tok = tokenizer(MISTRAL, ("</s>",), eos="</s>")
    (ex,) = turn_sequences({"messages": chat("Q1", "A1", "Q2", "A2")}, tok, Keys(), "row 1")
    assert text(tok, ex) == "<s>[INST] Q1 [/INST]A1</s>[INST] Q2 [/INST]A2</s>"
    assert runs(ex, tok) == [(18, "A1</s>"), (38, "A2</s>")]
    # the template has no system role: the data's system message is the cause, and the error says so
    with pytest.raises(DataError, match=r"train.parquet, row 3: the chat template rejects this row: Conversation "
                                        r"roles must alternate.*\(the template has no system role: .*message 0"):
        turn_sequences({"messages": chat("Q1", "A1", system="S")}, tok, Keys(), "train.parquet, row 3")
    with pytest.raises(DataError, match=r"row 4: .*must alternate.*the roles it was given: user, user"):
        turn_sequences({"messages": chat("Q1") + chat("Q2", "A2")}, tok, Keys(), "row 4")


def test_mistral_v3_system_placement_is_refused_with_the_text_that_moves():
    tok = tokenizer(MISTRAL_V3, ("</s>",), eos="</s>")
    (ex,) = turn_sequences({"messages": chat("Q1", "A1", "Q2", "A2")}, tok, Keys(), "row 1")
    assert runs(ex, tok) == [(17, " A1</s>"), (37, " A2</s>")]  # without a system message: prefix-preserving
    # the system message sits in the last user message when generating, and nowhere once the reply follows: the
    # history the model answers is not the start of the rendering with the answer (the old code trained 'Q1[/INST]')
    with pytest.raises(DataError, match=r"row 2: the chat template renders the conversation before message 2 "
                                        r"differently once message 2 \(assistant\) follows: 'S\\nQ1\[/INST\]' "
                                        r"with the generation prompt, 'Q1\[/INST\] A1</s>' with the message"):
        turn_sequences({"messages": chat("Q1", "A1", system="S")}, tok, Keys(), "row 2")


# --- Gemma: no system role -----------------------------------------------------------------------------------
def test_gemma_folds_the_system_message_into_the_first_user_turn():
    tok = tokenizer(GEMMA3, ("<start_of_turn>", "<end_of_turn>"))
    (ex,) = turn_sequences({"messages": chat("Q1", "A1", "Q2", "A2", system="S")}, tok, Keys(), "row 1")
    assert text(tok, ex) == ("<s><start_of_turn>user\nS\nQ1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
                             "<start_of_turn>user\nQ2<end_of_turn>\n<start_of_turn>model\nA2<end_of_turn>\n")
    assert runs(ex, tok) == [(20, "A1<end_of_turn>"), (41, "A2<end_of_turn>")]
    tok = tokenizer(GEMMA2, ("<start_of_turn>", "<end_of_turn>"))
    with pytest.raises(DataError, match=r"row 5: the chat template rejects this row: System role not supported "
                                        r"\(the template has no system role"):
        turn_sequences({"messages": chat("Q1", "A1", system="S")}, tok, Keys(), "row 5")
    tool_row = chat("Q1") + [{"role": "tool", "content": "R"}, {"role": "assistant", "content": "A"}]
    with pytest.raises(DataError, match=r"row 6: .*must alternate.*roles it was given: user, tool"):
        turn_sequences({"messages": tool_row}, tok, Keys(), "row 6")


# --- a verl multi-turn parquet with the Qwen3 template trains --------------------------------------------------
def test_verl_multiturn_parquet_trains_with_a_qwen3_template(tmp_path, pm, qwen3):
    model = tmp_path / "qwen3_like"
    build_tiny_llama(qwen3, hidden=32, layers=1, heads=1, ffn=64).save_pretrained(model)
    qwen3.save_pretrained(model)
    rows = [{"messages": chat(f"{i}+1", f"<think>{i}</think>{i + 1}", f"{i}+2", f"<think>{i + 1}</think>{i + 2}",
                              system="S")} for i in range(4)]
    path = tmp_path / "multiturn.parquet"  # parquet fills absent fields (tool_calls, reasoning_content) with None
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = load_config(overrides=[*FAST, f"sft.init={model}", f"sft.output_dir={tmp_path / 'out'}",
                                 f"sft.train_file={path}", "sft.steps=1"])
    logged: list[str] = []
    m = run_sft(cfg, pm, log=logged.append)  # 4 rows x 2 turns = 8 sequences = one batch of 8
    assert math.isfinite(m["train/loss"])
    assert any("8 training examples" in line for line in logged)


# --- the chat template's keyword arguments and a row's enable_thinking column (verl's multi-turn SFT dataset) --------
THINKING = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>"
            "{% if enable_thinking is not defined %}-{% elif enable_thinking %}T{% else %}F{% endif %}"
            "{{ effort | default('') }}{% endif %}")


def test_a_rows_enable_thinking_column_goes_over_the_template_kwargs(char_tokenizer):
    tok = build_char_tokenizer()
    tok.chat_template = THINKING
    rows = [{"prompt": "Q", "response": "A", "think": True}, {"prompt": "Q", "response": "A", "think": None},
            {"prompt": "Q", "response": "A"}]

    def prompts(keys: Keys) -> list[str]:
        examples, _ = build_examples(rows, tok, OmegaConf.create({"format": "auto", "max_length": 64,
                                                                   "truncation": "error"}), keys, "d.jsonl")
        return [tok.decode(e.ids[: e.mask.index(1)]) for e in examples]

    kwargs = {"enable_thinking": False, "effort": "low"}
    assert prompts(Keys(template=kwargs, thinking="think", thinking_default=True)) == [
        "<|user|>Q<|end|><|assistant|>Tlow", "<|user|>Q<|end|><|assistant|>Flow", "<|user|>Q<|end|><|assistant|>Tlow"]
    assert prompts(Keys(template=kwargs, thinking="think")) == [
        "<|user|>Q<|end|><|assistant|>Tlow", "<|user|>Q<|end|><|assistant|>Flow", "<|user|>Q<|end|><|assistant|>Flow"]
    assert prompts(Keys(thinking="")) == ["<|user|>Q<|end|><|assistant|>-"] * 3  # the column not read
    for bad in ("no", "False", "1"):  # a string is refused, even one that looks boolean (bool("False") is True)
        with pytest.raises(DataError, match=r"d.jsonl, row 4: 'think' \(sft.enable_thinking_key\) must be true, false "
                                            r"or null, got '"):
            build_examples([*rows, {"prompt": "Q", "response": "A", "think": bad}], tok,
                           OmegaConf.create({"format": "auto", "max_length": 64, "truncation": "error"}),
                           Keys(thinking="think"), "d.jsonl")
    failing = "{{ messages[0]['content'] / 0 }}"  # the template's own code fails: the row is named, no traceback
    tok.chat_template = failing
    with pytest.raises(DataError, match=r"d.jsonl, row 1: the chat template fails on this row: TypeError"):
        prompts(Keys())


def test_sft_renders_with_model_chat_template_and_its_kwargs_and_saves_the_template(tmp_path, pm):
    model = tmp_path / "no_template"
    tok = build_char_tokenizer()
    build_tiny_llama(tok, hidden=32, layers=1, heads=1, ffn=64).save_pretrained(model)
    tok.chat_template = None
    tok.save_pretrained(model)  # a base model: no chat template of its own
    rows = [{"prompt": f"{i}+1", "response": str(i + 1), "enable_thinking": True if i % 2 else None} for i in range(8)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    template = THINKING.replace("'", '"')
    cfg = load_config(overrides=[*FAST, f"sft.init={model}", f"sft.output_dir={tmp_path / 'out'}",
                                 f"sft.train_file={path}", "sft.steps=1", f"model.chat_template='{template}'",
                                 "data.apply_chat_template_kwargs={enable_thinking: false, effort: hi}"])
    from rlforge.sft.data import train_examples
    from rlforge.sft.module import build_tokenizer

    sft_tok = build_tokenizer(cfg)
    examples, _ = train_examples(cfg, pm.registry, sft_tok)
    heads = [sft_tok.decode(e.ids[: e.mask.index(1)]) for e in examples]
    assert heads[:2] == ["<|user|>0+1<|end|><|assistant|>Fhi", "<|user|>1+1<|end|><|assistant|>Thi"]
    assert math.isfinite(run_sft(cfg, pm)["train/loss"])
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template == template  # saved with the model


def test_a_null_in_a_parquet_int_thinking_column_sets_nothing(tmp_path, pm):
    """verl's pandas reads such a null as NaN and renders it as enable_thinking=True; rlforge reads a null as unset
    (docs/sft.md states the difference)."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["1+1", "2+1", "3+1"], "response": ["2", "3", "4"],
                             "enable_thinking": pa.array([1, None, 0], type=pa.int64())}), path)
    template = THINKING.replace("'", '"')
    cfg = load_config(overrides=[*FAST, f"sft.train_file={path}", f"model.chat_template='{template}'",
                                 "data.apply_chat_template_kwargs={enable_thinking: false}"])
    from rlforge.sft.data import train_examples
    from rlforge.sft.module import build_tokenizer

    tok = build_tokenizer(cfg)
    examples, _ = train_examples(cfg, pm.registry, tok)
    assert [tok.decode(e.ids[: e.mask.index(1)])[-1] for e in examples] == ["T", "F", "F"]
