"""rlforge.data: row validation + chat template (tokenize_rows), collate, and the resumable PromptSampler."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge.data import PromptSampler, collate, tokenize_rows
from rlforge.errors import DataError


def _row(content: str = "What is 1+2?", truth: str = "3", **extra) -> dict:
    row = {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"i": 0},
    }
    row.update(extra)
    return row


def _len(tok, content: str) -> int:
    """Prompt length in tokens with the chat template: <|user|> content <|end|> <|assistant|>."""
    return len(content) + 3


# --- tokenize_rows ------------------------------------------------------------------------------------


def test_tokenize_applies_chat_template(char_tokenizer) -> None:
    prompts = tokenize_rows([_row()], char_tokenizer, 64, True, "train")
    assert len(prompts) == 1
    p = prompts[0]
    assert char_tokenizer.decode(p.ids) == "<|user|>What is 1+2?<|end|><|assistant|>"
    assert len(p.ids) == _len(char_tokenizer, "What is 1+2?")
    assert p.data_source == "arith"
    assert p.ground_truth == "3"
    assert p.extra_info == {"i": 0}
    assert p.messages == [{"role": "user", "content": "What is 1+2?"}]


def test_tokenize_accepts_a_plain_string_prompt(char_tokenizer, caplog, monkeypatch) -> None:
    prompts = tokenize_rows([_row(prompt="hi")], char_tokenizer, 64, True, "train")
    assert prompts[0].messages == [{"role": "user", "content": "hi"}]
    import json

    from rlforge import data

    monkeypatch.setattr(data, "_JSON_WARNED", set())
    text = json.dumps([{"role": "user", "content": "hi"}])  # a list a CSV or pandas pipeline stored as text
    with caplog.at_level("WARNING", logger="rlforge.data"):
        prompts = tokenize_rows([_row(prompt=text), _row(prompt=text)], char_tokenizer, 64, True, "train")
    assert prompts[0].messages == [{"role": "user", "content": text}]  # as verl's string: one message's text
    warned = [r.getMessage() for r in caplog.records if "string holding JSON chat messages" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("train, row 1: 'prompt'")


def test_a_role_chat_templates_do_not_know_is_warned_once_per_role(char_tokenizer, caplog, monkeypatch) -> None:
    from rlforge import data

    monkeypatch.setattr(data, "_ROLES_WARNED", set())
    sharegpt = [{"role": "system", "content": "s"}, {"role": "human", "content": "hi"}]
    with caplog.at_level("WARNING", logger="rlforge.data"):
        tokenize_rows([_row(prompt=sharegpt), _row(prompt=sharegpt), _row(prompt=[{"role": "tool", "content": "x"}])],
                      char_tokenizer, 64, True, "train")
    warned = [r.getMessage() for r in caplog.records if "chat templates are not written for" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("train, row 1: a prompt message has the role 'human'")
    assert "ShareGPT's 'human' is 'user'." in warned[0]


def test_a_lone_surrogate_in_a_message_is_named(char_tokenizer) -> None:
    bad = _row(prompt=[{"role": "user", "content": "What is \ud800?"}])  # what json reads from "\\ud800"
    with pytest.raises(DataError, match=r"mydata, row 2: prompt message 1 has text that is not valid Unicode "
                                        r"\(surrogates not allowed at character 8: '\\ud800'\)"):
        tokenize_rows([_row(), bad], char_tokenizer, 64, True, "mydata")


@pytest.mark.parametrize("column", ["prompt", "data_source"])
def test_missing_column_names_row_and_column(char_tokenizer, column: str) -> None:
    bad = _row()
    del bad[column]
    with pytest.raises(DataError) as info:
        tokenize_rows([_row(), bad], char_tokenizer, 64, True, "mydata")
    msg = str(info.value)
    assert "mydata, row 2" in msg
    assert f"'{column}'" in msg


def test_error_uses_row_origin(char_tokenizer) -> None:
    bad = _row()
    del bad["prompt"]
    bad["_origin"] = "train.jsonl, row 17"
    with pytest.raises(DataError, match="train.jsonl, row 17: missing column 'prompt'"):
        tokenize_rows([bad], char_tokenizer, 64, True, "files")


@pytest.mark.parametrize("content", ["", "   ", "\n"])
def test_empty_prompt(char_tokenizer, content: str) -> None:
    with pytest.raises(DataError, match="row 1: the prompt is empty"):
        tokenize_rows([_row(content)], char_tokenizer, 64, True, "train")


def test_malformed_messages(char_tokenizer) -> None:
    with pytest.raises(DataError, match="list of chat messages"):
        tokenize_rows([_row(prompt=[{"role": "user"}])], char_tokenizer, 64, True, "train")
    with pytest.raises(DataError, match="list of chat messages"):
        tokenize_rows([_row(prompt=42)], char_tokenizer, 64, True, "train")


def test_a_tool_calling_message_may_have_null_content() -> None:
    """OpenAI's format: an assistant message that only calls tools has ``content: null``; it renders as no text."""
    from rlforge.tools.tiny_chat import build_tokenizer

    chatml_tokenizer = build_tokenizer()
    call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {}}}]}
    turns = [{"role": "user", "content": "What is 1+2?"}, {**call, "content": None}, {"role": "tool", "content": "3"}]
    (null,) = tokenize_rows([_row(prompt=turns)], chatml_tokenizer, 256, True, "train")
    (empty,) = tokenize_rows([_row(prompt=[turns[0], {**call, "content": ""}, turns[2]])], chatml_tokenizer, 256,
                             True, "train")
    assert null.ids == empty.ids and "<tool_call>" in chatml_tokenizer.decode(null.ids)
    with pytest.raises(DataError, match="prompt message 2 has content of type NoneType"):  # no tool call: no text
        tokenize_rows([_row(prompt=[turns[0], {"role": "assistant", "content": None}])], chatml_tokenizer, 256, True,
                      "train")


