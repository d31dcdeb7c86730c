"""``generative`` reward manager: a judge model scores each response by writing a verdict (LLM-as-a-judge, a GenRM).

The judge is any OpenAI-compatible chat-completions endpoint (``reward.generative.base_url``: vLLM's or SGLang's
server, a hosted API, rlforge's own agent endpoint). Each sample becomes one request: ``reward.generative.template``
filled with the sample's ``{prompt}`` (the last user message of the prompt), ``{response}`` (the decoded response,
or an agent loop's answer), ``{ground_truth}`` and ``{data_source}``, as a user message after an optional system
message. The score is the last match of ``reward.generative.score_pattern`` in the reply (its first group, a
number), checked against ``[score_min, score_max]`` and, with ``normalize``, mapped linearly onto [0, 1].

The requests of a batch run concurrently (at most ``max_concurrency`` at once) with one ``openai.AsyncOpenAI``
client on an event loop in a daemon thread, kept across steps. A request gets ``timeout_s`` seconds per attempt
and ``retries`` more attempts after a timeout, a connection error, HTTP 408/409/429 or a 5xx (not after another
HTTP error, such as 400 or 401, nor after an unreadable reply). A sample whose request failed in the end, or whose
reply has no score in range, gets ``reward.fallback_score`` and is counted exactly as a failed rule-reward call:
``reward/errors``, ``reward/timeouts``, ``reward/error_share``; a batch whose share of failures reaches
``reward.max_error_share`` stops the run with the first failure, the endpoint and the model named. An endpoint that
does not answer when the manager starts is an error naming ``base_url``.

With ``reward.generative.local_model`` instead of ``base_url`` the judge is a causal LM loaded in this process and
run on rlforge's ``hf`` rollout engine (``local_device``): the same prompts through the judge's chat template, in
batches of ``max_concurrency``, the same parsing and accounting (``timeout_s`` and ``retries`` are the endpoint's).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from rlforge.plugins.reward.results import BAD_VALUE, ERROR_KINDS, OK, RAISED, TIMEOUT, Outcome, describe
from rlforge.plugins.reward.rule import ERROR_SHARE, RewardFailure, more_tolerance, why_stop

from rlforge import batch as B
from rlforge.agent.workers import ToolLoop
from rlforge.config.checks import check_device
from rlforge.config.schema import option
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import, optional_import
from rlforge.sampling import SamplingParams

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

log = logging.getLogger("rlforge.reward")

KEY = "reward.generative"
FIELDS = ("prompt", "response", "ground_truth", "data_source")  # the template's placeholders
DEFAULT_TEMPLATE = (
    "You are grading a response to a question. Compare it with the reference answer and judge whether it is "
    "correct and well reasoned.\n\n"
    "Question:\n{prompt}\n\n"
    "Reference answer:\n{ground_truth}\n\n"
    "Response:\n{response}\n\n"
    "Give a short justification, then the grade as an integer from 0 (wrong) to 10 (fully correct) in the form "
    "\\boxed{{GRADE}} at the very end."
)
DEFAULT_PATTERN = r"\\boxed\{\s*([-+]?\d+(?:\.\d+)?)\s*\}"
RETRIED_STATUS = (408, 409, 429)  # and every 5xx: the error may pass
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # wait before retry k (the last value for later ones)


@dataclass
class GenerativeRewardConfig:
    """The judge of ``reward.manager=generative``."""

    base_url: str = ""  # the judge's OpenAI-compatible endpoint, up to /v1 (e.g. http://127.0.0.1:8000/v1); this or local_model
    model: str = ""  # the model name sent in each request (the endpoint's served model name); required with base_url
    local_model: Optional[str] = None  # instead of an endpoint: a causal LM (folder, Hub id, builtin:NAME) run in this process on the hf rollout engine
    local_device: str = "auto"  # local_model: auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    api_key_env: str = option("OPENAI_API_KEY", pattern=r"[A-Za-z_][A-Za-z0-9_]*", what="an environment variable name")  # environment variable holding the API key (unset: the key 'EMPTY', as local servers accept)
    system: Optional[str] = None  # system message before the judge prompt (None: none)
    template: str = DEFAULT_TEMPLATE  # the judge prompt: str.format placeholders {prompt} {response} {ground_truth} {data_source}; write literal braces as {{ }}
    score_pattern: str = DEFAULT_PATTERN  # regular expression of the score; its first group (a number) in the reply's last match is the score (default: the last \boxed{N})
    score_min: float = 0.0  # the lowest score the judge may give (a score outside [score_min, score_max] is a reward error)
    score_max: float = 10.0  # the highest score the judge may give
    normalize: bool = True  # map [score_min, score_max] linearly onto [0, 1]; false = the judge's number as the reward
    max_concurrency: int = option(32, ge=1)  # requests in flight at once
    timeout_s: float = option(60.0, gt=0)  # wall-clock limit of one request attempt, in seconds
    retries: int = option(2, ge=0)  # more attempts after a timeout, connection error, HTTP 408/409/429 or 5xx
    temperature: float = option(0.0, ge=0)  # the judge's sampling temperature (0 = greedy)
    max_tokens: int = option(512, ge=1)  # longest judge reply, in tokens


def template_fields(template: str) -> list[str]:
    """The placeholders of a ``str.format`` template; ``ConfigError`` naming ``reward.generative.template`` for an
    unknown, positional or indexed one, or for unmatched braces."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"'{KEY}.template' is not a valid str.format template: {exc}. Write a literal brace "
                          f"as '{{{{' or '}}}}'.") from None
    fields = []
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if name not in FIELDS:
            raise ConfigError(f"'{KEY}.template' has the placeholder '{{{name}}}'. Allowed: "
                              f"{', '.join('{' + f + '}' for f in FIELDS)}; write a literal brace as '{{{{' or '}}}}'.")
        if spec and "{" in spec:
            raise ConfigError(f"'{KEY}.template': the placeholder '{{{name}}}' has a nested field in its format "
                              f"spec ('{spec}').")
        fields.append(name)
    if "response" not in fields:
        raise ConfigError(f"'{KEY}.template' has no '{{response}}' placeholder: the judge would not see the response.")
    return fields


