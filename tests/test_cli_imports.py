"""The CLI answers without loading torch: `rlforge --help`, `rlforge algos`, `rlforge plugins list` and config
errors (their speed is measured by benchmarks/cli_latency.py; here: what they import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from rlforge.lazy import is_loaded
{body}
heavy = [m for m in ("torch", "transformers", "vllm", "ray", "mlflow", "matplotlib") if is_loaded(m)]
print("HEAVY:" + ",".join(heavy))
"""


def _heavy(body: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(body=body)], capture_output=True, text=True, timeout=300)
    line = [x for x in out.stdout.splitlines() if x.startswith("HEAVY:")]
    assert line, out.stdout + out.stderr
    return [m for m in line[0][len("HEAVY:"):].split(",") if m]


def test_importing_the_cli_loads_no_heavy_library() -> None:
    assert _heavy("import rlforge.cli") == []


@pytest.mark.parametrize("argv", [["algos"], ["plugins", "list"], ["fit", "actor.lr=abc"],
                                  ["fit", "actor.ppo_mini_batch_size=7"], ["config", "show", "actor.lr=1e-5"]])
def test_listing_and_config_commands_load_no_heavy_library(argv: list[str]) -> None:
    body = f"from rlforge.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert _heavy(body) == []


def test_a_lazily_imported_submodule_is_an_attribute_of_its_package() -> None:
    """``lazy_import("rlforge.ops")`` (rlforge.module does it) sets ``rlforge.ops`` as a plain import does, without
    running it: ``import rlforge.ops; rlforge.ops.x`` later finds it (the module runs on first use)."""
    body = ("import rlforge\nfrom rlforge.lazy import lazy_import\nops = lazy_import('rlforge.ops')\n"
            "assert vars(rlforge)['ops'] is ops and not is_loaded('torch')\n"
            "import rlforge.ops\nassert rlforge.ops.response_logprobs and is_loaded('torch')")
    assert _heavy(body) == ["torch"]


def test_a_submodule_of_a_lazy_package_imported_first_runs_once() -> None:
    """``import torch.distributed.checkpoint`` while ``lazy_import("torch")`` has not run torch yet: torch's
    ``__init__`` imports torch.distributed itself, and the import system must not run it a second time (that aborted
    the process: "cannot initialize type GradBucket: an object with that name is already defined")."""
    body = ("from rlforge.lazy import lazy_import\ntorch = lazy_import('torch')\nassert not is_loaded('torch')\n"
            "from torch.distributed.checkpoint import FileSystemReader\n"
            "import torch.distributed.checkpoint as dcp\n"
            "assert dcp.FileSystemReader is FileSystemReader and float(torch.ones(2).sum()) == 2.0")
    assert _heavy(body) == ["torch"]
