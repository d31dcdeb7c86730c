"""verl's veomni training engine (``model_engine=veomni``) as rlforge's fsdp strategy, checked against verl 0.9.1's
``VeOmniEngine`` and VeOmni's own optimizer and schedule (``veomni.optim``): precision, layout, offload, and the
learning-rate schedule, whose values are compared step by step with VeOmni's published formula. Pure config work."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge.config import verl
from rlforge.config.verl_launch import prepare

A, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
O = f"{A}.optim"
BASE = ["model_engine=veomni", "trainer.n_gpus_per_node=4", "trainer.total_training_steps=20",
        "actor_rollout_ref.rollout.name=vllm"]


def _t(*args: str) -> verl.Translation:
    return prepare([*BASE, *args], refuse=False).translation


def _fate(t: verl.Translation, key: str) -> verl.Fate:
    (fate,) = [f for f in t.fates if f.key == key]
    return fate


def test_veomni_runs_as_the_fsdp_strategy_with_its_mixed_precision() -> None:
    t = _t()
    assert not t.refused
    assert t.overrides["strategy.name"] == "fsdp" and t.overrides["strategy.num_processes"] == 4
    assert t.overrides["model.precision"] == "bf16-mixed"  # VeOmni's default: fp32 weights, bf16 compute
    assert _t(f"{A}.veomni.mixed_precision=False").overrides["model.precision"] == "bf16-true"  # loaded in bf16


def test_veomni_layout_keys() -> None:
    t = _t(f"{A}.veomni.ulysses_parallel_size=2", f"{A}.veomni.param_offload=True", f"{A}.veomni.optimizer_offload=True",
           f"{A}.veomni.enable_full_shard=True", f"{A}.veomni.attn_implementation=sdpa",
           f"{A}.use_kl_loss=True", f"{REF}.veomni.param_offload=False")
    assert t.overrides["strategy.fsdp.sequence_parallel_size"] == 2
    assert t.overrides["strategy.offload_optimizer"] is True
    # VeOmni's reference reads its own param_offload (verl's FSDP engine would offload it whatever it says)
    assert t.overrides["strategy.fsdp.offload_params"] == ["actor"]
    assert _fate(t, f"{A}.veomni.enable_full_shard").kind == verl.IGNORED
    assert _fate(t, f"{A}.veomni.attn_implementation").kind == verl.MAPPED
    assert _t(f"{A}.use_kl_loss=True", f"{REF}.veomni.param_offload=True").overrides[
        "strategy.fsdp.offload_params"] == ["ref"]


@pytest.mark.parametrize(("key", "value", "missing"), [
    (f"{A}.veomni.expert_parallel_size", "2", "expert parallelism"),
    (f"{A}.veomni.router_replay.mode", "R2", "router replay"),
    (f"{A}.veomni.load_checkpoint_path", "/ckpt", "VeOmni checkpoint"),
    (f"{A}.veomni.attn_implementation", "native-sparse", "native sparse attention"),
    (f"{A}.veomni.qat_implementation", "int4", "quantization-aware"),
    (f"{O}.lr_scheduler_type", "linear", "'linear' schedule"),
    (f"{O}.lr_decay_ratio", "0.5", "ends at 0.5 of the run"),
])
def test_what_rlforge_lacks_is_refused_by_name(key, value, missing) -> None:
    fate = _fate(_t(f"{key}={value}"), key)
    assert fate.kind == verl.REFUSED and missing in fate.text


def test_the_critic_s_precision_and_fsdp2_offload() -> None:
    gae = ["algorithm.adv_estimator=gae"]
    assert _fate(_t(*gae, "critic.veomni.mixed_precision=False"), "critic.veomni.mixed_precision").kind == verl.REFUSED
    assert not _t(*gae, "critic.veomni.mixed_precision=False", f"{A}.veomni.mixed_precision=False").refused
    t = _t(f"{A}.veomni.enable_fsdp_offload=True")  # VeOmni's FSDP2 CPUOffloadPolicy
    assert t.overrides["strategy.fsdp.offload_params"] == ["actor"]
    fate = _fate(_t(f"+{O}.num_cycles=1.0"), f"{O}.num_cycles")  # no such field in VeOmniOptimizerConfig
    assert fate.kind == verl.REFUSED and "VeOmniOptimizerConfig" in fate.text


def test_a_warm_up_from_lr_start_is_refused_only_with_a_warm_up() -> None:
    assert _fate(_t(f"{O}.lr_start=1e-7"), f"{O}.lr_start").kind == verl.MAPPED  # no warm-up: never read
    fate = _fate(_t(f"{O}.lr_start=1e-7", f"{O}.lr_warmup_steps_ratio=0.1"), f"{O}.lr_start")
    assert fate.kind == verl.REFUSED and "lr_start" in fate.text


def _veomni_cosine(step: int, total: int, warmup: int, lr: float, lr_min: float) -> float:
    """VeOmni's get_cosine_schedule_with_warmup (lr_start 0, lr_decay_ratio 1), written from its definition."""
    if step < warmup:
        return lr * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    floor = lr_min / lr
    return lr * max(0.0, 0.5 * (1 + math.cos(math.pi * progress)) * (1 - floor) + floor)


def test_veomni_schedule_gives_veomni_s_rates() -> None:
    """verl's veomni config sets a cosine (its dataclass default is constant); the warm-up is the ratio's, never
    lr_warmup_steps."""
    from omegaconf import OmegaConf

    from rlforge import lr_schedule

    t = _t(f"{O}.lr=1e-3", f"{O}.lr_min=1e-4", f"{O}.lr_warmup_steps_ratio=0.2", f"{O}.lr_warmup_steps=7")
    o = t.overrides
    assert (o["actor.lr_scheduler"], o["actor.warmup_steps"], o["actor.warmup_ratio"]) == ("cosine", 0, 0.2)
    assert o["actor.min_lr_ratio"] == pytest.approx(0.1)
    assert _fate(t, f"{O}.lr_warmup_steps").kind == verl.IGNORED
    section = OmegaConf.create({k.split(".", 1)[1]: o[k] for k in ("actor.lr_scheduler", "actor.warmup_steps",
                                                                  "actor.warmup_ratio", "actor.min_lr_ratio")}
                               | {"num_cycles": 0.5})
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = lr_schedule.build(opt, section, 20)
    rates = []
    for _ in range(20):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([_veomni_cosine(s, 20, int(20 * 0.2), 1e-3, 1e-4) for s in range(20)], rel=1e-9)
    assert _t(f"{O}.lr_scheduler_type=constant").overrides["actor.lr_scheduler"] == "constant"
