"""The MkDocs site builds with --strict: no broken links or anchors, every nav entry exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_files(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in _nav_files(item)]
    return [f for value in nav.values() for f in _nav_files(value)]


def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    for page in ("index.html", "cli/index.html", "config/index.html", "hooks/index.html", "faq/index.html",
                 "migration-from-verl/index.html", "algorithms/index.html", "algorithms/grpo/index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_nav_has_the_guides_and_references():
    nav = _nav_files(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    for page in ("quickstart.md", "concepts.md", "config.md", "hooks.md", "plugins.md", "cli.md",
                 "migration-from-verl.md", "faq.md", "algorithms/README.md", "algorithms/formulas.md",
                 "rollout.md", "performance.md", "distributed.md"):
        assert page in nav, page
