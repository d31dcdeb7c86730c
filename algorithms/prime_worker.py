"""The ``prm`` role of PRIME (``algorithms/prime.py``): the implicit PRM on the run's strategy with its optimizer.

Its own module so that registering PRIME (``rlforge algos``) does not import the worker machinery and torch: the role
names this module as ``"rlforge.algorithms.prime_worker:PRMRank"`` and the controllers import it when they place it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlforge import batch as B
from rlforge.algorithms.prime import PRIME
from rlforge.controller.ray_workers import RankWorker
from rlforge.errors import RLForgeError
from rlforge.worker import TrainWorker, remote

if TYPE_CHECKING:
    from rlforge.module import LossContext, RLModule


class PRMWorker(TrainWorker):
    """The PRM on the strategy with its optimizer: the update loop of every trained role, the BCE loss, the scoring
    pass."""

    role = "prm"
    section_key = "algorithm.prm"
    module: PRIME

    def __init__(self, config: Any, module: RLModule, strategy: Any, hook: Any = None) -> None:
        if not isinstance(module, PRIME):
            raise RLForgeError(f"The 'prm' role runs PRIME's implicit PRM; {type(module).__qualname__} is not PRIME.")
        super().__init__(config, module, strategy, hook)
        module.prm = self._prepare(module.prm)
        module.prm.train()
        module.prm_ref = self._setup(module.prm_ref, "ref")
        module.prm = self.optimize(module.prm, module.configure_prm_optimizers(), "configure_prm_optimizers")

    def loss(self, micro: B.Batch, ctx: LossContext) -> tuple[torch.Tensor, dict[str, float]]:
        return self.module.prm_step(micro, ctx)

    @remote("dp_score", "concat")
    def implicit_q(self, batch: B.Batch) -> torch.Tensor:
        """``log pi_psi - log pi_ref`` per response token [B, R], in the scoring pass's micro-batches."""
        return self._per_row(batch, lambda micro: self.module.implicit_q(micro, grad=False), "log_prob")


class PRMRank(RankWorker):
    """A rank of the ``prm`` role: the PRMWorker's methods (``update``, ``implicit_q``) and the checkpoints."""

    trains = PRMWorker
