"""``rule`` reward manager: per-sample reward functions chosen by ``data_source`` or by config.

A user function loads from a file (``reward.file``, ``reward.fn_name``; ``user_file``) with verl's contract
``compute_score(data_source, solution_str, ground_truth, extra_info)``, so verl reward code ports unchanged.
Without one, each row's ``data_source`` picks the function: one registered under that name, else the built-in
that verl's default scorer uses for it (``DATA_SOURCES``). Before any model loads, ``check_data_sources`` refuses rows
whose data_source has no function (naming the first such row) and a registered function the rows (or ``reward.fn``)
use whose signature cannot take the contract's arguments (``check_registered``). Keys of a dict result besides ``score``
are kept per sample (column ``reward_extra_info``; a number result keeps ``acc``, the number, as verl's managers do) and
their batch means reported as ``reward/extra/<key>/mean`` (``acc``: ``critic/acc/mean``, rlforge's own).

Reward functions run in persistent worker processes (``workers.RewardWorkers``), forked from this process on
the first ``score`` and reused across steps, each call limited in CPU time. A call that raises, times out, or
returns NaN/inf, a value outside the float32 range of the reward tensor or a non-number (``results``), gives
the sample ``reward.fallback_score``; ``reward/errors``, ``reward/timeouts`` and ``reward/error_share`` count
them. A step on which the share of failed calls reaches ``reward.max_error_share`` (by default: every call
failed) stops the run with the first failure: such a step trains on the fallback score alone, no signal. A
reward function that raises ``RLForgeError`` (a configuration mistake, such as the code sandbox refusing to run
without isolation) stops the run with that message.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rlforge.plugins.reward.code import CodeRewardConfig, code_exec_score
from rlforge.plugins.reward.functions import arith_score, gsm8k_score, qa_em_score
from rlforge.plugins.reward.math import geo3k_score, math_boxed_score, math_dapo_score
from rlforge.plugins.reward.results import (
    ERROR_KINDS,
    OK,
    TIMEOUT,
    Outcome,
    ScoreFn,
    _short,
    extra_metrics,
)
from rlforge.plugins.reward.user_file import check_contract, contract_call, load_user_function
from rlforge.plugins.reward.workers import RewardWorkers

from rlforge import batch as B
from rlforge.config.schema import plain
from rlforge.errors import ConfigError, RLForgeError
from rlforge.evaluation import TRAINING, VALIDATION, scored_for
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

log = logging.getLogger("rlforge.reward")

FIXED = "<reward.fn or reward.file>"  # the function table's key for a function set by config
ERROR_SHARE = "reward/error_share"  # share of a step's reward calls that failed (errors and timeouts)
# why a batch with failed calls stops the run where reward.max_error_share is above 0: its scores would be the
# fallback alone, for what the batch is scored for (rlforge.evaluation.scored_for)
FALLBACK_ONLY = {TRAINING: "the training step would train on reward.fallback_score alone",
                 VALIDATION: "the validation would measure reward.fallback_score alone, not the model's answers"}
FIRST_FAILURE_STOPS = ("the first failed call stops the run (verl's reward managers stop on a call that raises; "
                       "rlforge also on a value it cannot train on, such as NaN, where verl would train on it)")
# where reward.max_error_share is 0, the value rlforge verl sets: how to change it on that launcher's command line
VERL_DOOR = ("; a run started with `rlforge verl`, which sets it to 0 as verl stops, takes it after `--`: "
             "rlforge verl VERL_ARGS... -- reward.max_error_share=1")

# verl's data_source names (default_compute_score, verl/utils/reward_score/__init__.py) -> built-in reward function.
# A reward function registered under the data_source itself comes first.
DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    **dict.fromkeys(["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"], "math_boxed"),
    **dict.fromkeys(["math_dapo", "math", "math_dapo_reasoning"], "math_dapo"),
    **dict.fromkeys([f"numina_{name}" for name in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc",
                                                   "cn_k12", "olympiads")], "math_boxed"),
    **dict.fromkeys(["codecontests", "apps", "codeforces", "taco"], "code"),
    "hiyouga/geometry3k": "geo3k",
    **dict.fromkeys([f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa",
                                                     "musique", "bamboogle")], "qa_em"),
}
DATA_SOURCE_PREFIXES: dict[str, str] = {"aime": "math_dapo"}  # aime2024, aime_2025, ...


def bind_config(fn: ScoreFn, *sections: Any) -> ScoreFn:
    """Pass each config value to the keyword-only parameter of ``fn`` of the same name. ``sections``: the core
    ``reward`` section (e.g. ``timeout_s``), then the function's own (``reward.<fn name>.*``, e.g. the ``code``
    function's ``sandbox_timeout_s``); a later section wins."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return fn
    wanted = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    kwargs = {k: section[k] for section in sections if section is not None for k in section.keys() if k in wanted}
    return functools.partial(fn, **kwargs) if kwargs else fn


