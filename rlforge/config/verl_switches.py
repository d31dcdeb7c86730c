"""verl's true/false switches given a word or a quoted value (``use_kl_loss=no``, ``'False'``): an error at
composition, naming every such key. Hydra reads only true and false (in any case) as booleans, so such a value stays a
string; verl's code takes any non-empty string as true where it tests the switch, where rlforge's schema would read
'no' as false, so the two would train differently."""

from __future__ import annotations

import fnmatch
from typing import Any

from rlforge.config.verl_fates import flatten
from rlforge.errors import ConfigError

# switches whose default is null (verl tests them as given), and the ones verl converts with OmegaConf's bool rules
# first ('no' is false there; their rules read them so: verl_rules.converts)
NULL_SWITCHES = ("critic.enable", "reward_model.enable")
CONVERTED_SWITCHES = ("skip.*.enable",)


def switches(defaults: dict[str, Any]) -> frozenset[str]:
    """The switches of a resolved default tree: its keys whose value is a bool."""
    return frozenset(k for k, v in flatten(defaults) if isinstance(v, bool))


def check(tree: dict[str, Any], known: frozenset[str]) -> None:
    """Raise naming every key of the resolved launch ``tree`` that is a switch (``known``, or a null-default one) and
    holds a string (given so, or through an interpolation)."""
    words = [f"{k}={v!r}" for k, v in flatten(tree) if isinstance(v, str) and (k in known or k in NULL_SWITCHES)
             and not any(fnmatch.fnmatchcase(k, p) for p in CONVERTED_SWITCHES)]
    if words:
        raise ConfigError(f"A string for a true/false switch of verl's config: {', '.join(words)}. Hydra reads only "
                          f"true and false (in any case) as booleans, so such a value stays a string, which verl's code "
                          f"takes as true where it tests the switch (any non-empty string): write true or false.")
