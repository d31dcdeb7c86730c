"""The offline preference algorithms (dpo, ipo, kto, simpo, orpo, rm): data formats, batch layout, config checks,
losses wired to the pure functions, micro-batching, fit / resume / export, and short learning runs."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from rlforge import Trainer, hookimpl, load_config
from rlforge import batch as B
from rlforge.algorithms import preference as P
from rlforge.algorithms.offline import example_sums, finish_metrics, sequence_sums
from rlforge.cli import main
from rlforge.preferences import PreferenceExample, collate_preferences, tokenize_preferences
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.module import LossContext

PREFERENCE_ALGOS = ["dpo", "ipo", "kto", "orpo", "rm", "simpo"]
FAST = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "data.arith.val_size=8", "data.arith.train_size=64",
        "trainer.val_every=0", "trainer.progress=false", "logger.backends=[]"]


def _pair(**extra) -> dict:
    return {"prompt": "What is 1+2?", "chosen": "3", "rejected": "4", **extra}


def _tok(tokenizer, rows, paired=True, max_completion=64):
    return tokenize_preferences(rows, tokenizer, 64, max_completion, True, "prefs", paired)


# --- data formats --------------------------------------------------------------------------------------


def test_pair_of_strings_is_rendered_by_the_chat_template(char_tokenizer) -> None:
    (ex,) = _tok(char_tokenizer, [_pair(margin=1.5)])
    assert char_tokenizer.decode(ex.prompt.ids) == "<|user|>What is 1+2?<|end|><|assistant|>"
    # the completion is what the template adds after the generation prompt: the answer and the end-of-turn token
    assert [char_tokenizer.decode(c) for c in ex.completions] == ["3<|end|>", "4<|end|>"]
    assert ex.labels == [1.0, 0.0] and ex.margin == 1.5


def test_chat_messages_and_the_implicit_prompt_give_the_same_example(char_tokenizer) -> None:
    user = [{"role": "user", "content": "What is 1+2?"}]
    messages = {"prompt": user, "chosen": [{"role": "assistant", "content": "3"}],
                "rejected": [{"role": "assistant", "content": "4"}]}
    implicit = {"chosen": user + [{"role": "assistant", "content": "3"}],
                "rejected": user + [{"role": "assistant", "content": "4"}]}
    plain, chat, shared = (_tok(char_tokenizer, [r])[0] for r in (_pair(), messages, implicit))
    assert plain.prompt.ids == chat.prompt.ids == shared.prompt.ids
    assert plain.completions == chat.completions == shared.completions


def test_unpaired_rows_and_pairs_split_for_kto(char_tokenizer) -> None:
    rows = [{"prompt": "What is 1+2?", "completion": "3", "label": True}, _pair()]
    examples = _tok(char_tokenizer, rows, paired=False)
    assert [ex.labels for ex in examples] == [[1.0], [1.0], [0.0]]  # the pair gives a desirable and an undesirable
    assert [char_tokenizer.decode(ex.completions[0]) for ex in examples] == ["3<|end|>", "3<|end|>", "4<|end|>"]


def test_long_completions_are_truncated_and_an_empty_answer_is_the_end_of_turn(char_tokenizer) -> None:
    (ex,) = _tok(char_tokenizer, [_pair(chosen="123456789", rejected="")], max_completion=4)
    assert [char_tokenizer.decode(c) for c in ex.completions] == ["1234", "<|end|>"]


def test_pairs_without_a_preference_are_dropped_with_a_count(char_tokenizer, caplog) -> None:
    rows = [_pair(), _pair(rejected="3"), _pair(chosen="", rejected=""), _pair(chosen="1234x", rejected="1234y")]
    with caplog.at_level("WARNING", logger="rlforge.data"):
        examples = _tok(char_tokenizer, rows, max_completion=4)  # the last two differ only past 4 tokens
    assert [[char_tokenizer.decode(c) for c in ex.completions] for ex in examples] == [["3<|end|>", "4<|end|>"]]
    (warning,) = caplog.messages
    assert warning.startswith("prefs: dropped 3 of 4 pairs whose 'chosen' and 'rejected' are the same tokens (the "
                              "same text, both empty, or the same within algorithm.max_completion_length=4 tokens), "
                              "first prefs, row 2")
    assert len(_tok(char_tokenizer, rows[:1] + rows[2:3], paired=False)) == 4  # unpaired (KTO) keeps both sides


def test_a_dataset_of_only_identical_pairs_is_refused(char_tokenizer) -> None:
    with pytest.raises(DataError, match=r"^prefs: in every one of its 2 pairs 'chosen' and 'rejected' are the same "
                                        r"tokens .*, first prefs, row 1: there is no preference to learn from."):
        _tok(char_tokenizer, [_pair(rejected="3"), _pair(chosen="", rejected="")])


@pytest.mark.parametrize("row, paired, message", [
    ({"prompt": "q", "chosen": "a"}, True, r"prefs, row 1: missing column 'rejected'"),
    ({"prompt": "q", "completion": "a", "label": True}, True, "unpaired data \\(KTO\\)"),
    ({"prompt": "q", "completion": "a", "label": "yes"}, False, "boolean 'label'"),
    (_pair(margin="big"), True, "'margin' must be a finite number"),
    (_pair(margin=float("nan")), True, "'margin' must be a finite number, got nan"),
    (_pair(prompt=""), True, "the prompt is empty"),
    ({"chosen": "3", "rejected": "4"}, True, "missing column 'prompt'"),
    ({"prompt": "What is 1+2?", "answer": "3"}, True, "missing column 'chosen'"),
])
def test_bad_preference_rows_name_the_row_and_the_columns(char_tokenizer, row, paired, message) -> None:
    with pytest.raises(DataError, match=message):
        _tok(char_tokenizer, [row], paired=paired)


def test_a_chat_template_that_does_not_continue_the_prompt_is_an_error(char_tokenizer) -> None:
    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = ("{% for m in messages|reverse %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    with pytest.raises(DataError) as info:
        _tok(tok, [_pair()])
    assert str(info.value) == ("prefs, row 1: the chat template does not render 'chosen' as a continuation of the "
                               "prompt: the prompt with the generation prompt is not a prefix of prompt + chosen, as "
                               "text (they part at character 3: the prompt has 'user|>What is 1+2?<|end|><|assistant"
                               "|>', prompt + chosen has 'assistant|>3<|end|><|user|>What is 1+2?<').")


HH_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ '\n\nHuman: ' + m['content'] }}{% else %}"
               "{{ '\n\nAssistant: ' + m['content'] }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '\n\nAssistant: ' }}{% endif %}")


def test_a_generation_prompt_ending_in_a_space_keeps_the_prompt_tokens_generation_sees() -> None:
    """Anthropic HH's template: byte-level BPE merges the generation prompt's trailing space into the answer's first
    token ('Ġ' + 'Paris' -> 'ĠParis'), so prompt + answer is not prompt ids + more ids; the answer's text is tokenized
    on its own after the prompt's ids, as TRL does."""
    from rlforge.data import apply_template
    from rlforge.tools.tiny_chat import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = HH_TEMPLATE
    question = [{"role": "user", "content": "What is 2+2?"}]
    generation = apply_template(tok, question, "q", add_generation_prompt=True)
    merged = apply_template(tok, question + [{"role": "assistant", "content": "The answer is 4"}], "q")
    assert merged[: len(generation)] != generation  # the token boundary moved
    (ex,) = _tok(tok, [{"prompt": question, "chosen": "The answer is 4", "rejected": "Paris."}])
    assert ex.prompt.ids == generation
    assert [tok.decode(c) for c in ex.completions] == ["The answer is 4", "Paris."]
    assert ex.completions[0] == tok("The answer is 4", add_special_tokens=False)["input_ids"]


