"""The corpus of verl launches (tests/tools/data/verl_launches.jsonl) through the translation: the fate of every
override, the figures docs/migration-from-verl.md reports, and the audit table the fates are checked against.

    python -m tests.tools.verl_corpus --audit   # rewrite tests/tools/data/verl_audit.tsv from today's tables
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rlforge.config import verl, verl_hydra
from rlforge.config.verl_launch import given_keys
from rlforge.errors import ConfigError

DATA = Path(__file__).parent / "data"
CORPUS, AUDIT = DATA / "verl_launches.jsonl", DATA / "verl_audit.tsv"
DELETED = "deleted"
UNREAD = "unread"  # ignored because verl 0.9.1 does not read the key in that launch either (Fate.unread)
# composition errors that are rlforge's, not verl's: a config file rlforge does not ship (a recipe's own), or a config
# group verl 0.9.1 has and rlforge's SFT does not (engine=automodel, engine=megatron, optim=megatron)
RLFORGE_LACKS = re.compile(r"rlforge does not know verl's config|chooses verl's '\w+' \w+ for SFT")


@dataclass
class Outcome:
    source: str
    entry: str
    overrides: list[str]
    error: str = ""  # the launch did not compose: verl 0.9.1 refuses it (Hydra's rules, unknown keys), or RLFORGE_LACKS
    translation: verl.Translation | None = None
    fates: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # override key -> {(kind, target)}


def launches() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def run(launch: dict) -> Outcome:
    try:
        parsed = verl_hydra.parse_args(launch["args"], verl_hydra.ENTRY_CONFIGS[launch["entry"]])
        tree = verl_hydra.compose_tree(parsed)
    except ConfigError as exc:
        return Outcome(launch["source"], launch["entry"], [], error=str(exc))
    t = verl.translate(tree, given_keys(parsed.overrides), sft=parsed.config_name.startswith("sft_"),
                       config_name=verl_hydra.base_config(parsed))
    out = Outcome(launch["source"], launch["entry"], parsed.overrides, translation=t)
    for o in parsed.overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        # a deleted key (~key) is gone from the tree: verl's code then sees no value, and neither does the translation
        out.fates[key] = {(UNREAD if f.unread else f.kind, f.target) for f in t.fates_for(key)} or {(DELETED, "")}
    return out


def figures(outcomes: list[Outcome]) -> dict[str, float]:
    kinds: Counter[str] = Counter()
    stated = unread = 0
    for o in outcomes:
        for key in o.fates:
            fs = o.translation.fates_for(key) if o.translation else []
            worst = (verl.REFUSED if any(f.kind == verl.REFUSED for f in fs) else
                     verl.MAPPED if any(f.kind == verl.MAPPED for f in fs) else verl.IGNORED) if fs else DELETED
            kinds[worst] += 1
            unread += worst == verl.IGNORED and all(f.unread for f in fs)
            stated += worst == verl.MAPPED and any(f.kind == verl.MAPPED and f.target and f.text for f in fs)
    total = sum(kinds.values())
    composed = [o for o in outcomes if o.translation is not None]
    lacking = sum(bool(RLFORGE_LACKS.search(o.error)) for o in outcomes if o.translation is None)
    return {
        "launches": len(outcomes), "verl_refuses": len(outcomes) - len(composed) - lacking,
        "config_not_in_rlforge": lacking,
        "compose": sum(not o.translation.refused for o in composed),
        "refused_named": sum(bool(o.translation.refused) for o in composed),
        "overrides": total, "mapped": kinds[verl.MAPPED], "refused": kinds[verl.REFUSED],
        "ignored": kinds[verl.IGNORED], "deleted": kinds[DELETED], "mapped_with_a_stated_difference": stated,
        "mapped_pct": 100 * kinds[verl.MAPPED] / total, "refused_pct": 100 * kinds[verl.REFUSED] / total,
        "ignored_pct": 100 * kinds[verl.IGNORED] / total,
        # of the ignored: keys verl 0.9.1 does not read in that launch either, which mean there what they mean here
        "unread": unread, "unread_pct": 100 * unread / total,
        "same_meaning_pct": 100 * (kinds[verl.MAPPED] + unread) / total,
    }


def audit_lines(outcomes: list[Outcome]) -> list[str]:
    rows = {(key, kind, target or "-") for o in outcomes for key, fs in o.fates.items() for kind, target in fs}
    return [f"{k}\t{kind}\t{target}" for k, kind, target in sorted(rows)]


def read_audit() -> set[tuple[str, str, str]]:
    rows = [line.split("\t") for line in AUDIT.read_text().splitlines() if line and not line.startswith("#")]
    return {(r[0], r[1], r[2]) for r in rows}


if __name__ == "__main__":
    results = [run(x) for x in launches()]
    if "--audit" in sys.argv:
        AUDIT.write_text("# verl key\tfate\trlforge key (hand-audited: tests/tools/test_verl_corpus.py checks every "
                         "override of the corpus against these lines)\n" + "\n".join(audit_lines(results)) + "\n")
    print(json.dumps(figures(results), indent=1))