@pytest.mark.parametrize("reward_model", [None, {}, {"style": "rule"}])
def test_missing_ground_truth(char_tokenizer, reward_model) -> None:
    bad = _row(reward_model=reward_model)
    with pytest.raises(DataError, match=r"row 2: missing 'reward_model.ground_truth'"):
        tokenize_rows([_row(), bad], char_tokenizer, 64, True, "train")


def test_reward_model_absent(char_tokenizer) -> None:
    bad = _row()
    del bad["reward_model"]
    with pytest.raises(DataError, match="reward_model.ground_truth"):
        tokenize_rows([bad], char_tokenizer, 64, True, "train")


@pytest.mark.parametrize("reward_model", [5, "ground_truth=3"])
def test_non_mapping_reward_model(char_tokenizer, reward_model) -> None:
    with pytest.raises(DataError, match="row 1"):
        tokenize_rows([_row(reward_model=reward_model)], char_tokenizer, 64, True, "train")


def test_overlong_prompt_filtered(char_tokenizer, caplog) -> None:
    short, long_ = "What is 1+2?", "x" * 40
    rows = [_row(short), _row(long_), _row(short, truth="4")]
    max_len = _len(char_tokenizer, short)
    with caplog.at_level("WARNING", logger="rlforge.data"):
        prompts = tokenize_rows(rows, char_tokenizer, max_len, True, "train")
    assert [p.ground_truth for p in prompts] == ["3", "4"]
    # the drop is counted and the first dropped row named with its length, as the identical pairs' warning does
    assert caplog.messages == [f"train: dropped 1 of 3 rows whose prompt is longer than data.max_prompt_length="
                               f"{max_len} tokens (after the chat template), first train, row 2 "
                               f"({_len(char_tokenizer, long_)} tokens): raise data.max_prompt_length to keep them."]
    caplog.clear()
    with caplog.at_level("WARNING", logger="rlforge.data"):
        assert len(tokenize_rows(rows[::2], char_tokenizer, max_len, True, "train")) == 2
    assert not caplog.messages  # nothing dropped, nothing said


