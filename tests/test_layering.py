"""The core's layering (docs/concepts.md, "The pieces and who does what"): the core never imports the built-in plugins
or algorithms (it reaches them through the plugin manager), and its packages import each other in one direction only."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "rlforge"
# the core's parts, lowest first: a part may import its own modules and the parts below it, never above
LAYERS = ["base", "build", "controller", "trainer", "sft", "tools", "cli"]


def _imports(path: Path) -> set[str]:
    """Every ``rlforge.*`` module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):  # lazy_import("rlforge.x") calls
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_import" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return {m for m in found if m.startswith("rlforge.")}  # ``from rlforge import batch`` is rlforge.batch


def _part(module: str) -> str:
    """The layer of a core module: its subpackage, or ``build``/``cli`` for those modules, else ``base``."""
    parts = module.split(".")
    if module == "rlforge":  # the package's facade re-exports from every part (lazily)
        return "cli"
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "base"


def _core_modules() -> dict[str, Path]:
    out = {}
    for path in CORE.rglob("*.py"):
        rel = path.relative_to(CORE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = path
    return out


def test_the_core_never_imports_plugins_or_algorithms() -> None:
    offenders = {
        name: sorted(m for m in _imports(path) if m.startswith(("rlforge.plugins", "rlforge.algorithms")))
        for name, path in _core_modules().items()
    }
    offenders = {k: v for k, v in offenders.items() if v and k != "rlforge.plugin_manager"}
    assert offenders == {}, "the core reaches plugins only through the plugin manager's module names"


def test_core_parts_import_downwards_only() -> None:
    modules = _core_modules()
    upward = []
    for name, path in modules.items():
        mine = LAYERS.index(_part(name))
        for target in _imports(path):
            if target in modules and LAYERS.index(_part(target)) > mine:
                upward.append(f"{name} -> {target}")
    assert upward == [], "a lower part of the core imports a higher one: " + "; ".join(sorted(upward))


def test_no_import_cycle_between_core_modules_at_import_time() -> None:
    """Module-level imports (what runs at ``import``) form no cycle among the core's modules."""
    modules = _core_modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    seen: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [node, nxt]))
            if nxt not in seen:
                visit(nxt, stack + [node])
        seen[node] = 2

    for name in sorted(modules):
        if name not in seen:
            visit(name, [])
