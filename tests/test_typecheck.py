"""The type checker runs in the test suite: the package type-checks (mypy, settings in pyproject.toml) and every
built-in component satisfies its Protocol (tests/typing/check_protocols.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# setuptools maps rlforge.algorithms -> algorithms/ and rlforge.plugins -> plugins/; mypy reads source folders,
# so it checks a tree of links laid out as the installed package
PACKAGE_DIRS = {"algorithms": ROOT / "algorithms", "plugins": ROOT / "plugins", "templates": ROOT / "templates"}


def _package_tree(root: Path) -> Path:
    pkg = root / "rlforge"
    pkg.mkdir()
    for entry in (ROOT / "rlforge").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, target in PACKAGE_DIRS.items():
        (pkg / name).symlink_to(target)
    shutil.copy(ROOT / "tests" / "typing" / "check_protocols.py", root / "check_protocols.py")
    return root


def test_mypy_passes_on_the_package_and_the_protocol_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    tree = _package_tree(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
         str(tmp_path / ".mypy_cache"), "rlforge", "check_protocols.py"],
        cwd=tree, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