def parse_score(reply: str, pattern: re.Pattern[str], low: float, high: float, normalize: bool) -> float:
    """The reward of a judge's ``reply``: the first group of ``pattern``'s last match as a number in [low, high],
    mapped onto [0, 1] when ``normalize``. Raises ``ValueError`` saying why there is none."""
    matches = list(pattern.finditer(reply))
    if not matches:
        raise ValueError(f"the judge's reply has no score matching {KEY}.score_pattern '{pattern.pattern}' "
                         f"(reply: {_clip(reply)!r})")
    text = matches[-1].group(1)
    try:
        raw = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"the judge's score {text!r} is not a number (reply: {_clip(reply)!r})") from None
    if not low <= raw <= high:
        raise ValueError(f"the judge's score {raw:g} is outside [{KEY}.score_min, score_max] = [{low:g}, {high:g}] "
                         f"(reply: {_clip(reply)!r})")
    return (raw - low) / (high - low) if normalize else raw


def last_user_text(messages: Any) -> str:
    """The content of the last user message of a prompt (a plain string prompt as it is)."""
    if isinstance(messages, str):
        return messages
    for message in reversed(list(messages or [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EndpointJudge:
    """The judge behind an OpenAI-compatible endpoint: one ``openai.AsyncOpenAI`` client on an event loop in a
    daemon thread, kept across steps; at most ``max_concurrency`` requests in flight."""

    def __init__(self, options: Any) -> None:
        self.errors = optional_import("openai", "reward.generative.base_url needs the openai client",
                                      "pip install 'rlforge[judge]'")
        self.options = options
        self.base_url, self.model = str(options.base_url).rstrip("/"), str(options.model)
        self.where = f"judge {self.base_url}, model '{self.model}'"
        self.loop = ToolLoop("rlforge-judge")
        self.client: Any = None
        try:
            self.client = self._run(self._client(os.environ.get(options.api_key_env) or "EMPTY"))
            self._run(self._check_endpoint())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Any) -> Any:
        return self.loop.submit(coro).result()

    async def _client(self, api_key: str) -> Any:  # built on the loop that uses it (its connection pool is bound to it)
        return self.errors.AsyncOpenAI(base_url=self.base_url, api_key=api_key, max_retries=0,
                                       timeout=float(self.options.timeout_s))

    async def _check_endpoint(self) -> None:
        """``GET <base_url>/models``: an endpoint that does not answer, or refuses the key, stops here."""
        e, where = self.errors, f"The judge endpoint {KEY}.base_url={self.base_url}"
        try:
            listed = await asyncio.wait_for(self.client.models.list(), float(self.options.timeout_s))
        except (e.APIConnectionError, asyncio.TimeoutError) as exc:
            raise RLForgeError(f"{where} is not reachable ({describe(exc)}). Start the judge server, or fix the "
                               f"URL (it ends before /chat/completions, e.g. http://HOST:PORT/v1).") from None
        except (e.AuthenticationError, e.PermissionDeniedError) as exc:
            raise RLForgeError(f"{where} refused the API key from ${self.options.api_key_env} "
                               f"({_status(exc)}).") from None
        except e.APIError as exc:  # e.g. a server without the model list (404): the requests will tell
            log.info("%s has no model list (%s); going on.", where, describe(exc))
            return
        names = [m.id for m in getattr(listed, "data", [])]
        if names and self.model not in names:
            raise ConfigError(f"'{KEY}.model' is '{self.model}', which {self.base_url} does not serve. It serves: "
                              f"{', '.join(names[:20])}{', ...' if len(names) > 20 else ''}.")

    def replies(self, conversations: list[list[dict[str, str]]]) -> list[Outcome]:
        """The judge's reply to each conversation: ``(OK, text)`` or ``(kind, reason)``."""
        return self._run(self._ask_all(conversations))

    async def _ask_all(self, conversations: list[list[dict[str, str]]]) -> list[Outcome]:
        gate = asyncio.Semaphore(int(self.options.max_concurrency))

        async def one(messages: list[dict[str, str]]) -> Outcome:
            async with gate:
                return await self._ask(messages)

        return list(await asyncio.gather(*(one(m) for m in conversations)))

    async def _ask(self, messages: list[dict[str, str]]) -> Outcome:
        """One request with its retries; never raises."""
        g, e = self.options, self.errors
        outcome: Outcome = (RAISED, "no attempt")
        for attempt in range(int(g.retries) + 1):
            if attempt:
                await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S)) - 1])
            try:
                reply = await asyncio.wait_for(self.client.chat.completions.create(
                    model=self.model, messages=messages, temperature=float(g.temperature),
                    max_tokens=int(g.max_tokens)), float(g.timeout_s))
            except (asyncio.TimeoutError, e.APITimeoutError):
                outcome = (TIMEOUT, f"no reply within {KEY}.timeout_s={g.timeout_s:g} s")
                continue
            except e.APIConnectionError as exc:
                outcome = (RAISED, f"connection failed: {describe(exc)}")
                continue
            except e.APIStatusError as exc:
                outcome = (RAISED, _status(exc))
                if exc.status_code in RETRIED_STATUS or exc.status_code >= 500:
                    continue
                return outcome
            except Exception as exc:  # noqa: BLE001 - a malformed reply body: the sample fails, the batch goes on
                return RAISED, f"the request failed: {describe(exc)}"
            try:
                return OK, reply.choices[0].message.content or ""
            except (AttributeError, IndexError, TypeError):
                return BAD_VALUE, f"the reply has no message ({_clip(repr(reply))})"
        suffix = f" (after {g.retries} retries)" if g.retries else ""
        return outcome[0], outcome[1] + suffix

    def close(self) -> None:
        """Close the client's connections and stop its event loop."""
        client, self.client = self.client, None
        if client is not None and not self.loop.loop.is_closed():
            try:
                self._run(client.close())
            except Exception as exc:  # noqa: BLE001 - closing must not fail the run's end
                log.debug("closing the judge client failed: %s", describe(exc))
        self.loop.close()


