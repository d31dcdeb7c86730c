"""verl's interpolations resolved fast (``Simple``): the two forms verl's defaults use, ``${key}`` and
``${oc.select:key,default}``, whole or inside a string; any other form is left to OmegaConf (``verl_hydra.resolve``).
A cycle of references is reported with every key in it (``Cycle``)."""

from __future__ import annotations

import re
from typing import Any

import yaml

_REF = re.compile(r"\$\{(\.*[A-Za-z_][\w.]*)\}")  # ${a.b}, ${.sibling}
_KEY = re.compile(r"\.*[A-Za-z_][\w.]*")


def _select_args(text: str) -> tuple[str, str] | None:
    """(key, default text) of a string that is one whole ``${oc.select:key[,default]}``, else None."""
    head = "${oc.select:"
    if not (text.startswith(head) and text.endswith("}")):
        return None
    depth, body = 0, text[len(head):-1]
    comma = -1
    for i, ch in enumerate(body):
        depth += ch == "{"
        depth -= ch == "}"
        if depth < 0:
            return None  # the closing brace belongs to an earlier interpolation
        if ch == "," and depth == 0 and comma < 0:
            comma = i
    key, default = (body[:comma], body[comma + 1:]) if comma >= 0 else (body, "")
    key = key.strip()
    return (key, default.strip()) if depth == 0 and _KEY.fullmatch(key) else None


class Simple:
    """A fast resolver for the two forms verl's defaults use (``${key}`` and ``${oc.select:key,default}``, whole or
    inside a string); ``resolved()`` is None when any other interpolation is present (OmegaConf then resolves)."""

    def __init__(self, tree: dict[str, Any]) -> None:
        self.tree = tree

    def resolved(self) -> dict[str, Any] | None:
        try:
            return self._node(self.tree, [], ())
        except _NotSimple:
            return None

    def _node(self, node: Any, path: list[str], busy: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {k: self._node(v, [*path, str(k)], busy) for k, v in node.items()}
        if isinstance(node, list):
            return [self._node(v, path, busy) for v in node]
        if isinstance(node, str) and "${" in node:
            return self._string(node, path, busy)
        return node

    def _string(self, text: str, path: list[str], busy: tuple[str, ...]) -> Any:
        select = _select_args(text)
        if select is not None:
            key, default = select
            found = self._lookup(key, path, busy)
            if found is not _ABSENT:
                return found
            if "${" in default:
                return self._string(default, path, busy)
            return yaml.safe_load(default or "null")
        ref = _REF.fullmatch(text)
        if ref:
            found = self._lookup(ref.group(1), path, busy)
            if found is _ABSENT:
                raise _NotSimple
            return found
        if "${" in _REF.sub("", text):  # another form beside (${now:...}): OmegaConf resolves it, once the keys it
            for m in _REF.finditer(text):  # refers to are known to hold no cycle (OmegaConf's error names none)
                self._lookup(m.group(1), path, busy)
            raise _NotSimple
        return _REF.sub(lambda m: str(self._get_or_fail(m.group(1), path, busy)), text)

    def _get_or_fail(self, key: str, path: list[str], busy: tuple[str, ...]) -> Any:
        found = self._lookup(key, path, busy)
        if found is _ABSENT:
            raise _NotSimple
        return found

    def _lookup(self, key: str, path: list[str], busy: tuple[str, ...]) -> Any:
        """The resolved value of ``key`` (``busy``: the keys being resolved, outermost first; a key among them again
        is a cycle)."""
        if key.startswith("."):
            dots = len(key) - len(key.lstrip("."))
            parts = path[:len(path) - dots] + key.lstrip(".").split(".")
        else:
            parts = key.split(".")
        full = ".".join(parts)
        if full in busy:
            raise Cycle((*busy[busy.index(full):], full))
        node: Any = self.tree
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        if node == "???":
            return _ABSENT
        return self._node(node, parts, (*busy, full))


class _NotSimple(Exception):
    pass


class Cycle(Exception):
    """Interpolations that refer to each other in a circle: ``keys`` in order, the first one again at the end."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        super().__init__(" -> ".join(keys))
        self.keys = keys


def raw(tree: dict[str, Any], key: str) -> Any:
    """The value at the dotted ``key`` of ``tree`` as written (its interpolation unresolved)."""
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node


_ABSENT = object()