def test_anthropic_hh_transcripts_are_read_as_conversations(char_tokenizer) -> None:
    """Anthropic/hh-rlhf as published: 'chosen' and 'rejected' are whole transcripts; their common turns are the
    prompt (rendered by the model's own chat template), each last assistant turn the completion."""
    talk = "\n\nHuman: What is 1+2?\n\nAssistant: 3?\n\nHuman: Sure?"
    (hh,) = _tok(char_tokenizer, [{"chosen": talk + "\n\nAssistant: Yes, 3.", "rejected": talk + "\n\nAssistant: 4"}])
    turns = [{"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": "3?"},
             {"role": "user", "content": "Sure?"}]
    (chat,) = _tok(char_tokenizer, [{"prompt": turns, "chosen": "Yes, 3.", "rejected": "4"}])
    assert hh.prompt.ids == chat.prompt.ids and hh.completions == chat.completions
    # a transcript beside a plain string is not a conversation pair: the missing prompt is named
    with pytest.raises(DataError, match="Anthropic HH transcripts in both"):
        _tok(char_tokenizer, [{"chosen": talk + "\n\nAssistant: Yes, 3.", "rejected": "4"}])


def _uf_row(prompt: str = "What is 1+2?") -> dict:
    """An UltraFeedback-binarized row: a string prompt, conversations that repeat it, and its other columns."""
    user = [{"role": "user", "content": "What is 1+2?"}]
    return {"prompt": prompt, "prompt_id": "0a1b", "chosen": user + [{"role": "assistant", "content": "3"}],
            "rejected": user + [{"role": "assistant", "content": "4"}], "messages": user, "score_chosen": 8.0,
            "score_rejected": 3.5}


