"""A plugin file for tests/controller/test_step_boundary.py: GRPO whose policy loss reads the step and logs it."""

from __future__ import annotations

from rlforge import hookimpl
from rlforge.algorithms.grpo import GRPO


class StepProbe(GRPO):
    """GRPO that logs, from its policy loss (run where the actor trains), the step it sees two ways."""

    def policy_loss(self, batch, log_probs, entropy, ctx):
        self.log("probe/ctx_step", ctx.step)
        self.log("probe/module_step", self.step)
        return super().policy_loss(batch, log_probs, entropy, ctx)


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("step_probe", StepProbe)
