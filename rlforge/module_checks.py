"""Checks of an algorithm's class (an ``RLModule`` subclass, ``rlforge.module``) for mistakes its own code would
not make clear: a ``validate_config`` that raises ValueError or AssertionError stops the run as a ConfigError naming
the algorithm (:func:`validate_config`, which config composition calls), and a method named like a hook that is none
(a Lightning name, a typo) is reported: nothing calls it."""

from __future__ import annotations

import difflib
from pathlib import Path
from traceback import extract_tb
from typing import Any

from rlforge import hookspecs
from rlforge.errors import ConfigError, RLForgeError, did_you_mean, first_line


def validate_config(algo_cls: Any, config: Any) -> None:
    """Run the algorithm class's ``validate_config(config)``; a ValueError or AssertionError it raises becomes a
    :class:`ConfigError` that names the algorithm, the class and the reason: one line, as the CLI prints an error,
    rather than a traceback."""
    try:
        algo_cls.validate_config(config)
    except (ValueError, AssertionError) as exc:
        raise ConfigError(f"--algo {config.algorithm.name}: {algo_cls.__qualname__}.validate_config refused the "
                          f"config: {_reason(exc)}. Change the value it names (key=value or --config).") from exc


def _reason(exc: ValueError | AssertionError) -> str:
    """What a failed check says: its message, or for a bare ``assert`` the failing line."""
    if not isinstance(exc, AssertionError):
        return first_line(exc)
    if first_line(exc):
        return f"assertion failed: {first_line(exc)}"
    frame = extract_tb(exc.__traceback__)[-1]
    return f"assertion failed at {Path(frame.filename).name}:{frame.lineno}: {(frame.line or '').strip()}"


def unknown_hooks(cls: type, base: type) -> list[str]:
    """A warning for each method of ``cls`` named ``on_*`` that is no hook of ``base`` (``RLModule``), which nothing
    calls: with the closest of ``base``'s hooks and the plugin hook (``rlforge_*``) for that event, if any."""
    hooks = sorted(n for n in dir(base) if n.startswith("on_"))
    events = [n for n in dir(hookspecs) if n.startswith("rlforge_")]
    out = []
    for name in sorted(n for n in dir(cls) if n.startswith("on_") and n not in hooks and callable(getattr(cls, n))):
        plugin_hook = difflib.get_close_matches(f"rlforge_{name[3:]}", events, n=1, cutoff=0.6)
        other = (f" For other events implement a plugin hook{f' (here {plugin_hook[0]})' if plugin_hook else ''} "
                 f"as an @hookimpl method of a callback, Trainer(callbacks=[...]) (docs/hooks.md).")
        out.append(f"{cls.__name__}.{name} is never called: it is not an RLModule hook (those are "
                   f"{', '.join(hooks)}).{did_you_mean(name, hooks)}{other}")
    return out