def test_ultrafeedback_rows_take_the_prompt_of_their_conversations(char_tokenizer, caplog) -> None:
    """A string prompt beside conversations that carry it is ignored (TRL's maybe_extract_prompt)."""
    (plain,) = _tok(char_tokenizer, [_pair()])
    with caplog.at_level("WARNING", logger="rlforge.data"):
        (uf,) = _tok(char_tokenizer, [_uf_row()])
    assert uf.prompt.ids == plain.prompt.ids and uf.completions == plain.completions
    assert not caplog.messages
    with caplog.at_level("WARNING", logger="rlforge.data"):
        examples = _tok(char_tokenizer, [_uf_row(), _uf_row("What is 1 + 2?"), _uf_row("something else")])
    assert [ex.prompt.ids for ex in examples] == [plain.prompt.ids] * 3  # the conversations' prompt, every time
    assert caplog.messages == ["prefs: 2 of 3 rows have a string 'prompt' besides 'chosen' and 'rejected' "
                               "conversations that carry the prompt, and it is not the last user message of that "
                               "prompt, first prefs, row 2: the conversations' prompt is the one trained on, 'prompt' "
                               "is ignored (TRL's maybe_extract_prompt)."]
    # a string prompt beside assistant-only conversations is still the prompt
    answers = {"chosen": [{"role": "assistant", "content": "3"}], "rejected": [{"role": "assistant", "content": "4"}]}
    (assistant_only,) = _tok(char_tokenizer, [{"prompt": "What is 1+2?", **answers}])
    assert assistant_only.prompt.ids == plain.prompt.ids and assistant_only.completions == plain.completions


@pytest.mark.parametrize("chosen, rejected, message", [
    (["u", "a"], ["u"], "no 'prompt' column, and 'rejected' has no completion after the prompt it shares with "
                        "'chosen': its only message (role 'user') is the first message of 'chosen' too, which leaves "
                        "'rejected' empty once that message is the prompt. End 'rejected' with its own assistant "
                        "message, or give the row a 'prompt' column."),
    (["u"], ["u", "b"], "'chosen' has no completion after the prompt it shares with 'rejected'"),
    (["u"], ["u"], "'chosen' and 'rejected' are the same single message: no completion follows it in either."),
    (["u", "a"], ["v", "b"], "no 'prompt' column, and 'chosen' and 'rejected' share no first message to take as the "
                             "prompt."),
])
def test_implicit_prompt_mistakes_say_what_is_missing(char_tokenizer, chosen, rejected, message) -> None:
    turns = {"u": ("user", "What is 1+2?"), "v": ("user", "What is 2+2?"), "a": ("assistant", "3"),
             "b": ("assistant", "4")}

    def conversation(keys):
        return [{"role": turns[k][0], "content": turns[k][1]} for k in keys]

    with pytest.raises(DataError) as info:
        _tok(char_tokenizer, [{"chosen": conversation(chosen), "rejected": conversation(rejected)}])
    assert str(info.value).startswith("prefs, row 1: ") and message in str(info.value)


