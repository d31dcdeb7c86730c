"""The training-side settings that several verl keys decide together (``Derived`` rules, beside ``verl_derived``):
the micro-batches of the updates and of the forward-only passes, the clip ratios, the learning-rate warm-up and
schedule, activation recomputation, the entropy's computation, DAPO's dynamic sampling and rollout correction
(the trainer module's own keys and the loop's frequencies: ``verl_loop``). They follow verl 0.9.1's workers, engines and trainers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.config import verl_veomni
from rlforge.config.verl_fates import SEPARATE_TRAINERS, TRAINER_NAMES
from rlforge.config.verl_layout import NO_KL, kl_term, uses_ref
from rlforge.config.verl_rules import float_list, joined, non_negative, off

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

ARO = "actor_rollout_ref"
A, R, REF = f"{ARO}.actor", f"{ARO}.rollout", f"{ARO}.ref"
RC = "algorithm.rollout_correction"
SUM_NORM = "seq-mean-token-sum-norm"
# verl's forward-only passes: (its keys' section, their prefix, the key that turns on token budgets, rlforge's section)
SCORING = ((R, "log_prob_", f"{R}.log_prob_use_dynamic_bsz", "actor.log_prob"),
           (REF, "log_prob_", f"{REF}.log_prob_use_dynamic_bsz", "actor.ref_log_prob"),
           ("critic", "forward_", "critic.use_dynamic_bsz", "critic.values"))
SCHEDULES = ("constant", "cosine")  # verl's FSDP engine schedules; rlforge's lr_scheduler has both (rlforge.lr_schedule)
# verl's filter_groups.metric -> rlforge's algorithm.filter_metric (seq_final_reward: before any KL in the reward)
FILTER_METRICS = {"reward": "reward", "seq_reward": "reward", "seq_final_reward": "reward", "score": "score",
                  "acc": "acc"}
FILTER_METRICS_COMPUTED = ("reward", "seq_reward", "seq_final_reward")  # computed by a verl trainer, not looked up
# verl 0.9.1 on a deprecated global micro-batch count (use_dynamic_bsz off): its config classes and validate_config
# raise beside the per-GPU one ('You have set both'; the critic's per-GPU key copies the global one), and the workers
# assert the per-GPU keys of the actor's update and log-prob passes (engine_workers.py)
GLOBAL_BESIDE_STOPS = (f"{A}.ppo_micro_batch_size", "critic.ppo_micro_batch_size", f"{REF}.log_prob_micro_batch_size",
                       f"{R}.log_prob_micro_batch_size")
GLOBAL_ALONE_STOPS = (f"{A}.ppo_micro_batch_size", f"{R}.log_prob_micro_batch_size", f"{REF}.log_prob_micro_batch_size")
NO_LIMIT_ROUNDS = 1000  # verl's max_num_gen_batches=0 (no limit) as rlforge's algorithm.max_gen_batches


def _cut(c: Context, flag: str, keys: tuple[str, str, str], targets: tuple[str, str], unset: str) -> None:
    """One pass's micro-batches: ``flag`` on, a token budget (``keys[0]``); off, a per-GPU count (``keys[1]``) or a
    deprecated global count (``keys[2]``, where verl 0.9.1 does not stop on it: divided by the data-parallel size,
    as verl before 0.9 did). ``targets``: rlforge's (budget, count)."""
    tokens, per_gpu, total = keys
    name = flag.rsplit(".", 1)[1]
    if c.get(flag):
        c.map(tokens, targets[0], c.get(tokens))
        c.unread(per_gpu, f"not read with {name}=True")
        c.unread(total, f"not read with {name}=True")
        return
    c.unread(tokens, f"read only with {name}=True")
    count = None if c.get(total) is None else max(1, int(c.get(total)) // c.dp_size)
    if c.get(per_gpu) is not None:
        c.map(per_gpu, targets[1], c.get(per_gpu))
        if count is not None and total in GLOBAL_BESIDE_STOPS:
            c.stop(total, f"verl 0.9.1 stops on this deprecated global count beside {per_gpu.rsplit('.', 1)[1]}"
                          + (" (which copies it: critic.yaml)" if total.startswith("critic.") else "") +
                          f" ('You have set both'): set only {per_gpu} (now {c.get(per_gpu)}; the global "
                          f"{c.get(total)} / {c.dp_size} data-parallel ranks is {count})")
        else:
            c.unread(total, "verl reads the _per_gpu value when it is set")
    elif count is not None and total in GLOBAL_ALONE_STOPS and (not total.startswith(REF) or uses_ref(c)):
        c.unread(per_gpu, "null")
        c.stop(total, f"verl 0.9.1 no longer reads this deprecated global count: its workers need {per_gpu} and stop "
                      f"without it; set {per_gpu}={count} ({c.get(total)} / {c.dp_size} data-parallel ranks, as verl "
                      f"before 0.9 divided it)")
    elif count is not None:
        c.unread(per_gpu, "null")
        c.map(total, targets[1], count, "the global count / the data-parallel size, as verl before 0.9 divided it "
              "(verl 0.9.1 hands its engine only the per-GPU value)")
    else:
        c.map(per_gpu, targets[1], None, f"verl requires a micro-batch size here (0.9.1 stops without one: 'Please set "
              f"at least one of ...'); rlforge {unset}")
        c.unread(total, "null")


def micro_batches(c: Context) -> None:
    """The update's micro-batches: ``use_dynamic_bsz`` picks the token budget or the count."""
    for section, target in ((A, "actor"), ("critic", "critic")):
        flag = f"{section}.use_dynamic_bsz"
        if not c.has(flag):
            continue
        c.same(flag, "micro-batches cut by tokens" if c.get(flag) else "micro-batches by count")
        _cut(c, flag, (f"{section}.ppo_max_token_len_per_gpu", f"{section}.ppo_micro_batch_size_per_gpu",
                       f"{section}.ppo_micro_batch_size"),
             (f"{target}.max_tokens_per_micro_batch", f"{target}.ppo_micro_batch_size"), "takes the whole mini-batch")


def scoring(c: Context) -> None:
    """The forward-only passes' micro-batches: old log-probs (``rollout.log_prob_*``), reference log-probs
    (``ref.log_prob_*``), values (``critic.forward_*``, cut by tokens with the critic's own use_dynamic_bsz)."""
    for section, prefix, flag, target in SCORING:
        keys = tuple(f"{section}.{prefix}{leaf}" for leaf in ("max_token_len_per_gpu", "micro_batch_size_per_gpu",
                                                               "micro_batch_size"))
        if not c.has(keys[0]):
            continue
        if section == REF and not kl_term(c):  # as every other key of the reference model (verl.translate)
            for key in (k for k in (*keys, flag) if k in c.owned):
                c.unread(key, NO_KL)
            continue
        if section == R and bool(c.get(flag)) != bool(c.get(f"{A}.use_dynamic_bsz")):
            c.stop(flag, f"verl 0.9.1 stops where it differs from {A}.use_dynamic_bsz (engine_workers.py asserts they "
                         f"are equal)")
        if flag in c.owned:  # the rollout's and the reference's own switch (the critic's is its update's)
            (c.same(flag, "micro-batches cut by tokens") if c.get(flag) else
             c.map(flag, f"{target}.max_tokens_per_micro_batch", 0, "micro-batches by count"))
        _cut(c, flag, keys, (f"{target}.max_tokens_per_micro_batch", f"{target}.micro_batch_size"),  # type: ignore[arg-type]
             "cuts them as the update")


def clip(c: Context) -> None:
    """verl reads clip_ratio only where clip_ratio_low/high are null."""
    base, used = c.get(f"{A}.clip_ratio"), False
    for side in ("low", "high"):
        value = c.get(f"{A}.clip_ratio_{side}")
        used |= value is None
        c.map(f"{A}.clip_ratio_{side}", f"actor.clip_ratio_{side}", base if value is None else value)
    if used:
        c.same(f"{A}.clip_ratio", "the default of clip_ratio_low/high (mapped there)")
    else:
        low, high = c.get(f"{A}.clip_ratio_low"), c.get(f"{A}.clip_ratio_high")
        mine = [f"clip_ratio_{s}" for s in ("low", "high") if f"{A}.clip_ratio_{s}" in c.given]
        c.unread(f"{A}.clip_ratio", f"not read: verl 0.9.1 clips at clip_ratio_low={low} and clip_ratio_high={high} ("
                                    + (f"the launch sets {' and '.join(mine)}" if mine else "its config's defaults; "
                                       "to clip at clip_ratio, set those to null or to its value") + ")")


def grad_clip(c: Context) -> None:
    """verl 0.9.1's engines clip at optim.clip_grad (mapped to <role>.grad_clip) and never read the role's own
    grad_clip: a grad_clip equal to it asks for what verl does; another value changes nothing in verl."""
    for section, target in ((A, "actor"), ("critic", "critic")):
        key, used = f"{section}.grad_clip", c.get(f"{section}.optim.clip_grad")
        if not c.has(key):
            continue
        if c.get(key) == used:
            c.same(key, f"gradient clipping at {used}: verl 0.9.1 clips at {section}.optim.clip_grad, the same value "
                   f"(mapped to {target}.grad_clip)")
        else:
            c.unread(key, f"not read by verl 0.9.1's engines: they clip at optim.clip_grad ({used}, mapped to "
                     f"{target}.grad_clip)")


def betas(c: Context) -> None:
    """AdamW's betas: verl 0.9.1's FSDP engine passes ``optim.betas`` to torch's AdamW (rlforge's <role>.betas); its
    megatron engine builds megatron's Adam, which keeps megatron's own betas (0.9, 0.999) and never reads them."""
    megatron = c.get("model_engine") == "megatron"
    for key in c.owned:
        role, value = ("critic" if key.startswith("critic.") else "actor"), float_list(c.get(key))
        if not megatron:
            c.map(key, f"{role}.betas", value)
        elif value == [0.9, 0.999]:
            c.same(key, "megatron's Adam betas (0.9, 0.999), rlforge's default")
        else:
            c.unread(key, "not read by verl's megatron engine: its Adam keeps megatron's betas (0.9, 0.999), "
                     f"rlforge's default {role}.betas")


def warmup(c: Context) -> None:
    """verl: lr_warmup_steps when > 0, else lr_warmup_steps_ratio x the run's steps; rlforge's warmup_steps and
    warmup_ratio follow the same rule."""
    for section, target in ((A, "actor"), ("critic", "critic")):
        steps, ratio = f"{section}.optim.lr_warmup_steps", f"{section}.optim.lr_warmup_steps_ratio"
        if not c.has(steps):
            continue
        if c.get("model_engine") == verl_veomni.ENGINE:
            verl_veomni.warmup(c, steps, ratio, target)
            continue
        if c.get(steps) is not None and c.get(steps) > 0:
            c.map(steps, f"{target}.warmup_steps", c.get(steps))
            c.unread(ratio, "not read: lr_warmup_steps is set")
        else:
            c.map(steps, f"{target}.warmup_steps", 0, "<= 0: the ratio applies")
            c.map(ratio, f"{target}.warmup_ratio", float(c.get(ratio) or 0.0))


def schedule(c: Context) -> None:
    """verl's FSDP schedule: ``lr_scheduler_type`` (the deprecated ``warmup_style`` wins where set), constant or cosine
    down to ``min_lr_ratio`` (null: 0) with ``num_cycles`` waves, steps counted from 0. transformers' schedules, which
    rlforge's ``lr_scheduler`` names, are the same functions."""
    veomni = c.get("model_engine") == verl_veomni.ENGINE
    for section, target in ((A, "actor"), ("critic", "critic")):
        if c.has(f"{section}.optim.lr_scheduler_type"):
            (verl_veomni.schedule if veomni else fsdp_schedule)(c, f"{section}.optim", target)
    for key in c.owned:  # the same names in other engines' optimizer sections
        if c.done(key):
            continue
        if veomni:  # only a '+key' puts them there: VeOmniOptimizerConfig has no such field
            c.refuse(key, f"verl's veomni optimizer option {key.rsplit('.', 1)[1]} (VeOmniOptimizerConfig has no such "
                          "field: verl 0.9.1 refuses the launch too)")
        else:
            c.unread(key, "read only by verl's FSDP schedule (lr_scheduler_type); other engines' schedules: "
                          "lr_decay_style")


def fsdp_schedule(c: Context, o: str, target: str) -> None:
    """The schedule of the ``optim`` section ``o`` of verl's FSDP engine as rlforge's ``target`` section's."""
    key, other, why = ((f"{o}.warmup_style", f"{o}.lr_scheduler_type", "not read: the deprecated warmup_style is "
                        "set and wins") if c.get(f"{o}.warmup_style") is not None else
                       (f"{o}.lr_scheduler_type", f"{o}.warmup_style", "null: lr_scheduler_type applies"))
    c.unread(other, why)
    kind = c.get(key)
    if kind in SCHEDULES:
        c.map(key, f"{target}.lr_scheduler", kind)
    else:
        c.refuse(key, f"the '{kind}' schedule (verl's FSDP engine has {' and '.join(SCHEDULES)}; it refuses others "
                 "too)")
    cosine_keys(c, o, target, kind == "cosine")


def cosine_keys(c: Context, o: str, target: str, cosine: bool) -> None:
    """The cosine schedule's options under ``o`` (an ``optim`` section) as ``target``'s."""
    keys = (f"{o}.min_lr_ratio", f"{o}.num_cycles", f"{o}.zero_indexed_step")
    if not cosine:
        for key in keys:
            c.unread(key, "read only by the cosine schedule")
        return
    c.map(keys[0], f"{target}.min_lr_ratio", float(c.get(keys[0]) or 0.0))
    c.map(keys[1], f"{target}.num_cycles", float(c.get(keys[1], 0.5)))
    (c.same(keys[2], "steps counted from 0, as transformers' schedules") if c.get(keys[2]) in (True, None) else
     c.refuse(keys[2], "a cosine schedule counted from step 1 (zero_indexed_step=False)"))


SPEED = "speed or memory only: what is computed does not change"
RECOMPUTE = f"{A}.megatron.override_transformer_config"


def recompute(c: Context) -> None:
    """Activation recomputation: verl's FSDP engine reads ``model.enable_gradient_checkpointing``, its megatron engine
    only ``megatron.override_transformer_config.recompute_*`` (null: none). rlforge's ``model.gradient_checkpointing``
    recomputes every layer in the backward pass (megatron: recompute_granularity=full, method uniform, 1 layer)."""
    gc = f"{ARO}.model.enable_gradient_checkpointing"
    keys = [k for k in c.owned if k.startswith(f"{RECOMPUTE}.")]
    if c.get("model_engine") != "megatron":
        c.map(gc, "model.gradient_checkpointing", bool(c.get(gc)))
        for key in keys:
            c.unread(key, "read only by verl's megatron engine (model_engine=megatron)")
        return
    c.unread(gc, f"not read by verl's megatron engine: {RECOMPUTE}.recompute_granularity decides")
    granularity, method, layers = (c.get(f"{RECOMPUTE}.recompute_{k}") for k in ("granularity", "method", "num_layers"))
    full, every = granularity == "full", method == "uniform" and layers == 1
    if granularity == "selective":
        c.set("model.gradient_checkpointing", False)
        c.ignore(f"{RECOMPUTE}.recompute_granularity", f"megatron's selective recomputation (of recompute_modules) is "
                 f"not in rlforge; rlforge keeps the activations (model.gradient_checkpointing=false; {SPEED})")
    else:
        c.map(f"{RECOMPUTE}.recompute_granularity", "model.gradient_checkpointing", full, "" if not full or every else
              f"rlforge recomputes each layer on its own, verl {method} over {layers} layers ({SPEED})")
    for key in keys:
        leaf = key.rsplit(".", 1)[1]
        if leaf == "recompute_modules":
            (c.ignore(key, f"the modules megatron's selective recomputation recomputes ({SPEED})") if granularity ==
             "selective" else c.unread(key, "read only with recompute_granularity=selective"))
        elif not full:
            c.unread(key, "read only with recompute_granularity=full")
        elif every:
            c.same(key, "every layer recomputed on its own (model.gradient_checkpointing)")
        elif not c.done(key):
            c.ignore(key, f"rlforge recomputes each layer on its own (uniform, 1 layer; {SPEED})")


def entropy(c: Context) -> None:
    """The actor's entropy from the logits, as verl's engine reads it: from its own section (``fsdp_config``,
    ``megatron``), which the actor's keys fill by interpolation. ``entropy_from_logits_with_chunking`` computes it in
    chunks, as rlforge always does (of 64 MiB of fp32 logits); ``entropy_checkpointing`` recomputes it in the backward
    pass of an update that has the entropy in its loss (entropy_coeff != 0 or calculate_entropy), as rlforge recomputes
    its log-prob and entropy chunks (where the logits span more than one)."""
    megatron = c.get("model_engine") == "megatron"
    engine = f"{A}.megatron" if megatron else f"{A}.fsdp_config"
    graded = bool(c.get(f"{A}.calculate_entropy") or c.get(f"{A}.entropy_coeff"))
    for key in c.owned:
        leaf, read = key.rsplit(".", 1)[1], f"{engine}.{key.rsplit('.', 1)[1]}"
        if not c.has(read) or (key != read and (key.rsplit(".", 1)[0] != A or c.get(key) != c.get(read))):
            c.unread(key, f"not read: verl's {'megatron' if megatron else 'FSDP'} engine reads {read}"
                     if c.has(read) else f"not read by verl's {'megatron' if megatron else 'FSDP'} engine")
        elif leaf == "entropy_from_logits_with_chunking":
            (c.same(key, "the entropy computed from the logits in chunks, as rlforge always computes it (of 64 MiB "
                    "of fp32 logits; verl's: entropy_from_logits_chunk_size tokens)") if c.get(key)
             else c.ignore(key, f"rlforge computes the entropy in chunks anyway ({SPEED})"))
        elif leaf == "entropy_checkpointing" and not graded:
            c.unread(key, "not reached: the update has no entropy term (entropy_coeff=0, calculate_entropy=False) "
                     "and the old log-probs need no backward pass")
        elif leaf == "entropy_checkpointing":
            (c.same(key, "the entropy recomputed in the backward pass: rlforge recomputes its log-prob and entropy "
                    "chunks where the logits span more than one (64 MiB of fp32)") if c.get(key)
             else c.ignore(key, f"rlforge recomputes its log-prob and entropy chunks in the backward pass ({SPEED})"))
        else:
            c.ignore(key, f"rlforge's chunks hold 64 MiB of fp32 logits ({SPEED})")


def filter_groups(c: Context) -> None:
    """DAPO's dynamic sampling: enable, metric, max_num_gen_batches, and the generation batch (data.gen_batch_size)."""
    f = "algorithm.filter_groups"
    keys = [k for k in c.owned if k.startswith(f"{f}.") or k == "data.gen_batch_size"]
    if c.trainer in SEPARATE_TRAINERS and c.get(f"{f}.enable"):  # only main_ppo and the DAPO recipe filter groups
        for key in keys:
            (c.map(key, "algorithm.filter_groups", False, "verl's fully-async and one-step-off trainers do not read "
                   "it: they train every group") if key == f"{f}.enable" else
             c.unread(key, "read only by main_ppo's and the DAPO recipe's dynamic sampling"))
        return
    if not c.get(f"{f}.enable"):
        gen, train = c.get("data.gen_batch_size"), c.get("data.train_batch_size")
        for key in keys:
            if key == f"{f}.enable":
                c.map(key, "algorithm.filter_groups", False)
            elif key == "data.gen_batch_size" and c.trainer == "fully_async":  # its rollouter streams prompts
                (c.ignore(key, "verl's fully-async rollouter draws one prompt at a time (it asserts gen_batch_size "
                               "== 1); rlforge's pipeline draws data.train_batch_size per step") if gen == 1 else
                 c.stop(key, "verl's fully-async rollouter asserts gen_batch_size == 1"))
            elif key != "data.gen_batch_size" or not gen:  # verl reads 0 as null too ('or train_batch_size')
                c.unread(key, "read only with filter_groups.enable (dynamic sampling)" if key != "data.gen_batch_size"
                         else f"{gen}: verl's data loader draws data.train_batch_size prompts")
            elif gen == train:
                c.same(key, "data.train_batch_size prompts per step, as verl's data loader draws them")
            elif c.trainer not in TRAINER_NAMES:  # main_ppo's v1 trainer fetches a step's prompts in such chunks
                (c.same(key, f"verl fetches each step's data.train_batch_size={train} prompts {gen} at a time (the "
                             "same prompts)") if isinstance(gen, int) and gen > 0 and train % gen == 0 else
                 c.stop(key, f"verl 0.9.1 stops on a gen_batch_size that does not divide data.train_batch_size={train} "
                             "('must be a positive multiple of gen_batch_size')"))
            else:  # the legacy loader of the DAPO recipe and the one-step-off trainer: gen_batch_size prompts a step
                c.refuse(key, f"data.gen_batch_size={gen} prompts per step beside data.train_batch_size={train} without "
                              f"dynamic sampling ({TRAINER_NAMES[c.trainer]} draws gen_batch_size prompts a step then; "
                              "set data.train_batch_size to it)")
        return
    c.map(f"{f}.enable", "algorithm.filter_groups", True)
    metric, recipe = c.get(f"{f}.metric"), c.trainer == "dapo"
    # the DAPO recipe's trainer computes seq_reward / seq_final_reward itself and looks any other name up in the reward
    # function's extra info; main_ppo's v1 replay buffer computes only "reward" (the pre-KL reward sum) and looks
    # others up there too, stopping where a group lacks it
    computed = ("seq_reward", "seq_final_reward") if recipe else ("reward",)
    kl = recipe and metric == "seq_final_reward" and c.get("algorithm.use_kl_in_reward")
    if metric in FILTER_METRICS and not kl:
        notes = [("verl's dapo reward manager takes a reward function's plain-number result as its acc; rlforge's acc "
                  "is then result >= 1") if metric == "acc" and c.reward_manager == "dapo" else ""]
        if metric in FILTER_METRICS_COMPUTED and metric not in computed:
            notes.append(f"verl's {'DAPO recipe trainer' if recipe else 'main_ppo'} looks {metric!r} up in the reward "
                         f"function's extra info and stops where it is missing; rlforge filters on the sequence reward "
                         f"(what {'main_ppo' if recipe else 'the DAPO recipe trainer'} computes for it)")
        c.map(f"{f}.metric", "algorithm.filter_metric", FILTER_METRICS[metric], joined(*notes))
    else:
        c.refuse(f"{f}.metric", "dynamic sampling on the KL-penalized reward (seq_final_reward with use_kl_in_reward)"
                 if kl else f"dynamic sampling on metric={metric} (rlforge's algorithm.filter_metric: reward, score, acc)")
    rounds = int(c.get(f"{f}.max_num_gen_batches") or 0)
    if not recipe:  # main_ppo's v1 replay buffer refills until the batch is full, one prompt at a time
        c.map(f"{f}.max_num_gen_batches", "algorithm.max_gen_batches", NO_LIMIT_ROUNDS,
              "verl 0.9.1's main_ppo ignores it and refills without a limit: 1000 rounds" if rounds > 0 else
              "no limit: 1000 rounds")
        if "data.gen_batch_size" in c.owned:
            c.ignore("data.gen_batch_size", "verl 0.9.1's main_ppo draws prompts one at a time with dynamic sampling "
                     "(it sets gen_batch_size to 1); rlforge draws data.train_batch_size per round until enough groups "
                     "are kept: the same groups are trained")
    else:
        train, gen = c.get("data.train_batch_size"), c.get("data.gen_batch_size")
        same = not (gen and train and gen != train)
        # rlforge draws data.train_batch_size prompts per round: the same number of prompts at most as verl's rounds
        limit = NO_LIMIT_ROUNDS if rounds <= 0 else rounds if same else -(-rounds * gen // train)
        note = "" if same else (f"verl draws data.gen_batch_size={gen} prompts per round; rlforge draws "
                                f"data.train_batch_size={train} per round and stops when enough groups are kept"
                                + ("" if rounds <= 0 else f": at most {limit} rounds, the {rounds * gen} prompts of "
                                   f"verl's {rounds}"))
        if 0 < rounds * (gen or train) < train:  # fewer prompts in all the rounds than groups in a batch
            c.refuse(f"{f}.max_num_gen_batches", f"filling a batch from fewer prompts than it holds "
                     f"(max_num_gen_batches={rounds} rounds of data.gen_batch_size={gen} prompts for "
                     f"data.train_batch_size={train} groups: verl's DAPO recipe stops with an error at its first step "
                     f"too)")
        c.map(f"{f}.max_num_gen_batches", "algorithm.max_gen_batches", limit,
              "verl's 0 (no limit) is 1000 rounds" if rounds <= 0 else "verl's DAPO recipe stops with an error when "
              "the rounds run out; rlforge trains the step on the groups it kept")
        if "data.gen_batch_size" in c.owned:
            (c.same("data.gen_batch_size", "data.train_batch_size") if same
             else c.map("data.gen_batch_size", "algorithm.max_gen_batches", limit, note))
    for key in keys:
        if key.endswith("max_inflight_gen_batches"):
            c.ignore(key, "generation prefetch (speed only)")


def rollout_correction(c: Context) -> None:
    """verl's rollout correction (IS weights, rejection): applied only with the engine's log-probs in the batch, and
    not in bypass mode (see ``verl_derived.algorithm``) except by the DAPO recipe's trainer, which does not read it."""
    skip = ("verl applies rollout correction only with the engine's log-probs (rollout.calculate_log_probs=True; "
            "this launch has it off)" if not c.get(f"{R}.calculate_log_probs") else
            "verl 0.9.1 skips rollout correction in bypass mode" if c.get(f"{RC}.bypass_mode")
            and c.trainer != "dapo" else "")
    targets = {"rollout_is": "algorithm.rollout_is", "rollout_is_threshold": "algorithm.rollout_is_threshold",
               "rollout_is_batch_normalize": "algorithm.rollout_is_batch_normalize",
               "rollout_rs": "algorithm.rollout_rs", "rollout_rs_threshold": "algorithm.rollout_rs_threshold"}
    no_is = c.get(f"{RC}.rollout_is_threshold") is None  # verl computes IS weights only with a threshold
    for key in c.owned:
        leaf, value = key[len(RC) + 1:], c.get(key)
        if leaf in ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize") and no_is and not skip:
            (c.map(key, "algorithm.rollout_is", None, "rollout_is_threshold=null: verl computes no IS weights")
             if leaf == "rollout_is" and value is not None else c.unread(key, "null: no IS weights"
                                                                        if leaf != "rollout_is_batch_normalize" else
                                                                        "read only with IS weights"))
        elif leaf in targets and skip:
            c.unread(key, skip)
        elif leaf in targets:  # thresholds: a number or a string of them ("0.5_2.0"); null: verl's default
            c.map(key, targets[leaf], str(value) if leaf.endswith("threshold") and value is not None else value)
        elif off(value):
            c.same(key, "")
        else:
            c.refuse(key, f"the rollout-correction option {key[len(RC) + 1:]}")


def weight_decay(c: Context) -> None:
    """``optim.weight_decay``: AdamW's decoupled decay of every parameter; megatron-core's optimizer skips biases and
    1-D weights (norms)."""
    megatron = c.get("model_engine") == "megatron"
    for key in c.owned:
        value = c.get(key)
        c.map(key, f"{'critic' if key.startswith('critic.') else 'actor'}.weight_decay", value,
              "megatron-core's optimizer does not decay biases and 1-D weights (norms); rlforge's AdamW decays every "
              "parameter" if megatron and value else "")


def loss_scale(c: Context) -> None:
    """``loss_scale_factor``: the divisor of each sequence's token sum with loss_agg_mode=seq-mean-token-sum-norm (the
    only mode that reads it); rlforge's algorithm.norm_length, one for the actor and the critic."""
    actor, critic = f"{A}.loss_scale_factor", "critic.loss_scale_factor"
    wide = ("verl 0.9.1's main_ppo divides by the longest response of each micro-batch (the width it pads to); "
            "rlforge by rollout.max_new_tokens (loss_scale_factor=<data.max_response_length> gives one constant in "
            "both)")
    if actor in c.owned:
        value = c.get(actor)
        if c.get(f"{A}.loss_agg_mode") != SUM_NORM:
            c.unread(actor, f"read only with loss_agg_mode={SUM_NORM}")
        else:
            c.map(actor, "algorithm.norm_length", non_negative(value), "" if value else wide)
    if critic in c.owned:
        value, mine = c.get(critic), c.get(actor) if c.get(f"{A}.loss_agg_mode") == SUM_NORM else None
        if c.get("critic.loss_agg_mode") != SUM_NORM:
            c.unread(critic, f"read only with critic.loss_agg_mode={SUM_NORM}")
        elif c.get(f"{A}.loss_agg_mode") != SUM_NORM:  # the actor's loss does not read algorithm.norm_length
            c.map(critic, "algorithm.norm_length", non_negative(value), "" if value else wide)
        elif value == mine:
            c.same(critic, f"algorithm.norm_length, the actor's" + ("" if value else f" ({wide})"))
        else:
            c.refuse(critic, f"a value-loss length normalization ({value}) other than the actor's ({mine}; rlforge's "
                             f"algorithm.norm_length is one for both)")
