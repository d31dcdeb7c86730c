"""Regenerate tests/algorithms/data/verl_vectors.json: verl 0.9.1's own policy losses and estimators run on fixed
random inputs (the values rlforge's functions are tested against in test_verl_vectors.py).

verl is not a dependency of rlforge: run this in a throwaway environment, outside the repository, e.g.

    python3 -m venv /tmp/verlenv
    /tmp/verlenv/bin/pip install torch==2.13.0 numpy omegaconf packaging tensordict transformers codetiming orjson
    /tmp/verlenv/bin/pip download verl==0.9.1 --no-deps -d /tmp/verlpkg   # then unzip the wheel into /tmp/verlpkg/src
    PYTHONPATH=/tmp/verlpkg/src:STUBS /tmp/verlenv/bin/python tests/algorithms/gen_verl_vectors.py \\
        --sppo-recipe PATH/verl-recipe/sppo
    PYTHONPATH=/tmp/verlpkg/src:STUBS /tmp/verlenv/bin/python tests/algorithms/gen_verl_vectors.py \\
        --prime-recipe PATH/verl-recipe/prime   # writes data/verl_prime_vectors.json only
    /tmp/verlenv/bin/pip install datasets pillow   # verl.trainer.distillation imports verl's dataset module
    PYTHONPATH=/tmp/verlpkg/src:STUBS /tmp/verlenv/bin/python tests/algorithms/gen_verl_vectors.py \\
        --distill   # writes data/verl_distill_vectors.json only

``STUBS`` is a folder with a ``ray`` package that defines ``ObjectRef`` (verl's protocol module names
``ray.ObjectRef`` at import; nothing here uses Ray). The SPPO recipe (verl-recipe, not in the wheel) is read from its
files: its ``softmean`` and ``compute_sppo_loss`` are compiled from the recipe's source and run, nothing is copied.
The PRIME recipe likewise (``prime_core_algos.py``'s ``compute_rloo_advantage_return``, ``compute_ce_dpo_loss_rm``,
``compute_dpo_accuracy``; ``prime_dp_rm.py``'s ``prime_norm`` method, whose module needs flash-attn to import: only the
method is compiled). The PRIME files were taken from verl's repository at the commit before the recipes moved out
(2bb42bae6^, ``recipe/prime/``).

``--distill`` runs verl's on-policy distillation losses (nothing needs a recipe): the FSDP logits processor's
``verl.trainer.distillation.fsdp.losses.compute_forward_kl_topk`` (teacher top-k log-probs and ids as jagged nested
tensors in verl's packed no-padding layout; its per-token outputs are read back with verl's ``no_padding_2_padding``),
and ``verl.trainer.distillation.losses.distillation_loss`` (through the registered ``forward_kl_topk`` and
``compute_distillation_loss_reverse_kl_estimator``, the ``loss_max_clamp``, and ``agg_loss`` or the vanilla policy
loss), with verl's own ``ActorConfig``, ``DistillationConfig`` and ``DistillationLossConfig``.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parent / "data" / "verl_vectors.json"
PRIME_OUT = OUT.with_name("verl_prime_vectors.json")
B, R = 4, 6
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
ACTOR_KEYS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")  # options that are actor keys in verl too


def _list(x: torch.Tensor) -> Any:
    """Nested lists of floats rounded to 12 significant digits (the tests compare to 1e-9)."""
    values = x.detach().double()
    return [_list(v) for v in values] if values.dim() else float(f"{float(values):.12g}")


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    """The inputs of the policy-loss and SPPO cases (stored once per seed under "inputs"): old/new log-probs of probabilities in (0.05, 0.95), per-token advantages, a mask with different lengths (and
    one hole), IS weights; float64."""
    g = torch.Generator().manual_seed(seed)
    old = torch.empty(B, R, dtype=torch.float64).uniform_(0.05, 0.95, generator=g).log()
    new = (old + 0.4 * torch.randn(B, R, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, R, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]],
                        dtype=torch.float64)
    weights = torch.empty(B, R, dtype=torch.float64).uniform_(0.5, 1.8, generator=g)
    return {"old": old, "new": new, "adv": adv, "mask": mask, "weights": weights}


def _actor_config(**policy_loss: Any) -> Any:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    options = dict(policy_loss)
    rc = options.pop("rollout_correction", None)
    actor = {"clip_ratio_low": CLIP_LOW, "clip_ratio_high": CLIP_HIGH}
    actor.update({k: options.pop(k) for k in ACTOR_KEYS if k in options})
    pl = PolicyLossConfig(**options, **({"rollout_correction": RolloutCorrectionConfig(**rc)} if rc else {}))
    return ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                       policy_loss=pl, **actor)


def _policy_loss_case(name: str, seed: int, agg: str, weighted: bool, options: dict[str, Any]) -> dict[str, Any]:
    from verl.trainer.ppo import core_algos

    x = _inputs(seed)
    new = x["new"].clone().requires_grad_(True)
    weights = x["weights"] if weighted else None
    torch.manual_seed(seed)  # clip_cov draws its tokens with torch.randperm
    loss, metrics = core_algos.get_policy_loss_fn(name)(x["old"], new, x["adv"], x["mask"], agg,
                                                        _actor_config(**options), weights)
    loss.backward()
    return {"loss_mode": name, "seed": seed, "loss_agg_mode": agg, "weighted": weighted, "options": options,
            "loss": loss.item(), "grad": _list(new.grad),
            "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) or torch.is_tensor(v)}}


WEIGHTED = {"vanilla", "gspo", "geo_mean", "sapo", "dppo_kl"}  # also run with rollout-correction weights (seed 1)


def policy_losses() -> list[dict[str, Any]]:
    cases = []
    for seed, weighted in ((0, False), (1, True)):
        for name, agg, options in (
            ("vanilla", "token-mean", {}),
            ("vanilla", "seq-mean-token-sum", {}),
            ("gspo", "seq-mean-token-mean", {}),
            ("gspo", "token-mean", {}),
            ("gpg", "token-mean", {}),
            ("cispo", "token-mean", {}),
            ("sapo", "token-mean", {}),  # verl aggregates SAPO per sequence whatever the mode
            ("clip_cov", "token-mean", {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0, "clip_cov_ub": 5.0}),
            ("kl_cov", "token-mean", {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.1}),
            ("geo_mean", "token-mean", {}),
            ("dppo_tv", "token-mean", {}),
            ("dppo_kl", "token-mean", {}),
            # tight trust regions and truncation, so that tokens leave them
            ("dppo_tv", "token-mean", {"clip_ratio_low": 0.03, "clip_ratio_high": 0.05, "clip_ratio_c": 1.2}),
            ("dppo_kl", "token-mean", {"clip_ratio_low": 0.005, "clip_ratio_high": 0.01, "clip_ratio_c": 1.2}),
            ("vanilla", "token-mean", {"clip_ratio_c": 1.3}),  # the dual clip acts
            ("dro", "token-mean", {"dro_beta": 0.5}),
        ):
            if name in WEIGHTED or not weighted:
                cases.append(_policy_loss_case(name, seed, agg, weighted, options))
    for seed, rc in (
        (2, {"loss_type": "ppo_clip", "rollout_is": "token", "rollout_rs": "token_k3", "rollout_rs_threshold": 0.05}),
        (3, {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_rs": "seq_mean_k1",
             "rollout_rs_threshold": "0.8_1.25"}),
        (4, {"loss_type": "reinforce", "rollout_is": "sequence", "rollout_is_threshold": 2.0}),
    ):
        cases.append(_policy_loss_case("bypass_mode", seed, "token-mean", False,
                                       {"rollout_correction": {"bypass_mode": True, **rc}}))
    return cases


def _groups_batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, r = 7, 6
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.float64)
    rewards = torch.zeros(n, r, dtype=torch.float64)
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(n), last] = torch.randint(0, 2, (n,), generator=g).double()
    rewards[:, 0] += 0.1 * torch.randn(n, generator=g, dtype=torch.float64)  # a shaping reward early in the row
    old = torch.empty(n, r, dtype=torch.float64).uniform_(0.05, 0.95, generator=g).log()
    pi = old.exp()  # the other tokens' mass 1 - pi spread unevenly: pi^2 <= sum_v pi_v^2 <= pi^2 + (1 - pi)^2
    spp = pi.square() + (1 - pi).square() * torch.empty(n, r, dtype=torch.float64).uniform_(0.05, 1.0, generator=g)
    weights = torch.empty(n, r, dtype=torch.float64).uniform_(0.5, 1.5, generator=g)
    return {"rewards": rewards, "mask": mask, "old": old, "sum_pi_squared": spp, "weights": weights}


UIDS = ["a", "a", "a", "b", "b", "c", "b"]  # group c is a singleton; group a's longest row is unique


def estimators() -> dict[str, Any]:
    import numpy as np
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    inputs, cases = {}, []
    index = np.array(UIDS, dtype=object)
    for seed, weighted in ((0, False), (1, True)):
        x = _groups_batch(seed)
        inputs[str(seed)] = {**{k: _list(v) for k, v in x.items()}, "multi_turn_mask": _list(_multi_turn(x["mask"]))}
        for name, fn, multi_turn in (
            ("optimal_token_baseline", core_algos.compute_optimal_token_baseline_advantage, False),
            ("tir_optimal_token_baseline", core_algos.compute_multi_turn_optimal_token_baseline_advantage, True),
        ):
            mask = _multi_turn(x["mask"]) if multi_turn else x["mask"]
            adv, ret = fn(x["rewards"], mask, index, x["old"], x["sum_pi_squared"],
                          x["weights"] if weighted else None)
            cases.append({"estimator": name, "seed": seed, "weighted": weighted, "multi_turn": multi_turn,
                          "advantages": _list(adv), "returns": _list(ret)})
    # GDPO: two reward components written as compute_score's extra keys
    g = torch.Generator().manual_seed(5)
    x = _groups_batch(5)
    fmt = torch.randint(0, 2, (len(UIDS),), generator=g).double()
    acc = torch.randint(0, 2, (len(UIDS),), generator=g).double()
    inputs["gdpo"] = {"rewards": _list(x["rewards"]), "mask": _list(x["mask"]), "format": _list(fmt),
                      "correct": _list(acc)}
    prompt_len = 3
    attention = torch.cat([torch.ones(len(UIDS), prompt_len), x["mask"]], 1).long()
    for weights in (None, [1.0, 0.5]):
        cfg = OmegaConf.create({"gdpo_reward_keys": ["format", "correct"], "gdpo_reward_weights": weights})
        adv, _ = core_algos.compute_gdpo_outcome_advantage(
            x["rewards"], x["mask"], index, config=cfg,
            non_tensor_batch={"format": fmt.numpy(), "correct": acc.numpy()},
            batch={"prompts": torch.zeros(len(UIDS), prompt_len), "attention_mask": attention})
        cases.append({"estimator": "gdpo", "weights": weights, "advantages": _list(adv)})
    return {"uids": UIDS, "inputs": inputs, "cases": cases}


def _multi_turn(mask: torch.Tensor) -> torch.Tensor:
    """Tool output inside some responses (holes), and one response with no model token at all."""
    m = mask.clone()
    m[0, 1] = 0
    m[2, 2:4] = 0
    m[6, 1] = 0
    m[4] = 0
    return m


def pf_ppo() -> list[dict[str, Any]]:
    from verl import DataProto
    from verl.trainer.ppo import core_algos

    scores = torch.tensor([0.0, 1.0, 0.5, 1.0, -1.0, 0.25, 0.0, -1.0], dtype=torch.float64)
    cases = []
    for method, power in (("pow", 2.0), ("pow", 0.0), ("max_min", 2.0), ("max_random", 2.0)):
        tls = torch.zeros(len(scores), 3, dtype=torch.float64)
        tls[:, -1] = scores
        data = DataProto.from_dict(tensors={"token_level_scores": tls, "row": torch.arange(len(scores))})
        torch.manual_seed(11)
        out = core_algos.compute_pf_ppo_reweight_data(data, method, power)
        cases.append({"reweight_method": method, "weight_pow": power, "seed": 11, "scores": _list(scores),
                      "rows": out.batch["row"].tolist()})
    return cases


def _recipe_functions(path: Path, functions: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The named top-level functions (or ``Class.method``) of the recipe's files, compiled from their source."""
    import verl
    import verl.utils.torch_functional as verl_F

    namespace: dict[str, Any] = {"torch": torch, "verl_F": verl_F, "verl": verl}
    for file, name in functions:
        body = ast.parse((path / file).read_text()).body
        owner, _, method = name.rpartition(".")
        if owner:
            body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == owner).body
        node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == (method or name))
        exec(compile(ast.Module([node], type_ignores=[]), str(path / file), "exec"), namespace)
    return namespace