def test_overlong_prompts_are_dropped_with_a_count(char_tokenizer, caplog) -> None:
    """As identical pairs are: counted, the first named (file and row), with its length and the key to raise."""
    long_prompt = "What is 1+2? Explain your reasoning in detail, and be precise about each step."
    rows = [_pair(prompt=long_prompt), _pair(), _pair(prompt=long_prompt + "!"), _pair(chosen="30")]
    with caplog.at_level("WARNING", logger="rlforge.data"):
        examples = tokenize_preferences(rows, char_tokenizer, 40, 64, True, "files (train)")
    assert [char_tokenizer.decode(ex.completions[0]) for ex in examples] == ["3<|end|>", "30<|end|>"]
    assert caplog.messages == ["files (train): dropped 2 of 4 rows whose prompt is longer than "
                               "data.max_prompt_length=40 tokens (after the chat template), first files (train), row 1 "
                               f"({len(long_prompt) + 3} tokens): raise data.max_prompt_length to keep them."]
    with pytest.raises(DataError, match=r"^files \(val\): all 2 prompts are longer than data.max_prompt_length=40 "
                                        r"tokens \(after the chat template\), first files \(val\), row 1 \(81 "
                                        r"tokens\): raise data.max_prompt_length.$"):
        tokenize_preferences(rows[::2], char_tokenizer, 40, 64, True, "files (val)")
    # not filtered: the error gives the one way out that applies (data.truncation never cuts a preference prompt:
    # helper-59's loop of advice)
    with pytest.raises(DataError, match=r"set data.filter_overlong_prompts=true to drop such rows; a preference "
                                        r"row's prompt is never cut \(docs/data.md\)\)\.$"):
        tokenize_preferences(rows, char_tokenizer, 40, 64, False, "files (train)")


def test_collate_lays_pairs_out_as_groups_of_two(char_tokenizer) -> None:
    examples = _tok(char_tokenizer, [_pair(), _pair(prompt="What is 10+20?", chosen="30", rejected="3")])
    batch = collate_preferences(examples, char_tokenizer.pad_token_id, ["a", "b"])
    assert batch[B.UID] == ["a", "a", "b", "b"]
    assert batch[B.LABEL].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert torch.equal(batch[B.INPUT_IDS], torch.cat([batch[B.PROMPTS], batch[B.RESPONSES]], 1))
    assert torch.equal(batch[B.ATTENTION_MASK], torch.cat([batch[B.PROMPT_MASK], batch[B.RESPONSE_MASK]], 1))
    assert batch[B.RESPONSE_MASK].sum(-1).tolist() == [2, 2, 3, 2]  # "3<|end|>", "4<|end|>", "30<|end|>", ...
    assert batch[B.PROMPT_MASK][0, 0] == 0 and batch[B.PROMPT_MASK][2, 0] == 1  # prompts left-padded


