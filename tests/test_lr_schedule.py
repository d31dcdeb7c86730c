"""Learning-rate schedules (rlforge.lr_schedule): transformers' schedules under rlforge's names, checked against
hand-computed factors and against verl 0.9.1's own formulas (verl/utils/torch_functional.py, transcribed here); and the
actor's and critic's AdamW betas."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.config.schema import ActorConfig, SFTConfig
from rlforge.lr_schedule import build, warmup_steps


def factors(section, total: int, steps: int | None = None) -> list[float]:
    """The rate of each scheduler step (lr = 1, so the rate is the factor)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build(opt, section, total)
    out = []
    for _ in range(steps or total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def verl_cosine(step: int, warmup: int, total: int, min_lr_ratio: float, num_cycles: float) -> float:
    """verl 0.9.1's get_cosine_schedule_with_warmup (zero_indexed_step=True, init_lr_ratio=0), by hand."""
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    x = math.cos(math.pi * num_cycles * 2.0 * progress)
    return max(min_lr_ratio, x * (1 - min_lr_ratio) * 0.5 + (1 + min_lr_ratio) * 0.5)


def test_constant_warms_up_from_zero() -> None:
    assert factors(ActorConfig(warmup_steps=2), 5) == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0])
    assert factors(ActorConfig(), 3) == pytest.approx([1.0, 1.0, 1.0])  # no warm-up: the peak from the first step


def test_warmup_ratio_counts_on_the_run_where_warmup_steps_is_zero() -> None:
    assert warmup_steps(0, 0.4, 5) == 2 and warmup_steps(3, 0.4, 5) == 3 and warmup_steps(0, 0.25, 10) == 2
    assert factors(ActorConfig(warmup_ratio=0.4), 5) == pytest.approx([0.0, 0.5, 1.0, 1.0, 1.0])


def test_cosine_by_hand_and_as_verl() -> None:
    s = ActorConfig(lr_scheduler="cosine", warmup_steps=2, min_lr_ratio=0.1)
    by_hand = [0.0, 0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55, 0.1 + 0.45 * (1 + math.cos(0.75 * math.pi)),
               0.1]
    assert factors(s, 6, 7) == pytest.approx(by_hand)
    for cycles in (0.5, 1.0):
        s = ActorConfig(lr_scheduler="cosine", warmup_steps=3, min_lr_ratio=0.2, num_cycles=cycles)
        assert factors(s, 20) == pytest.approx([verl_cosine(k, 3, 20, 0.2, cycles) for k in range(20)])


def test_linear_decays_to_zero() -> None:
    assert factors(ActorConfig(lr_scheduler="linear", warmup_steps=1), 5) == pytest.approx([0.0, 1.0, 0.75, 0.5, 0.25])


def test_sft_defaults_decay_to_a_tenth() -> None:
    s = SFTConfig(warmup_steps=0)
    assert s.lr_scheduler == "cosine" and factors(s, 4, 5)[-1] == pytest.approx(0.1)


def test_the_actor_and_critic_adamw_take_their_betas_and_bad_betas_are_refused() -> None:
    from rlforge import load_config
    from rlforge.errors import ConfigError
    from rlforge.module import _adamw

    cfg = load_config("ppo", ["actor.betas=[0.9,0.95]", "critic.betas=[0.8,0.99]"])
    for section, betas in ((cfg.actor, (0.9, 0.95)), (cfg.critic, (0.8, 0.99))):
        opt, _ = _adamw(torch.nn.Linear(2, 2), section, 4)
        assert opt.param_groups[0]["betas"] == betas  # verl's FSDP engine: optim.betas
    assert _adamw(torch.nn.Linear(2, 2), ActorConfig(), 4)[0].param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(ConfigError, match=r"'actor.betas' must be 2 numbers, each in \[0, 1\), got \[0.9, 1.5\]"):
        load_config("grpo", ["actor.betas=[0.9,1.5]"])
    with pytest.raises(ConfigError, match=r"'critic.betas' must be 2 numbers, each in \[0, 1\), got \[0.9\]"):
        load_config("ppo", ["critic.betas=[0.9]"])