def prime(recipe: Path) -> dict[str, Any]:
    """PRIME's advantage (both sources and each alone), outcome BCE, pairwise accuracy and batch norm on 2 groups of
    4 samples with right-padded responses of different lengths."""
    from omegaconf import OmegaConf
    from verl import DataProto

    fns = _recipe_functions(recipe, (("prime_core_algos.py", "compute_rloo_advantage_return"),
                                     ("prime_core_algos.py", "compute_ce_dpo_loss_rm"),
                                     ("prime_core_algos.py", "compute_dpo_accuracy"),
                                     ("prime_dp_rm.py", "DataParallelPRIMERewardModel.prime_norm")))
    g = torch.Generator().manual_seed(5)
    n, rows, resp, prompt = 4, 8, 6, 3
    lengths = torch.tensor([6, 3, 1, 4, 5, 2, 6, 3])
    mask = (torch.arange(resp).unsqueeze(0) < lengths.unsqueeze(1)).long()  # verl's masks are int64
    scores = torch.randn(rows, resp, generator=g) * mask
    acc = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    attention = torch.cat([torch.ones(rows, prompt, dtype=torch.long), mask], dim=1)
    data = DataProto.from_dict(tensors={"rm_scores": scores, "acc": acc, "prompts": torch.ones(rows, prompt, dtype=torch.long),
                                        "attention_mask": attention})
    cases = []
    for dpo, gt in ((5.0, 5.0), (0.0, 5.0), (5.0, 0.0), (2.0, 3.0)):
        config = OmegaConf.create({"algorithm": {"reward_dpo_coef": dpo, "reward_gt_coef": gt}})
        adv, ret = fns["compute_rloo_advantage_return"](data, mask, n, config)
        cases.append({"dpo_coef": dpo, "gt_coef": gt, "advantages": _list(adv), "returns": _list(ret)})
    beta = 0.05
    bce = fns["compute_ce_dpo_loss_rm"](scores, acc, mask, beta)
    pairwise = fns["compute_dpo_accuracy"](scores, acc, mask, n)

    class _RM:  # the prime_norm method's self
        config = OmegaConf.create({"prime_norm": "batch_norm"})

    normed = fns["prime_norm"](_RM(), scores)
    return {"n": n, "mask": _list(mask), "scores": _list(scores), "acc": _list(acc), "advantage": cases,
            "beta": beta, "bce": bce.item(), "pairwise_acc": pairwise.item(), "batch_norm": _list(normed)}


