"""How the forward-only passes cut their micro-batches (``microbatch.scoring_cut``): their own size or token budget
where set, else the update's."""

from __future__ import annotations

from rlforge.config.schema import ScoringConfig
from rlforge.microbatch import Cut, scoring_cut

UPDATE, BUDGETED = Cut(8), Cut(8, 4096)


def test_unset_follows_the_update() -> None:
    assert scoring_cut(UPDATE, ScoringConfig()) == UPDATE and scoring_cut(BUDGETED, ScoringConfig()) == BUDGETED


def test_a_size_or_a_budget_of_its_own() -> None:
    assert scoring_cut(BUDGETED, ScoringConfig(micro_batch_size=32)) == Cut(32)  # by count, not the update's budget
    assert scoring_cut(UPDATE, ScoringConfig(max_tokens_per_micro_batch=16384)) == Cut(8, 16384)
    assert scoring_cut(BUDGETED, ScoringConfig(max_tokens_per_micro_batch=0)) == Cut(8)  # 0: by the update's count
