"""The verl door's two commands: ``rlforge verl ARGS...`` (a verl launch run by rlforge) and ``rlforge config from-verl``
(its translation written or shown), called by ``rlforge.cli``. The translation itself is ``rlforge.config.verl_launch``;
docs/migration-from-verl.md is the user's guide."""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Collection
from typing import Any

from omegaconf import OmegaConf

from rlforge.config.checks import check_cuda_present, check_fit_keys, check_sft_layers
from rlforge.config.verl_fates import STOPS_ON_VALUE
from rlforge.errors import ConfigError, RLForgeError

Loaded = Callable[[Any], Any]  # called with the plugin manager once plugins are loaded (the CLI prints their warnings)


def from_verl_args(argv: list[str]) -> argparse.Namespace:
    """``--out FILE`` and ``--sft`` (verl's SFT trainer) out of ``config from-verl``'s arguments; the rest is the
    launch's, in verl's syntax (``--config-path``/``--config-name``, ``+key=v``, ``~key``) or a verl config file."""
    out, sft, rest = None, False, []
    it = iter(argv)
    for arg in it:
        if arg == "--out":
            out = next(it, None)
            if out is None:
                raise RLForgeError("rlforge config from-verl: --out needs a file name.")
        elif arg.startswith("--out="):
            out = arg.split("=", 1)[1]
        elif arg == "--sft":
            sft = True
        else:
            rest.append(arg)
    return argparse.Namespace(overrides=rest, out=out, sft=sft)


def from_verl(args: argparse.Namespace, loaded: Loaded) -> int:
    """``rlforge config from-verl VERL.yaml|ARGS... [--out FILE]``: translate, report every key, check the result.
    Exit status 2 when a key is refused (a value the run would stop on included), when the composed translation
    would stop the run otherwise, or when the written translation's custom reward function would (the translation is
    written or shown all the same)."""
    from pathlib import Path

    import yaml

    from rlforge.config import compose_with_plugins
    from rlforge.config.verl_launch import PPO_ENTRY, SFT_ENTRY, prepare, prepare_file

    if not args.overrides:
        raise RLForgeError("Usage: rlforge config from-verl VERL_CONFIG.yaml|[--sft] VERL_ARGS... [--out rlforge.yaml]")
    one = args.overrides[0]
    if len(args.overrides) == 1 and "=" not in one and one.endswith((".yaml", ".yml")):
        prepared, source = prepare_file(one), one
    else:
        entry = SFT_ENTRY if getattr(args, "sft", False) else PPO_ENTRY
        prepared, source = prepare(list(args.overrides), entry, refuse=False), "the verl launch"
    t = prepared.translation
    stop: RLForgeError | None = None
    try:  # every value the run would stop on: refused in the report
        refuse_stopping_values(prepared, [], loaded, files=False)
    except RLForgeError as exc:  # about no single verl key's value: said after the translation
        stop = exc
    text = yaml.safe_dump(t.nested() if t.command != "sft" else
                          {k: v for k, v in t.nested().items() if k != "algorithm"}, sort_keys=False)
    head, *lines = t.report()
    report = [f"# translated from {source}: {head}", *(f"# {line}" for line in lines)]
    out = Path(args.out) if args.out else None
    if out is None:
        print(text, end="")
        print("\n".join(report), file=sys.stderr)
    else:  # the file holds the whole report; printed here: its first line and what was refused
        out.write_text("\n".join(report) + "\n" + text, encoding="utf-8")
        print("\n".join([report[0], *(f"# {f.line()}" for f in t.refused)]))
        if stop is None and not t.refused and t.command != "sft":  # it composes as it is, its reward function loads
            pm, cfg = compose_with_plugins(None, str(out), [], loaded=loaded)
            try:
                check_reward_function(pm, cfg, prepared, [])
            except RLForgeError as exc:
                stop = exc
        print(f"wrote {out}: rlforge {'sft' if t.command == 'sft' else 'fit'} --config {out}"
              + (f" ({len(t.refused)} refused key(s) above)" if t.refused else ""))
    if stop is not None:
        print(f"rlforge: a run of it would stop here: {stop}", file=sys.stderr)
        return 2
    if t.refused:  # the YAML is the rest of the launch: run as it is, it would train without what was refused
        stopping = sum(f.text.startswith(STOPS_ON_VALUE) for f in t.refused)
        print(f"rlforge: {len(t.refused)} key(s) of this verl launch are REFUSED (above): the translation is not the "
              "launch, and a run of it would " + ("stop on their values" if stopping == len(t.refused) else
                                                 "go without them" if not stopping else
                                                 "go without them or stop on their values (each line says which)")
              + " (exit status 2).", file=sys.stderr)
        return 2
    return 0


def compose_launch(prepared: Any, ours: list[str], loaded: Loaded) -> tuple[Any, Any]:
    """The translated launch with rlforge's own keys (``ours``) on top, composed and checked; a value rlforge refuses
    is named by the verl key it came from."""
    from rlforge.config.verl_launch import named_by_verl

    try:
        return _compose(prepared, ours, loaded)
    except ConfigError as exc:
        raise named_by_verl(exc, prepared, ours) from None


