"""What the migration pages' tests share: a page's code blocks and command keys, and its conversion and reward
wrapper run in a scratch folder beside the user's own (importable) reward module."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def doc_blocks(page: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (DOCS / page).read_text(), re.S)


def doc_command_keys(page: str, block: int = -1) -> list[str]:
    """The ``key=value`` words of the page's bash block ``block`` (the last by default; quotes removed)."""
    command = doc_blocks(page, "bash")[block].replace("\\\n", " ")
    return [word.strip("'") for word in command.split() if "=" in word]


def run_page(page: str, folder: Path, rows_file: str, rows: list[dict], module: str, source: str,
             wrapper_file: str) -> None:
    """Write ``rows`` as the JSON lines file the page converts, the user's reward code as ``module``
    (``package.name``), then run the page's conversion (its first python block) in ``folder`` and save its wrapper
    (the second) as ``wrapper_file``."""
    (folder / rows_file).write_text("".join(json.dumps(r) + "\n" for r in rows))
    package, name = module.split(".")
    (folder / package).mkdir()
    (folder / package / "__init__.py").write_text("")
    (folder / package / f"{name}.py").write_text(source)
    convert, wrapper = doc_blocks(page, "python")
    subprocess.run([sys.executable, "-c", convert], cwd=folder, check=True)
    (folder / wrapper_file).write_text(wrapper)