def fn_kwargs(rc: Any) -> dict[str, Any]:
    """``reward.fn_kwargs`` as verl hands custom_reward_function.reward_kwargs over: a dict whose mappings and lists
    are OmegaConf containers (``cfg.bonus`` works, as in verl), resolved and writable."""
    from omegaconf import OmegaConf

    given = plain(rc.get("fn_kwargs")) or {}
    return {k: OmegaConf.create(v) if isinstance(v, (dict, list)) else v for k, v in given.items()}


def _fn_section(config: Any, registry: Any, name: str) -> Any:
    """The reward function ``name``'s own config section, if it declared one."""
    path = registry.reward_fn.entry(name).config_path(registry.SPECS["reward_fn"])
    section = config if path else None
    for part in (path or "").split("."):
        section = getattr(section, part, None)
    return section


def _bound(config: Any, registry: Any, name: str) -> ScoreFn:
    """The registered reward function ``name`` with its config values bound (``bind_config``), as the workers call
    it (``contract_call``: the four arguments as keywords where its signature takes them so)."""
    return contract_call(bind_config(registry.reward_fn.get(name), config.reward, _fn_section(config, registry, name)))


def registered_as(entry: Any) -> str:
    """How an error names a registered reward function: its name, plugin and the file and line defining it."""
    obj = getattr(entry.obj, "func", entry.obj)  # a functools.partial: the function it calls
    try:
        at = f", {inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
    except (TypeError, OSError):  # a builtin, or a function whose source is gone
        at = ""
    return f"Reward function '{entry.name}' (registry.reward_fn, plugin '{entry.plugin}'{at})"


def check_registered(config: Any, registry: Any, names: Iterable[str]) -> None:
    """Each registered reward function of ``names`` takes the contract's four arguments as rlforge calls it, its config
    values bound (``user_file.check_contract``, as for ``reward.file``): a ConfigError naming the function, its plugin
    and file, the contract and its signature otherwise, before any model loads (not at the first batch's scores)."""
    for name in dict.fromkeys(names):
        entry = registry.reward_fn.entry(name)
        check_contract(_bound(config, registry, name), "", getattr(entry.obj, "__name__", name),
                       subject=registered_as(entry), section=f"reward.{name}")


class RewardFailure(RLForgeError):
    """Too many reward calls of one batch failed (``reward.max_error_share``): the run stops."""


def why_stop(max_error_share: float, batch: B.Batch) -> str:
    """Why a batch whose share of failed calls reaches ``reward.max_error_share`` stops the run: at 0 every failure
    does (as in verl); above, its scores would be ``reward.fallback_score`` alone, for the training step or the
    validation that scores it (``FALLBACK_ONLY``)."""
    return FIRST_FAILURE_STOPS if max_error_share == 0 else FALLBACK_ONLY[scored_for(batch)]


def more_tolerance(max_error_share: float, calls: str) -> str:
    """The advice to tolerate more failed ``calls`` (e.g. "call", "request"): raise ``reward.max_error_share`` (after
    ``--`` under ``rlforge verl``, which sets 0); "" at 1, its most."""
    if max_error_share >= 1:
        return ""
    return (f"raise reward.max_error_share (1 stops only when every {calls} fails"
            f"{VERL_DOOR if max_error_share == 0 else ''})")


