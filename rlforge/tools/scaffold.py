"""``rlforge new plugin|experiment NAME``: render the file templates shipped in ``rlforge.templates``.

Every template file ends in ``.tmpl``; ``{{ variable }}`` placeholders in its contents and in its path are
replaced by the values computed from NAME. A placeholder without a value is a bug in the template and
fails loudly rather than leaving ``{{ ... }}`` in the output.
"""

from __future__ import annotations

import re
from importlib import metadata
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from rlforge.errors import RLForgeError
from rlforge.hookspecs import HOOK_SPEC_VERSION

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SUFFIX = ".tmpl"
KINDS = ("plugin", "experiment")
_NAME = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")  # a letter first, a letter or digit last (PEP 508)
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# what each template names after NAME, for the note that says NAME was changed (naming_note)
DERIVED = {
    "plugin": "its entry point, algorithm and reward function are '{name}', its package {package}, its distribution "
              "{dist}",
    "experiment": "its folder is {name}/ and its trainer.experiment {name}",
}


def template_variables(kind: str, name: str) -> dict[str, str]:
    """The values that fill the placeholders, derived from NAME (``my-algo`` -> ``my_algo``, ``MyAlgo``, ...)."""
    if not _NAME.match(name):
        raise RLForgeError(
            f"Invalid {kind} name '{name}': use letters, digits, '_' or '-', starting with a letter and ending with a "
            f"letter or digit (e.g. my_algo)."
        )
    ident = name.lower().replace("-", "_")
    try:
        version = metadata.version("rlforge")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        version = "0.1.0"
    return {
        "name": ident,
        "package": f"rlforge_{ident}",
        "dist": f"rlforge-{ident.replace('_', '-')}",
        "class_name": "".join(part.capitalize() for part in ident.split("_") if part),
        "rlforge_version": version,
        "hook_spec_version": str(HOOK_SPEC_VERSION),
    }


def naming_note(kind: str, name: str) -> str:
    """What ``rlforge new`` says when it used NAME changed (lower case, ``_`` for ``-``) because the names a template
    derives from it must be valid Python identifiers; ``""`` when NAME is used as given."""
    variables = template_variables(kind, name)
    if variables["name"] == name:
        return ""
    return (f"note: the {kind} '{name}' is named '{variables['name']}' (lower case, '_' for '-'), because the names "
            f"rlforge new derives from it must be valid Python identifiers: {DERIVED[kind].format(**variables)}.")


def check_free(name: str) -> None:
    """The template registers an algorithm and a reward function named ``name``: neither may be taken already (by
    rlforge or an installed plugin), or the generated plugin would fail to load."""
    from rlforge.plugin_manager import PluginManager

    registry = PluginManager().registry
    taken = [kind for kind in ("algorithm", "reward_fn") if name in getattr(registry, kind)]
    if taken:
        raise RLForgeError(f"Plugin name '{name}' is taken: the template registers an algorithm and a reward function "
                           f"of that name, and {' and '.join(f'{kind} {name!r}' for kind in taken)} exists already "
                           f"(`rlforge algos`, `rlforge plugins list`): choose another name.")


def render_text(text: str, variables: dict[str, str], where: str) -> str:
    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in variables:
            raise RLForgeError(f"Template {where} uses an unknown placeholder '{{{{{key}}}}}'.")
        return variables[key]

    return _PLACEHOLDER.sub(fill, text)


def _walk(folder: Traversable, rel: str = "") -> list[tuple[str, Traversable]]:
    out: list[tuple[str, Traversable]] = []
    for item in sorted(folder.iterdir(), key=lambda t: t.name):
        path = f"{rel}{item.name}"
        if item.is_dir():
            out += _walk(item, path + "/")
        elif item.name.endswith(SUFFIX):
            out.append((path[: -len(SUFFIX)], item))
    return out


def render(kind: str, name: str, parent: str | Path = ".") -> Path:
    """Render ``templates/<kind>/`` for NAME into a new folder under ``parent``; return that folder."""
    if kind not in KINDS:
        raise RLForgeError(f"Unknown template '{kind}'. Available: {', '.join(KINDS)}.")
    variables = template_variables(kind, name)
    if kind == "plugin":
        check_free(variables["name"])
    target = Path(parent) / (variables["dist"] if kind == "plugin" else variables["name"])
    if target.exists():
        made = f" (the folder of {kind} '{name}')" if target.name != name else ""
        raise RLForgeError(f"{target} already exists{made}: choose another name or another folder (--dir).")
    for rel, source in _walk(files("rlforge.templates") / kind):
        dest = target / render_text(rel, variables, f"path {kind}/{rel}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(render_text(source.read_text(encoding="utf-8"), variables, f"{kind}/{rel}"), encoding="utf-8")
    return target
