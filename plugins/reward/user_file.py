"""A reward function from a user's Python file (``reward.file``, ``reward.fn_name``), with verl's contract
``compute_score(data_source, solution_str, ground_truth, extra_info)``.

The file is imported once in a throwaway child process first (limited like a reward call), so one that
exits, crashes or hangs at import time is a clear error instead of a dead or stuck trainer. Then the function's
signature is checked against the contract: a function that cannot take the four arguments, or names them in
another order (verl's own ``verl/utils/reward_score/gsm8k.py::compute_score(solution_str, ground_truth, ...)``
is a scorer that verl's ``default_compute_score`` calls, not a custom reward function), would fail on every
sample; it is refused with the wrapper to write. The four arguments go as keywords where the function takes them so
(as verl calls it), else by position. Keyword arguments from ``reward.fn_kwargs`` are bound to it (verl's
``custom_reward_function.reward_kwargs``), and an ``async def`` function runs to completion in the reward worker, on
that process's one event loop (verl awaits it on its reward worker's loop).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from rlforge.plugins.reward.results import CRASHED, OK, RAISED, TIMEOUT, ScoreFn, describe
from rlforge.plugins.reward.workers import RewardWorkers

from rlforge.errors import ConfigError, RLForgeError

CONTRACT = ("data_source", "solution_str", "ground_truth", "extra_info")


def load_user_function(path: str, name: str = "compute_score", timeout_s: float = 10.0,
                       kwargs: Mapping[str, Any] | None = None) -> ScoreFn:
    """Import ``name`` from the Python file at ``path``, with errors that name the file and function; ``kwargs``
    (``reward.fn_kwargs``) are bound to it as keyword arguments, as verl binds custom_reward_function.reward_kwargs.

    The file is imported in a throwaway child process first, limited like a reward call (``timeout_s`` of
    CPU time, a wall-clock backstop of ``WALL_BACKSTOP`` times that): a file that calls ``sys.exit``, kills
    its process or loops forever at import time is an ``RLForgeError`` instead of a dead or hung trainer.
    """
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"Reward file {path} (reward.file) is a directory; give the Python file that defines "
                          f"{name}(data_source, solution_str, ground_truth, extra_info).")
    if not file.is_file():
        raise ConfigError(f"Reward file not found: {path} (reward.file).")
    if file.suffix != ".py":
        raise ConfigError(f"Reward file {path} (reward.file) is not a Python file (its name does not end in .py); "
                          f"give a .py file that defines {name}(data_source, solution_str, ground_truth, "
                          f"extra_info).")
    probe = RewardWorkers({"import": lambda: _import_function(path, name) and 0.0}, 1, timeout_s)
    try:
        kind, reason = probe.run([(0, "import", ())], quiet=True)[0]
    finally:
        probe.close()
    if kind != OK:
        raise RLForgeError(_IMPORT_FAILURES[kind].format(path=path, reason=reason, timeout_s=timeout_s))
    fn = _import_function(path, name)  # now in this process: the workers are forked from it
    kwargs = dict(kwargs or {})
    by_keyword = check_contract(fn, path, name, kwargs)
    if _is_async(fn):  # verl awaits an async reward function; a reward worker runs it to its end
        fn = _run_to_completion(fn)
    if by_keyword:
        fn = _by_keyword(fn)
    return functools.partial(fn, **kwargs) if kwargs else fn


def contract_call(fn: ScoreFn) -> ScoreFn:
    """``fn`` (a registered reward function, its config values bound) called as a ``reward.file`` function is: with the
    contract's four arguments as keywords where its signature takes them so (as verl calls it), else by position; an
    async one run to its end. Never raises: :func:`check_contract` says what is wrong with a function that takes
    neither."""
    call = _run_to_completion(fn) if _is_async(fn) else fn
    try:
        by_keyword = _binds(inspect.signature(fn), (), dict.fromkeys(CONTRACT))
    except (TypeError, ValueError):  # a C callable without a signature: called as it is
        return call
    return _by_keyword(call) if by_keyword else call


def _is_async(fn: Any) -> bool:
    """``fn`` (a function, a ``functools.partial`` of one, or an object whose ``__call__`` is) returns a coroutine."""
    target = getattr(fn, "func", fn)
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None))


def _by_keyword(fn: ScoreFn) -> ScoreFn:
    """``fn`` called as verl calls a custom reward function: the contract's four arguments as keywords."""

    @functools.wraps(fn)  # its signature, for what inspects it
    def call(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> Any:
        return fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                  extra_info=extra_info, **kwargs)

    return call


_LOOPS: dict[int, asyncio.AbstractEventLoop] = {}  # process id -> its event loop for async reward functions