class _SelfTokenizing(list):
    """Rows that tokenize themselves in chunks of 2 (a PromptSource, as the hf dataset's rows: they name themselves
    by ``_origin``)."""

    def tokenize_prompts(self, encode):
        return [p for start in range(0, len(self), 2)
                for p in encode(self[start:start + 2], list(range(start, min(start + 2, len(self)))),
                                [row["_origin"] for row in self[start:start + 2]])]


@pytest.mark.parametrize("long_at", [[0], [3], [5, 6], [6], [1, 2, 3, 4, 5, 6]])
def test_overlong_prompts_of_rows_that_tokenize_themselves_name_the_first(char_tokenizer, caplog, long_at) -> None:
    """A PromptSource returns only the prompts it kept: the first dropped row is found from their indices."""
    rows = _SelfTokenizing(_row("x" * (40 + i) if i in long_at else "ab", _origin=f"t.parquet, row {i + 1}")
                           for i in range(7))
    with caplog.at_level("WARNING", logger="rlforge.data"):
        prompts = tokenize_rows(rows, char_tokenizer, 20, True, "hf (train)")
    assert [p.index for p in prompts] == [i for i in range(7) if i not in long_at]
    first = long_at[0]
    assert caplog.messages == [f"hf (train): dropped {len(long_at)} of 7 rows whose prompt is longer than "
                               f"data.max_prompt_length=20 tokens (after the chat template), first t.parquet, row "
                               f"{first + 1} ({_len(char_tokenizer, 'x' * (40 + first))} tokens): raise "
                               f"data.max_prompt_length to keep them."]


def test_prompt_at_exact_limit_is_kept(char_tokenizer) -> None:
    n = _len(char_tokenizer, "abc")
    assert len(tokenize_rows([_row("abc")], char_tokenizer, n, False, "train")) == 1
    with pytest.raises(DataError):
        tokenize_rows([_row("abc")], char_tokenizer, n - 1, False, "train")


def test_overlong_prompt_error_when_not_filtering(char_tokenizer) -> None:
    rows = [_row("short"), _row("x" * 40)]
    with pytest.raises(DataError) as info:
        tokenize_rows(rows, char_tokenizer, 20, False, "train")
    msg = str(info.value)
    assert "train, row 2" in msg
    assert f"{_len(char_tokenizer, 'x' * 40)} tokens" in msg
    assert "data.max_prompt_length=20" in msg
    assert "data.filter_overlong_prompts" in msg


