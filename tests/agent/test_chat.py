"""Inserted turns for other chat templates: a Qwen-style template (end marker ``<|im_end|>\\n``, consecutive tool
replies merged into one user turn), a template that rewrites history, one that drops assistant content."""

from __future__ import annotations

import jinja2
import pytest

from rlforge.agent.chat import ChatFormat
from rlforge.errors import RLForgeError

QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>{{ m.content }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class CharTokenizer:
    """Characters as token ids; the chat template rendered with jinja2."""

    def __init__(self, template: str, eos: str = "<|im_end|>") -> None:
        self.template, self.eos_token = jinja2.Template(template), eos

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
        return self.template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def text(tok, ids):
    return tok.decode(ids)


def test_qwen_style_end_marker_and_merged_tool_replies():
    tok = CharTokenizer(QWEN_LIKE)
    chat = ChatFormat(tok)
    assert chat.end_of_message == "<|im_end|>\n"
    replies = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}]
    # the model stopped at <|im_end|>: the template's "\n" after it is inserted, then both replies in one user turn
    assert text(tok, chat.inserted_ids(replies, "<|im_end|>")) == (
        "\n<|im_start|>user\n<tool_response>5</tool_response>\n<tool_response>6</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    # a turn cut by the length limit gets the whole end marker
    assert text(tok, chat.inserted_ids([{"role": "user", "content": "go on"}], "")) == (
        "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_rewrites_earlier_messages_is_refused():
    rewrites = ("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[old]{% else %}"
                "{{ m.content }}{% endif %}|{% endfor %}")
    chat = ChatFormat(CharTokenizer(rewrites, eos="|"))
    with pytest.raises(RLForgeError, match="renders a conversation differently once messages with roles"):
        chat.inserted_ids([{"role": "user", "content": "again"}], "|")


def test_a_template_without_assistant_content_is_refused():
    with pytest.raises(RLForgeError, match="drops the content of assistant messages"):
        ChatFormat(CharTokenizer("{% for m in messages %}{{ m.role }}{% endfor %}"))


def test_a_template_that_ignores_a_role_is_refused():
    ignores_tools = "{% for m in messages %}{% if m.role != 'tool' %}{{ m.content }}|{% endif %}{% endfor %}"
    chat = ChatFormat(CharTokenizer(ignores_tools, eos="|"))
    with pytest.raises(RLForgeError, match="renders messages with roles \\['tool'\\] as nothing"):
        chat.inserted_ids([{"role": "tool", "content": "5"}], "|")


@pytest.mark.parametrize(("side", "expected"), [
    ("right", "abcdefghij...(truncated)"),  # the head kept
    ("left", "(truncated)...0123456789"),  # the tail kept
    ("middle", "abcde...(truncated)...56789"),  # head and tail
])
def test_a_long_reply_is_cut_on_the_side_verl_names(char_tokenizer, side, expected):
    """verl's tool_response_truncate_side: the side cut away (in tokens here; the marker counts in the budget)."""
    chat = ChatFormat(char_tokenizer)
    marker = {"right": 14, "left": 14, "middle": 17}[side]  # characters: one token each
    text, cut = chat.truncate("abcdefghijklmnopqrstuvwxyz0123456789", 10 + marker, side)
    assert (text, cut) == (expected, True)
    assert chat.truncate("short", 30, side) == ("short", False)


@pytest.mark.parametrize("side", ["right", "left", "middle"])
@pytest.mark.parametrize("text", ["数据" * 300 + "尾巴", "🙂🚀" * 200, "abc数据🙂" * 150])
def test_a_cut_never_splits_a_character_nor_passes_the_budget(tiny_chat_model, side, text):
    """Byte-level BPE splits a multibyte character over tokens: a cut between them would show U+FFFD (and its
    re-encoding would take more tokens than the budget)."""
    from transformers import AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(tiny_chat_model))
    cut, was_cut = chat.truncate(text, 30, side)
    assert was_cut and "\ufffd" not in cut and len(chat.encode(cut)) <= 30
