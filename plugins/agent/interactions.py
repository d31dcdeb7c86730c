"""Built-in interaction: ``arith_tutor``, a tutor that checks the model's answer against the row's ground truth and
says "wrong, try again" until it is right (use with ``rollout.agent.loop=interaction``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rlforge.agent import Interaction, Sample
from rlforge.hookspecs import hookimpl

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class ArithTutorConfig:
    """The ``arith_tutor`` interaction (``rollout.agent.arith_tutor``)."""

    correct_reward: float = 1.0  # turn reward when the answer is right (added to the reward function's score)
    wrong_reward: float = 0.0  # turn reward of each wrong answer (e.g. -0.1 to prefer fewer attempts)
    retry_message: str = "Wrong, try again."  # the tutor's reply to a wrong answer


class ArithTutor(Interaction):
    """Compares the last number of each model message with the ground truth: right ends the conversation with
    ``correct_reward``; wrong gets ``retry_message`` and ``wrong_reward``."""

    name = "arith_tutor"

    def reset(self, sample: Sample) -> None:
        self.truth = str(sample.ground_truth).strip()

    def step(self, message: str) -> tuple[str, float, bool]:
        o = self.options or ArithTutorConfig()
        numbers = _NUMBER.findall(message)
        if numbers and _same(numbers[-1], self.truth):
            return "Correct.", float(o.correct_reward), True
        return str(o.retry_message), float(o.wrong_reward), False


def _same(answer: str, truth: str) -> bool:
    try:
        return float(answer) == float(truth)
    except ValueError:
        return answer == truth


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.interaction.register("arith_tutor", ArithTutor, config=ArithTutorConfig)