# --- config --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo, overrides, message", [
    ("dpo", ["rollout.n=4"], "rollout.n must be 2"),
    ("kto", ["rollout.n=2"], "rollout.n must be 1"),
    ("dpo", ["actor.ppo_micro_batch_size=3", "actor.ppo_mini_batch_size=3", "data.train_batch_size=3"], "must be even"),
    ("dpo", ["actor.max_tokens_per_micro_batch=512"], "would split preference pairs"),
    ("ipo", ["rollout.temperature=0.7"], "temperature 1.0"),
    ("dpo", ["algorithm.label_smoothing=0.7"], r"label_smoothing' must be in \[0, 0.5\]"),
    ("simpo", ["algorithm.beta=0"], "'algorithm.beta' must be > 0"),
    ("kto", ["algorithm.undesirable_weight=-1"], "must be >= 0"),
    ("rm", ["algorithm.max_completion_length=0"], "'algorithm.max_completion_length' must be > 0"),
    ("rm", ["model.lora.rank=4"], "LoRA is not offered for reward models"),
])
def test_config_mistakes(pm, algo, overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(algo, overrides, plugins=pm)


def test_presets_and_flows(pm) -> None:
    flows = {a: pm.registry.algorithm.get(a)(load_config(a, plugins=pm)).flow().compile().names()
             for a in PREFERENCE_ALGOS}
    assert flows == {
        "dpo": ["ref_logprob", "update_actor", "sync_weights"], "ipo": ["ref_logprob", "update_actor", "sync_weights"],
        "kto": ["ref_logprob", "kto_reference_point", "update_actor", "sync_weights"],
        "simpo": ["update_actor", "sync_weights"], "orpo": ["update_actor", "sync_weights"], "rm": ["update_actor"],
    }
    assert load_config("simpo", plugins=pm).algorithm.beta == 2.0
    assert load_config("kto", plugins=pm).rollout.n == 1 and load_config("dpo", plugins=pm).rollout.n == 2


# --- losses, metrics and micro-batches -------------------------------------------------------------------


def test_finish_metrics_are_the_means_of_preference_metrics() -> None:
    chosen, rejected = torch.tensor([0.5, -0.2]), torch.tensor([-0.5, 0.1])
    logps = sequence_sums(_labelled([1, 0, 1, 0]), torch.tensor([[-10.0], [-30.0], [-20.0], [-40.0]]), paired=True)
    # two micro-batches of one pair each, summed as the workers do
    halves = [example_sums(chosen[i:i + 1], rejected[i:i + 1], logps._replace(
        chosen=logps.chosen[i:i + 1], rejected=logps.rejected[i:i + 1]), paired=True) for i in (0, 1)]
    total = {k: halves[0][k] + halves[1][k] for k in halves[0]}
    assert finish_metrics(total) == pytest.approx(P.preference_metrics(chosen, rejected, logps.chosen, logps.rejected))


def _labelled(labels) -> B.Batch:
    n = len(labels)
    return B.Batch({B.LABEL: torch.tensor(labels, dtype=torch.float32), B.RESPONSE_MASK: torch.ones(n, 1)})


def test_a_split_pair_is_an_error() -> None:
    with pytest.raises(RLForgeError, match="not whole preference pairs"):
        sequence_sums(_labelled([0, 1]), torch.zeros(2, 1), paired=True)
    with pytest.raises(RLForgeError, match="not whole preference pairs"):
        sequence_sums(_labelled([1, 0, 1]), torch.zeros(3, 1), paired=True)


@pytest.fixture(scope="module")
def dpo_module(pm, char_tokenizer):
    cfg = load_config("dpo", ["algorithm.beta=0.5", "algorithm.label_smoothing=0.1"], plugins=pm)
    module = pm.registry.algorithm.get("dpo")(cfg)
    module.configure_model()
    return module


def _pairs_batch(module, n=4) -> B.Batch:
    rows = [_pair(prompt=f"What is {i}+{i}?", chosen=str(2 * i), rejected=str(2 * i + 1)) for i in range(n)]
    batch = module.collate(_tok(module.tokenizer, rows), list(range(n)))
    batch[B.REF_LOG_PROBS] = module.forward_responses(module.ref, batch, 1.0).detach()
    return batch


def test_dpo_training_step_is_the_dpo_loss_and_micro_batches_add_up(dpo_module) -> None:
    batch = _pairs_batch(dpo_module)
    whole = LossContext(global_tokens=float(batch[B.RESPONSE_MASK].sum()), global_seqs=float(len(batch)))
    loss, metrics = dpo_module.training_step(batch, whole)
    with torch.no_grad():
        mask = batch[B.RESPONSE_MASK]
        policy = (dpo_module.forward_responses(dpo_module.actor, batch, 1.0) * mask).sum(-1)
        ref = (batch[B.REF_LOG_PROBS] * mask).sum(-1)
        expected = P.dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], 0.5, 0.1).losses.mean()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert abs(finish_metrics(metrics)["rewards/margins"]) < 1e-5  # the policy is the reference: margins are 0
    micro_losses = [dpo_module.training_step(batch.select(rows), whole)[0] for rows in ([0, 1], [2, 3, 4, 5], [6, 7])]
    assert sum(m.item() for m in micro_losses) == pytest.approx(loss.item(), abs=1e-6)


def test_a_pair_runs_its_prompt_once(pm, dpo_module, shared_calls) -> None:
    """``model.shared_prefix`` (the default): on the actor worker a pair's chosen and rejected rows share one forward
    pass of their prompt, and the log-probs equal the plain forward's."""
    from rlforge.worker import ActorWorker

    batch = _pairs_batch(dpo_module)
    log_probs = {}
    for shared in ("true", "false"):
        cfg = load_config("dpo", [f"model.shared_prefix={shared}"], plugins=pm)
        module = copy.copy(dpo_module)
        module.config, module.actor = cfg, copy.deepcopy(dpo_module.actor)
        log_probs[shared] = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg)).compute_log_probs(batch)
    assert len(shared_calls) == 1  # the shared run's one micro-batch
    torch.testing.assert_close(log_probs["true"], log_probs["false"], rtol=1e-5, atol=1e-5)


# --- the Trainer: fit, checkpoints, resume, export, validation ---------------------------------------------


def test_fit_dpo_from_the_command_line(tmp_path, capsys) -> None:
    code = main(["fit", "--algo", "dpo", *FAST, "trainer.total_steps=2", f"trainer.runs_root={tmp_path}",
                 "logger.backends=[console,mlflow]"])
    assert code == 0
    run = next((tmp_path / "default").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["accuracy_before"] is not None  # arith_pairs: generation accuracy too
    assert (run / "checkpoints" / "step_000002" / "actor" / "model.safetensors").is_file()
    assert not (run / "samples.jsonl").exists()  # no generated samples in training steps
    assert (run / "val_samples.jsonl").is_file()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=summary["mlflow_uri"])
    data = client.get_run((run / "mlflow_run_id").read_text().strip()).data
    for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                "logps/rejected", "actor/loss", "val/accuracy", "val/rewards/accuracies", "val/loss"):
        assert key in data.metrics, key


