"""``reward.manager=generative``: a judge behind an OpenAI-compatible endpoint scores each response.

The judge here is a scripted server on rlforge's own HTTP server (``openai_http.HttpServer``, h11) in a thread's
event loop: ``FakeJudge.reply(prompt)`` picks each answer (a text, an HTTP status, or no answer at all), and the
server counts the requests it holds at once, so the concurrency is asserted from the server's side."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
import torch

import rlforge
from rlforge import Trainer
from rlforge import batch as B
from rlforge.agent.workers import ToolLoop
from rlforge.errors import ConfigError, RLForgeError
from rlforge.plugins.agent.openai_http import HttpRequest, HttpResponse, HttpServer, error_payload
from rlforge.plugins.reward.generative import DEFAULT_PATTERN, GenerativeRewardManager, last_user_text, parse_score
from rlforge.plugins.reward.rule import RewardFailure
from tests.plugins.test_reward import _response_batch

MODEL = "judge-1"
HANG = object()  # reply(): never answer


class FakeJudge:
    """An OpenAI-compatible judge: ``GET /v1/models`` lists ``MODEL``; ``POST /v1/chat/completions`` answers
    ``reply(user message)``: a str (the reply's content), an int (that HTTP status) or ``HANG``. With ``hold=k`` a
    request waits until k requests are in flight, or all ``expect`` requests have arrived (or 5 s passed), before
    it is answered."""

    def __init__(self) -> None:
        self.loop = ToolLoop("fake-judge")
        self.http = HttpServer(self.route)
        self.loop.submit(self.http.start()).result()
        self.url = f"{self.http.url}/v1"
        self.reset()

    def reset(self, reply=lambda prompt: "\\boxed{10}", hold: int = 0, expect: int = 0) -> None:
        self.reply, self.hold, self.expect = reply, hold, expect
        self.models_status = 200  # what GET /v1/models answers
        self.bodies: list[dict] = []
        self.in_flight = self.peak = 0

    async def route(self, request: HttpRequest) -> HttpResponse:
        if request.method == "GET" and request.path == "/v1/models":
            if self.models_status != 200:
                return HttpResponse(self.models_status, error_payload("scripted", "invalid_request_error"))
            return HttpResponse(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        body = json.loads(request.body)
        self.bodies.append(body)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            for _ in range(500):
                if self.in_flight >= self.hold or len(self.bodies) >= self.expect:
                    break
                await asyncio.sleep(0.01)
            answer = self.reply(body["messages"][-1]["content"])
            if answer is HANG:
                await asyncio.sleep(3600)
            if isinstance(answer, int):
                return HttpResponse(answer, error_payload(f"scripted {answer}", "server_error"))
            return HttpResponse(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                                      "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                                   "message": {"role": "assistant", "content": answer}}]})
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        self.loop.submit(self.http.close()).result()
        self.loop.close()


@pytest.fixture(scope="module")
def judge():
    server = FakeJudge()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def fresh_judge(judge):
    """Every test starts with the judge's defaults (a reply of 10, no holding, the model list served)."""
    judge.reset()


@pytest.fixture
def make_manager(pm, char_tokenizer, judge):
    managers = []

    def make(*overrides: str, url: str | None = None) -> GenerativeRewardManager:
        cfg = rlforge.load_config("grpo", ["reward.manager=generative",
                                           f"reward.generative.base_url={url or judge.url}",
                                           f"reward.generative.model={MODEL}", *overrides], plugins=pm)
        managers.append(GenerativeRewardManager(cfg, char_tokenizer, pm.registry))
        return managers[-1]

    yield make
    for m in managers:
        m.close()


def _batch(tok, texts, truths=None):
    batch = _response_batch(tok, texts, ["arith"] * len(texts), truths or ["5"] * len(texts))
    batch[B.RAW_PROMPT] = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}?"}]
                           for i in range(len(texts))]
    return batch


def test_parse_score_takes_the_last_match_and_normalises():
    pattern = re.compile(DEFAULT_PATTERN)
    assert parse_score("maybe \\boxed{2}, no: \\boxed{ 7.5 }", pattern, 0, 10, True) == 0.75
    assert parse_score("\\boxed{-1}", pattern, -1, 1, True) == 0.0
    assert parse_score("\\boxed{3}", pattern, 0, 10, False) == 3.0
    assert parse_score("Score: 4", re.compile(r"Score:\s*(\d+)"), 0, 5, True) == 0.8
    with pytest.raises(ValueError, match=r"no score matching .*reply: 'I think it is fine'"):
        parse_score("I think it is fine", pattern, 0, 10, True)
    with pytest.raises(ValueError, match=r"score 11 is outside \[reward.generative.score_min, score_max\] = \[0, 10\]"):
        parse_score("\\boxed{11}", pattern, 0, 10, True)
    with pytest.raises(ValueError, match="'x' is not a number"):
        parse_score("S=x", re.compile(r"S=(\w)"), 0, 10, True)


