"""rlforge's policy losses and estimators against verl 0.9.1's own functions, run on the same inputs.

The expected values (data/verl_vectors.json) were computed by verl's code in a throwaway environment
(gen_verl_vectors.py, which says how); this test needs no verl. Each policy-loss case goes through the registered
loss (``actor.policy_loss``) and ``agg_loss`` as ``PolicyGradientModule.policy_loss`` does; verl ran without
global batch counts, so the aggregation uses this micro-batch's own (``global_tokens=None``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlforge.algorithms import functional as F
from rlforge.config import compose
from rlforge.protocols import PolicyLossInputs

DATA = json.loads((Path(__file__).parent / "data" / "verl_vectors.json").read_text())
TOL = {"atol": 1e-9, "rtol": 1e-8}
CLIP = ["actor.clip_ratio_low=0.2", "actor.clip_ratio_high=0.28"]  # what gen_verl_vectors.py gave verl

# verl's option names -> rlforge's keys
OPTIONS = {
    "clip_cov_ratio": "actor.clip_cov.ratio", "clip_cov_lb": "actor.clip_cov.lb", "clip_cov_ub": "actor.clip_cov.ub",
    "kl_cov_ratio": "actor.kl_cov.ratio", "ppo_kl_coef": "actor.kl_cov.coef", "dro_beta": "actor.dro.beta",
    "clip_ratio_low": "actor.clip_ratio_low", "clip_ratio_high": "actor.clip_ratio_high",
    "clip_ratio_c": "actor.clip_ratio_c",
}
ROLLOUT_CORRECTION = {
    "loss_type": "actor.bypass_mode.loss_type", "rollout_is": "algorithm.rollout_is",
    "rollout_is_threshold": "algorithm.rollout_is_threshold", "rollout_rs": "algorithm.rollout_rs",
    "rollout_rs_threshold": "algorithm.rollout_rs_threshold",
}


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _overrides(case: dict) -> list[str]:
    out = [*CLIP, f"actor.policy_loss={case['loss_mode']}"]
    for key, value in case["options"].items():
        if key == "rollout_correction":
            out += [f"{ROLLOUT_CORRECTION[k]}={v}" for k, v in value.items() if k != "bypass_mode"]
        else:
            out.append(f"{OPTIONS[key]}={value}")
    return out


def _case_id(case: dict) -> str:
    options = "-".join(f"{k}={v}" for k, v in case["options"].items() if k != "rollout_correction")
    return (f"{case['loss_mode']}-{case['loss_agg_mode']}-seed{case['seed']}{'-weighted' if case['weighted'] else ''}"
            f"{'-' + options if options else ''}")


@pytest.mark.parametrize("case", DATA["policy_losses"], ids=_case_id)
def test_policy_loss_matches_verl(registry, case) -> None:
    cfg = compose(registry, None, None, _overrides(case))
    x = {k: _t(v) for k, v in DATA["inputs"][str(case["seed"])].items()}
    logp = x["new"].clone().requires_grad_(True)
    weights = x["weights"] if case["weighted"] else None
    torch.manual_seed(case["seed"])  # clip_cov draws its tokens with torch.randperm, as verl's does
    out = registry.policy_loss.get(case["loss_mode"])(PolicyLossInputs(logp, x["old"], x["adv"], x["mask"], cfg,
                                                                       weights))
    mask = x["mask"] if out.mask is None else out.mask
    loss = F.agg_loss(out.loss, mask, out.agg_mode or case["loss_agg_mode"])
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(case["loss"], dtype=torch.float64), **TOL)
    torch.testing.assert_close(logp.grad, _t(case["grad"]), **TOL)
    for name in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "rollout_corr/kl",
                 "rollout_corr/k3_kl"):
        if name in case["metrics"] and name in out.stats:
            # verl averages its metrics over the mask the loss aggregates with (after bypass's rejection)
            on = mask if name.startswith("actor/") else x["mask"]
            value = F.agg_loss(out.stats[name].double(), on, "token-mean")
            assert value.item() == pytest.approx(case["metrics"][name], abs=1e-9), name


def test_every_verl_policy_loss_has_a_case(registry) -> None:
    verl_losses = {"vanilla", "gspo", "gpg", "cispo", "sapo", "clip_cov", "kl_cov", "geo_mean", "dppo_tv", "dppo_kl",
                   "dro", "bypass_mode"}
    assert verl_losses == {c["loss_mode"] for c in DATA["policy_losses"]}
    assert verl_losses <= set(registry.policy_loss.available())


@pytest.mark.parametrize("case", [c for c in DATA["estimators"]["cases"] if c["estimator"] != "gdpo"],
                         ids=lambda c: f"{c['estimator']}-seed{c['seed']}")
def test_optimal_token_baseline_matches_verl(case) -> None:
    x = {k: _t(v) for k, v in DATA["estimators"]["inputs"][str(case["seed"])].items()}
    fn = F.tir_optimal_token_baseline_advantage if case["multi_turn"] else F.optimal_token_baseline_advantage
    mask = x["multi_turn_mask"] if case["multi_turn"] else x["mask"]
    adv, ret = fn(x["rewards"], mask, DATA["estimators"]["uids"], x["old"], x["sum_pi_squared"],
                  x["weights"] if case["weighted"] else None)
    torch.testing.assert_close(adv, _t(case["advantages"]), **TOL)
    torch.testing.assert_close(ret, _t(case["returns"]), **TOL)


@pytest.mark.parametrize("case", [c for c in DATA["estimators"]["cases"] if c["estimator"] == "gdpo"],
                         ids=lambda c: f"gdpo-weights{c['weights']}")
def test_gdpo_matches_verl(case) -> None:
    x = {k: _t(v) for k, v in DATA["estimators"]["inputs"]["gdpo"].items()}
    adv, ret = F.gdpo_advantage(x["rewards"], x["mask"], DATA["estimators"]["uids"], [x["format"], x["correct"]],
                                case["weights"])
    # verl's components are float32 (it builds them with np.float32), so 1e-6 here
    torch.testing.assert_close(adv, _t(case["advantages"]), atol=1e-6, rtol=1e-6)
    assert ret is adv


@pytest.mark.parametrize("case", DATA["pf_ppo"], ids=lambda c: f"{c['reweight_method']}-{c['weight_pow']}")
def test_pf_ppo_resampling_matches_verl(case) -> None:
    # verl draws from the global generator after torch.manual_seed(seed); rlforge from a generator seeded the same
    rows = F.pf_ppo_resample_indices(_t(case["scores"]), case["reweight_method"], case["weight_pow"],
                                   torch.Generator().manual_seed(case["seed"]))
    assert rows.tolist() == case["rows"]


@pytest.mark.parametrize("case", DATA["sppo"], ids=lambda c: f"beta{c['softmean_beta']}-eta{c['eta']}")
def test_sppo_matches_the_verl_recipe(case) -> None:
    x = {k: _t(v) for k, v in DATA["inputs"][str(case["seed"])].items()}
    centred = _t(case["rewards"]) - F.softmean(_t(case["rewards"]), case["softmean_beta"])
    torch.testing.assert_close(centred, _t(case["seq_level_rewards"]), **TOL)
    logp = x["new"].clone().requires_grad_(True)
    adv = centred.unsqueeze(-1).expand_as(logp) * x["mask"]
    loss_mat, _ = F.sppo_policy_loss(logp, x["old"], adv, x["mask"], case["eta"])
    loss = F.agg_loss(loss_mat, x["mask"], "seq-mean-token-mean")  # the recipe's "token-mean" is a mean over sequences
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(case["loss"], dtype=torch.float64), **TOL)
    torch.testing.assert_close(logp.grad, _t(case["grad"]), **TOL)
