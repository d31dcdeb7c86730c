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

``STUBS`` is a folder with a ``ray`` package that defines ``ObjectRef`` (verl's protocol module names
``ray.ObjectRef`` at import; nothing here uses Ray). The SPPO recipe (verl-recipe, not in the wheel) is read from its
files: its ``softmean`` and ``compute_sppo_loss`` are compiled from the recipe's source and run, nothing is copied.
The PRIME recipe likewise (``prime_core_algos.py``'s ``compute_rloo_advantage_return``, ``compute_ce_dpo_loss_rm``,
``compute_dpo_accuracy``; ``prime_dp_rm.py``'s ``prime_norm`` method, whose module needs flash-attn to import: only the
method is compiled). The PRIME files were taken from verl's repository at the commit before the recipes moved out
(2bb42bae6^, ``recipe/prime/``).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sppo-recipe", type=Path, help="verl-recipe's sppo/ folder: writes data/verl_vectors.json")
    parser.add_argument("--prime-recipe", type=Path, help="the prime/ recipe folder: writes data/verl_prime_vectors.json")
    args = parser.parse_args()
    import verl

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