def test_last_user_text():
    assert last_user_text([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": [{"type": "text", "text": "c"}, {"type": "image"}]}]) == "c"
    assert last_user_text("plain") == "plain" and last_user_text(None) == ""


def test_scores_are_the_judges_parsed_and_normalised(judge, make_manager, char_tokenizer):
    judge.reset(lambda prompt: "good \\boxed{10}" if "Response:\n5\n" in prompt else "bad \\boxed{2}")
    manager = make_manager("reward.generative.system=You grade.", "reward.generative.max_tokens=7",
                           "reward.generative.temperature=0.5")
    out = manager.score(_batch(char_tokenizer, ["5", "4", "5"]))
    torch.testing.assert_close(out[B.SCORES], torch.tensor([1.0, 0.2, 1.0]))
    assert out[B.TOKEN_LEVEL_SCORES][:, 1].tolist() == pytest.approx([1.0, 0.2, 1.0])  # the response's last token (EOS)
    assert out.meta["metrics"]["reward/error_share"] == 0 and out.meta["metrics"]["reward/errors"] == 0
    assert out.meta["metrics"]["reward/judge/mean"] == pytest.approx(2.2 / 3)
    body = next(b for b in judge.bodies if "q0?" in b["messages"][-1]["content"])  # the requests arrive in any order
    assert body["model"] == MODEL and body["max_tokens"] == 7 and body["temperature"] == 0.5
    assert body["messages"][0] == {"role": "system", "content": "You grade."}
    prompt = body["messages"][1]["content"]
    assert "Question:\nq0?\n" in prompt and "Reference answer:\n5\n" in prompt
    assert prompt.endswith("\\boxed{GRADE} at the very end.")  # the template's {{ }} reach the judge as braces


def test_a_custom_template_and_pattern_without_normalisation(judge, make_manager, char_tokenizer):
    judge.reset(lambda prompt: f"Score: {len(prompt)}")
    manager = make_manager("reward.generative.template='[{data_source}] {prompt} => {response} ({ground_truth})'",
                           "reward.generative.score_pattern='Score: (\\d+)'", "reward.generative.normalize=false",
                           "reward.generative.score_max=100")
    out = manager.score(_batch(char_tokenizer, ["12"], ["7"]))
    assert judge.bodies[0]["messages"] == [{"role": "user", "content": "[arith] q0? => 12 (7)"}]
    assert out[B.SCORES].tolist() == [float(len("[arith] q0? => 12 (7)"))]


def test_requests_overlap_up_to_max_concurrency(judge, make_manager, char_tokenizer):
    judge.reset(hold=3, expect=6)
    manager = make_manager("reward.generative.max_concurrency=3")
    out = manager.score(_batch(char_tokenizer, [str(i) for i in range(6)]))
    assert judge.peak == 3 and len(judge.bodies) == 6  # three at once, never more
    assert out[B.SCORES].tolist() == [1.0] * 6


def test_failures_get_the_fallback_and_are_counted(judge, make_manager, char_tokenizer, caplog):
    replies = {"q0?": HANG, "q1?": "no verdict", "q2?": 400, "q3?": "\\boxed{4}"}
    judge.reset(lambda prompt: replies[re.search(r"q\d\?", prompt).group()])
    manager = make_manager("reward.generative.timeout_s=0.5", "reward.generative.retries=0",
                           "reward.fallback_score=-1")
    with caplog.at_level(logging.WARNING, logger="rlforge.reward"):
        out = manager.score(_batch(char_tokenizer, ["1", "2", "3", "4"]))
    assert out[B.SCORES].tolist() == [-1.0, -1.0, -1.0, pytest.approx(0.4)]
    assert out[B.REWARD_FAILED].tolist() == [1.0, 1.0, 1.0, 0.0]
    metrics = out.meta["metrics"]
    assert (metrics["reward/timeouts"], metrics["reward/errors"], metrics["reward/error_share"]) == (1, 2, 0.75)
    text = caplog.text
    assert "1 of 4 judge requests timed out (reward.generative.timeout_s=0.5 s" in text
    assert "(bad value): the judge's reply has no score" in text and "HTTP 400: scripted 400" in text


def test_retries_after_a_server_error_but_not_after_a_bad_request(judge, make_manager, char_tokenizer):
    answers = iter([503, "\\boxed{6}"])
    judge.reset(lambda prompt: next(answers))
    manager = make_manager("reward.generative.retries=1")
    assert manager.score(_batch(char_tokenizer, ["1"]))[B.SCORES].tolist() == [pytest.approx(0.6)]
    assert len(judge.bodies) == 2
    judge.reset(lambda prompt: 400 if "q0?" in prompt else "\\boxed{1}")
    out = manager.score(_batch(char_tokenizer, ["1", "2"]))
    assert len(judge.bodies) == 2 and out.meta["metrics"]["reward/errors"] == 1  # a bad request is not retried


def test_a_batch_past_max_error_share_stops_naming_the_judge(judge, make_manager, char_tokenizer):
    judge.reset(lambda prompt: "\\boxed{1}" if "q0?" in prompt else 500)
    manager = make_manager("reward.max_error_share=0.5", "reward.generative.retries=0")
    with pytest.raises(RewardFailure, match=rf"2 of 3 judge requests failed on this batch \(2 raised\), which reaches "
                                            rf"reward.max_error_share=0.5.*sample 1: HTTP 500: scripted 500 \(judge "
                                            rf"{re.escape(judge.url)}, model '{MODEL}'\)"):
        manager.score(_batch(char_tokenizer, ["1", "2", "3"]))


def test_an_unreachable_endpoint_is_named_at_start(make_manager):
    with pytest.raises(RLForgeError, match=r"The judge endpoint reward.generative.base_url=http://127.0.0.1:9/v1 is "
                                           r"not reachable"):
        make_manager(url="http://127.0.0.1:9/v1")


def test_a_refused_key_names_its_variable_and_a_missing_model_list_is_accepted(judge, make_manager, char_tokenizer,
                                                                                monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "wrong")
    judge.models_status = 401
    with pytest.raises(RLForgeError, match=r"base_url=.* refused the API key from \$JUDGE_KEY \(HTTP 401: scripted\)"):
        make_manager("reward.generative.api_key_env=JUDGE_KEY")
    judge.models_status = 404  # a server without the model list: its requests tell
    assert make_manager().score(_batch(char_tokenizer, ["1"]))[B.SCORES].tolist() == [1.0]


def test_a_model_the_endpoint_does_not_serve(make_manager):
    with pytest.raises(ConfigError, match=rf"'reward.generative.model' is 'other', which .* does not serve. It "
                                          rf"serves: {MODEL}\."):
        make_manager("reward.generative.model=other")


@pytest.mark.parametrize(("overrides", "message"), [
    ([], r"needs one of 'reward.generative.base_url' .* and 'reward.generative.local_model' .*\.$"),
    (["reward.generative.base_url=http://h/v1", "reward.generative.local_model=builtin:tiny-arith"], r"not both"),
    (["reward.generative.base_url=http://h/v1"], r"needs 'reward.generative.model' with reward.generative.base_url"),
    (["reward.generative.local_device=gpu"], r"'reward.generative.local_device' is 'gpu'. Allowed: auto, cpu"),
    (["reward.generative.base_url=h:8000"], r"'reward.generative.base_url' is 'h:8000': write an http"),
    (["reward.generative.template='{prompt} {answer}'"], r"placeholder '\{answer\}'. Allowed: \{prompt\}, "
                                                         r"\{response\}, \{ground_truth\}, \{data_source\}"),
    (["reward.generative.template='{response} {0}'"], r"placeholder '\{0\}'"),
    (["reward.generative.template='{response.x}'"], r"placeholder '\{response.x\}'"),
    (["reward.generative.template='\\boxed{N} {response}'"], r"placeholder '\{N\}'"),
    (["reward.generative.template='{response'"], r"not a valid str.format template"),
    (["reward.generative.template='{prompt}'"], r"no '\{response\}' placeholder"),
    (["reward.generative.score_pattern='score: \\d+'"], r"'reward.generative.score_pattern' .* has no group"),
    (["reward.generative.score_pattern='(\\d+'"], r"'reward.generative.score_pattern' is not a regular expression"),
    (["reward.generative.score_min=5", "reward.generative.score_max=5"], r"'reward.generative.score_max' \(5\) must"),
    (["reward.generative.max_concurrency=0"], r"reward.generative.max_concurrency"),
])
def test_config_mistakes(pm, overrides, message):
    given = ["reward.generative.base_url=http://h/v1", "reward.generative.model=m"] if "needs" not in message else []
    with pytest.raises(ConfigError, match=message):
        rlforge.load_config("grpo", ["reward.manager=generative", *given, *overrides], plugins=pm)


SMALL = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2", "data.arith.train_size=64",
         "data.arith.val_size=4", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.progress=false",
         "logger.backends=[]", "trainer.total_steps=2"]


@pytest.mark.slow
def test_grpo_fits_on_the_judges_reward(judge, tmp_path):
    """Two GRPO steps where the judge gives 10 to a response equal to the reference answer, else 0."""
    def grade(prompt):
        truth, response = prompt.split("|")
        return "\\boxed{10}" if response.strip() == truth else "\\boxed{0}"

    judge.reset(grade)
    cfg = rlforge.load_config("grpo", [*SMALL, f"trainer.runs_root={tmp_path}", "reward.manager=generative",
                                       f"reward.generative.base_url={judge.url}", f"reward.generative.model={MODEL}",
                                       "reward.generative.template='{ground_truth}|{response}'"])
    trainer = Trainer(cfg)
    summary = trainer.fit()
    assert len(judge.bodies) == 2 * 4 * 2 + 4  # steps x prompts x samples, and the end-of-run validation's 4 prompts
    for step in trainer.history:
        assert step["reward/error_share"] == 0 and step["critic/score/mean"] == pytest.approx(step["reward/judge/mean"])
    assert summary["reward_error_share"] == 0


JUDGE_SUMS = ["reward.generative.template='What is {response}?'", "reward.generative.score_pattern='(\\d+)'",
              "reward.generative.normalize=false", "reward.generative.score_max=1000", "reward.generative.max_tokens=6"]


@pytest.fixture(scope="module")
def tiny_engine(pm, char_tokenizer):
    """The shipped tiny model on the hf engine, and the config it was built with."""
    from rlforge.build import Builder
    from rlforge.models import load_model

    cfg = rlforge.load_config("grpo", ["data.max_prompt_length=64", "rollout.max_new_tokens=6"], plugins=pm)
    return Builder(cfg, pm).rollout(load_model(cfg.model.path), char_tokenizer), cfg


SUMS = ["53+93", "1+38", "20+20"]  # the "responses" the tiny model judges: it answers each with a different number


def _greedy_numbers(engine, tok, texts):
    """The last number of the tiny model's greedy reply to each judge prompt, asked directly (all different, so a
    judge that mixed the samples up would not pass)."""
    from rlforge.sampling import SamplingParams

    out = []
    for text in texts:
        ids = tok.apply_chat_template([{"role": "user", "content": f"What is {text}?"}], add_generation_prompt=True,
                                      tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        gen = engine.generate_tokens([ids], [SamplingParams(n=1, temperature=0.0, max_new_tokens=6)])[0]
        out.append(float(re.findall(r"\d+", tok.decode(gen.ids, skip_special_tokens=True))[-1]))
    assert len(set(out)) == len(out), out
    return out


def test_rlforge_own_endpoint_serving_the_tiny_model_as_the_judge(pm, make_manager, char_tokenizer, tiny_engine):
    """The judge is rlforge's OpenAI endpoint (openai_server.ChatServer) on the shipped tiny model through the hf
    engine, asked with the real openai client: each score is the number the model answers, greedily, to the judge
    prompt (the tiny model does sums)."""
    from rlforge.agent.engine import EngineHandle, TrajectoryEngine, token_generator
    from rlforge.agent.types import Sample
    from rlforge.build import Builder
    from rlforge.plugins.agent.openai_recorder import Recorder
    from rlforge.plugins.agent.openai_server import ChatServer
    from rlforge.sampling import SamplingParams

    engine, cfg = tiny_engine
    context = Builder(cfg, pm).agent(char_tokenizer).context
    loop = ToolLoop("rlforge-endpoint")

    async def serve():
        server = ChatServer()
        await server.start()
        handle = EngineHandle(token_generator(engine, char_tokenizer, True),
                              SamplingParams(n=1, temperature=0.0, max_new_tokens=6), max_len=70)
        sample = Sample([], [], "judge", None, None, 0, 0)
        return server, server.add(Recorder(context, sample, TrajectoryEngine(handle)))

    server, key = loop.submit(serve()).result()
    try:
        manager = make_manager(*JUDGE_SUMS, "reward.generative.model=rlforge-policy", url=f"{server.url}/t/{key}/v1")
        out = manager.score(_batch(char_tokenizer, SUMS))
    finally:
        loop.submit(server.close()).result()
        loop.close()
    assert out.meta["metrics"]["reward/error_share"] == 0
    assert out[B.SCORES].tolist() == _greedy_numbers(engine, char_tokenizer, SUMS)


def test_a_local_judge_on_the_hf_engine(pm, char_tokenizer, tiny_engine):
    """reward.generative.local_model: the tiny model in this process judges as the endpoint above does."""
    cfg = rlforge.load_config("grpo", ["reward.manager=generative", "reward.generative.local_model=builtin:tiny-arith",
                                       "reward.generative.local_device=cpu", "reward.generative.max_concurrency=2",
                                       *JUDGE_SUMS], plugins=pm)
    manager = GenerativeRewardManager(cfg, char_tokenizer, pm.registry)
    out = manager.score(_batch(char_tokenizer, SUMS))
    manager.close()
    assert out.meta["metrics"]["reward/error_share"] == 0
    assert out[B.SCORES].tolist() == _greedy_numbers(tiny_engine[0], char_tokenizer, SUMS)
