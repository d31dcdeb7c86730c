"""Reading YAML as the user wrote it: config files and ``key=value`` overrides.

YAML 1.1 (PyYAML, OmegaConf) reads some plain scalars other than they look: ``1:30`` is 90 (base 60), ``010`` is 8
(octal), ``5_0.5`` is 50.5 (underscores dropped); a key given twice in a mapping keeps the last value silently. Both
are errors here, naming the file and line or the override (:func:`load_yaml`, :func:`parse_overrides`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlforge.errors import ConfigError

log = logging.getLogger("rlforge")
OVERRIDES = "command-line overrides"  # where an override's errors say it comes from


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    source = ""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(f"Config file {self.source} gives '{key}' twice in one section (line {seen[key]} and "
                                  f"line {line}): the second would silently replace the first. Merge them into one.")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_checked_number(self, node: yaml.ScalarNode) -> Any:
        """An int or float scalar, refused where YAML 1.1 reads it as another number than it looks
        (:func:`_yaml_number_surprise`: ``1:30`` is 90, ``010`` is 8, ``5_0.5`` is 50.5)."""
        value = (self.construct_yaml_int if node.tag.endswith(":int") else self.construct_yaml_float)(node)
        surprise = _yaml_number_surprise(str(node.value).strip(), value)
        if surprise is not None:
            raise NumberMisread(f"YAML reads {str(node.value).strip()!r} as the number {value!r} ({surprise}); write "
                                f"the number you mean, or quote the value as a string", node.start_mark.line + 1)
        return value


class NumberMisread(ConfigError):
    """A number YAML 1.1 reads other than it looks (:meth:`_UniqueKeyLoader.construct_checked_number`), at ``line``."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def _safe_load(text: str, source: str = "") -> Any:
    """``text`` read as YAML by :class:`_UniqueKeyLoader` (no key twice in a mapping, no misread number)."""
    loader = _UniqueKeyLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


for _tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
    _UniqueKeyLoader.add_constructor(_tag, _UniqueKeyLoader.construct_checked_number)


def load_yaml(path: Path, source: str) -> Any:
    """The YAML document in ``path``; a key repeated in a mapping is an error naming the key and both lines."""
    try:
        return _safe_load(path.read_text(encoding="utf-8"), source)
    except NumberMisread as exc:
        raise ConfigError(f"Config file {source}, line {exc.line}: {exc}.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {source} is not valid YAML: {exc}") from None


def parse_overrides(overrides: list[str]) -> DictConfig:
    """Turn ``["actor.lr=1e-5", "logger.backends=[console]"]`` into a config (values parsed as YAML)."""
    hydra = [o for o in overrides if o.startswith(("+", "~"))]
    if hydra:
        raise ConfigError(f"Override '{hydra[0]}': '+key', '++key' and '~key' are Hydra's (verl's) syntax. rlforge's "
                          f"overrides are key=value on keys that exist (rlforge config show lists them); a whole verl "
                          f"launch runs as it is with 'rlforge verl ARGS' (see docs/migration-from-verl.md).")
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"Override '{bad[0]}' is not of the form key=value (e.g. actor.lr=1e-5).")
    for o in overrides:  # a value is YAML: 'Q: {prompt}' is a mapping, or not YAML at all, unless it is quoted
        key, value = o.split("=", 1)
        try:
            parsed = _safe_load(value, OVERRIDES)
        except NumberMisread as exc:
            quoted = ("quote that item inside it" if value.lstrip().startswith(("[", "{"))
                      else f"{key}='\"{value}\"'")
            raise ConfigError(f"Override '{o}': {exc}: {quoted}.") from None
        except yaml.YAMLError as exc:
            hint = (f"quote each interpolation inside it as a YAML string, e.g. '{key}={{x: \"${{a.b}}\"}}'."
                    if value.lstrip().startswith(("{", "[")) and "${" in value  # inside a mapping or list
                    else f"quote it as a YAML string: {key}='\"...\"' (in a shell: '{key}=\"...\"').")
            raise ConfigError(f"Override '{o}': the value is not valid YAML ({str(exc).splitlines()[0]}); {hint}"
                              ) from None
        if isinstance(parsed, dict) and not value.lstrip().startswith("{"):
            colon = "it ends in ':'" if value.rstrip().endswith(":") else "it has ': '"
            raise ConfigError(f"Override '{o}': YAML reads the value as a mapping ({colon}); quote it as a YAML "
                              f"string: '{key}=\"{value}\"'.")
        glued = _glued_key(parsed)
        if glued is not None:
            name, rest = glued.split(":", 1)
            raise ConfigError(f"Override '{o}': YAML reads '{{{glued}}}' as the key '{glued}' without a value (Hydra "
                              f"reads it as {name}: {rest}); write '{{{name}: {rest}}}', with a space after the colon.")
    given: dict[str, str] = {}
    for o in overrides:
        key, value = o.split("=", 1)
        if key in given and given[key] != value:
            log.warning("Override '%s' is given twice (%s, then %s): the last, %s, is used.", key, given[key], value,
                        value)
        given[key] = value
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"Cannot parse overrides {overrides}: {exc}") from None


def _yaml_number_surprise(text: str, parsed: Any) -> str | None:
    """Why YAML 1.1's reading of the scalar ``text`` as the number ``parsed`` is not what it looks like, else None:
    a float with underscores (``5_0.5`` is 50.5), base 60 (``1:30`` is 90), octal (``010`` is 8). Integers with
    underscores (``1_000``) read as Python reads them."""
    if isinstance(parsed, bool) or not isinstance(parsed, (int, float)):
        return None
    if ":" in text:
        return "YAML 1.1 reads a colon between digits as base 60"
    if "_" in text and isinstance(parsed, float):
        return "it drops the underscores of a number"
    if re.fullmatch(r"[-+]?0[0-9]+", text):
        return "a leading 0 makes it octal"
    return None


def _glued_key(value: Any) -> str | None:
    """A mapping key with a colon and no value anywhere in ``value`` (YAML's reading of ``{a:b}``), else None."""
    if isinstance(value, dict):
        for k, v in value.items():
            found = k if isinstance(k, str) and ":" in k and v is None else _glued_key(v)
            if found is not None:
                return found
    if isinstance(value, list):
        return next((g for g in map(_glued_key, value) if g is not None), None)
    return None