class RuleRewardManager:
    """Decodes each response and calls its reward function; the score goes on the last token of the response mask.
    With an agent loop the function scores the trajectory's answer (``solution_text``), not the whole response.

    A sample whose function raised, hung past ``reward.timeout_s`` or returned a non-number gets
    ``reward.fallback_score``; the first fault of each kind is logged. A batch whose share of failed calls
    reaches ``reward.max_error_share`` (1.0: every call failed) stops the run with a ``RewardFailure``.
    """

    def __init__(self, config: Any, tokenizer: Any, registry: Any) -> None:
        self.tokenizer = tokenizer
        self.registry = registry
        rc = config.reward
        if not rc.timeout_s > 0:
            raise RLForgeError(f"reward.timeout_s must be > 0 seconds, got {rc.timeout_s}.")
        self.fallback_score = float(rc.fallback_score)
        self.max_error_share = float(rc.get("max_error_share", 1.0))
        self.fixed = rc.file or rc.fn
        self.extra_info = plain(rc.get("extra_info")) or {}
        fns = {name: _bound(config, registry, name) for name in registry.reward_fn.available()}
        if rc.file:
            # reward.fn_kwargs only, as verl binds reward_kwargs only: a parameter of the user's function named like a
            # reward key (timeout_s, model) keeps its own default
            fns[FIXED] = load_user_function(rc.file, rc.fn_name, float(rc.timeout_s), fn_kwargs(rc))
        elif rc.fn:
            check_registered(config, registry, [rc.fn])  # an unknown name: the registry's error, with the known ones
            fns[FIXED] = fns[rc.fn]
        self.workers = RewardWorkers(fns, int(rc.get("num_workers", 1)), float(rc.timeout_s))
        self._logged: set[str] = set()

    @staticmethod
    def check_data_sources(config: Any, registry: Any, data_sources: Iterable[str]) -> None:
        """Called by the Builder on every dataset it loads, before any model loads (module function below)."""
        check_data_sources(config, registry, data_sources)

    @staticmethod
    def check_function(config: Any) -> None:
        """``reward.file``'s function loads and takes its arguments and ``reward.fn_kwargs`` (what building the
        manager checks first; ``rlforge verl --print`` calls it)."""
        rc = config.reward
        if rc.file:
            load_user_function(rc.file, rc.fn_name, float(rc.timeout_s), fn_kwargs(rc))

    def key_for(self, data_source: str, batch: B.Batch | None = None, index: int = 0) -> str:
        """The function table's key for a row of ``data_source``; a data_source without a function (a row that
        reached scoring without the dataset's ``check_data_sources``) is an error naming it, and where ``batch`` is
        given, the row ``index`` by its place in the batch and its prompt (a batch does not know its rows' files)."""
        if self.fixed:
            return FIXED
        name = function_for(data_source, self.registry)
        if name is None:
            where = {data_source: _sample_where(batch, index)} if batch is not None else None
            raise RLForgeError(no_function_message([data_source], self.registry, where))
        return name

    def score(self, batch: B.Batch) -> B.Batch:
        texts = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        solutions = batch.lists.get(B.SOLUTION_TEXT, texts)  # an agent loop's answer, when it gives one
        n = len(batch)
        sources, truths = batch[B.DATA_SOURCE], batch[B.GROUND_TRUTH]
        extra = verl_extra_info(batch, self.extra_info)
        loop = batch.lists.get(B.LOOP_SCORES) or [None] * n  # rows an agent loop scored: the function is not called
        tasks = [(i, self.key_for(sources[i], batch, i), (sources[i], solutions[i], truths[i], extra[i]))
                 for i in range(n) if loop[i] is None]
        outcomes: dict[int, Outcome] = self.workers.run(tasks) if tasks else {}
        outcomes.update({i: (OK, (score, float(score >= 1), {"acc": float(score)})) for i, score in enumerate(loop)
                         if score is not None})  # verl's reward_extra_info of a number
        self._check_error_share(outcomes, sources, batch)
        scores = torch.full((n,), self.fallback_score)
        accs, failed = torch.zeros(n), torch.zeros(n)
        extras: list[dict[str, Any]] = [{} for _ in range(n)]
        faults: Counter[str] = Counter()
        for i in range(n):
            kind, value = outcomes[i]
            if kind == OK:
                scores[i], accs[i], extras[i] = value
            else:
                faults[kind] += 1
                failed[i] = 1.0
                extras[i] = {"acc": 0.0}  # wrong, as B.ACC has it: verl's validation keeps reading acc
                self._log_first(kind, sources[i], i, value)
        batch[B.SCORES] = scores
        batch[B.TOKEN_LEVEL_SCORES] = B.on_last_model_token(scores, batch[B.RESPONSE_MASK])
        batch[B.ACC] = accs
        batch[B.RESPONSE_TEXT] = texts
        batch[B.REWARD_EXTRA_INFO] = extras
        batch[B.REWARD_FAILED] = failed
        batch.meta["metrics"] = {**batch.meta.get("metrics", {}),
                                 "reward/errors": float(sum(faults[k] for k in ERROR_KINDS)),
                                 "reward/timeouts": float(faults[TIMEOUT]),
                                 ERROR_SHARE: sum(faults.values()) / n if n else 0.0,
                                 **extra_metrics(extras)}
        return batch

    def _check_error_share(self, outcomes: dict[int, Outcome], sources: list[str], batch: B.Batch) -> None:
        """Stop when the share of failed calls reaches ``reward.max_error_share``: the batch has (almost) no
        reward signal, only the fallback score, which no amount of training turns into learning."""
        failed = sorted(i for i, (kind, _) in outcomes.items() if kind != OK)
        if not failed or len(failed) / len(outcomes) < self.max_error_share:
            return
        kinds = Counter(outcomes[i][0] for i in failed)
        first = failed[0]
        advice = more_tolerance(self.max_error_share, "call")
        raise RewardFailure(
            f"{len(failed)} of {len(outcomes)} reward calls failed on this batch "
            f"({', '.join(f'{c} {k}' for k, c in kinds.most_common())}), which reaches reward.max_error_share="
            f"{self.max_error_share:g}: {why_stop(self.max_error_share, batch)}. The first: data_source "
            f"'{sources[first]}', sample {first}: {outcomes[first][1]}. Fix the reward function (the contract is "
            f"compute_score(data_source, solution_str, ground_truth, extra_info))"
            + (f" or, to tolerate more failures, {advice}." if advice else ".")
        )

    def _log_first(self, kind: str, data_source: str, index: int, reason: str) -> None:
        if kind in self._logged:
            return
        self._logged.add(kind)
        metric = "reward/timeouts" if kind == TIMEOUT else "reward/errors"
        log.warning("Reward function for data_source '%s' failed on sample %d (%s): %s. The sample gets "
                    "reward.fallback_score=%g; later '%s' faults are only counted in %s.",
                    data_source, index, kind, reason, self.fallback_score, kind, metric)

    def close(self) -> None:
        """Stop the reward worker processes."""
        self.workers.close()


