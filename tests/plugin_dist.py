"""A third-party plugin package, pip-installed for the tests that need a real distribution (its entry point found by
``importlib.metadata``), and removed after.

It is installed into a folder of its own that only the installing test process sees (``sys.path`` and, for the
processes it starts, ``PYTHONPATH``), never into the shared virtual environment: under pytest-xdist the other
workers' tests run meanwhile and must not find its entry points."""

from __future__ import annotations

import importlib
import os
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
def visible(site: Path) -> Iterator[None]:
    """Distributions installed into ``site`` (``pip install --target``) are importable, with their entry points, in
    this process and in the processes it starts during the block; not before or after."""
    path = str(site)
    saved = os.environ.get("PYTHONPATH")
    sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = path if not saved else f"{path}{os.pathsep}{saved}"
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(path)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        importlib.invalidate_caches()


def install(source: Path, site: Path) -> subprocess.CompletedProcess:
    """``pip install`` the project folder ``source`` into ``site`` (see :func:`visible`)."""
    return pip("install", "--no-deps", "--no-build-isolation", "-q", "--target", str(site), str(source))


@contextmanager
def installed_package(root: Path, dist: str, package: str, plugins: dict[str, tuple[str, str]],
                      version: str = "0.1.0") -> Iterator[None]:
    """Distribution ``dist`` with the package ``package``: each rlforge entry point of ``plugins`` (name -> (module,
    source)) is ``package.<module>`` with that source; pip-installed from ``root`` for the block (:func:`visible`),
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
    site = root.parent / f"{root.name}-site"
    res = install(root, site)
    if res.returncode != 0:
        pytest.fail(f"pip install of the test plugin {dist} failed:\n{res.stdout}\n{res.stderr}")
    try:
        with visible(site):
            yield
    finally:
        for mod in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
            del sys.modules[mod]
