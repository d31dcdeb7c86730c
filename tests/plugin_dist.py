"""A third-party plugin package, pip-installed for the tests that need a real distribution (its entry point found by
``importlib.metadata``), and uninstalled after."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@contextmanager
def installed_package(root: Path, dist: str, package: str, plugins: dict[str, tuple[str, str]],
                      version: str = "0.1.0") -> Iterator[None]:
    """Distribution ``dist`` with the package ``package``: each rlforge entry point of ``plugins`` (name -> (module,
    source)) is ``package.<module>`` with that source; pip-installed from ``root`` for the block, uninstalled and
    unimported after."""
    entry_points = "\n".join(f'{name} = "{package}.{module}"' for name, (module, _) in plugins.items())
    (root / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "{version}"
        dependencies = []

        [project.entry-points.rlforge]
        {{entry_points}}

        [tool.setuptools]
        packages = ["{package}"]
        """).replace("{entry_points}", entry_points))
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    for module, source in plugins.values():
        (root / package / f"{module}.py").write_text(source)
    res = pip("install", "--no-deps", "--no-build-isolation", "-q", str(root))
    if res.returncode != 0:
        pytest.fail(f"pip install of the test plugin {dist} failed:\n{res.stdout}\n{res.stderr}")
    importlib.invalidate_caches()
    try:
        yield
    finally:
        pip("uninstall", "-y", "-q", dist)
        for mod in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
            del sys.modules[mod]
        importlib.invalidate_caches()