class LocalJudge:
    """The judge as a causal LM in this process, on rlforge's ``hf`` rollout engine: each conversation through the
    judge's chat template, ``max_concurrency`` prompts per ``generate_tokens`` call, seeded by ``trainer.seed`` (a
    sampled verdict leaves the training's random numbers alone)."""

    def __init__(self, config: Any, options: Any, registry: Any) -> None:
        from rlforge.models import frozen_model_device, load_model, load_tokenizer

        self.options = options
        path = str(options.local_model)
        self.where = f"local judge {path} on the hf engine"
        device = frozen_model_device(options.local_device)
        self.tokenizer = load_tokenizer(path, key=f"{KEY}.local_model")
        model = load_model(path).requires_grad_(False).eval().to(device)
        self.engine = registry.rollout.get("hf")(config, model, self.tokenizer)
        self.params = SamplingParams(n=1, temperature=float(options.temperature),
                                     max_new_tokens=int(options.max_tokens), seed=int(config.trainer.seed))

    def replies(self, conversations: list[list[dict[str, str]]]) -> list[Outcome]:
        size = int(self.options.max_concurrency)
        out: list[Outcome] = []
        for start in range(0, len(conversations), size):
            chunk = conversations[start:start + size]
            try:
                ids = [_ids(self.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True))
                       for m in chunk]
                gens = self.engine.generate_tokens(ids, [self.params] * len(ids))
            except Exception as exc:  # noqa: BLE001 - the chunk's samples fail; the batch's share decides the run
                out += [(RAISED, f"generation failed: {describe(exc)}")] * len(chunk)
                continue
            out += [(OK, self.tokenizer.decode(g.ids, skip_special_tokens=True)) for g in gens]
        return out

    def close(self) -> None:
        """Nothing runs between calls."""


