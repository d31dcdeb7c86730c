"""verl's ``veomni`` training engine (``model_engine=veomni``) in rlforge's terms. verl 0.9.1's ``VeOmniEngine`` is its
FSDP engine (a subclass) with VeOmni's model building and parallel plan: FSDP2 over the data-parallel ranks, Ulysses
sequence parallelism, expert parallelism for MoE models, VeOmni's mixed precision, and VeOmni's optimizer and
learning-rate schedule (``veomni.optim``). rlforge runs it as its ``fsdp`` strategy:

- ``veomni.mixed_precision`` (default true): fp32 parameters computing in bf16 (FSDP2's ``MixedPrecisionPolicy``,
  bf16 parameters, fp32 reductions) = ``model.precision=bf16-mixed``; false: the model loaded in bf16 = ``bf16-true``.
- ``veomni.ulysses_parallel_size``, ``param_offload``, ``fsdp_size``: as the FSDP engine's keys (``verl_layout``).
- The optimizer is VeOmni's ``build_optimizer``: AdamW with ``lr``, ``betas``, eps 1e-8 and ``weight_decay`` on every
  parameter (verl passes no no-decay groups), as the FSDP engine's. Its schedule (``build_lr_scheduler``) reads
  ``lr_scheduler_type`` (constant | cosine | linear; verl's veomni config sets cosine), ``lr_warmup_steps_ratio``
  (never ``lr_warmup_steps``), ``lr_start``, ``lr_min`` and ``lr_decay_ratio``: its cosine with ``lr_start=0`` and
  ``lr_decay_ratio=1`` is transformers' ``cosine_with_min_lr`` with ``min_lr_rate = lr_min / lr`` (rlforge's cosine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.config.verl_rules import Derived, Ignore, Keep, Rule, Unread, at_most_one, gate, is_

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

ENGINE = "veomni"
SPEED = "speed or memory only: what is computed does not change"
OPTIONS = (f"VeOmni engine options ({SPEED}): sharding (full shard, FSDP1 offload, basic modules), initialisation "
           "device, prefetch, activation offload, kernels (attention, MoE, cross-entropy, norms, RoPE, SwiGLU), padding "
           "to length buckets, checkpoint manager")


def engine_rules(section: str, role: str, sp: Rule, entropy: Rule, optimizer_offload: Rule) -> dict[str, Rule]:
    """``<section>.veomni.*`` of the actor, the reference or the critic."""
    v = f"{section}.{ENGINE}"
    follows = Ignore("follows the actor's precision")
    return {
        f"{v}.param_offload": Derived("offload"),
        f"{v}.fsdp_size": Derived("offload"),
        f"{v}.optimizer_offload": optimizer_offload,
        f"{v}.mixed_precision": follows if role == "ref" else Derived("precision"),
        f"{v}.enable_fsdp_offload": Derived("offload"),
        f"{v}.ulysses_parallel_size": sp,
        f"{v}.expert_parallel_size": Keep(at_most_one, "no expert parallelism", "expert parallelism (MoE)"),
        f"{v}.strategy": Derived("parallel") if role == "actor" else Ignore("the strategy is one for all roles"),
        f"{v}.seed": Ignore("seeds do not carry over between frameworks; rlforge seeds everything with trainer.seed"),
        f"{v}.forward_only": Ignore("internal: set for forward-only roles"),
        f"{v}.entropy_*": entropy,
        f"{v}.router_replay.mode": Keep(is_("disabled"), "no router replay", "MoE router replay"),
        f"{v}.router_replay.*": Unread("read only with router_replay.mode (refused where set)",
                                       gate(f"{v}.router_replay.mode", lambda m: m not in (None, "disabled"))),
        f"{v}.qat_implementation": Keep(is_("none", None), "no quantization-aware training",
                                        "quantization-aware training (QAT)"),
        f"{v}.load_checkpoint_path": Keep(is_(None), "weights from model.path (Hugging Face)",
                                          "initial weights from a VeOmni checkpoint (veomni.load_checkpoint_path)"),
        f"{v}.attn_implementation": Keep(lambda x: x != "native-sparse", "dense attention (the kernel is speed only)",
                                         "native sparse attention (attn_implementation=native-sparse)"),
        f"{v}.*": Ignore(OPTIONS),
    }


def precision(c: Context) -> None:
    """rlforge's model.precision of a veomni launch, from the actor's ``mixed_precision``; a critic in another one is
    refused (rlforge's precision is one for every model; the frozen reference computes the same either way)."""
    key, critic = f"actor_rollout_ref.actor.{ENGINE}.mixed_precision", f"critic.{ENGINE}.mixed_precision"
    mixed = c.get(key, True) is not False
    for owned in c.owned:
        if owned == key:
            c.map(key, "model.precision", "bf16-mixed" if mixed else "bf16-true")
        elif owned == critic and (c.get(critic, True) is not False) != mixed:
            c.refuse(critic, f"a critic in another precision than the actor's (veomni.mixed_precision={c.get(critic)} "
                     f"for the critic, {c.get(key)} for the actor)")
        elif owned == critic:
            c.same(critic, "the actor's precision: one for every model")
        else:
            c.unread(owned, "read only by verl's FSDP engine (model_engine=veomni here)")


def schedule(c: Context, o: str, target: str) -> None:
    """The learning-rate schedule of the veomni ``optim`` section ``o`` as rlforge's ``target`` section's."""
    kind, key = c.get(f"{o}.lr_scheduler_type", "constant"), f"{o}.lr_scheduler_type"
    lr, lr_min, start = float(c.get(f"{o}.lr")), float(c.get(f"{o}.lr_min", 0.0)), float(c.get(f"{o}.lr_start", 0.0))
    warm = float(c.get(f"{o}.lr_warmup_steps_ratio") or 0) > 0
    if kind == "constant":
        c.map(key, f"{target}.lr_scheduler", "constant")
        for leaf in ("lr_min", "lr_decay_ratio"):
            c.unread(f"{o}.{leaf}", "read only by VeOmni's decaying schedules (cosine, linear)")
    elif kind == "cosine":
        c.map(key, f"{target}.lr_scheduler", "cosine")
        decay = float(c.get(f"{o}.lr_decay_ratio", 1.0))
        if not 0 <= lr_min <= lr:
            c.refuse(f"{o}.lr_min", f"a cosine floor lr_min={lr_min} outside [0, lr={lr}]")
        else:
            c.map(f"{o}.lr_min", f"{target}.min_lr_ratio", lr_min / lr if lr else 0.0,
                  "VeOmni's floor is a rate: rlforge's min_lr_ratio = lr_min / lr")
        (c.same(f"{o}.lr_decay_ratio", "the cosine spans the run") if decay == 1.0 else
         c.refuse(f"{o}.lr_decay_ratio", f"a cosine that ends at {decay:g} of the run (VeOmni's lr_decay_ratio)"))
    else:  # VeOmni's linear schedule keeps a floor of 1e-7 (its default min_lr; verl passes none): not rlforge's
        c.refuse(key, f"VeOmni's '{kind}' schedule (rlforge's veomni mapping has constant and cosine)")
        for leaf in ("lr_min", "lr_decay_ratio"):
            c.unread(f"{o}.{leaf}", f"read by the '{kind}' schedule (refused)")
    (c.same(f"{o}.lr_start", "the warm-up starts from 0") if start == 0 or not warm else
     c.refuse(f"{o}.lr_start", f"a warm-up that starts at lr_start={start:g} (rlforge's starts at 0)"))


def warmup(c: Context, steps: str, ratio: str, target: str) -> None:
    """VeOmni's warm-up: int(lr_warmup_steps_ratio x the run's steps); lr_warmup_steps is never read."""
    c.unread(steps, "not read by verl's veomni engine: its schedule reads lr_warmup_steps_ratio only")
    c.map(ratio, f"{target}.warmup_ratio", float(c.get(ratio) or 0.0))
    c.set(f"{target}.warmup_steps", 0)
