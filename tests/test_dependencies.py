"""Every package the shipped code imports is declared in pyproject.toml: as a dependency, or, when only an optional
backend needs it, in an extra and imported lazily (inside the function that needs it), so that a plain
``pip install rlforge`` imports every module."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("rlforge", "plugins", "algorithms", "templates")


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


# packages that cannot be an extra and are installed without their dependencies (scripts/setup.sh, docs/agentic.md):
# verl 0.9.1 pins a transformers older than rlforge's; its tool and dataset classes are read through its own loaders
NO_DEPS = {"verl"}


def _declared() -> tuple[set[str], dict[str, str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extra = {_name(r): group for group, reqs in project["optional-dependencies"].items() for r in reqs}
    extra.pop("rlforge", None)  # the self-referencing groups (gpu, test)
    return core, extra


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """Top-level module name -> [(file:line, imported at module level)] for every absolute import of the sources."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            top_level = {id(node) for node in tree.body}
            top_level |= {id(n) for node in tree.body if isinstance(node, ast.Try) for n in node.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                for name in names:
                    found.setdefault(name.split(".")[0], []).append((where, id(node) in top_level))
    return found


def test_every_imported_package_is_declared() -> None:
    core, extra = _declared()
    distributions = importlib.metadata.packages_distributions()
    undeclared, eager_optional = [], []
    for module, sites in sorted(_imports().items()):
        if module in sys.stdlib_module_names or module in {"rlforge", "__future__"}:
            continue
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        if names & core:
            continue
        if module in NO_DEPS:  # optional and imported lazily, as an extra's packages
            eager_optional += [f"{module} imported at module level: {where}" for where, at_top in sites if at_top]
            continue
        if names & set(extra):
            eager = [where for where, at_top in sites if at_top]
            if eager:
                group = extra[next(iter(names & set(extra)))]
                eager_optional.append(f"{module} (extra '{group}') imported at module level: {', '.join(eager)}")
            continue
        undeclared.append(f"{module} ({', '.join(sorted(names))}): {', '.join(where for where, _ in sites[:3])}")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(undeclared)
    assert not eager_optional, "optional packages must be imported lazily:\n" + "\n".join(eager_optional)