def _ids(encoded: Any) -> list[int]:
    """``apply_chat_template(..., tokenize=True)``'s ids (transformers 5 returns a ``BatchEncoding``)."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


class GenerativeRewardManager:
    """Asks the judge for a verdict on each response and parses its score (module docstring)."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        g = config.reward.generative
        if bool(str(g.base_url or "").strip()) == bool(g.local_model):
            raise ConfigError(f"reward.manager=generative needs one of '{KEY}.base_url' (the judge's OpenAI-compatible "
                              f"endpoint, e.g. http://127.0.0.1:8000/v1) and '{KEY}.local_model' (a causal LM run in "
                              f"this process)" + (", not both." if g.local_model else "."))
        if g.base_url and not str(g.model or "").strip():
            raise ConfigError(f"reward.manager=generative needs '{KEY}.model' with {KEY}.base_url: the judge's model "
                              f"name, as the endpoint serves it.")
        if g.base_url and not str(g.base_url).startswith(("http://", "https://")):
            raise ConfigError(f"'{KEY}.base_url' is '{g.base_url}': write an http:// or https:// URL.")
        check_device(g.local_device, f"{KEY}.local_device")
        template_fields(g.template)
        compile_pattern(g.score_pattern)
        if not g.score_max > g.score_min:
            raise ConfigError(f"'{KEY}.score_max' ({g.score_max:g}) must be greater than '{KEY}.score_min' "
                              f"({g.score_min:g}).")

    def __init__(self, config: Any, tokenizer: Any, registry: Any) -> None:
        self.validate_config(config, registry)
        g = self.options = config.reward.generative
        self.tokenizer = tokenizer
        self.pattern = compile_pattern(g.score_pattern)
        self.fallback_score = float(config.reward.fallback_score)
        self.max_error_share = float(config.reward.max_error_share)
        self.judge = LocalJudge(config, g, registry) if g.local_model else EndpointJudge(g)
        self._logged: set[str] = set()

    def score(self, batch: B.Batch) -> B.Batch:
        texts = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        responses = batch.lists.get(B.SOLUTION_TEXT, texts)  # an agent loop's answer, when it gives one
        n = len(batch)
        outcomes = [self._score(reply) for reply in self.judge.replies(self.conversations(batch, responses))]
        self._check_error_share(outcomes, batch)
        scores, failed = torch.full((n,), self.fallback_score), torch.zeros(n)
        faults: Counter[str] = Counter()
        for i, (kind, value) in enumerate(outcomes):
            if kind == OK:
                scores[i] = value
            else:
                faults[kind] += 1
                failed[i] = 1.0
                self._log_first(kind, i, value)
        if faults[TIMEOUT]:
            log.warning("%d of %d judge requests timed out (%s.timeout_s=%g s, %d retries); they get "
                        "reward.fallback_score and are counted in reward/timeouts.", faults[TIMEOUT], n, KEY,
                        self.options.timeout_s, self.options.retries)
        token_scores = B.on_last_model_token(scores, batch[B.RESPONSE_MASK])
        batch[B.SCORES], batch[B.TOKEN_LEVEL_SCORES], batch[B.RESPONSE_TEXT] = scores, token_scores, texts
        batch[B.REWARD_FAILED] = failed
        ok = [value for kind, value in outcomes if kind == OK]
        batch.meta["metrics"] = {**batch.meta.get("metrics", {}),
                                 "reward/errors": float(sum(faults[k] for k in ERROR_KINDS)),
                                 "reward/timeouts": float(faults[TIMEOUT]),
                                 ERROR_SHARE: sum(faults.values()) / n if n else 0.0,
                                 **({"reward/judge/mean": sum(ok) / len(ok)} if ok else {})}
        return batch

    def conversations(self, batch: B.Batch, responses: list[str]) -> list[list[dict[str, str]]]:
        """The judge's messages for each sample: the system message (if any), then the filled-in template."""
        g, n = self.options, len(batch)
        prompts = [last_user_text(m) for m in batch.lists.get(B.RAW_PROMPT, [None] * n)]
        sources, truths = batch[B.DATA_SOURCE], batch[B.GROUND_TRUTH]
        system = [{"role": "system", "content": str(g.system)}] if g.system else []
        return [[*system, {"role": "user", "content": g.template.format(
            prompt=prompts[i], response=responses[i], ground_truth="" if truths[i] is None else str(truths[i]),
            data_source=sources[i])}] for i in range(n)]

    def _score(self, reply: Outcome) -> Outcome:
        kind, value = reply
        if kind != OK:
            return reply
        g = self.options
        try:
            return OK, parse_score(value, self.pattern, float(g.score_min), float(g.score_max), bool(g.normalize))
        except ValueError as exc:
            return BAD_VALUE, str(exc)

    def _check_error_share(self, outcomes: list[Outcome], batch: B.Batch) -> None:
        """Stop when the share of failed requests reaches ``reward.max_error_share``, as the rule manager does."""
        failed = [i for i, (kind, _) in enumerate(outcomes) if kind != OK]
        if not failed or len(failed) / len(outcomes) < self.max_error_share:
            return
        kinds = Counter(outcomes[i][0] for i in failed)
        first = failed[0]
        advice = more_tolerance(self.max_error_share, "request")
        raise RewardFailure(
            f"{len(failed)} of {len(outcomes)} judge requests failed on this batch "
            f"({', '.join(f'{c} {k}' for k, c in kinds.most_common())}), which reaches reward.max_error_share="
            f"{self.max_error_share:g}: {why_stop(self.max_error_share, batch)}. The first: sample {first}: "
            f"{outcomes[first][1]} ({self.judge.where}). Check the judge and {KEY}.score_pattern"
            + (f", or {advice}." if advice else ".")
        )

    def _log_first(self, kind: str, index: int, reason: str) -> None:
        if kind in self._logged:
            return
        self._logged.add(kind)
        log.warning("The %s failed on sample %d (%s): %s. The sample gets reward.fallback_score=%g; later '%s' "
                    "faults are only counted in %s.", self.judge.where, index, kind, reason, self.fallback_score,
                    kind, "reward/timeouts" if kind == TIMEOUT else "reward/errors")

    def close(self) -> None:
        """Stop the judge's client (its connections and event loop)."""
        self.judge.close()


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``reward.generative.score_pattern`` compiled; ``ConfigError`` when it is not a regex with a group."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"'{KEY}.score_pattern' is not a regular expression ({exc}): {pattern!r}.") from None
    if compiled.groups < 1:
        raise ConfigError(f"'{KEY}.score_pattern' ({pattern!r}) has no group: put the number in parentheses, e.g. "
                          r"'Score: (\d+)'.")
    return compiled


def _status(exc: Any) -> str:
    """``HTTP 400: <the server's error message>`` of an ``openai.APIStatusError``."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    message = message or getattr(exc, "message", "") or str(exc)
    return f"HTTP {getattr(exc, 'status_code', '?')}: {_clip(str(message))}"


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register(
        "generative", GenerativeRewardManager, config=GenerativeRewardConfig,
        description="a judge model behind an OpenAI-compatible endpoint writes a verdict; its score is the reward")