def function_for(data_source: str, registry: Any) -> str | None:
    """The reward function for rows of ``data_source``: one registered under that name, else verl's name for it
    (``DATA_SOURCES``, ``DATA_SOURCE_PREFIXES``); None when there is none."""
    if data_source in registry.reward_fn:
        return data_source
    name = DATA_SOURCES.get(data_source) or next(
        (fn for prefix, fn in DATA_SOURCE_PREFIXES.items() if data_source.startswith(prefix)), None)
    return name if name is not None and name in registry.reward_fn else None


def no_function_message(data_sources: list[str], registry: Any, where: Mapping[str, str] | None = None) -> str:
    """The error for rows whose ``data_sources`` have no reward function: each named with ``where`` its rows are
    (e.g. ``first row: train.jsonl, row 3``) where known, the functions there are and the two ways out."""
    names = ", ".join(f"'{s}'" + (f" ({where[s]})" if where and s in where else "") for s in data_sources)
    return (f"No reward function for data_source {names}. Reward functions: {', '.join(registry.reward_fn.available())}"
            f", and verl's data_source names for them (openai/gsm8k, lighteval/MATH, math_dapo, aime*, ...: "
            f"docs/migration-from-verl.md). Register one under the data_source's name in a plugin "
            f"(registry.reward_fn.register('{data_sources[0]}', compute_score) in its rlforge_register hook: "
            f"docs/plugins.md), or set reward.fn=NAME or reward.file=path.py (a compute_score function) to score "
            f"every row with one function.")