def test_truncation_cuts_an_overlong_prompt_as_verl_cuts(char_tokenizer) -> None:
    """data.truncation with filter_overlong_prompts=false: left keeps the last tokens (verl 0.9.1's agent loop),
    right the first, middle the first half and the last half; a prompt within the limit is not touched."""
    from rlforge.data import truncate

    ids = list(range(10))
    assert truncate(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate(ids, 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate(ids, 10, "left") == ids
    full = tokenize_rows([_row("abcdefgh")], char_tokenizer, 64, False, "train")[0].ids
    short = tokenize_rows([_row("ab")], char_tokenizer, 8, False, "train", truncation="left")[0]
    cut = tokenize_rows([_row("abcdefgh"), _row("ab")], char_tokenizer, 8, False, "train", truncation="left")
    assert [p.ids for p in cut] == [full[-8:], short.ids]
    assert char_tokenizer.decode(cut[0].ids).endswith("<|assistant|>")  # the generation prompt survives a left cut
    assert cut[0].messages == [{"role": "user", "content": "abcdefgh"}]  # the row's conversation is kept whole
    right = tokenize_rows([_row("abcdefgh")], char_tokenizer, 8, False, "train", truncation="right")[0]
    assert right.ids == full[:8]
    # filtering comes first: with filter_overlong_prompts the row is dropped, whatever data.truncation says
    assert tokenize_rows([_row("abcdefgh"), _row("ab")], char_tokenizer, 8, True, "train", truncation="left")[0].ids \
        == short.ids


def test_truncation_error_names_the_ways_out(char_tokenizer) -> None:
    with pytest.raises(DataError, match=r"row 1.*data.truncation=left\|right\|middle"):
        tokenize_rows([_row("x" * 40)], char_tokenizer, 20, False, "train", truncation="error")


def test_chat_template_kwargs_reach_the_prompt_and_the_agent_renders(char_tokenizer) -> None:
    """data.apply_chat_template_kwargs (verl's key) go to every render of a prompt: the data loader's and the agent
    loops' (rlforge.agent.chat.ChatFormat), e.g. Qwen3's enable_thinking."""
    import copy

    from omegaconf import OmegaConf

    from rlforge.agent.chat import ChatFormat
    from rlforge.data import template_kwargs

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = char_tokenizer.chat_template.replace(
        "<|assistant|>{% endif %}", "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}.{% endif %}"
                                    "{% endif %}")
    cfg = OmegaConf.create({"data": {"apply_chat_template_kwargs": {"enable_thinking": False}}})
    kwargs = template_kwargs(cfg)
    assert kwargs == {"enable_thinking": False} and type(kwargs) is dict
    plain = tokenize_rows([_row("ab")], tok, 64, True, "train")[0].ids
    off = tokenize_rows([_row("ab")], tok, 64, True, "train", template=kwargs)[0].ids
    assert tok.decode(off) == tok.decode(plain) + "."
    assert ChatFormat(tok, kwargs).render([{"role": "user", "content": "ab"}]).endswith("<|assistant|>.")


def test_all_prompts_overlong_is_an_error(char_tokenizer) -> None:
    rows = [_row("x" * 40), _row("y" * 50)]
    with pytest.raises(DataError) as info:
        tokenize_rows(rows, char_tokenizer, 10, True, "mytrain")
    assert str(info.value) == (f"mytrain: all 2 prompts are longer than data.max_prompt_length=10 tokens (after the "
                               f"chat template), first mytrain, row 1 ({_len(char_tokenizer, 'x' * 40)} tokens): "
                               f"raise data.max_prompt_length.")


def test_no_rows_gives_no_prompts(char_tokenizer) -> None:
    assert tokenize_rows([], char_tokenizer, 10, True, "val") == []


# --- collate --------------------------------------------------------------------------------------------


def test_collate_left_pads(char_tokenizer) -> None:
    prompts = tokenize_rows([_row("ab"), _row("abcd", truth="9")], char_tokenizer, 64, True, "train")
    batch = collate(prompts, char_tokenizer.pad_token_id, ["u0", "u1"])
    ids, mask = batch[B.PROMPTS], batch[B.PROMPT_MASK]
    assert ids.shape == (2, 7) and mask.shape == (2, 7)
    assert mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert mask[1].tolist() == [1] * 7
    assert ids[0, :2].tolist() == [char_tokenizer.pad_token_id] * 2
    assert ids[0, 2:].tolist() == prompts[0].ids
    assert batch[B.UID] == ["u0", "u1"]
    assert batch[B.GROUND_TRUTH] == ["3", "9"]
    assert batch[B.DATA_SOURCE] == ["arith", "arith"]
    assert len(batch) == 2


# --- PromptSampler ----------------------------------------------------------------------------------------


def test_sampler_without_shuffle_rolls_over_epochs() -> None:
    s = PromptSampler(size=10, batch_size=4, shuffle=False, seed=0)
    assert s.next_indices() == [0, 1, 2, 3]
    assert s.next_indices() == [4, 5, 6, 7]
    assert s.state_dict() == {"epoch": 0, "position": 8}
    assert s.next_indices() == [0, 1, 2, 3]  # the incomplete tail (8, 9) is dropped
    assert s.state_dict() == {"epoch": 1, "position": 4}


def test_sampler_epoch_is_a_permutation_and_epochs_differ() -> None:
    s = PromptSampler(size=12, batch_size=4, shuffle=True, seed=3)
    epoch0 = [i for _ in range(3) for i in s.next_indices()]
    epoch1 = [i for _ in range(3) for i in s.next_indices()]
    assert sorted(epoch0) == list(range(12))
    assert sorted(epoch1) == list(range(12))
    assert epoch0 != epoch1
    assert s.state_dict() == {"epoch": 1, "position": 12}


def test_sampler_is_deterministic_and_ignores_global_rng() -> None:
    a = PromptSampler(20, 5, True, seed=11)
    torch.manual_seed(0)
    first = [a.next_indices() for _ in range(7)]
    b = PromptSampler(20, 5, True, seed=11)
    torch.manual_seed(12345)
    torch.rand(100)
    assert [b.next_indices() for _ in range(7)] == first
    c = PromptSampler(20, 5, True, seed=12)
    assert [c.next_indices() for _ in range(7)] != first


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 5, 8])
def test_sampler_resume_gives_the_exact_same_sequence(consumed: int) -> None:
    reference = PromptSampler(size=10, batch_size=3, shuffle=True, seed=5)
    expected = [reference.next_indices() for _ in range(12)]

    run = PromptSampler(size=10, batch_size=3, shuffle=True, seed=5)
    got = [run.next_indices() for _ in range(consumed)]
    state = dict(run.state_dict())

    resumed = PromptSampler(size=10, batch_size=3, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    got += [resumed.next_indices() for _ in range(12 - consumed)]
    assert got == expected


def test_sampler_state_dict_is_a_copy() -> None:
    s = PromptSampler(8, 4, True, 0)
    s.next_indices()
    state = s.state_dict()
    s.next_indices()
    assert state == {"epoch": 0, "position": 4}


def test_sampler_load_state_dict_accepts_saved_types() -> None:
    s = PromptSampler(8, 4, False, 0)
    s.load_state_dict({"epoch": torch.tensor(2), "position": 4.0})
    assert s.state_dict() == {"epoch": 2, "position": 4}
    assert s.next_indices() == [4, 5, 6, 7]


def test_sampler_needs_enough_prompts() -> None:
    with pytest.raises(DataError, match="fewer than data.train_batch_size=8"):
        PromptSampler(size=5, batch_size=8, shuffle=True, seed=0)
    assert PromptSampler(size=8, batch_size=8, shuffle=True, seed=0).next_indices() != []


def test_continue_final_message_leaves_an_assistant_prefill_open(tiny_chat_model) -> None:
    from transformers import AutoTokenizer

    from rlforge.agent.chat import ChatFormat

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    prefill = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "<think>"}]
    rows = [_row(prompt="hi"), _row(prompt=prefill), _row(prompt="ho")]
    closed = tokenize_rows(rows, tok, 256, True, "train")
    opened = tokenize_rows(rows, tok, 256, True, "train", continue_final=True)
    assert tok.decode(opened[1].ids).endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>")
    assert tok.decode(closed[1].ids).endswith("<think><|im_end|>\n<|im_start|>assistant\n")  # verl's reading
    # prompts ending with the user's message get the generation prompt either way, in the rows' order
    assert [p.ids for p in opened[::2]] == [p.ids for p in closed[::2]] and [p.index for p in opened] == [0, 1, 2]
    # an agent loop opens its trajectory as the data loader renders the prompt
    assert ChatFormat(tok, continue_final=True).prompt_ids(prefill) == opened[1].ids
    assert ChatFormat(tok).prompt_ids(prefill) == closed[1].ids
