"""Build tests/tools/data/verl_launches.jsonl: every trainer launch in verl's and verl-recipe's example scripts, with
the shell variables filled in as bash fills them.

    python scripts/extract_verl_launches.py --repo verl=/tmp/verl:examples@COMMIT --repo recipe=/tmp/verl-recipe:.@COMMIT

Each ``*.sh`` under the given folder runs in bash with its commands stubbed: ``python``/``python3``/``torchrun``
record their arguments instead of running (``python3 -c ...`` fails, as it does where ``torch_npu`` is missing),
every other command outside a short list of text utilities (``date``, ``dirname``, ``sed``, ...) does nothing, and
``HOME`` is ``/home/user``. So what a launch line receives is exactly what bash passes it, arrays, defaults
(``${VAR:-x}``), ``$(( ))`` and loops included. One JSON line per launch of a trainer entry point (``ENTRIES``):
``{"source": "verl@COMMIT:examples/x.sh", "entry": "verl.trainer.main_ppo", "args": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "tools" / "data" / "verl_launches.jsonl"
# the trainer entry points `rlforge verl` stands in for (PPO family and SFT); other recipes' mains are not recorded
ENTRIES = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo", "verl.experimental.fully_async_policy.fully_async_main",
           "verl.experimental.one_step_off_policy.main_ppo", "verl.trainer.sft_trainer", "verl.trainer.fsdp_sft_trainer")
# real commands a script may use to compute its arguments (everything else is a no-op)
UTILITIES = ("bash", "sh", "date", "dirname", "basename", "echo", "printf", "seq", "expr", "awk", "sed", "grep", "tr",
             "cut", "head", "tail", "cat", "wc", "sort", "uniq", "realpath", "readlink", "pwd", "env", "true", "false",
             "test", "[", "id", "whoami", "uname", "bc", "xargs")

STUB = r"""#!/usr/bin/env bash
# records a python/torchrun invocation (argv as JSON) instead of running it
if [ "$1" = "-c" ]; then exit 1; fi
"$STUB_PY" - "$(basename "$0")" "$@" <<'EOF' >> "$RECORD"
import json, os, sys
print(json.dumps({"script": os.environ["SCRIPT"], "argv": sys.argv[1:]}))
EOF
exit 0
"""
BASH_ENV = ("command_not_found_handle() { return 0; }\nsleep() { return 0; }\nnproc() { echo 8; }\n"
            "ulimit() { return 0; }\n")
# a script that stops without launching and reads $1/$# is run again with these (e.g. SFT: <nproc_per_node> <save_path>)
POSITIONAL = ("8", "/home/user/ckpt")


def sandbox(tmp: Path) -> dict[str, str]:
    """A PATH of stubs and the allowed utilities, and the environment a script runs in."""
    bins = tmp / "bin"
    bins.mkdir()
    for name in ("python", "python3", "torchrun", "ray"):  # `ray job submit -- python3 -m ...` too
        (bins / name).write_text(STUB)
        (bins / name).chmod(0o755)
    for name in UTILITIES:
        found = shutil.which(name)
        if found:
            (bins / name).symlink_to(found)
    (tmp / "bash_env").write_text(BASH_ENV)
    return {"PATH": str(bins), "HOME": "/home/user", "BASH_ENV": str(tmp / "bash_env"), "STUB_PY": sys.executable,
            "LANG": "C.UTF-8"}


def entry_and_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) of ``python3 -m MODULE ARGS`` or ``torchrun ... -m MODULE ARGS``."""
    if "-m" not in argv[1:]:
        return None
    i = argv.index("-m", 1)
    return (argv[i + 1], argv[i + 2:]) if i + 1 < len(argv) else None


def _launches(script: Path, root: Path, rel: str, positional: tuple[str, ...], env: dict[str, str],
              record: Path) -> list[tuple[str, list[str]]]:
    record.write_text("")
    try:
        subprocess.run(["bash", str(script), *positional], cwd=root, env={**env, "RECORD": str(record), "SCRIPT": rel},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    except subprocess.TimeoutExpired:
        pass  # what it launched before it hung is recorded
    found = [entry_and_args(json.loads(line)["argv"]) for line in record.read_text().splitlines()]
    out = []
    for entry, args in (f for f in found if f and f[0] in ENTRIES):
        for arg in reversed(positional):  # a script that forwards "$@" without shifting passes them on
            if args and args[-1] == arg:
                args = args[:-1]
        out.append((entry, args))
    return out


def run_scripts(root: Path, folder: str, label: str, env: dict[str, str], record: Path) -> list[dict]:
    launches = []
    scripts = sorted((root / folder).rglob("*.sh"))
    for script in scripts:
        rel = script.relative_to(root).as_posix()
        found = _launches(script, root, rel, (), env, record)
        text = script.read_text(errors="replace")
        if not found and ("$1" in text or "$#" in text):
            found = _launches(script, root, rel, POSITIONAL, env, record)
        launches += [{"source": f"{label}:{rel}", "entry": entry, "args": args} for entry, args in found]
    print(f"{label}: {len(scripts)} scripts, {len(launches)} launches", file=sys.stderr)
    return launches


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", action="append", required=True, metavar="NAME=PATH:FOLDER@COMMIT",
                   help="a checkout, the folder of scripts in it, and its commit (repeatable)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    launches: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = sandbox(Path(tmp))
        for spec in args.repo:
            name, rest = spec.split("=", 1)
            path, rest = rest.split(":", 1)
            folder, commit = rest.split("@", 1)
            launches += run_scripts(Path(path), folder, f"{name}@{commit[:12]}", env, Path(tmp) / "record.jsonl")
    args.out.write_text("".join(json.dumps(x) + "\n" for x in launches), encoding="utf-8")
    print(f"wrote {args.out} ({len(launches)} launches)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