def sppo(recipe: Path) -> list[dict[str, Any]]:
    fns = _recipe_functions(recipe, (("sppo_ray_trainer.py", "softmean"), ("dp_actor.py", "compute_sppo_loss")))
    cases = []
    for seed, beta, eta in ((0, 1.0, 1.0), (1, 0.0, 1.0), (2, 2.0, 0.5)):
        x = _inputs(seed)
        rewards = torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
        centred = rewards - fns["softmean"](rewards, beta, keepdim=True)
        new = x["new"].clone().requires_grad_(True)
        loss, _, _ = fns["compute_sppo_loss"](x["old"], new, centred, x["mask"], eta, "token-mean")
        loss.backward()
        cases.append({"seed": seed, "softmean_beta": beta, "eta": eta, "rewards": _list(rewards),
                      "seq_level_rewards": _list(centred),
                      "loss": loss.item(), "grad": _list(new.grad)})
    return cases


# --- on-policy distillation (--distill: data/verl_distill_vectors.json) ----------------------------------------------

DISTILL_OUT = OUT.with_name("verl_distill_vectors.json")
PROMPT_LENS = (2, 3, 1, 2)  # verl's no-padding layout: every row's prompt and response tokens, packed
RESPONSE_LENS = (6, 3, 5, 4)  # B rows, R = 6 (right padding)
VOCAB, TOPK = 12, 4
DISTILL_CLIP = (0.2, 0.28)  # DistillationLossConfig's clip_ratio_low/high; its vanilla loss reads no clip_ratio_c: 3.0


