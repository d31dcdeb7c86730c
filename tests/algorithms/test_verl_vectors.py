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


# --- on-policy distillation: data/verl_distill_vectors.json (gen_verl_vectors.py --distill) ---------------------------

DISTILL = json.loads((Path(__file__).parent / "data" / "verl_distill_vectors.json").read_text())
F32_TOL = {"atol": 1e-6, "rtol": 1e-6}  # float32 math (verl's top-k divergence is float32 whatever its inputs)


def _distill_mask() -> torch.Tensor:
    lengths = torch.tensor(DISTILL["response_lens"])
    return (torch.arange(6)[None] < lengths[:, None]).double()


def _estimator_id(case: dict) -> str:
    return (f"{case['loss_mode']}-{'pg' if case['use_policy_gradient'] else 'direct'}-clamp{case['loss_max_clamp']}"
            f"-{case['loss_agg_mode']}{'-weighted' if case['weighted'] else ''}")


@pytest.mark.parametrize("case", DISTILL["estimator"], ids=_estimator_id)
def test_distillation_estimator_loss_matches_verl(case) -> None:
    """``F.distillation_loss`` (aggregated with ``F.agg_loss``) against verl's ``distillation_loss`` with an estimator
    loss_mode: the loss, its gradient in the student's sampled-token log-probs, the per-token estimate (verl's
    ``compute_distillation_loss_reverse_kl_estimator``, before the clamp) and the metrics. verl's policy-gradient
    form is its vanilla loss with DistillationLossConfig's clip ratios and the default clip_ratio_c 3.0."""
    x = {k: _t(v) for k, v in DISTILL["estimator_inputs"][str(case["seed"])].items()}
    mask = _distill_mask()
    logp = x["new"].clone().requires_grad_(True)
    loss_mat, stats = F.distillation_loss(logp, x["teacher"], x["old"], mask, case["loss_mode"],
                                          case["loss_max_clamp"], case["use_policy_gradient"],
                                          tuple(DISTILL["clip_ratios"]), x["weights"] if case["weighted"] else None)
    loss = F.agg_loss(loss_mat, mask, case["loss_agg_mode"])
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(case["loss"], dtype=torch.float64), **TOL)
    torch.testing.assert_close(logp.grad, _t(case["grad"]), **TOL)
    d = F.kl_penalty(x["new"], x["teacher"], case["loss_mode"]) * mask
    torch.testing.assert_close(d, _t(case["distillation_losses"]) * mask, **TOL)
    metrics = case["metrics"]
    assert F.agg_loss(stats["abs_loss"], mask).item() == pytest.approx(metrics["distillation/abs_loss"], abs=1e-9)
    for name in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):  # verl's clip fractions are float32 means
        if case["use_policy_gradient"]:
            value = F.agg_loss(stats[name].double(), mask).item()
            assert value == pytest.approx(metrics[f"distillation/{name}"], abs=1e-7), name


def test_every_verl_estimator_mode_has_a_case() -> None:
    modes = {(c["loss_mode"], c["use_policy_gradient"]) for c in DISTILL["estimator"]}
    # verl refuses k1 without the policy gradient (its gradient does not depend on the teacher)
    assert {m for m, _ in modes} == {"k1", "k3", "abs", "mse", "k2", "low_var_kl"}
    assert {("k1", True), ("k3", True), ("k3", False)} <= modes


def test_the_topk_vectors_reach_the_clamps_and_the_edge_cases() -> None:
    """verl's un-clamped truncated sum goes negative somewhere (so the clamp at 0 is tested), some position has no
    overlap, the loss_max_clamp acts, and the log_prob_min_clamp changes the divergence."""
    cases = DISTILL["topk"]
    assert any(v < 0 for c in cases for row in c["distillation_losses"] for v in row)
    assert all(any(v == 0 for row in c["overlap_count"] for v in row) for c in cases)
    assert any(v > c["loss_max_clamp"] for c in cases if c["loss_max_clamp"] for row in c["distillation_losses"]
               for v in row)
    by_clamp = {(c["seed"], c["log_prob_min_clamp"]): c["distillation_losses"] for c in cases}
    assert by_clamp[(0, None)] != by_clamp[(0, -3.0)]


def _topk_id(case: dict) -> str:
    return (f"{case['dtype']}-seed{case['seed']}-min{case['log_prob_min_clamp']}-max{case['loss_max_clamp']}"
            f"{'-pg' if case['use_policy_gradient'] else ''}")


