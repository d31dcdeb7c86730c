"""verl 0.9's on-policy distillation (``distillation.*``) as rlforge's ``--algo opd`` (algorithms/distill.py).

verl adds a teacher's distillation loss to any estimator; rlforge's ``opd`` is GRPO with it, so a launch on
``adv_estimator=grpo`` maps and one on another estimator is refused naming it. Several teachers routed by
``distillation.teacher_key`` (MOPD) map to ``algorithm.teacher.routes`` and ``route_by``. The estimator losses (``k1``/``kl``, ``abs``,
``k2``/``mse``, ``k3``/``low_var_kl``) and the top-k loss ``forward_kl_topk`` (with ``topk`` and
``log_prob_min_clamp``) map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlforge.errors import ConfigError

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

D, L = "distillation", "distillation.distillation_loss"
ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # verl's estimator losses: kl_penalty's names
TOPK = ("forward_kl_topk",)  # verl 0.9.1's loss over the teacher's top-k tokens
DEFAULT = "teacher_model"  # verl's default teacher entry
PLACEMENT = ("the teacher's devices and inference engine (rlforge's teacher is a forward pass of the Hugging Face "
             "model on ranks of the teacher role: algorithm.teacher.num_workers, .device, .batch_size); what is "
             "computed does not change")


def teachers(c: Context) -> dict[str, str]:
    """The teacher entries verl uses, ``name -> model_path`` (None where an entry has none): ``teacher_models``'
    entries, without the default ``teacher_model`` when the launch names others (verl pops it then, even when it has
    a model_path)."""
    prefix = f"{D}.teacher_models."
    names = sorted({k[len(prefix):].split(".", 1)[0] for k in c.owned if k.startswith(prefix)})
    if len(names) > 1 and DEFAULT in names:
        names.remove(DEFAULT)
    return {n: c.get(f"{prefix}{n}.model_path") for n in names}


def distillation(c: Context) -> None:
    """On-policy distillation: ``enabled`` picks ``--algo opd`` (on GRPO); the loss keys and the teachers (one path,
    or several routed by teacher_key) map, the teachers' placement and inference engines are ignored, and the rest is
    read only when enabled. A launch verl itself refuses (a teacher entry without model_path or key, two with one key)
    is an error."""
    if not c.get(f"{D}.enabled"):
        c.same(f"{D}.enabled", "no teacher")
        for key in c.owned:
            c.unread(key, "read only with distillation.enabled")
        return
    found = teachers(c)
    if c.algorithm != "grpo":
        c.refuse(f"{D}.enabled", f"on-policy distillation on adv_estimator={c.get('algorithm.adv_estimator')} "
                                 f"(rlforge's --algo opd is GRPO with a teacher)")
        for key in c.owned:
            c.unread(key, "read only by on-policy distillation (refused: distillation.enabled)")
        return
    if not found:
        raise ConfigError(f"distillation.enabled=True, but {D}.teacher_models has no entry: name a teacher "
                          f"({D}.teacher_models.{DEFAULT}.model_path, or +{D}.teacher_models.<name>.key/.model_path); "
                          f"verl 0.9.1 has none to distil from either.")
    missing = [n for n, path in found.items() if not path]
    if missing:  # verl's DistillationTeacherModelConfig.check_configured
        raise ConfigError(f"distillation.enabled=True, but {D}.teacher_models.{missing[0]}.model_path is unset: "
                          f"every teacher entry verl uses needs one (verl 0.9.1 raises for it too, 'model_path must "
                          f"be specified'). Name the teacher's model there.")
    c.map(f"{D}.enabled", "--algo", "opd")
    c.algorithm = "opd"
    routed(c, found)
    mode = c.get(f"{L}.loss_mode")
    if mode == "k1" and not c.get(f"{L}.use_policy_gradient"):  # verl's DistillationLossConfig.__post_init__
        raise ConfigError(f"{L}.loss_mode=k1 with use_policy_gradient=False: verl 0.9.1 refuses it too (as a direct "
                          f"loss its gradient does not depend on the teacher). Set use_policy_gradient=True, or "
                          f"loss_mode=k3.")
    if mode in TOPK and c.get("model_engine") == "megatron":
        c.refuse(f"{L}.loss_mode", f"the top-k distillation loss {mode} on the megatron engine (rlforge computes it "
                                   f"with the single and fsdp strategies)")
    elif mode == "kl" and not c.get(f"{L}.use_policy_gradient"):
        c.refuse(f"{L}.loss_mode", "loss_mode=kl as a direct loss (use_policy_gradient=False): its gradient does not "
                                   "depend on the teacher (verl 0.9.1 refuses it under the name k1 only)")
    elif mode in ESTIMATORS or mode in TOPK:
        c.map(f"{L}.loss_mode", "algorithm.distill.loss_mode", mode)
    else:
        c.refuse(f"{L}.loss_mode", f"distillation loss_mode={mode}, which verl 0.9.1 does not have either (its "
                                   f"estimators: {', '.join(ESTIMATORS)}; its top-k loss: {', '.join(TOPK)})")
    for key, ours in ((f"{L}.topk", "algorithm.distill.topk"),
                      (f"{L}.log_prob_min_clamp", "algorithm.distill.log_prob_min_clamp")):
        if mode in TOPK:
            c.map(key, ours, c.get(key))
        else:
            c.unread(key, "read only by the top-k loss (loss_mode=forward_kl_topk)")
    for key in (f"{L}.use_chunked_topk", f"{L}.chunked_topk_chunk_size"):
        c.ignore(key, "how verl computes the top-k loss's log-softmax (memory only); rlforge always computes it in "
                      "chunks, recomputed in the backward pass")
    task, pg = bool(c.get(f"{L}.use_task_rewards")), bool(c.get(f"{L}.use_policy_gradient"))
    c.map(f"{L}.use_task_rewards", "algorithm.distill.use_task_rewards", task)
    c.map(f"{L}.use_policy_gradient", "algorithm.distill.use_policy_gradient", pg)
    c.map(f"{L}.loss_max_clamp", "algorithm.distill.loss_max_clamp", c.get(f"{L}.loss_max_clamp"))
    if task:
        c.map(f"{L}.distillation_loss_coef", "algorithm.distill.distillation_loss_coef",
              c.get(f"{L}.distillation_loss_coef"))
    else:
        c.unread(f"{L}.distillation_loss_coef", "read only with use_task_rewards (the distillation loss alone has "
                                                "weight 1)")
    policy_gradient(c, pg)
    prefix = f"{D}.teacher_models."
    for key in c.owned:  # the rest of the teacher entries, and the teacher pool
        if key.startswith(f"{prefix}{DEFAULT}.") and DEFAULT not in found:
            c.unread(key, f"verl drops its default entry {DEFAULT} when a launch names other teachers (its "
                          f"distillation.yaml says so)")
        elif key.startswith(prefix) or key in (f"{D}.n_gpus_per_node", f"{D}.nnodes"):
            c.ignore(key, PLACEMENT)


def routed(c: Context, found: dict[str, str]) -> None:
    """One teacher: its model_path is ``algorithm.teacher.path`` and every sample goes to it (its key and
    ``teacher_key`` are not read). Several (MOPD): ``algorithm.teacher.routes`` maps each entry's ``key`` to its
    model_path, and ``teacher_key`` is ``algorithm.teacher.route_by`` (rlforge's rows keep data_source and
    extra_info; another dataset column is refused)."""
    prefix = f"{D}.teacher_models."
    keys = {name: c.get(f"{prefix}{name}.key") for name in found}
    unnamed = [n for n, k in keys.items() if k is None and n != DEFAULT]  # verl names its default entry "default"
    if unnamed:
        raise ConfigError(f"{prefix}{unnamed[0]}.key is unset: verl routes samples to its teacher entries by key "
                          f"(distillation.teacher_key) and 0.9.1 raises for an entry without one, 'key must be "
                          f"specified', even for a single entry besides the default {DEFAULT}.")
    if len(found) == 1:
        name, path = next(iter(found.items()))
        c.map(f"{prefix}{name}.model_path", "algorithm.teacher.path", path)
        c.unread(f"{prefix}{name}.key", "one teacher: every sample goes to it (verl routes by key only with several)")
        c.unread(f"{D}.teacher_key", "one teacher: every sample goes to it")
        return
    by_text: dict[str, str] = {}
    for name, key in keys.items():
        if str(key) == "":
            c.refuse(f"{prefix}{name}.key", "a teacher for the rows whose data_source is empty (rlforge's routes "
                                            "need a non-empty key)")
        if str(key) in by_text:
            raise ConfigError(f"{prefix}{by_text[str(key)]}.key and {prefix}{name}.key are both {str(key)!r}: "
                              f"each teacher needs a key of its own (verl 0.9.1 raises for it too, 'Duplicate "
                              f"teacher key').")
        by_text[str(key)] = name
    routes = {str(keys[name]): found[name] for name in found}
    for name in found:
        c.map(f"{prefix}{name}.model_path", "algorithm.teacher.routes", routes)
        c.map(f"{prefix}{name}.key", "algorithm.teacher.routes", routes, "the routing value of this entry's teacher")
    by = c.get(f"{D}.teacher_key")
    if by == "data_source":
        c.map(f"{D}.teacher_key", "algorithm.teacher.route_by", by)
    else:
        c.refuse(f"{D}.teacher_key", f"routing samples to teachers by the dataset column '{by}' (rlforge's rows keep "
                                     f"data_source and extra_info: algorithm.teacher.route_by=data_source or "
                                     f"extra_info.<name>)")


def policy_gradient(c: Context, pg: bool) -> None:
    """The PPO-clip term of ``use_policy_gradient``: verl's vanilla loss with the distillation section's clip ratios
    (``clip_ratio_low``/``high``, each ``clip_ratio`` where null) and its dual clip 3.0."""
    keys = [f"{L}.{k}" for k in ("policy_loss_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high")]
    mode = c.get(f"{L}.policy_loss_mode")
    if mode != "vanilla":  # verl 0.9.1's DistillationLossConfig raises for it, policy gradient or not
        c.refuse(f"{L}.policy_loss_mode", f"policy_loss_mode={mode} for the distillation term, which verl 0.9.1 "
                                          f"refuses too (only vanilla: PPO clip, what rlforge's opd uses)")
        keys.remove(f"{L}.policy_loss_mode")
    if not pg:
        for key in keys:
            c.unread(key, "read only with use_policy_gradient")
        return
    if mode == "vanilla":
        c.same(f"{L}.policy_loss_mode", "PPO clip with dual clip 3.0 (verl's vanilla)")
    ratio = c.get(f"{L}.clip_ratio")
    for side in ("low", "high"):
        value = c.get(f"{L}.clip_ratio_{side}")
        c.map(f"{L}.clip_ratio_{side}", f"algorithm.distill.clip_ratio_{side}", ratio if value is None else value)
    if c.get(f"{L}.clip_ratio_low") is not None and c.get(f"{L}.clip_ratio_high") is not None:
        c.unread(f"{L}.clip_ratio", "clip_ratio_low and clip_ratio_high are both set (verl reads clip_ratio only for a "
                                    "null one)")
    else:
        c.same(f"{L}.clip_ratio", "the clip ratio of the null side")