def _response_mask(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return (torch.arange(R)[None] < torch.tensor(RESPONSE_LENS)[:, None]).to(dtype)


def _packed(padded: torch.Tensor, fill: torch.Tensor) -> Any:
    """``padded`` ([B, R, *], the response tokens' values) in verl's packed no-padding layout, a jagged nested tensor
    over the rows' prompt + response positions: response token j of row i sits at the position that predicts it
    (``offset_i + prompt_len_i - 1 + j``, what ``no_padding_2_padding`` reads back); ``fill`` ([total_nnz, *]) holds
    the other positions. Differentiable in ``padded``."""
    lengths = torch.tensor(PROMPT_LENS) + torch.tensor(RESPONSE_LENS)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    rows, cols = _response_mask().nonzero(as_tuple=True)
    positions = offsets[rows] + torch.tensor(PROMPT_LENS)[rows] - 1 + cols
    values = fill.to(padded.dtype).index_put((positions,), padded[rows, cols])
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _distill_batch(**tensors: Any) -> Any:
    """A micro-batch TensorDict as verl's distillation loss reads it (nested prompts/responses/response_mask, dp_size 1,
    this micro-batch's own token and sequence counts)."""
    import verl.utils.tensordict_utils as tu

    def jagged(lengths: tuple[int, ...]) -> torch.Tensor:
        return torch.nested.nested_tensor([torch.ones(n, dtype=torch.long) for n in lengths], layout=torch.jagged)

    base = {"prompts": jagged(PROMPT_LENS), "responses": jagged(RESPONSE_LENS), "response_mask": jagged(RESPONSE_LENS)}
    return tu.get_tensordict({**base, **tensors}, non_tensor_dict={
        "dp_size": 1, "batch_num_tokens": sum(RESPONSE_LENS), "global_batch_size": B})


def _distill_configs(loss_mode: str, agg: str = "token-mean", **loss: Any) -> tuple[Any, Any]:
    from verl.workers.config import ActorConfig, DistillationConfig, DistillationLossConfig

    loss_config = DistillationLossConfig(loss_mode=loss_mode, clip_ratio_low=DISTILL_CLIP[0],
                                         clip_ratio_high=DISTILL_CLIP[1], **loss)
    actor = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                        loss_agg_mode=agg)
    return actor, DistillationConfig(enabled=False, distillation_loss=loss_config)


