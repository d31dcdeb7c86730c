"""The checkpoint hooks, called one implementation at a time: ``rlforge_save_checkpoint`` gives each a dict of its own
(an entry two of them write is an error naming both), ``rlforge_load_checkpoint`` gives each a copy of every entry
(one that pops or changes entries leaves the next its own)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from rlforge.errors import RLForgeError
from rlforge.plugin_manager import PluginManager, implementer_name


def _one_by_one(plugins: PluginManager, hook: str) -> Iterator[tuple[Any, Any]]:
    """Each implementation of ``hook`` in the order pluggy calls them, with a caller of that implementation alone."""
    impls = list(reversed(getattr(plugins.hook, hook).get_hookimpls()))
    for impl in impls:
        yield impl, plugins.pm.subset_hook_caller(hook, [i.plugin for i in impls if i is not impl])


def checkpoint_entries(plugins: PluginManager, trainer: Any) -> dict[str, Any]:
    """The entries ``rlforge_save_checkpoint`` adds (the later of two writers' values would be the only one saved,
    and the other would find it on resume: an error)."""
    entries: dict[str, Any] = {}
    writer: dict[str, str] = {}
    for impl, call in _one_by_one(plugins, "rlforge_save_checkpoint"):
        own: dict[str, Any] = {}
        call(trainer=trainer, checkpoint=own)
        for key in own:
            if key in writer:
                raise RLForgeError(
                    f"rlforge_save_checkpoint: {writer[key]} and {implementer_name(impl)} both save the checkpoint "
                    f"entry {key!r}; one's state would be lost on resume. Give each its own key (a callback of several "
                    f"instances: a key per instance).")
            writer[key] = implementer_name(impl)
        entries.update(own)
    return entries


def restore_checkpoint_entries(plugins: PluginManager, trainer: Any, entries: dict[str, Any]) -> None:
    """``rlforge_load_checkpoint`` with ``entries``, a copy for each implementation."""
    for _, call in _one_by_one(plugins, "rlforge_load_checkpoint"):
        call(trainer=trainer, checkpoint=copy.deepcopy(entries))
