"""The ``rlforge`` command: fit, sft, algos, plugins, config, new, eval, generate, export, data, report.

Each command parses its arguments and calls one function; the work happens in ``rlforge.tools`` (and the
trainer). User mistakes are ``RLForgeError``s, printed as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rlforge.config.checks import check_fit_keys, check_sft_layers
from rlforge.diskio import output_file
from rlforge.errors import SHIELDED, STOP_UNDERWAY, RLForgeError, Terminated, first_line


def _warn(pm: Any) -> Any:
    """Print one line per plugin that failed to load or was disabled (every command that loads plugins)."""
    for line in pm.warnings():
        print(f"rlforge: warning: {line}", file=sys.stderr)
    return pm


def _plugins(args: argparse.Namespace) -> Any:
    from rlforge.plugin_manager import PluginManager

    return _warn(PluginManager(modules=args.plugin))


def _compose(args: argparse.Namespace) -> tuple[Any, Any]:
    from rlforge.config import compose_with_plugins

    return compose_with_plugins(getattr(args, "algo", None), args.config, args.overrides, loaded=_warn,
                                modules=args.plugin)


def cmd_fit(args: argparse.Namespace) -> int:
    pm, cfg = _compose(args)  # config mistakes answer before torch is imported
    check_fit_keys(cfg)
    from rlforge.trainer import Trainer

    Trainer(cfg, plugins=pm).fit()
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from rlforge.config.compose import load_file
    from rlforge.config.yaml_text import parse_overrides

    check_sft_layers([(parse_overrides(args.overrides), "command-line overrides"),
                     *([(load_file(args.config), args.config)] if args.config else [])])
    pm, cfg = _compose(args)
    from rlforge.sft import run_sft

    run_sft(cfg, pm)
    return 0


def cmd_algos(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    for entry in _plugins(args).registry.algorithm.entries():
        flat = OmegaConf.to_container(OmegaConf.create(entry.obj.preset or {}))
        preset = " ".join(f"{k}={v}" for k, v in _flatten(flat) if k != "algorithm.name") or "(defaults)"
        print(f"{entry.name:<22} {entry.description}  [plugin: {entry.plugin}]\n{'':<22} preset: {preset}")
    return 0


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if not isinstance(d, dict):
        return [(prefix, d)]
    return [kv for k, v in d.items() for kv in _flatten(v, f"{prefix}{k}." if isinstance(v, dict) else f"{prefix}{k}")]


def cmd_plugins(args: argparse.Namespace) -> int:
    from rlforge.hookspecs import HOOK_SPEC_VERSION
    from rlforge.plugin_manager import AUTOLOAD_ENV

    pm = _plugins(args)
    print(f"# hook spec version {HOOK_SPEC_VERSION}; entry-point plugins: {'on' if pm.autoload else 'off'} "
          f"({AUTOLOAD_ENV}); "
          f"block plugins for a run with 'plugins.disable=[NAME,...]', add some with -p MODULE|FILE.py")
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

    if args.action == "from-verl":
        from rlforge.tools.verl_cli import from_verl

        return from_verl(args, _warn)
    pm, cfg = _compose(args)
    print(OmegaConf.to_yaml(cfg), end="")
    words = pm.registry.algorithm.get(cfg.algorithm.name).batch_words()
    ranks = pm.registry.strategy.entry(cfg.strategy.name).capabilities.data_parallel_size(cfg)
    print("\n# batch sizes\n# " + explain_batch_sizes(cfg, words, ranks).replace("\n", "\n# "))
    owners = [f"{path} ({entry.plugin})" for path, (_, entry) in sorted(pm.registry.config_sections().items())]
    if owners:
        print("\n# sections owned by plugins\n# " + "\n# ".join(owners))
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from rlforge.tools.scaffold import naming_note, render

    target = render(args.kind, args.name, args.dir)
    print(f"created {target}")
    if note := naming_note(args.kind, args.name):
        print(note)
    if args.kind == "plugin":
        print(f"next: pip install -e {target} && rlforge plugins list && pytest {target}")
    else:
        print(f"next: cd {target} && rlforge fit --config config.yaml")
    return 0


def _inference_config(args: argparse.Namespace) -> tuple[Any, Any]:
    from rlforge.tools.inference import compose_for_model

    return compose_for_model(args.model, data=args.data, split=args.split, n=args.n, temperature=args.temperature,
                             config_file=args.config, overrides=args.overrides, loaded=_warn, modules=args.plugin)


def _progress(line: str) -> None:
    print(line, file=sys.stderr)


def cmd_eval(args: argparse.Namespace) -> int:
    from rlforge.tools.evaluate import evaluate, write_report

    pm, cfg = _inference_config(args)
    out = output_file(args.out, [*cfg.data.train_files, *cfg.data.val_files], "--out", [args.model])  # before loading
    report = evaluate(cfg, pm, split=args.split, ks=args.k, limit=args.limit, log=_progress)
    path = write_report(report, out)
    print(f"{report['prompts']} prompts x {report['samples_per_prompt']} samples of {report['dataset']} "
          f"({report['split']}), model {report['model']}")
    for name, value in report["metrics"].items():
        print(f"  {name:<12} {value:.4f}")
    print(f"report: {path}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from rlforge.tools.generate import generate

    pm, cfg = _inference_config(args)
    out = output_file(args.out, [*cfg.data.train_files, *cfg.data.val_files], "--out", [args.model])  # before loading
    lines = generate(cfg, pm, out, split=args.split, limit=args.limit, log=_progress)
    print(f"wrote {lines} samples to {args.out}")
    return 0


# how `rlforge export` says to load an export, by its transformers Auto class (rlforge.tools.model_card.auto_class)
EXPORT_USES = {
    "AutoModelForSequenceClassification": "AutoModelForSequenceClassification.from_pretrained, or reward.manager=model "
                                          "reward.model.path={out}",
    "AutoModelForImageTextToText": "AutoModelForImageTextToText and AutoProcessor.from_pretrained, or model.path={out}",
    "AutoModelForCausalLM": "AutoModelForCausalLM.from_pretrained or model.path={out}",
}


def cmd_export(args: argparse.Namespace) -> int:
    from rlforge.tools.export import export_checkpoint, hub_token, push_to_hub
    from rlforge.tools.model_card import auto_class

    if args.private and not args.push_to_hub:
        raise RLForgeError("--private makes the repo that --push-to-hub REPO creates private: give --push-to-hub too.")
    token = hub_token(args.push_to_hub) if args.push_to_hub else None  # before the export: it may take a while
    out = export_checkpoint(args.checkpoint, args.out, _plugins(args).registry, adapter_only=args.adapter,
                            warn=lambda line: print(f"rlforge: warning: {line}", file=sys.stderr),
                            repo_id=args.push_to_hub, dtype=args.dtype or "")
    how = ("PeftModel.from_pretrained(base_model, OUT)" if args.adapter
           else EXPORT_USES[auto_class(out)].format(out=out))
    print(f"exported to {out} (load it with {how})")
    if token is not None:
        print(f"pushed to {push_to_hub(out, args.push_to_hub, token, args.private)} "
              f"(from_pretrained({args.push_to_hub!r}) loads it)")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from rlforge.tools.data_prep import prepare

    for path in prepare(args.dataset, args.input, args.out, _plugins(args).registry, args.split, args.subset):
        print(f"wrote {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if args.trajectory is not None:
        from rlforge.trainer.report import show_trajectories

        show_trajectories(args.run_dir, args.trajectory)
        return 0
    from rlforge.tools.plots import report

    for path in report(args.run_dir):
        print(f"wrote {path}")
    return 0


def _add_config_args(p: argparse.ArgumentParser, with_algo: bool = True) -> None:
    if with_algo:
        p.add_argument("--algo", help="algorithm name (see `rlforge algos`); default grpo")
    p.add_argument("--config", help="YAML file merged over the defaults and the algorithm preset, or builtin:NAME "
                   "for a config shipped with rlforge (builtin:agentic)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. actor.lr=1e-5 trainer.total_steps=50")


def _add_inference_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a model folder, builtin:NAME, a checkpoint folder (step_N) or a run folder (its newest "
                                 "checkpoint)")
    p.add_argument("--data", action="append", metavar="FILE",
                   help="jsonl/parquet prompt file (repeatable); default: the dataset of data.name")
    p.add_argument("--split", default="val", help="val (default) or train")
    p.add_argument("--n", type=int, help="samples per prompt (rollout.val_n; default 1)")
    p.add_argument("--temperature", type=float, help="sampling temperature (rollout.val_temperature; default 0 = greedy)")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    _add_config_args(p, with_algo=False)


def _add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name in ("fit", "sft"):
        _add_config_args(p)
    elif name == "config":
        p.add_argument("action", choices=["show", "from-verl"],
                       help="show: the resolved config; from-verl FILE: translate a verl config (see --out)")
        p.add_argument("--out", help="from-verl: write the rlforge config here (and check that it composes)")
        _add_config_args(p)
    elif name == "plugins":
        p.add_argument("action", nargs="?", choices=["list"], default="list")
    elif name == "new":
        p.add_argument("kind", choices=["plugin", "experiment"])
        p.add_argument("name", help="e.g. my_algo: the plugin's entry point, algorithm and reward name")
        p.add_argument("--dir", default=".", help="parent folder of the new one (default: the current folder)")
    elif name == "eval":
        _add_inference_args(p)
        p.add_argument("--k", help="comma-separated k for pass@k, each <= --n (default: 1 and n)")
        p.add_argument("--out", default="eval_report.json", help="JSON report (default: eval_report.json)")
    elif name == "generate":
        _add_inference_args(p)
        p.add_argument("--out", required=True, help="output JSONL file, one line per sample")
    elif name == "export":
        p.add_argument("checkpoint", help="checkpoints/step_N folder, or a run folder (its newest checkpoint)")
        p.add_argument("out", help="new folder for the Hugging Face model")
        p.add_argument("--adapter", action="store_true",
                       help="LoRA runs: write the adapter (peft folder) instead of the merged model")
        p.add_argument("--push-to-hub", metavar="REPO",
                       help="then upload the folder (model card included) to the Hub model repo ORG/NAME, created "
                            "if missing (HF_TOKEN or `hf auth login`; HF_ENDPOINT)")
        p.add_argument("--private", action="store_true", help="with --push-to-hub: a new repo is private")
        p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                       help="write every floating weight in this dtype (default: each weight's dtype in the model the "
                            "run loaded, e.g. bf16 for a bf16 model trained in fp32)")
    elif name == "data":
        p.add_argument("dataset", choices=["gsm8k", "math", "geometry3k"])  # rlforge.tools.data_prep.SOURCES
        p.add_argument("--input", action="append", required=True, metavar="SOURCE",
                       help="a jsonl/parquet file of the source dataset (repeatable: one per split), or through "
                            "Hugging Face datasets a folder saved by save_to_disk, a local dataset folder or a Hub "
                            "id (its train and test splits)")
        p.add_argument("--out", required=True, help="folder for <split>.parquet")
        p.add_argument("--split", help="train or test (default: from the input file name; of a dataset with splits: "
                                       "both it has)")
        p.add_argument("--subset", help="the configuration of a dataset with splits (default: the one verl's script "
                                        "reads, main for gsm8k)")
    elif name == "report":
        p.add_argument("run_dir", help="a run folder (with mlflow.db)")
        p.add_argument("--trajectory", metavar="N|STEP:INDEX|all",
                       help="show a trajectory of the run's trajectories.jsonl (rollout.agent.record_trajectories) "
                            "with its spans and loss mask instead of redrawing the plots; N: a line from 0 (-1: the "
                            "last), STEP:INDEX: a row of a step, all: one line each")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlforge", description="RL post-training for LLMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {
        "fit": (cmd_fit, "train with an RL algorithm"),
        "sft": (cmd_sft, "supervised fine-tuning (builds the shipped tiny base model)"),
        "algos": (cmd_algos, "list algorithms"),
        "plugins": (cmd_plugins, "list plugins and what they register"),
        "config": (cmd_config, "show the resolved config and the batch-size arithmetic"),
        "new": (cmd_new, "create a plugin package or an experiment folder from a template"),
        "eval": (cmd_eval, "evaluate a model or checkpoint: mean reward, accuracy, pass@k (JSON report)"),
        "generate": (cmd_generate, "generate responses for a dataset into a JSONL file"),
        "export": (cmd_export, "export a checkpoint as a plain Hugging Face model folder"),
        "data": (cmd_data, "preprocess GSM8K, MATH or Geometry3K from local files into verl-compatible parquet"),
        "report": (cmd_report, "redraw a run's plots from its mlflow store"),
    }
    for name, (fn, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=fn, plugin=[])
        if name not in ("new", "report"):
            p.add_argument("-p", dest="plugin", action="append", metavar="MODULE",
                           help="load a plugin module (a module name or a .py file) besides the installed ones; "
                                "repeatable (plugins.modules in a config; see docs/plugins.md)")
        _add_arguments(name, p)
    # listed for --help only: main() hands `rlforge verl ...` to tools.verl_cli.run_verl before argparse sees verl's syntax
    sub.add_parser("verl", help="run a verl launch unchanged: rlforge verl ARGS (the arguments of python3 -m "
                   "verl.trainer.main_ppo; --sft: verl's SFT trainer; --print: the translation)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verl"]:  # verl's own argument syntax (--config-path, +key=v, ~key): no argparse
        from rlforge.tools.verl_cli import run_verl

        return _run(lambda: run_verl(argv[1:], _warn, _progress))
    if argv[:2] == ["config", "from-verl"] and not {"-h", "--help"} & set(argv):  # verl's syntax too
        from rlforge.tools.verl_cli import from_verl, from_verl_args

        return _run(lambda: from_verl(from_verl_args(argv[2:]), _warn))
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse cannot intermix a `*` positional with options inside a sub-command: collect stray key=value
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return _run(lambda: args.func(args))


def _run(command: Callable[[], int]) -> int:
    try:
        with _terminate_as_interrupt():
            return command()
    except RLForgeError as exc:
        if os.environ.get("RLFORGE_TRACEBACK"):  # the whole chain: where a plugin's, loop's or tool's code failed
            traceback.print_exc()
        print(f"rlforge: error: {exc}", file=sys.stderr)
        return _stopped() if _TERMINATED.is_set() else 2  # (an error of the stop, e.g. a worker the signal ended)
    except KeyboardInterrupt:  # Ctrl-C; a Terminated, or one a library raised anew from it (Ray's waits do)
        return _stopped()
    except SystemExit:
        if not _TERMINATED.is_set():
            raise
        return _stopped()  # the exit a library made of the interrupt (Lightning's, under rlforge sft)
    except BrokenPipeError:  # e.g. `rlforge algos | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # what the interrupted code raised on its way out (torch.save cut mid-file)
        if not _TERMINATED.is_set():
            traceback.print_exc()
            print(f"rlforge: error: {_raised_where(exc)}", file=sys.stderr)
            return 1
        print(f"rlforge: error while stopping: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        return _stopped()


def _raised_where(exc: BaseException) -> str:
    """The one line under an unexpected exception's traceback: what was raised and where, a hook by its name (a
    plugin's ``rlforge_step_end`` that raised: the error names its file and hook)."""
    frames = traceback.extract_tb(exc.__traceback__)
    message = first_line(exc)
    what = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if not frames:
        return what
    last = frames[-1]
    inside = next((f"the hook {f.name} in {f.filename}:{f.lineno}" for f in reversed(frames)
                   if f.name.startswith("rlforge_")), f"{last.filename}:{last.lineno}, in {last.name}")
    return f"{what} (raised in {inside}; traceback above)"