def refuse_stopping_values(prepared: Any, ours: list[str], loaded: Loaded, files: bool = True) -> tuple[Any, Any] | None:
    """The launch composed as :func:`compose_launch` composes it, before its report is shown: where a value of a verl
    key stops the composition (``rollout.n=abc``), that key is refused in the report (counted in its first line, the
    reason on its line), and the composition tried again without it, until it passes or stops on something no verl key
    explains, which is raised (every such value is refused, not only the first; once one is, such a stop may come
    from rlforge's default standing in its place, and ends the search). Returns (plugin manager, config), or
    None where a value was refused. ``files=False``: the files and folders it names are not checked (a translation made
    on another machine than the run's)."""
    from rlforge.config.verl_launch import verl_sources

    without: set[str] = set()
    while True:
        try:  # the plugins' warnings are shown once, by the first composition
            composed = _compose(prepared, ours, None if without else loaded, files, without)
        except ConfigError as exc:
            found = [f for f in verl_sources(exc, prepared, ours) if f.target not in without]
            if not found and without:  # rlforge's defaults stand where refused values were: no longer the launch
                return None
            if not found:
                raise
            prepared.translation.stopped(found, str(exc))
            without |= {f.target for f in found}
            continue
        return None if without else composed


def _compose(prepared: Any, ours: list[str], loaded: Loaded, files: bool = True,
             without: Collection[str] = ()) -> tuple[Any, Any]:
    """The translation (less the rlforge keys ``without``) under ``ours``, composed."""
    from rlforge.config import compose_with_plugins
    from rlforge.config.verl_launch import ORIGIN, beneath

    layer, notes = beneath(prepared, ours)
    for note in notes if not without else ():
        print(f"rlforge: {note}", file=sys.stderr)
    if without:
        layer = copy.deepcopy(layer)  # prepared's own stays whole
        for key in without:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(layer, parent) if parent else layer
            if node is not None and leaf in node:
                del node[leaf]
    return compose_with_plugins(None, None, ours, loaded=loaded, base=(layer, ORIGIN), files=files)


def run_verl(argv: list[str], loaded: Loaded, progress: Callable[[str], None]) -> int:
    """``rlforge verl [--sft] [--print] ARGS... [-- RLFORGE_OVERRIDES...]``: a verl launch's arguments, run by rlforge;
    rlforge's own keys after ``--`` go on top of the translation."""
    from rlforge.config.verl_launch import PPO_ENTRY, SFT_ENTRY, prepare
    from rlforge.agent.verl_tools import load_verl_tools
    from rlforge.tools.verl_resume import check_verl_checkpoints

    flags = {"--sft", "--print"}
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: rlforge verl [--sft] [--print] VERL_ARGS... [-- RLFORGE_OVERRIDES...]\n\nThe arguments of "
              "`python3 -m verl.trainer.main_ppo` (--sft: of verl's SFT trainer): --config-path/--config-name and "
              "Hydra overrides (key=v, +key=v, ++key=v, ~key). After --: rlforge's own keys (as `rlforge fit` takes "
              "them, e.g. sft.devices=2), set on top of the translation. --print: show the translation, check "
              "what can be checked before any data is read (keys, values, data files, model folder) and stop; exit "
              "status 2 where the run would not start. See docs/migration-from-verl.md.")
        return 0
    at = argv.index("--") if "--" in argv else len(argv)
    argv, ours = argv[:at], argv[at + 1:]
    opts = {a for a in argv if a in flags}
    if "--sft" in opts:
        from rlforge.config.yaml_text import parse_overrides

        check_sft_layers([(parse_overrides(ours), "rlforge's keys after --")])
    prepared = prepare([a for a in argv if a not in flags], SFT_ENTRY if "--sft" in opts else PPO_ENTRY,
                       refuse="--print" not in opts)
    t = prepared.translation
    if "--print" in opts:  # exit status 2 where keys are refused, as `rlforge config from-verl`
        composed, stop = None, None
        try:  # the translation and the keys after -- compose as the run would compose them
            composed = refuse_stopping_values(prepared, ours, loaded)
        except RLForgeError as exc:
            stop = exc
        print("\n".join([*t.report(), *([f"then rlforge's keys: {' '.join(ours)}"] if ours else [])]))
        if t.refused:
            if stop is not None:
                print(f"rlforge: the run would stop here: {stop}", file=sys.stderr)
            return 2
        try:
            if stop is not None:
                raise stop
            assert composed is not None  # not refused: refuse_stopping_values composed it or raised
            pm, cfg = composed
            check_verl_checkpoints(cfg, sft=t.command == "sft")
            if t.command == "sft":
                from rlforge.sft.run import preflight

                preflight(cfg)
            else:
                check_fit_keys(cfg)
                check_cuda_present(cfg)
                check_reward_function(pm, cfg, prepared, ours)
                load_verl_tools(cfg)  # verl's tool files load (classes import, names unique) as the run loads them
        except RLForgeError as exc:
            print(f"rlforge: the run would stop here: {exc}", file=sys.stderr)
            return 2
        return 0
    print(f"rlforge: verl launch: {t.report()[0]}", file=sys.stderr)
    pm, cfg = compose_launch(prepared, ours, loaded)
    check_verl_checkpoints(cfg, sft=t.command == "sft")
    if t.command == "sft":
        from rlforge.sft import run_sft

        run_sft(cfg, pm)
    elif t.command == "eval":
        from rlforge.tools.evaluate import evaluate_launch

        print(f"report: {evaluate_launch(cfg, pm, log=progress)}")
    else:
        from rlforge.trainer import Trainer

        check_fit_keys(cfg)
        check_cuda_present(cfg)
        check_reward_function(pm, cfg, prepared, ours)
        Trainer(cfg, plugins=pm).fit()
    return 0


def check_reward_function(pm: Any, cfg: Any, prepared: Any, ours: list[str]) -> None:
    """The reward manager's ``check_function`` (where it has one), its error naming the verl keys it is about."""
    from rlforge.config.verl_launch import named_by_verl

    check = pm.registry.reward_manager.entry(cfg.reward.manager).functions.get("check_function")
    try:
        if check is not None:
            check(cfg)
    except RLForgeError as exc:  # a ConfigError, or the file's own failure (no such function, an import error)
        raise named_by_verl(exc, prepared, ours) from None
