"""The core's layering (docs/concepts.md, "The pieces and who does what"): the core never imports the built-in plugins
or algorithms (it reaches them through the plugin manager), its packages import each other in one direction only,
and its modules form no import cycle, neither among what runs at import nor among every import including the
``TYPE_CHECKING`` and function-level ones (a type-level cycle: the contracts then cannot be introspected, and moving
one import out of a function makes it real)."""

from __future__ import annotations

import ast
import inspect
import typing
from collections import defaultdict
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "rlforge"
# the core's parts, lowest first: a part may import its own modules and the parts below it, never above
LAYERS = ["base", "build", "controller", "trainer", "sft", "tools", "cli"]


def _named(node: ast.AST) -> set[str]:
    """The modules (and ``module.name`` candidates) an import statement names; empty for other nodes."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:  # ``from rlforge import batch``:
        return {node.module} | {f"{node.module}.{a.name}" for a in node.names}  # rlforge.batch
    return set()


def _imports(path: Path) -> set[str]:
    """Every module a file imports anywhere: at module level, under ``TYPE_CHECKING``, inside functions, and
    ``lazy_import("rlforge.x")`` calls."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        found |= _named(node)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "lazy_import" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def _type_checking(test: ast.expr) -> bool:
    return getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING"


def _runtime_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported: module and class level, outside ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        found.update(_named(node))
        if isinstance(node, ast.If) and _type_checking(node.test):
            children: list[ast.AST] = list(node.orelse)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            children = list(node.decorator_list) if not isinstance(node, ast.Lambda) else []
        else:
            children = list(ast.iter_child_nodes(node))
        for child in children:
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _modules(root: Path = CORE) -> dict[str, Path]:
    """The modules of the package at ``root`` by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = path
    return out


def _graph(modules: dict[str, Path], static: bool) -> dict[str, set[str]]:
    """Module -> the modules importing it runs first: each imported module and its parent packages (whose
    ``__init__`` runs before it), leaving out the importer's own packages (already running when it is imported).
    ``static``: every import (type-level edges included); else only those that run at import."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imports(path) if static else _runtime_imports(path):
            parts = target.split(".")
            for dep in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                if dep in modules and dep != name and not name.startswith(dep + "."):
                    graph[name].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module (Tarjan), sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(found)


def _explain(graph: dict[str, set[str]], cycles: list[list[str]]) -> str:
    """The edges inside each cycle, for an assertion message."""
    return "; ".join(", ".join(f"{a} -> {b}" for a in cycle for b in sorted(graph[a] & set(cycle))) for cycle in cycles)


def _part(module: str) -> str:
    """The layer of a core module: its subpackage, or ``build``/``cli`` for those modules, else ``base``."""
    parts = module.split(".")
    if module == "rlforge":  # the package's facade re-exports from every part (lazily)
        return "cli"
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "base"


def test_the_core_never_imports_plugins_or_algorithms() -> None:
    offenders = {
        name: sorted(m for m in _imports(path) if m.startswith(("rlforge.plugins", "rlforge.algorithms")))
        for name, path in _modules().items()
    }
    offenders = {k: v for k, v in offenders.items() if v and k != "rlforge.plugin_manager"}
    assert offenders == {}, "the core reaches plugins only through the plugin manager's module names"


def test_core_parts_import_downwards_only() -> None:
    modules = _modules()
    upward = []
    for name, path in modules.items():
        mine = LAYERS.index(_part(name))
        for target in _imports(path):
            if target.startswith("rlforge.") and target in modules and LAYERS.index(_part(target)) > mine:
                upward.append(f"{name} -> {target}")
    assert upward == [], "a lower part of the core imports a higher one: " + "; ".join(sorted(upward))


def test_no_import_cycle_between_core_modules_at_import_time() -> None:
    """What runs at ``import`` forms no cycle among the core's modules."""
    graph = _graph(_modules(), static=False)
    assert _cycles(graph) == [], "import cycle: " + _explain(graph, _cycles(graph))


# Type-level cycles that only deferred (function-level) imports close, left in parts owned elsewhere: this list may
# only shrink (delete an entry once its cycle is broken; the test fails while it is stale).
KNOWN_DEFERRED_CYCLES = [
    ["rlforge.checkpoint", "rlforge.lora", "rlforge.models", "rlforge.multimodal"],
]


def test_no_type_level_import_cycle_between_core_modules() -> None:
    """Counting ``TYPE_CHECKING`` and function-level imports too, the core's modules form no cycle but the known
    deferred ones."""
    graph = _graph(_modules(), static=True)
    new = [c for c in _cycles(graph) if c not in KNOWN_DEFERRED_CYCLES]
    assert new == [], "type-level import cycle: " + _explain(graph, new)
    stale = [c for c in KNOWN_DEFERRED_CYCLES if c not in _cycles(graph)]
    assert stale == [], f"no longer a cycle, delete it from KNOWN_DEFERRED_CYCLES: {stale}"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_cycle_checks_see_package_and_type_level_cycles(tmp_path: Path) -> None:
    """The circle the contracts once made with the agent package: ``protocols`` imports an agent type under
    ``TYPE_CHECKING``; the agent package's ``__init__`` imports its engine, which imports ``protocols``."""
    circle = {
        "pkg/__init__.py": "",
        "pkg/protocols.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.agent.base import Sample\n",
        "pkg/agent/__init__.py": "from pkg.agent.engine import Engine\n",
        "pkg/agent/base.py": "class Sample: ...\n",
        "pkg/agent/engine.py": "from pkg.protocols import Sampling\nclass Engine: ...\n",
    }
    modules = _modules(_write(tmp_path / "type_level", circle))
    assert _cycles(_graph(modules, static=False)) == []  # nothing runs in a circle...
    circle_modules = [["pkg.agent", "pkg.agent.engine", "pkg.protocols"]]  # pkg.agent: pkg.agent.base's package
    assert _cycles(_graph(modules, static=True)) == circle_modules

    # ... until the import leaves TYPE_CHECKING: a real circle, through the package's __init__ only
    circle["pkg/protocols.py"] = "from pkg.agent.base import Sample\n"
    modules = _modules(_write(tmp_path / "runtime", circle))
    assert _cycles(_graph(modules, static=False)) == circle_modules


def test_sampling_and_the_agent_types_are_leaves() -> None:
    """The value types the contracts name import nothing that imports further (so any module may import them)."""
    graph = _graph(_modules(), static=True)
    assert graph["rlforge.sampling"] == set()
    assert all(not graph[dep] for dep in graph["rlforge.agent.types"]), graph["rlforge.agent.types"]


def test_the_contracts_type_hints_resolve() -> None:
    """Every annotation in ``rlforge.protocols`` resolves at run time (a signature checker or docs generator can
    read the Protocols), e.g. ``AgentLoop.run``'s ``Sample`` and ``Trajectory``."""
    import rlforge.protocols as contracts
    from rlforge.agent.types import Sample, Trajectory

    assert typing.get_type_hints(contracts.AgentLoop.run) == {"sample": Sample, "engine": typing.Any,
                                                              "return": Trajectory}
    classes = [c for c in vars(contracts).values() if inspect.isclass(c) and c.__module__ == contracts.__name__]
    assert len(classes) >= 15
    for cls in classes:
        typing.get_type_hints(cls)
        for member in vars(cls).values():
            fn = member.fget if isinstance(member, property) else member
            if inspect.isfunction(fn):
                typing.get_type_hints(fn)