@pytest.mark.parametrize("algo", ["dpo", "kto"])
def test_resume_is_bit_identical(tmp_path, algo) -> None:
    from tests.test_e2e import CrashAt

    common = [*FAST, "trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last_n=0",
              "trainer.val_before_train=false"]
    full = Trainer(load_config(algo, [*common, f"trainer.runs_root={tmp_path / 'a'}"]))
    full.fit()
    with pytest.raises(KeyboardInterrupt):
        Trainer(load_config(algo, [*common, f"trainer.runs_root={tmp_path / 'b'}"]), callbacks=[CrashAt(3)]).fit()
    resumed = Trainer(load_config(algo, [*common, f"trainer.runs_root={tmp_path / 'b'}", "trainer.resume=auto"]))
    resumed.fit()
    a = load_file(str(full.run_dir / "checkpoints" / "step_000003" / "actor" / "model.safetensors"))
    b = load_file(str(resumed.run_dir / "checkpoints" / "step_000003" / "actor" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert full.history[2]["actor/loss"] == resumed.history[0]["actor/loss"]


def test_reward_model_exports_as_a_sequence_classifier(tmp_path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    trainer = Trainer(load_config("rm", [*FAST, "trainer.total_steps=2", f"trainer.runs_root={tmp_path}"]))
    summary = trainer.fit()
    assert 0.0 <= summary["accuracy_after"] <= 1.0  # held-out pairwise accuracy
    out = tmp_path / "rm"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0
    model = AutoModelForSequenceClassification.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert model.config.num_labels == 1 and model.config.pad_token_id == tokenizer.pad_token_id
    batch = trainer.module.collate(_tok(tokenizer, [_pair(), _pair(chosen="30")]), [0, 1])
    with torch.no_grad():
        exported = trainer.module.rewards(model, batch)
        trained = trainer.module.rewards(trainer.module.actor, batch)
    torch.testing.assert_close(exported, trained)


def test_pairs_data_errors_before_any_model_loads(tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 1+2?", "data_source": "arith",
                                   "reward_model": {"ground_truth": "3"}}) + "\n")
    cfg = load_config("dpo", [*FAST, "data.name=files", f"data.train_files=[{prompts}]", "trainer.total_steps=1",
                              f"trainer.runs_root={tmp_path}"])
    with pytest.raises(DataError, match=f"{prompts}, row 1: missing column 'chosen'"):
        Trainer(cfg).fit()


# --- learning ------------------------------------------------------------------------------------------

LEARN = ["data.train_batch_size=16", "actor.ppo_mini_batch_size=16", "trainer.total_steps=10", "trainer.val_every=0",
         "trainer.save_every=0", "trainer.progress=false", "logger.backends=[]"]


@pytest.mark.slow
@pytest.mark.parametrize("algo, lr", [("dpo", 1e-4), ("ipo", 1e-4), ("kto", 1e-4), ("simpo", 1e-4), ("orpo", 1e-4),
                                      ("rm", 3e-4)])
def test_algorithm_learns_its_preferences(pm, tmp_path, algo, lr) -> None:
    """10 steps (5 epochs) over 32 pairs of the built-in task: the loss on those pairs, measured by validation on
    the same file before and after, falls, and the reward margin between chosen and rejected widens."""
    cfg = load_config("dpo", ["data.arith.train_size=32"], plugins=pm)
    rows = [{k: v for k, v in r.items() if k != "reward_model"}  # pairs only: no generation in validation
            for r in pm.registry.dataset.get("arith_pairs")(cfg, "train")]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    validations = ValidationRecorder()
    Trainer(load_config(algo, [*LEARN, f"actor.lr={lr}", "data.name=files", f"data.train_files=[{pairs}]",
                               f"data.val_files=[{pairs}]", f"trainer.runs_root={tmp_path}"]),
            callbacks=[validations]).fit()
    before, after = validations.by_step[0], validations.by_step[10]
    assert after["val/loss"] < before["val/loss"] - 0.01, (before, after)
    assert after["val/rewards/margins"] > before["val/rewards/margins"], (before, after)


class ValidationRecorder:
    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, float]] = {}

    @hookimpl
    def rlforge_validation_end(self, step, metrics):
        self.by_step[step] = metrics