def _run_to_completion(fn: Callable[..., Awaitable[Any]]) -> ScoreFn:
    """``async def compute_score(...)`` as a plain function, with its signature (the config binds by it). Every call
    in a process runs on one event loop of that process, as verl awaits them on its reward worker's loop: a client
    the function keeps between calls (an aiohttp session, ``openai.AsyncOpenAI``) stays bound to a live loop."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        loop = _LOOPS.get(os.getpid())
        if loop is None:  # a forked reward worker makes its own (the parent's is not its to run)
            _LOOPS.clear()
            loop = _LOOPS[os.getpid()] = asyncio.new_event_loop()
        return loop.run_until_complete(fn(*args, **kwargs))

    return call


# what a failed import check means (a file that raises at import comes back as the RLForgeError of
# _import_function, which RewardWorkers.run raises itself)
_IMPORT_FAILURES = {
    RAISED: "Reward file {path} failed to import: {reason}.",
    CRASHED: "Reward file {path} ended its process while being imported: {reason} (os._exit or a crash at "
             "import time?).",
    TIMEOUT: "Reward file {path} did not finish importing: it {reason} (reward.timeout_s={timeout_s:g}). An "
             "infinite loop or a blocking call at import time?",
}


def _import_function(path: str, name: str) -> ScoreFn:
    file = Path(path)
    spec = importlib.util.spec_from_file_location(f"rlforge_user_reward_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise RLForgeError(f"Reward file {path} (reward.file) cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise RLForgeError(f"Reward file {path} has a syntax error at line {exc.lineno}: {exc.msg}.") from None
    except BaseException as exc:  # noqa: BLE001 - SystemExit included: importing must never end the trainer
        raise RLForgeError(f"Reward file {path} failed to import: {describe(exc)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RLForgeError(
            f"Reward file {path} has no function '{name}' (reward.fn_name). It must define "
            f"{name}(data_source, solution_str, ground_truth, extra_info)."
        )
    return fn


def check_contract(fn: ScoreFn, path: str, name: str, kwargs: Mapping[str, Any] | None = None, *,
                   subject: str = "", section: str = "") -> bool:
    """Whether ``fn`` is called with the contract's four arguments as keywords (as verl calls a custom reward function,
    ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``: True) or, where its parameters have
    other names, by position (False); with ``kwargs`` (``reward.fn_kwargs``) as keywords either way. Refused: a
    function that takes neither call, or whose parameters name the four in other places (it would misread every call),
    and keyword arguments that repeat the contract's, that it does not take, or that it requires and are not given.

    Errors name ``subject`` (default: ``Reward file <path>``) and the function ``name`` with its signature. A
    registered function (``rule.check_registered``) gives its ``section``, ``reward.<name>``: the config section whose
    values its keyword-only parameters get, in place of ``reward.fn_kwargs``."""
    subject = subject or f"Reward file {path}"
    kwargs = dict(kwargs or {})
    taken = [k for k in kwargs if k in CONTRACT]
    if taken:
        raise ConfigError(f"reward.fn_kwargs.{taken[0]}: '{taken[0]}' is an argument of the reward-function contract "
                          f"(rlforge passes it for every sample); give the function's other keyword arguments only.")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a C callable without a signature: called as it is
        return False
    if _binds(signature, (), {**dict.fromkeys(CONTRACT), **kwargs}):
        return True
    params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    misplaced = [(p.name, i) for i, p in enumerate(params[:len(CONTRACT)]) if p.name in CONTRACT and
                 p.name != CONTRACT[i]]
    if not misplaced and _binds(signature, CONTRACT, kwargs):
        return False
    unknown = [k for k in kwargs if not _takes(signature, k)]
    if unknown:
        raise ConfigError(f"reward.fn_kwargs.{unknown[0]}: {subject}: {name}{signature} has no parameter "
                          f"'{unknown[0]}' (nor **kwargs), so every call would fail; the keyword arguments it "
                          f"takes: {', '.join(_keywords(signature)) or 'none'}.")
    needed = [p.name for p in signature.parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in CONTRACT and p.name not in kwargs]
    if needed:
        given = (f"its config section does not give: register it with config= a dataclass with the field "
                 f"'{needed[0]}' ({section}.{needed[0]})" if section else
                 f"reward.fn_kwargs does not give (verl's custom_reward_function.reward_kwargs): set "
                 f"reward.fn_kwargs.{needed[0]}")
        raise ConfigError(f"{subject}: {name}{signature} requires the keyword argument '{needed[0]}', which {given}, "
                          f"or give the parameter a default.")
    why = (f"its parameter '{misplaced[0][0]}' is argument {misplaced[0][1] + 1}, where rlforge passes "
           f"'{CONTRACT[misplaced[0][1]]}'" if misplaced else "it cannot take these four arguments")
    raise ConfigError(
        f"{subject}: {name}{signature} does not follow the reward-function contract {name}(data_source, "
        f"solution_str, ground_truth, extra_info): {why}, so every call would fail or misread its arguments. (rlforge "
        f"passes the four as keywords, as verl does, or by position to a function whose parameters have other names. "
        f"verl's verl/utils/reward_score/*.py scorers have other signatures: verl calls them through "
        f"default_compute_score.) Wrap it, e.g. def {name}(data_source, solution_str, ground_truth, extra_info): return "
        f"scorer(solution_str, ground_truth)."
    )


def _binds(signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    try:
        signature.bind(*args, **kwargs)
        return True
    except TypeError:
        return False


def _takes(signature: inspect.Signature, keyword: str) -> bool:
    """Whether a function of ``signature`` accepts ``keyword=...`` (a parameter of that name, or ``**kwargs``)."""
    return any(p.kind is p.VAR_KEYWORD or p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               for p in signature.parameters.values())


def _keywords(signature: inspect.Signature) -> list[str]:
    return [p.name for p in signature.parameters.values() if p.name not in CONTRACT and
            p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