@pytest.mark.parametrize("case", DISTILL["topk"], ids=_topk_id)
def test_forward_kl_topk_matches_verl(case) -> None:
    """``F.forward_kl_topk`` and ``F.distillation_loss(divergence=...)`` against verl's FSDP
    ``compute_forward_kl_topk`` (the logits processor's per-token outputs) and its ``distillation_loss`` with loss_mode
    forward_kl_topk. The student's inputs are built as rlforge's OPD builds them: the full log-softmax of the logits
    gathered at the teacher's top-k ids, and the student's own top-k ids (K = the teacher's) for the overlap.

    Like with like: verl's ``compute_forward_kl_topk`` returns the truncated sum un-clamped (it can be negative; the
    registered ``forward_kl_topk`` loss clamps it at 0 afterwards), while rlforge's ``forward_kl_topk`` returns it
    already clamped at 0; so the per-token divergence is compared to verl's ``clamp_min(0)``, and the loss and its
    gradient (both after verl's clamp) directly. The divergence is float32 on both sides (verl's ``kl_divergence``
    casts to float32, as rlforge's does), hence 1e-6. verl's ``overlap_token_advantage`` is computed in the inputs'
    dtype and rlforge's in float32, so it too is compared to 1e-6 in the float64 case; the masses and the overlap
    count (no float32 cast on either side) to 1e-9 / exactly."""
    dtype = getattr(torch, case["dtype"])
    x = DISTILL["topk_inputs"][f"{case['seed']}-{case['dtype']}"]
    mask = _distill_mask()
    logits = torch.tensor(x["student_logits"], dtype=dtype).requires_grad_(True)
    new = torch.tensor(x["new"], dtype=dtype).requires_grad_(True)
    old = torch.tensor(x["old"], dtype=dtype)
    teacher = torch.tensor(x["teacher_topk_log_probs"], dtype=dtype)
    teacher_ids = torch.tensor(x["teacher_topk_ids"])
    log_softmax = torch.log_softmax(logits, dim=-1)
    student_ids = log_softmax.detach().topk(teacher_ids.shape[-1], dim=-1).indices
    divergence, stats = F.forward_kl_topk(log_softmax.gather(-1, teacher_ids), teacher, case["log_prob_min_clamp"],
                                          teacher_ids, student_ids)
    on = mask.bool()

    def expect(key: str) -> torch.Tensor:
        return torch.tensor(case[key], dtype=torch.float64)

    def masked(v: torch.Tensor) -> torch.Tensor:
        return torch.where(on, v.detach().double(), 0.0)

    assert divergence.dtype == getattr(torch, case["divergence_dtype"])
    torch.testing.assert_close(masked(divergence), expect("distillation_losses").clamp_min(0.0), **F32_TOL)
    exact = F32_TOL if dtype == torch.float32 else TOL
    torch.testing.assert_close(masked(stats["student_mass"]), expect("student_mass"), **exact)
    torch.testing.assert_close(masked(stats["teacher_mass"]), expect("teacher_mass"), **exact)
    assert masked(stats["overlap_count"]).tolist() == case["overlap_count"]
    torch.testing.assert_close(masked(stats["overlap_token_advantage"]), expect("overlap_token_advantage"), **F32_TOL)

    loss_mat, _ = F.distillation_loss(new, None, old, mask.to(dtype), "forward_kl_topk", case["loss_max_clamp"],
                                      case["use_policy_gradient"], tuple(DISTILL["clip_ratios"]), None, divergence)
    loss = F.agg_loss(loss_mat, mask.to(loss_mat.dtype), case["loss_agg_mode"])
    loss.backward()
    torch.testing.assert_close(loss.double(), torch.tensor(case["loss"], dtype=torch.float64), **F32_TOL)
    if case["use_policy_gradient"]:
        assert logits.grad is None  # the policy gradient detaches the divergence, in verl too
        torch.testing.assert_close(new.grad.double(), expect("grad_log_probs"), **F32_TOL)
    else:
        torch.testing.assert_close(logits.grad.double(), expect("grad_logits"), **F32_TOL)

    # verl's metrics from the same per-token values: means over the response tokens, the overlap advantage over
    # those with an overlap
    metrics, count = case["metrics"], stats["overlap_count"][on].double()
    assert stats["student_mass"][on].double().mean().item() == pytest.approx(metrics["distillation/student_mass"],
                                                                             abs=1e-6)
    assert stats["teacher_mass"][on].double().mean().item() == pytest.approx(metrics["distillation/teacher_mass"],
                                                                             abs=1e-6)
    assert count.mean().item() / teacher_ids.shape[-1] == pytest.approx(metrics["distillation/overlap_ratio"],
                                                                        abs=1e-6)
    advantage = stats["overlap_token_advantage"][on][count > 0].double().mean().item()
    assert advantage == pytest.approx(metrics["distillation/overlap_token_advantage"], abs=1e-6)
