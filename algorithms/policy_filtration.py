"""PF-PPO's sample selection (arXiv:2409.06957): pure functions from scores to the rows a PPO update trains on.

Import them from :mod:`rlforge.algorithms.functional`; the algorithm is :mod:`rlforge.algorithms.pf_ppo`. Two
modes: verl's reweighting (``compute_pf_ppo_reweight_data`` in ``verl/trainer/ppo/core_algos.py``, 0.9.1), which
resamples the whole batch with replacement, and the paper's per-prompt filtering, which keeps chosen responses of
each prompt. Formulas and the differences: docs/algorithms/pf_ppo.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch
from rlforge.algorithms import names
from rlforge.algorithms.estimators import group_index

PF_WEIGHT_FLOOR = 1e-8  # added to every weight (and the floor of all of them), as verl
_WEIGHTS = {
    "pow": lambda s, p: s.abs().pow(p),
    "max_min": lambda s, p: ((s == s.max()) | (s == s.min())).to(s.dtype),
    "max_random": lambda s, p: torch.where(s == s.max(), 0.4, 0.1).to(s.dtype),
}
REWEIGHT_METHODS = tuple(_WEIGHTS)
assert REWEIGHT_METHODS == names.PF_REWEIGHT_METHODS, "algorithms/names.py lists them for config validation"
# the second row a filter keeps from the group's other rows (their scores s), or None
_SECOND: dict[str, Callable[[torch.Tensor, torch.Generator | None], int | None]] = {
    "best_of_n": lambda s, g: None,
    "best_random": lambda s, g: int(torch.randint(len(s), (), generator=g)),
    "best_worst": lambda s, g: int(torch.argmin(s)),
}
FILTER_METHODS = tuple(_SECOND)
assert FILTER_METHODS == names.PF_FILTER_METHODS, "algorithms/names.py lists them for config validation"


def pf_ppo_weights(scores: torch.Tensor, method: str = "pow", weight_pow: float = 2.0) -> torch.Tensor:
    """verl's PF-PPO sampling weights ``[B]`` from the sequence scores ``[B]``, over the **whole batch**.

    ``pow``: ``|s|^weight_pow`` (``weight_pow=0``: uniform); ``max_min``: 1 for the rows scoring the batch's max or
    min, 0 for the others; ``max_random``: 0.4 for the max rows, 0.1 for the others. Then ``max(w + 1e-8, 1e-8)``,
    so every row keeps a tiny chance.
    """
    weights = _WEIGHTS.get(method)
    if weights is None:
        raise ValueError(f"Unknown PF-PPO reweight method '{method}'. Allowed: {', '.join(REWEIGHT_METHODS)}.")
    return (weights(scores.detach(), weight_pow) + PF_WEIGHT_FLOOR).clamp(min=PF_WEIGHT_FLOOR)


def pf_ppo_resample_indices(
    scores: torch.Tensor, method: str = "pow", weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``B`` row indices drawn with replacement in proportion to :func:`pf_ppo_weights` (``torch.multinomial`` with
    ``generator``): the rows of the resampled batch, duplicates included."""
    weights = pf_ppo_weights(scores, method, weight_pow)
    return torch.multinomial(weights, len(weights), replacement=True, generator=generator)


def pf_ppo_filter_indices(
    scores: torch.Tensor,
    group_ids: Sequence[Hashable],
    method: str = "best_random",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The paper's per-prompt filtering: the rows kept of each group, in batch order (a 1-d long tensor).

    ``best`` is the group's first row with the highest score. ``best_of_n`` keeps it alone; ``best_worst`` keeps it
    and the first row with the lowest score among the others; ``best_random`` keeps it and one other row drawn
    uniformly (``generator``). A group of one keeps its row.
    """
    second = _SECOND.get(method)
    if second is None:
        raise ValueError(f"Unknown PF-PPO filter method '{method}'. Allowed: {', '.join(FILTER_METHODS)}.")
    s = scores.detach().to("cpu", torch.float64)
    index, n = group_index(group_ids, len(s))
    keep = torch.zeros(len(s), dtype=torch.bool)
    for group in range(n):
        rows = (index == group).nonzero().squeeze(-1)
        best = rows[int(torch.argmax(s[rows]))]  # argmax/argmin return the first extreme
        keep[best] = True
        others = rows[rows != best]
        pick = second(s[others], generator) if len(others) else None
        if pick is not None:
            keep[others[pick]] = True
    return keep.nonzero().squeeze(-1)


__all__ = ["REWEIGHT_METHODS", "FILTER_METHODS", "pf_ppo_weights", "pf_ppo_resample_indices", "pf_ppo_filter_indices"]