def _nnz() -> int:
    return sum(PROMPT_LENS) + sum(RESPONSE_LENS)


def _distill_inputs(seed: int) -> dict[str, torch.Tensor]:
    """Sampled-token log-probs [B, R] of student (``new``), rollout policy (``old``), teacher, and IS weights; float64.
    The teacher is far enough off for the clamps to act."""
    g = torch.Generator().manual_seed(seed)
    old = torch.empty(B, R, dtype=torch.float64).uniform_(0.05, 0.95, generator=g).log()
    new = (old + 0.4 * torch.randn(B, R, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    teacher = (new + 1.2 * torch.randn(B, R, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    weights = torch.empty(B, R, dtype=torch.float64).uniform_(0.5, 1.8, generator=g)
    return {"old": old, "new": new, "teacher": teacher, "weights": weights}


def _estimator_case(seed: int, loss_mode: str, clamp: float | None, pg: bool, weighted: bool = False,
                    agg: str = "token-mean") -> dict[str, Any]:
    """verl.trainer.distillation.losses.distillation_loss with an estimator loss_mode (through the registered
    compute_distillation_loss_reverse_kl_estimator, the loss_max_clamp, and the vanilla policy loss or agg_loss)."""
    from verl.trainer.distillation import losses

    x = _distill_inputs(seed)
    g = torch.Generator().manual_seed(100 + seed)
    fill = torch.randn(_nnz(), generator=g, dtype=torch.float64) - 2.0  # prompt positions (read by nobody)
    new = x["new"].clone().requires_grad_(True)
    tensors = {"teacher_logprobs": _packed(x["teacher"].unsqueeze(-1), fill.unsqueeze(-1)),
               "old_log_probs": x["old"]}
    if weighted:
        tensors["rollout_is_weights"] = x["weights"]
    data = _distill_batch(**tensors)
    actor, distill = _distill_configs(loss_mode, agg, loss_max_clamp=clamp, use_policy_gradient=pg)
    loss, metrics = losses.distillation_loss(actor, distill, {"log_probs": _packed(new, fill)}, data)
    loss.backward()
    per_token, _ = losses.compute_distillation_loss_reverse_kl_estimator(
        actor, distill, {"log_probs": _packed(x["new"], fill)}, data)
    return {"seed": seed, "loss_mode": loss_mode, "loss_max_clamp": clamp, "use_policy_gradient": pg,
            "weighted": weighted, "loss_agg_mode": agg, "distillation_losses": _list(per_token),
            "loss": loss.item(), "grad": _list(new.grad), "metrics": _metrics(metrics)}


def _metrics(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        v = v.aggregate() if hasattr(v, "aggregate") else v  # verl's Metric(aggregation, value)
        if isinstance(v, (int, float)) or torch.is_tensor(v):
            out[k] = float(v)
    return out


def _topk_inputs(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Student logits [B, R, V] and the teacher's top-K log-probs and ids [B, R, K] of a teacher whose logits range
    from close to the student's to opposite (row 0's first token: exactly opposite, so the top-Ks are disjoint)."""
    g = torch.Generator().manual_seed(seed)
    student = 2.0 * torch.randn(B, R, VOCAB, generator=g, dtype=torch.float64)
    mix = torch.empty(B, R, 1, dtype=torch.float64).uniform_(-0.5, 1.0, generator=g)
    teacher = mix * student + 2.0 * (1 - mix.abs()) * torch.randn(B, R, VOCAB, generator=g, dtype=torch.float64)
    teacher[0, 0] = -student[0, 0]
    top = torch.log_softmax(teacher, -1).topk(TOPK, -1)
    sampled = torch.log_softmax(student, -1)[..., 0]  # the sampled tokens' log-probs (for the policy-gradient form)
    old = sampled + 0.3 * torch.randn(B, R, generator=g, dtype=torch.float64)
    return {"student_logits": student.to(dtype), "teacher_topk_log_probs": top.values.to(dtype),
            "teacher_topk_ids": top.indices, "new": sampled.to(dtype), "old": old.to(dtype)}


def _topk_case(seed: int, dtype: torch.dtype, min_clamp: float | None, max_clamp: float | None, pg: bool = False
               ) -> dict[str, Any]:
    """verl.trainer.distillation.fsdp.losses.compute_forward_kl_topk on the packed logits (as the FSDP engine's logits
    processor calls it; its (1, total_nnz) outputs made nested per row as prepare_model_outputs does), then
    verl.trainer.distillation.losses.distillation_loss with loss_mode forward_kl_topk (the registered
    compute_forward_kl_topk's clamp at 0, loss_max_clamp, agg_loss or the vanilla policy loss)."""
    from verl.trainer.distillation import losses
    from verl.trainer.distillation.fsdp import losses as fsdp_losses
    from verl.workers.utils.padding import no_padding_2_padding

    x = _topk_inputs(seed, dtype)
    g = torch.Generator().manual_seed(200 + seed)
    n = _nnz()
    fill_logits = 2.0 * torch.randn(n, VOCAB, generator=g, dtype=torch.float64)
    fill_top = torch.log_softmax(2.0 * torch.randn(n, VOCAB, generator=g, dtype=torch.float64), -1).topk(TOPK, -1)
    fill_new = torch.randn(n, generator=g, dtype=torch.float64) - 2.0
    logits = x["student_logits"].clone().requires_grad_(True)
    new = x["new"].clone().requires_grad_(True)
    data = _distill_batch(teacher_logprobs=_packed(x["teacher_topk_log_probs"], fill_top.values),
                          teacher_ids=_packed(x["teacher_topk_ids"], fill_top.indices), old_log_probs=x["old"])
    actor, distill = _distill_configs("forward_kl_topk", loss_max_clamp=max_clamp, log_prob_min_clamp=min_clamp,
                                      topk=TOPK, use_policy_gradient=pg)
    packed_logits = _packed(logits, fill_logits).values().unsqueeze(0)  # (1, total_nnz, V)
    outputs = fsdp_losses.compute_forward_kl_topk(packed_logits, data["teacher_logprobs"], data["teacher_ids"],
                                                  distill, "thd")
    offsets = data["teacher_logprobs"].offsets()
    model_output = {k: torch.nested.nested_tensor_from_jagged(v.squeeze(0), offsets) for k, v in outputs.items()}
    model_output["log_probs"] = _packed(new, fill_new)
    loss, metrics = losses.distillation_loss(actor, distill, model_output, data)
    loss.backward()
    mask = _response_mask().bool()
    per_token = {k: _list(torch.where(mask, no_padding_2_padding(v, data).detach().double(), 0.0))
                 for k, v in model_output.items() if k != "log_probs"}
    return {"seed": seed, "dtype": str(dtype).removeprefix("torch."), "log_prob_min_clamp": min_clamp,
            "loss_max_clamp": max_clamp, "use_policy_gradient": pg, "loss_agg_mode": "token-mean", **per_token,
            "divergence_dtype": str(outputs["distillation_losses"].dtype).removeprefix("torch."),
            "loss": loss.item(), "grad_logits": None if pg else _list(logits.grad),  # the policy gradient detaches it
            "grad_log_probs": _list(new.grad) if pg else None, "metrics": _metrics(metrics)}


def distill() -> dict[str, Any]:
    estimator = [
        *(_estimator_case(0, mode, clamp, False) for mode in ("k3", "abs", "mse", "k2", "low_var_kl")
          for clamp in (None, 0.5)),
        *(_estimator_case(1, mode, clamp, True) for mode in ("k1", "k3") for clamp in (None, 0.5)),
        _estimator_case(2, "k1", 0.5, True, weighted=True),
        _estimator_case(2, "k3", None, False, weighted=True),  # the direct loss ignores the IS weights
        _estimator_case(3, "k1", None, True, agg="seq-mean-token-mean"),
        _estimator_case(3, "k3", 0.5, False, agg="seq-mean-token-mean"),
    ]
    topk = [_topk_case(seed, dtype, min_clamp, max_clamp)
            for seed, dtype in ((0, torch.float32), (1, torch.float64))
            for min_clamp, max_clamp in ((None, None), (-3.0, None), (-3.0, 0.3))]
    topk.append(_topk_case(2, torch.float32, -3.0, 0.3, pg=True))
    for case in topk:
        assert any(c == 0 for row in case["overlap_count"] for c in row), "a position with no overlap"
    return {"prompt_lens": PROMPT_LENS, "response_lens": RESPONSE_LENS, "clip_ratios": [*DISTILL_CLIP, 3.0],
            "estimator_inputs": {str(s): {k: _list(v) for k, v in _distill_inputs(s).items()} for s in range(4)},
            "estimator": estimator,
            "topk_inputs": {f"{s}-{d}": {k: (v.tolist() if not v.is_floating_point() else _list(v))
                                         for k, v in _topk_inputs(s, getattr(torch, d)).items()}
                            for s, d in ((0, "float32"), (1, "float64"), (2, "float32"))},
            "topk": topk}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sppo-recipe", type=Path, help="verl-recipe's sppo/ folder: writes data/verl_vectors.json")
    parser.add_argument("--prime-recipe", type=Path, help="the prime/ recipe folder: writes data/verl_prime_vectors.json")
    parser.add_argument("--distill", action="store_true", help="writes data/verl_distill_vectors.json")
    args = parser.parse_args()
    import verl

    if args.distill:
        data = {"verl_version": verl.__version__, **distill()}
        DISTILL_OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"wrote {DISTILL_OUT} ({DISTILL_OUT.stat().st_size} bytes)")
    if args.prime_recipe:
        PRIME_OUT.write_text(json.dumps({"verl_version": verl.__version__, **prime(args.prime_recipe)},
                                        separators=(",", ":")) + "\n")
        print(f"wrote {PRIME_OUT}")
    if not args.sppo_recipe:
        return

    data = {"verl_version": verl.__version__, "inputs": {str(s): {k: _list(v) for k, v in _inputs(s).items()}
                                                         for s in range(5)},
            "policy_losses": policy_losses(), "estimators": estimators(),
            "pf_ppo": pf_ppo(), "sppo": sppo(args.sppo_recipe)}
    assert all(math.isfinite(c["loss"]) for c in data["policy_losses"])
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
