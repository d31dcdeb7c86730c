"""How verl lays its models out on the devices, in rlforge's terms (``Derived`` rules, beside ``verl_derived``): the
strategy and the parallel sizes as verl counts them (data-parallel size = GPUs / (TP x PP x CP x SP)), parameter
offload and FSDP's sharding group, the reference model's layout, Ulysses sequence parallelism and the precision.
They follow verl 0.9.1's engines (FSDP and megatron)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.config import verl_veomni
from rlforge.config.verl_rules import count, integral

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

ARO = "actor_rollout_ref"
A, REF = f"{ARO}.actor", f"{ARO}.ref"
OFFLOAD = "strategy.fsdp.offload_params"
SPEED_ONLY = "speed or memory only: what is computed does not change"
NO_REF = "read only with a reference model of its own (use_kl_loss or use_kl_in_reward, no LoRA)"
# without a KL term verl builds no reference model, and reads none of its keys
NO_KL = "read only with a reference model (use_kl_loss or use_kl_in_reward)"

def precision(c: Context) -> None:
    """FSDP's parameter dtype and compute dtype (or megatron's compute dtype, its parameters kept in fp32 by its
    optimizer) as one model.precision."""
    if c.get("model_engine") == verl_veomni.ENGINE:
        verl_veomni.precision(c)
        return
    megatron = c.get("model_engine") == "megatron"
    params = "fp32" if megatron else str(c.get(f"{A}.fsdp_config.model_dtype", "fp32"))
    # verl's FSDP engine computes (autocast) in mixed_precision.param_dtype, bf16 when unset, and none when fp32; it
    # never reads fsdp_config.dtype (only its megatron engine reads a dtype: megatron.dtype)
    compute = str(c.get(f"{A}.megatron.dtype", "bfloat16") if megatron
                  else c.get(f"{A}.fsdp_config.mixed_precision.param_dtype") or "bf16")
    keys = [k for k in c.owned if k.startswith((f"{A}.fsdp_config.", f"{A}.megatron."))]
    decider = f"{A}.megatron.dtype" if megatron else f"{A}.fsdp_config.model_dtype"
    for key in [k for k in keys if k.startswith(f"{A}.fsdp_config.") == megatron]:
        keys.remove(key)
        c.unread(key, "read only by verl's FSDP engine (model_engine=megatron here)" if megatron
                 else "read only by verl's megatron engine (model_engine=megatron)")
    if f"{A}.fsdp_config.dtype" in keys:
        keys.remove(f"{A}.fsdp_config.dtype")
        c.unread(f"{A}.fsdp_config.dtype", "not read by verl 0.9.1's FSDP engine, which computes in "
                                           "fsdp_config.mixed_precision.param_dtype (bf16 unless set)")
    half = {"bfloat16": "bf16", "bf16": "bf16", "float16": "16", "fp16": "16"}
    if params in ("fp32", "float32"):
        name = f"{half[compute]}-mixed" if compute in half else "32-true"
    elif params in ("bf16", "bfloat16"):
        name = "bf16-true"
    else:
        for key in keys:
            c.refuse(key, f"parameters in {params}")
        return
    for key in keys:
        if key == decider:
            c.map(key, "model.precision", name)
        else:
            c.same(key, f"model.precision={name}")


def parallel(c: Context) -> None:
    """model_engine -> strategy; GPUs = nnodes x n_gpus_per_node; data-parallel size = GPUs / (TP x PP x CP)."""
    engine, counts = c.get("model_engine", "dp"), ("trainer.nnodes", "trainer.n_gpus_per_node")
    # verl builds its resource pool as [n_gpus_per_node] * nnodes and divides the batch by their product
    if bad := [k for k in counts if not count(1)(integral(c.get(k, 1)))]:
        for key in counts:
            (c.stop(key, "verl 0.9.1 stops on this value: it takes a positive integer (its resource pool is "
                         "[n_gpus_per_node] x nnodes GPUs)") if key in bad else
             c.ignore(key, f"read together with {', '.join(bad)} (refused)"))
    world = c.gpus = 1 if bad else integral(c.get("trainer.nnodes", 1)) * integral(c.get("trainer.n_gpus_per_node", 1))
    tp = int(c.get(f"{A}.megatron.tensor_model_parallel_size", 1) or 1) if engine == "megatron" else 1
    pp = int(c.get(f"{A}.megatron.pipeline_model_parallel_size", 1) or 1) if engine == "megatron" else 1
    cp = int(c.get(f"{A}.megatron.context_parallel_size", 1) or 1) if engine == "megatron" else 1
    if pp > 1:
        c.refuse(f"{A}.megatron.pipeline_model_parallel_size", "pipeline parallelism in rlforge's megatron strategy")
    if cp > 1:
        c.refuse(f"{A}.megatron.context_parallel_size", "context parallelism (megatron)")
    if engine not in ("dp", "megatron", verl_veomni.ENGINE):
        c.refuse("model_engine", f"verl's {engine} training engine (rlforge's strategies: single, fsdp, megatron)")
    elif pp == cp == 1 and world % tp:
        c.refuse("trainer.n_gpus_per_node", f"{world} GPUs not divisible by TP x PP x CP = {tp * pp * cp} (verl refuses "
                 "it too)")
    ref_layout(c, engine, {"tensor": tp, "pipeline": pp, "context": cp})
    ref, actor = c.get(f"{REF}.strategy"), c.get(f"{A}.strategy")
    if not uses_ref(c):
        c.unread(f"{REF}.strategy", NO_REF)
    elif ref == actor:
        c.same(f"{REF}.strategy", f"the actor's strategy ({actor}): rlforge runs every model with the same one")
    else:
        c.ignore(f"{REF}.strategy", f"verl runs the reference model with {ref}, the actor with {actor}; rlforge runs both "
                 f"as the actor (the same values; {SPEED_ONLY})")
    for key in c.owned:
        if key.endswith(("strategy", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                         "context_parallel_size")) and key != "model_engine":
            c.same(key, f"the {engine} engine's layout (mapped from model_engine and the GPU counts)")
    c.dp_size = max(1, world // (tp * pp * cp))
    strategy = "megatron" if engine == "megatron" else ("fsdp" if world > 1 else "single")
    c.map("model_engine", "strategy.name", strategy)
    c.map("trainer.n_gpus_per_node", "strategy.num_processes", world)
    c.same("trainer.nnodes", f"strategy.num_processes = nnodes x n_gpus_per_node = {world}")
    if strategy != "single":
        c.set("trainer.controller", "ray")
    if strategy == "megatron":
        c.set("strategy.megatron.tensor_parallel_size", tp)
        c.set("strategy.checkpoint", "sharded")
    device = c.get("trainer.device", "cuda")
    if device in ("cuda", "cpu"):
        c.map("trainer.device", "strategy.device", device)
    else:
        c.refuse("trainer.device", f"trainer.device={device} (rlforge runs on cuda or cpu)")



def offload(c: Context) -> None:
    """Parameter offload as verl 0.9.1's FSDP engines do it: the actor and the critic keep their parameters in CPU
    memory with ``fsdp_config.param_offload`` (between passes) or ``offload_policy`` (FSDP2's CPUOffloadPolicy, only
    with strategy=fsdp2); the reference model, a forward-only engine, always does, whatever its keys say (in the FSDP
    engine; the veomni engine reads ``veomni.param_offload`` for every role). rlforge's
    fsdp strategy offloads the listed roles with CPUOffloadPolicy: the same values, the tensors waiting elsewhere.
    ``fsdp_size`` too: verl shards over all GPUs unless it names a smaller group (HSDP); rlforge always over all."""
    strategy = c.out.overrides.get("strategy.name")
    roles = []
    veomni = c.get("model_engine") == verl_veomni.ENGINE
    for section, role, engine in ((A, "actor", f"{A}.veomni" if veomni else f"{A}.fsdp_config"),
                                  (REF, "ref", f"{REF}.veomni" if veomni else f"{REF}.fsdp_config"),
                                  ("critic", "critic", "critic.veomni" if veomni else "critic.fsdp")):
        keys = [k for k in c.owned if k.startswith(f"{engine}.")]
        if not keys:
            continue
        if role == "ref" and not uses_ref(c):
            for key in keys:
                c.unread(key, NO_REF)
            continue
        if strategy != "fsdp":
            for key in keys:  # one GPU: verl's FSDP engine reads them, to no effect on what is computed
                (c.unread(key, "read only by verl's FSDP engines (model_engine=megatron here)") if strategy == "megatron"
                 else c.ignore(key, "one GPU: nothing to shard") if key.endswith((".fsdp_size", ".reshard_after_forward"))
                 else c.ignore(key, f"rlforge's single strategy (one GPU) keeps parameters on the device; {OFFLOAD} "
                                    f"needs strategy.name=fsdp (memory only: what is computed does not change)"))
            continue
        size_key, world = f"{engine}.fsdp_size", c.gpus
        if size_key in keys:  # verl's create_device_mesh: < 0 or >= the GPUs: one mesh over all of them, else HSDP
            keys.remove(size_key)
            size = int(c.get(size_key) or -1)
            (c.same(size_key, f"FSDP shards the model over all {world} ranks") if size < 0 or size >= world else
             c.ignore(size_key, f"verl shards over groups of {size} ranks and replicates across them (HSDP); rlforge "
                      f"shards over all {world}: the same values (speed or memory only)"))
        reshard = f"{engine}.reshard_after_forward"
        if reshard in keys:  # FSDP2's default, and FSDP1's FULL_SHARD (zero3), as rlforge's fully_shard
            keys.remove(reshard)
            (c.same(reshard, "each layer's gathered parameters are freed after its forward pass (FSDP2's default)")
             if c.get(reshard) else c.ignore(reshard, f"rlforge frees them after each forward pass ({SPEED_ONLY})"))
        # VeOmni's enable_fsdp_offload is FSDP2's CPUOffloadPolicy, as the FSDP engine's offload_policy
        param, policy = f"{engine}.param_offload", f"{engine}.enable_fsdp_offload" if veomni else f"{engine}.offload_policy"
        fsdp2 = veomni or c.get(f"{section}.strategy", c.get(f"{A}.strategy")) == "fsdp2"
        forced = role == "ref" and not veomni  # verl's FSDP engine offloads its forward-only roles; VeOmni's does not
        on = True if forced else bool(c.get(param) or (fsdp2 and c.get(policy)))
        if on:
            roles.append(role)
        for key in keys:
            value = bool(c.get(key))
            if forced:
                note = "" if value else ("verl 0.9.1 does not read it: the reference model, a forward-only engine, "
                                         "always keeps its parameters in CPU memory (FSDP CPU offload), and so does "
                                         "rlforge's")
            elif key == policy and not fsdp2:
                c.unread(key, "read only with strategy=fsdp2 (FSDP2's CPUOffloadPolicy)")
                continue
            elif key == param and not value and on:
                note = f"{policy.rsplit('.', 1)[1]}=True offloads the parameters (FSDP2's CPUOffloadPolicy)"
            else:
                note = ""
            c.map(key, OFFLOAD, roles, note)
    if roles:
        c.set(OFFLOAD, roles)


def grad_offload(c: Context) -> None:
    """verl 0.9.0's megatron ``grad_offload`` (0.9.1 dropped the key: its ``param_offload`` releases the gradient
    buffers too): no gradients held on the device between updates. rlforge frees them after every update (the next
    one starts from zero in both), so True asks for what rlforge always does; False changes memory only."""
    for key in c.owned:
        if key.startswith(f"{REF}."):
            c.unread(key, "the reference model computes no gradients")
        elif c.get(key):
            c.same(key, "no gradients held on the device between updates: rlforge frees them after each update")
        else:
            c.ignore(key, f"verl keeps the gradient buffers on the device; rlforge frees them after each update "
                     f"({SPEED_ONLY})")


def kl_term(c: Context) -> bool:
    """A KL term to a reference (in the loss or in the reward): without one verl computes no reference log-probs."""
    return bool(c.get(f"{A}.use_kl_loss") or c.get("algorithm.use_kl_in_reward"))


def uses_ref(c: Context) -> bool:
    """verl builds a reference model of its own: a KL term, and no LoRA (then the reference is the actor without its
    adapter)."""
    kl = kl_term(c)
    lora = int(c.get(f"{ARO}.model.lora.rank") or 0) > 0 or int(c.get(f"{ARO}.model.lora_rank") or 0) > 0
    return kl and not lora and c.get(f"{ARO}.model.lora_adapter_path") is None  # verl's ref_in_actor


def ref_layout(c: Context, engine: str, actor: dict[str, int]) -> None:
    """The reference's megatron TP / PP / CP: rlforge lays out the reference as the actor. A smaller tensor-parallel
    size computes the same values with less memory per GPU; a larger one, or pipeline or context parallelism, is
    refused (rlforge's megatron strategy has neither)."""
    for key in [k for k in c.owned if k.startswith(f"{REF}.megatron.")]:
        dim, size = key.rsplit(".", 1)[1].split("_", 1)[0], int(c.get(key) or 1)
        if engine != "megatron":
            c.unread(key, "read only by verl's megatron engine (model_engine=megatron)")
        elif not uses_ref(c):
            c.unread(key, NO_REF)
        elif dim != "tensor" and size > 1:
            c.refuse(key, f"{dim} parallelism for the reference model (megatron)")
        elif size > actor[dim]:
            c.refuse(key, f"a larger tensor-parallel size for the reference ({size}) than for the actor ({actor[dim]}; "
                     "rlforge lays out every model as the actor)")
        else:
            c.same(key, f"the actor's {dim}-parallel size ({actor[dim]}): rlforge lays out the reference as the actor"
                   + (f" (more than the reference's {size}: the same values, less memory per GPU)"
                      if size < actor[dim] else ""))


SP = "ulysses_sequence_parallel_size"
SP_TARGET = "strategy.fsdp.sequence_parallel_size"


def sequence_parallel(c: Context) -> None:
    """Ulysses: each role's ``ulysses_sequence_parallel_size`` where > 1, else its engine's (``fsdp_config``, the
    critic's ``fsdp``), as verl's FSDP configs read them. rlforge has one size for every model, the actor's: a reference
    (with a KL term) or critic with a smaller one is computed the same with less memory per GPU, a larger one is
    refused. Data-parallel size = GPUs / SP."""
    engine, world = c.get("model_engine", "dp"), c.gpus
    use_ref = bool(c.get(f"{A}.use_kl_loss") or c.get("algorithm.use_kl_in_reward"))
    sizes: dict[str, tuple[int, str]] = {}  # role section -> (its size, the key that decides it)
    for section in (A, REF, "critic"):
        keys = [k for k in c.owned if k.startswith(f"{section}.")]
        if not keys:
            continue
        if section == REF and not use_ref:
            for key in keys:
                c.unread(key, NO_KL)
            continue
        top, inner = f"{section}.{SP}", next((k for k in keys if k != f"{section}.{SP}"), None)
        decider = top if int(c.get(top) or 1) > 1 or inner is None else inner
        sizes[section] = (int(c.get(decider) or 1), decider)
        for key in keys:
            if key != decider:
                c.unread(key, f"not read: {top} > 1 wins (verl copies it here)" if key == inner else
                         f"1: verl reads {decider}")
    sp, decider = sizes.get(A, (1, ""))
    for section, (size, key) in sizes.items():
        role = section.rsplit(".", 1)[-1]
        if section == A:
            continue
        if size > sp:  # rlforge would hold more of each sequence per GPU than the launch planned for
            c.refuse(key, f"a larger sequence-parallel size for the {role} ({size}) than for the actor ({sp}, "
                     f"{decider}; rlforge's {SP_TARGET} is one for all models)")
        else:  # a larger size computes the same values with less memory per GPU
            c.same(key, f"{SP_TARGET}={sp}, the actor's: one for all models" + (
                f" (more than the {role}'s {size}: the same values, less memory per GPU)" if size < sp else ""))
    if sp <= 1:
        c.same(decider, "no sequence parallelism")
    elif engine == "megatron":
        c.refuse(decider, "Ulysses sequence parallelism with the megatron strategy")
    elif world % sp:
        c.refuse(decider, f"{SP}={sp} on {world} GPUs (it must divide them, in verl too)")
    else:
        c.map(decider, SP_TARGET, sp, "token budgets (..._max_token_len_per_gpu) stay per GPU, as in verl: a "
              "micro-batch holds SP x the budget")
        c.dp_size = max(1, c.dp_size // sp)