def _sample_where(batch: B.Batch, index: int) -> str:
    """How an error names the batch's sample ``index`` (counted from 0, as the reward manager's other messages):
    its place and the start of its prompt's last message, where the batch has prompts."""
    try:
        prompt = f", prompt {_short(batch.lists[B.RAW_PROMPT][index][-1]['content'], 80)}"
    except (KeyError, IndexError, TypeError):  # a batch without prompts (or not as chat messages)
        prompt = ""
    return f"sample {index} of this batch{prompt}"


def verl_extra_info(batch: B.Batch, added: dict[str, Any] | None = None) -> list[Any]:
    """Each row's ``extra_info`` as verl's naive reward manager passes it: with ``num_turns`` (the agent loop's turns;
    2, a prompt and one answer, for single-turn rollouts, which verl 0.9.1 runs as an agent loop too) and
    ``rollout_reward_scores`` ({}) added, and ``added`` over the row's keys (``reward.extra_info``: verl's gdpo
    manager sets ``experiment_name``); a row without extra_info gets a dict of these. A row whose extra_info is not a
    dict is passed as it is."""
    n = len(batch)
    turns = batch.lists.get(B.NUM_TURNS) or [None] * n
    out = []
    for info, t in zip(batch.lists.get(B.EXTRA_INFO) or [None] * n, turns):
        if info is None or isinstance(info, dict):
            info = {**(info or {}), **(added or {}), "num_turns": 2 if t is None else t, "rollout_reward_scores": {}}
        out.append(info)
    return out


def check_data_sources(config: Any, registry: Any, data_sources: Iterable[str]) -> None:
    """Fail before any model loads when rows of a dataset would have no reward function, or one that cannot take the
    contract's arguments (rule manager).

    :param config: the composed config; with ``reward.file`` nothing to check here (building the manager loads and
        checks it), with ``reward.fn`` its function's signature only
    :param registry: the registries (``registry.reward_fn``)
    :param data_sources: the ``data_source`` values of the dataset's rows; a mapping of them to where each first
        appears (``rlforge.data.first_rows``: ``train.jsonl, row 3``) names those rows in the error
    :raises ConfigError: naming every data source without a function (and its first row, where given), the known
        names and the keys to set; or a function the rows use whose signature does not fit (``check_registered``)
    """
    rc = config.reward
    if rc.file:
        return
    if rc.fn:
        check_registered(config, registry, [rc.fn])
        return
    where = {str(s): f"first row: {w}" for s, w in data_sources.items()} if isinstance(data_sources, Mapping) else {}
    if None in data_sources:  # a null in the data, not the name of a function that is missing
        at = f" ({where['None']})" if "None" in where else ""
        raise ConfigError(f"A row's data_source is null{at}: each row's data_source names the reward function that "
                          f"scores it. Give every row one, or set reward.fn=NAME or reward.file=path.py to score "
                          f"every row with one function.")
    names = {str(s): function_for(str(s), registry) for s in data_sources}
    missing = sorted(s for s, fn in names.items() if fn is None)
    if missing:
        raise ConfigError(no_function_message(missing, registry, where))
    check_registered(config, registry, [fn for fn in names.values() if fn is not None])


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register("rule", RuleRewardManager)
    registry.reward_fn.register("arith", arith_score)
    registry.reward_fn.register("gsm8k", gsm8k_score, description="GSM8K: the number after '####' (verl's rule)")
    registry.reward_fn.register("math_boxed", math_boxed_score,
                                description="MATH: last \\boxed{} answer, math-verify equivalence; 1/0")
    registry.reward_fn.register("math_dapo", math_dapo_score,
                                description="DAPO/AIME: last 'Answer:' line, math-verify equivalence; 1/-1")
    registry.reward_fn.register("geo3k", geo3k_score,
                                description="Geometry3K: 0.9 boxed answer (math-verify) + 0.1 <think> format")
    registry.reward_fn.register("qa_em", qa_em_score,
                                description="Search-R1 QA: exact match of the last <answer></answer>")
    registry.reward_fn.register("code", code_exec_score, config=CodeRewardConfig,
                                description="runs the program in the sandbox on stdin/stdout tests; pass fraction")