def _stopped() -> int:
    """The line and exit status of a command stopped by a SIGTERM (143), else by Ctrl-C (130)."""
    if _TERMINATED.is_set():
        print("rlforge: terminated (SIGTERM); stopped as after Ctrl-C", file=sys.stderr)
        return 143
    print("rlforge: interrupted", file=sys.stderr)
    return 130


_TERMINATED = threading.Event()  # a SIGTERM stopped the running command
_PUT_OFF = threading.Event()  # a SIGTERM that landed in an import is to be sent again


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While a command runs in the main thread, a SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``), so a
    preempted run stops as after Ctrl-C instead of dying where it stands (Python's default)."""
    _TERMINATED.clear()
    _PUT_OFF.clear()
    STOP_UNDERWAY.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = signal.signal(signal.SIGTERM, _terminate)
    unraisable = sys.unraisablehook
    sys.unraisablehook = _dropped_terminated(unraisable)
    try:
        yield
    finally:  # once stopped by one (or with one put off), a later SIGTERM must not end the process on its way out
        signal.signal(signal.SIGTERM, signal.SIG_IGN if _TERMINATED.is_set() or _PUT_OFF.is_set() else previous)
        sys.unraisablehook = unraisable


def _dropped_terminated(unraisable: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Python drops an exception raised where it ignores them (a weakref callback or ``__del__`` the garbage collector
    runs) and prints its traceback: a :class:`Terminated` dropped so is sent again 50 ms later, quietly, to stop the
    command where it can."""
    def hook(info: Any) -> None:
        if info.exc_type is None or not issubclass(info.exc_type, Terminated):
            unraisable(info)
            return
        _send_again()
    return hook


def _send_again() -> None:
    _PUT_OFF.set()
    again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
    again.daemon = True
    again.start()


def _terminate(signum: int, frame: Any) -> None:
    """A SIGTERM raises :class:`Terminated`; once the run's clean-up has it (``errors.STOP_UNDERWAY``) a repeat (a
    scheduler's, or the one a process group gets) lets that clean-up finish. Until then every one raises (one Python
    dropped is sent again: :func:`_dropped_terminated`). One that lands inside an
    import is sent again 50 ms later: an exception there can leave a module half-imported, which a library may catch
    and go on with; so is one that lands while ``errors.SHIELDED`` is set (a background checkpoint being made whole:
    its small files written and its folder renamed into place)."""
    if _TERMINATED.is_set() and STOP_UNDERWAY.is_set():
        return
    if SHIELDED.is_set() or _importing(frame):
        _send_again()
        return
    _TERMINATED.set()
    raise Terminated()


def _importing(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _child_default_sigterm() -> None:
    """In a process forked while a command runs (a reward worker): a SIGTERM ends it (the default), as its parent's
    ``terminate()`` expects, instead of raising :class:`Terminated` in code that does not expect it."""
    if signal.getsignal(signal.SIGTERM) is _terminate:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_child_default_sigterm)


if __name__ == "__main__":
    sys.exit(main())