def check_given_module(module: Any, config: Any, algorithms: Any) -> None:
    """A module handed to ``Trainer.fit`` runs with the Trainer's config: refuse one built with another config (the run
    would train with one and record the other), and one whose class sets a preset or config section that the config
    never got (only a registered algorithm's are composed in); run its own ``validate_config``."""
    import dataclasses

    from omegaconf import OmegaConf

    from rlforge.resume import flatten, may_change

    check_initialized(module)
    if module.config is not config:
        own, given = (flatten(OmegaConf.to_container(c, resolve=True)) for c in (module.config, config))
        differ = sorted(k for k in own.keys() | given.keys()  # keys a resume may change do not change the training
                        if own.get(k, "<unset>") != given.get(k, "<unset>") and not may_change(k))
        if differ:
            more = f" (and {len(differ) - 1} more: {', '.join(differ[1:4])}{', ...' if len(differ) > 4 else ''})"
            raise ConfigError(
                f"{type(module).__qualname__} was built with another config than the Trainer's: {differ[0]} is "
                f"{own.get(differ[0], '<unset>')!r} in the module's, {given.get(differ[0], '<unset>')!r} in the "
                f"Trainer's{more if len(differ) > 1 else ''}. The run would train with the module's and record the "
                f"Trainer's: build both from one config (cfg = load_config(...); Trainer(cfg).fit(MyModule(cfg))).")
    cls = type(module)
    registered = algorithms.get(config.algorithm.name)
    if cls is registered:
        return
    missing = [f.name for f in dataclasses.fields(cls.config_class) if f.name not in config.algorithm]
    own = flatten(cls.preset) if cls.preset is not registered.preset else {}  # a preset of the class's own making
    unapplied = sorted((k for k, v in own.items() if OmegaConf.select(config, k, default=None) != v),
                       key=lambda k: (k == "algorithm.name", k))  # the name last: the values say more
    if missing or unapplied:
        what = (f"its config_class's algorithm.{missing[0]}" if missing else
                f"{unapplied[0]}={own[unapplied[0]]!r} in its preset")
        name = next((n for n in algorithms.available() if algorithms.get(n) is cls), None)
        fix = (f"Compose the config for it: load_config({name!r}, ...) (--algo {name})." if name else
               f"Register the class and compose for it (PluginManager: rlforge.plugin_manager): "
               f"pm = PluginManager(); pm.registry.algorithm.register("
               f"'my_algo', {cls.__qualname__}); cfg = load_config('my_algo', plugins=pm); Trainer(cfg, plugins=pm)"
               f".fit() (or a plugin: docs/plugins.md).")
        raise ConfigError(
            f"{cls.__qualname__} sets {what}, which the config never got: it was composed for --algo "
            f"{config.algorithm.name} ({registered.__qualname__}), and only the preset and config section of the "
            f"algorithm it is composed for are in it. {fix}")
    validate_config(cls, config)


def check_initialized(module: Any) -> None:
    """``RLModule.__init__`` ran (a subclass's ``__init__`` that does not call it leaves the module without its
    attributes: every later step would fail on one of them)."""
    if "config" not in vars(module) or "tokenizer" not in vars(module):
        raise RLForgeError(f"{type(module).__qualname__}.__init__ did not call super().__init__(config): RLModule's "
                           f"sets the config, the models and the tokenizer the run needs. Call it first in __init__.")


def check_configured(module: Any) -> None:
    """``configure_model`` loaded the actor this process needs (an override that does not call
    ``super().configure_model()`` and sets no ``self.actor`` leaves it None)."""
    if module.loads("actor") and module.actor is None:
        raise RLForgeError(f"{type(module).__qualname__}.configure_model() left self.actor None: call "
                           f"super().configure_model() (it loads the actor, and the reference and critic the algorithm "
                           f"needs), or set self.actor yourself.")


def check_hook_signatures(cls: type, base: type) -> None:
    """``cls``'s overrides of ``base``'s ``on_*`` hooks take the arguments the loop passes (positionally, as
    ``base``'s signature has them): a wrong one is named before the run starts instead of a TypeError mid-step."""
    import inspect

    for name in sorted(n for n in dir(base) if n.startswith("on_")):
        hook = getattr(cls, name)
        if hook is getattr(base, name) or not callable(hook):
            continue
        expected = inspect.signature(getattr(base, name))
        try:
            inspect.signature(hook).bind(*(None for _ in expected.parameters))
        except TypeError:
            raise RLForgeError(f"{cls.__qualname__}.{name}{inspect.signature(hook)} does not take the arguments the "
                               f"loop passes it: RLModule.{name}{expected}.") from None
        except ValueError:  # no signature to read (a builtin): left to the call
            continue


def callback_without_hooks(callback: object) -> str:
    """The warning for a ``Trainer`` callback that implements no ``rlforge_*`` hook (a Lightning callback's
    ``on_*`` methods, say): nothing of it is ever called."""
    lightning = sorted(n for n in dir(callback) if n.startswith("on_") and callable(getattr(callback, n)))
    events = [n for n in dir(hookspecs) if n.startswith("rlforge_")]
    close = ", ".join(m for n in lightning for m in difflib.get_close_matches(f"rlforge_{n[3:]}", events, 1, 0.6))
    named = (f" Its {', '.join(lightning[:3])}{', ...' if len(lightning) > 3 else ''} are not rlforge hooks"
             f"{f' (close: {close})' if close else ''}." if lightning else "")
    return (f"The callback {type(callback).__qualname__} implements no rlforge_* hook, so nothing of it is called."
            f"{named} Implement the hooks of docs/hooks.md as @hookimpl methods (e.g. rlforge_step_end).")
