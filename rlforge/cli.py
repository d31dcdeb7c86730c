"""The ``rlforge`` command: fit, sft, algos, plugins, config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rlforge.errors import RLForgeError


def _compose(args: argparse.Namespace) -> tuple[Any, Any]:
    from rlforge.config import compose_with_plugins

    return compose_with_plugins(getattr(args, "algo", None), args.config, args.overrides)


def cmd_fit(args: argparse.Namespace) -> int:
    from rlforge.trainer import Trainer

    pm, cfg = _compose(args)
    Trainer(cfg, plugins=pm).fit()
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from rlforge.sft import run_sft

    pm, cfg = _compose(args)
    run_sft(cfg, pm)
    return 0


def cmd_algos(args: argparse.Namespace) -> int:
    from rlforge.plugin_manager import PluginManager

    from omegaconf import OmegaConf

    for entry in PluginManager().registry.algorithm.entries():
        flat = OmegaConf.to_container(OmegaConf.create(entry.obj.preset or {}))
        preset = " ".join(f"{k}={v}" for k, v in _flatten(flat) if k != "algorithm.name") or "(defaults)"
        print(f"{entry.name:<22} {entry.description}\n{'':<22} preset: {preset}  [{entry.plugin}]")
    return 0


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if not isinstance(d, dict):
        return [(prefix, d)]
    return [kv for k, v in d.items() for kv in _flatten(v, f"{prefix}{k}." if isinstance(v, dict) else f"{prefix}{k}")]


def cmd_plugins(args: argparse.Namespace) -> int:
    from rlforge.plugin_manager import PluginManager

    pm = PluginManager()
    for info in pm.plugins():
        dist = f"{info.distribution} {info.version}".strip()
        print(f"{info.name}  ({info.source}{', ' + dist if dist else ''})")
        if info.error:
            print(f"    FAILED to load: {info.error}")
        for comp in info.components:
            print(f"    {comp}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from rlforge.config import explain_batch_sizes

    _, cfg = _compose(args)
    print(OmegaConf.to_yaml(cfg), end="")
    print("\n# batch sizes\n# " + explain_batch_sizes(cfg).replace("\n", "\n# "))
    return 0


def _add_config_args(p: argparse.ArgumentParser, with_algo: bool = True) -> None:
    if with_algo:
        p.add_argument("--algo", help="algorithm name (see `rlforge algos`); default grpo")
    p.add_argument("--config", help="YAML file merged over the defaults and the algorithm preset")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.lr=1e-5 trainer.total_steps=50")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlforge", description="RL post-training for LLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
        "fit": (cmd_fit, "train with an RL algorithm"),
        "sft": (cmd_sft, "supervised fine-tuning (builds the shipped tiny base model)"),
        "algos": (cmd_algos, "list algorithms"),
        "plugins": (cmd_plugins, "list plugins and what they register"),
        "config": (cmd_config, "show the resolved config and the batch-size arithmetic"),
    }
    for name, (fn, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=fn)
        if name in ("fit", "sft"):
            _add_config_args(p)
        elif name == "config":
            p.add_argument("action", choices=["show"])
            _add_config_args(p)
        elif name == "plugins":
            p.add_argument("action", nargs="?", choices=["list"], default="list")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse cannot intermix a `*` positional with options inside a sub-command: collect stray key=value
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.func(args)
    except RLForgeError as exc:
        print(f"rlforge: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
