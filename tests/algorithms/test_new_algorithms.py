"""The algorithms of issue 30 as modules: VAPO, PF-PPO, SPPO, GDPO, OTB/TIR-OTB (presets, flows, the columns they
write, their losses), the sum-of-pi-squared forward pass, and a one-step run of each."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlforge import Trainer, load_config
from rlforge import batch as B
from rlforge.algorithms import functional as F
from rlforge.algorithms.otb import FORWARD_OUTPUT, SUM_PI_SQUARED, SumPiSquared
from rlforge.algorithms.pf_ppo import PolicyFiltration
from rlforge.algorithms.vapo import POS_LM_WEIGHT
from rlforge.errors import ConfigError, DataError
from rlforge.module import LossContext
from rlforge.testing import fake_controller, step_context

TWO_REWARDS = Path(__file__).parent / "data" / "two_rewards.py"


def _module(pm, algo, *overrides):
    module = pm.registry.algorithm.get(algo)(load_config(algo, list(overrides), plugins=pm))
    module.registry = pm.registry
    return module


def _batch(scores, lengths, uids, width=4, values=None):
    n = len(scores)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), torch.tensor(lengths) - 1] = torch.tensor(scores, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    return B.Batch({
        B.RESPONSE_MASK: mask, B.TOKEN_LEVEL_REWARDS: rewards, B.TOKEN_LEVEL_SCORES: rewards.clone(),
        B.SCORES: torch.tensor(scores, dtype=torch.float32), B.ACC: (torch.tensor(scores) >= 1).float(),
        B.VALUES: torch.randn(n, width, generator=g) * mask if values is None else values,
        B.OLD_LOG_PROBS: -torch.rand(n, width, generator=g) * mask, "row": torch.arange(n),
    }, {B.UID: uids, "text": [f"r{i}" for i in range(n)]})


def _ctx(cfg, step=1):
    """What a stage reads from its StepContext here: the config, the step, ``log``."""
    metrics: dict[str, float] = {}
    return SimpleNamespace(config=cfg, step=step, metrics=metrics, log=metrics.update)


# --- VAPO ---------------------------------------------------------------------------------------------------


def test_vapo_preset_turns_on_every_delta(pm):
    cfg = load_config("vapo", plugins=pm)
    alg = cfg.algorithm
    assert (alg.lam_critic, alg.lam_policy, alg.lam_alpha, alg.pos_lm_coef) == (1.0, 0.95, 0.05, 0.1)
    assert (cfg.actor.clip_ratio_high, cfg.actor.loss_agg_mode, cfg.rollout.n) == (0.28, "token-mean", 8)
    assert cfg.trainer.critic_warmup > 0
    names = _module(pm, "vapo").flow().names()
    assert names.index("values") < names.index("advantage") < names.index("update_critic") < names.index("update_actor")


def test_vapo_advantages_use_a_length_adaptive_lambda_and_mark_correct_rows(pm):
    module = _module(pm, "vapo", "algorithm.lam_alpha=0.5", "actor.ppo_mini_batch_size=1", "rollout.n=2",
                     "data.train_batch_size=2", "critic.ppo_mini_batch_size=1")
    batch = _batch([1.0, 0.0, 1.0, 1.0], [4, 2, 1, 3], ["a", "a", "b", "b"])
    out = module.advantages(batch)
    lams = F.length_adaptive_lambda(batch[B.RESPONSE_MASK], 0.5)  # 1 - 1 / (0.5 L): 0.5, 0, 0, 1/3
    adv, ret = F.decoupled_gae_advantage(batch[B.TOKEN_LEVEL_REWARDS], batch[B.VALUES], batch[B.RESPONSE_MASK],
                                         1.0, 1.0, lams)
    torch.testing.assert_close(out[B.ADVANTAGES], adv)
    torch.testing.assert_close(out[B.RETURNS], ret)
    # mini-batches of 1 prompt x 2 samples: rows 0-1 (positive tokens 4), rows 2-3 (1 + 3)
    torch.testing.assert_close(out[POS_LM_WEIGHT], torch.tensor([0.25, 0.0, 0.25, 0.25], dtype=torch.float64))


def test_vapo_lm_loss_adds_mu_times_the_nll_of_correct_rows_only(pm):
    small = ["actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2", "rollout.n=2", "data.train_batch_size=2"]
    vapo = _module(pm, "vapo", *small)
    batch = vapo.advantages(_batch([1.0, 0.0, 1.0, 0.0], [4, 2, 1, 3], ["a", "a", "b", "b"]))
    logp = batch[B.OLD_LOG_PROBS].clone().requires_grad_(True)
    ctx_ = LossContext(global_tokens=float(batch[B.RESPONSE_MASK].sum()), global_seqs=4.0)
    loss, metrics = vapo.policy_loss(batch, logp, None, ctx_)
    ppo = _module(pm, "ppo", "actor.clip_ratio_high=0.28")
    base, _ = ppo.policy_loss(batch, logp, None, ctx_)
    # NLL of the 4 + 1 tokens of the correct rows 0 and 2, over those 5 tokens
    nll = -(batch[B.OLD_LOG_PROBS][0].sum() + batch[B.OLD_LOG_PROBS][2, :1].sum()) / 5
    assert metrics["actor/pos_lm_loss"] == pytest.approx(nll.item(), rel=1e-6)
    assert (loss - base).item() == pytest.approx(0.1 * nll.item(), rel=1e-5)
    (loss - base).backward()
    assert torch.all(logp.grad[[1, 3]] == 0) and torch.all(logp.grad[0] != 0)  # only correct rows learn the LM term
    off = _module(pm, "vapo", "algorithm.pos_lm_coef=0", *small)
    assert POS_LM_WEIGHT not in off.advantages(_batch([1.0, 0.0], [2, 2], ["a", "a"]))


# --- PF-PPO -------------------------------------------------------------------------------------------------


def test_pf_ppo_resamples_the_whole_batch_after_advantages_seeded_by_step(pm):
    names = _module(pm, "pf_ppo").flow().names()
    assert names.index("advantage") + 1 == names.index("policy_filtration") < names.index("update_critic")
    cfg = load_config("pf_ppo", ["algorithm.reweight_method=max_min"], plugins=pm)
    batch = _batch([0.0, 1.0, 0.5, 0.25, 1.0, 0.5], [1, 2, 3, 4, 2, 1], list("aabbcc"))
    batch[B.ADVANTAGES] = batch[B.TOKEN_LEVEL_REWARDS]
    ctx = _ctx(cfg, step=3)
    out = PolicyFiltration().run(ctx, batch)
    assert len(out) == len(batch) and set(out["row"].tolist()) <= {0, 1, 4}  # batch min 0 and max 1 only
    for i, row in enumerate(out["row"].tolist()):  # every column of a row moved together
        assert out["text"][i] == f"r{row}" and out[B.UID][i] == batch[B.UID][row]
        assert torch.equal(out[B.RESPONSE_MASK][i], batch[B.RESPONSE_MASK][row])
    assert ctx.metrics["pf_ppo/score_before/mean"] == pytest.approx(3.25 / 6)
    assert ctx.metrics["pf_ppo/score_after/mean"] == pytest.approx(float(out[B.SCORES].mean()))
    again = PolicyFiltration().run(_ctx(cfg, step=3), batch)
    assert torch.equal(again["row"], out["row"])  # the same seed and step: the same draw (a resume repeats it)


def test_pf_ppo_filter_mode_keeps_chosen_responses_of_each_prompt(pm):
    cfg = load_config("pf_ppo", ["algorithm.pf_mode=filter", "algorithm.filter_method=best_worst"], plugins=pm)
    batch = _batch([0.0, 1.0, 0.5, 0.25, 1.0, 0.5, 0.75, 0.0], [1, 2, 3, 4, 2, 1, 1, 1], list("aaaabbbb"))
    batch[B.ADVANTAGES] = batch[B.TOKEN_LEVEL_REWARDS]
    ctx = _ctx(cfg)
    out = PolicyFiltration().run(ctx, batch)
    assert out["row"].tolist() == [0, 1, 4, 7]  # a: best 1, worst 0; b: best 4, worst 7
    assert ctx.metrics["pf_ppo/kept_rows"] == 4.0


# --- SPPO ---------------------------------------------------------------------------------------------------


def test_sppo_targets_and_preset(pm):
    sppo = _module(pm, "sppo")
    assert (sppo.config.actor.policy_loss, sppo.config.actor.loss_agg_mode) == ("sppo", "seq-mean-token-mean")
    batch = _batch([1.0, 0.0, 0.0, 1.0], [2, 2, 1, 3], list("aabb"))
    out = sppo.advantages(batch)
    expected, _ = F.sppo_softmean_advantage(batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], 1.0)
    torch.testing.assert_close(out[B.ADVANTAGES], expected)
    win = _module(pm, "sppo", "algorithm.target=win_rate").advantages(_batch([1.0, 0.0, 0.0, 1.0], [2, 2, 1, 3],
                                                                            list("aabb")))
    assert win[B.ADVANTAGES][:, 0].tolist() == [0.5, -0.5, -0.5, 0.5]
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        load_config("sppo", ["algorithm.target=win_rate", "rollout.n=1"], plugins=pm)


# --- GDPO ---------------------------------------------------------------------------------------------------


def test_gdpo_reads_its_components_from_the_reward_extras_or_batch_columns(pm):
    gdpo = _module(pm, "gdpo", "algorithm.reward_keys=[numeric,acc]")
    batch = _batch([1.0, 0.0, 1.0, 0.0], [1, 1, 1, 1], list("aabb"))
    batch["reward_extra_info"] = [{"numeric": 1.0}, {"numeric": 1.0}, {"numeric": 0.0}, {"numeric": 1.0}]
    components = gdpo.reward_components(batch)
    assert [c.tolist() for c in components] == [[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]]
    out = gdpo.advantages(batch)
    expected, _ = F.gdpo_advantage(batch[B.TOKEN_LEVEL_REWARDS], batch[B.RESPONSE_MASK], batch[B.UID], components)
    torch.testing.assert_close(out[B.ADVANTAGES], expected)
    batch["reward_extra_info"] = [{"numeric": 1.0}, {}, {}, {}]
    with pytest.raises(DataError, match="'numeric' .* sample 1"):
        gdpo.reward_components(batch)
    # samples whose reward call failed (they got reward.fallback_score) have the fallback for every component
    batch["reward_failed"] = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert [c.tolist() for c in gdpo.reward_components(batch)] == [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    gdpo = _module(pm, "gdpo", "algorithm.reward_keys=[numeric,acc]", "reward.fallback_score=-1")
    assert [c.tolist() for c in gdpo.reward_components(batch)] == [[1.0, -1.0, -1.0, -1.0], [1.0, -1.0, -1.0, -1.0]]
    with pytest.raises(ConfigError, match="reward_weights"):
        load_config("gdpo", ["algorithm.reward_keys=[a,b]", "algorithm.reward_weights=[1.0]"], plugins=pm)
    with pytest.raises(ConfigError, match="'algorithm.std_scope=batch' is GRPO's"):
        load_config("gdpo", ["algorithm.std_scope=batch"], plugins=pm)


# --- OTB ------------------------------------------------------------------------------------------------------


def test_otb_asks_the_actor_for_sum_pi_squared_after_the_old_log_probs(pm):
    names = _module(pm, "otb").flow().names()
    assert names[names.index("old_logprob") + 1] == "sum_pi_squared"
    seen = []

    def compute_log_probs(batch, role):
        seen.append((batch.meta.get(FORWARD_OUTPUT), role))
        return torch.full(batch[B.RESPONSE_MASK].shape, 0.5)

    batch = _batch([1.0, 0.0], [2, 1], ["a", "a"])
    cfg = load_config("otb", plugins=pm)
    ctx = step_context(cfg, controller=fake_controller(workers={"actor": {"compute_log_probs": compute_log_probs}}))
    out = SumPiSquared().run(ctx, batch)
    assert seen == [(SUM_PI_SQUARED, "actor")] and FORWARD_OUTPUT not in batch.meta
    assert torch.equal(out[SUM_PI_SQUARED], torch.full((2, 4), 0.5))


@pytest.fixture(scope="module")
def tiny():
    from rlforge.models import load_model

    return load_model("builtin:tiny-arith")


def test_otb_forward_returns_sum_pi_squared_only_when_asked(pm, tiny):
    from rlforge import ops

    otb = _module(pm, "otb")
    ids = torch.randint(3, 20, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, -1] = 0  # row 1's response is 2 tokens
    micro = B.Batch({B.INPUT_IDS: ids, B.ATTENTION_MASK: mask, B.RESPONSES: ids[:, -3:]})
    logp = otb.forward_responses(tiny, micro, 1.0)
    torch.testing.assert_close(logp, ops.response_logprobs(tiny, ids, mask, 3)[0])
    asked = B.Batch(micro.tensors, micro.lists, {FORWARD_OUTPUT: SUM_PI_SQUARED})
    spp = otb.forward_responses(tiny, asked, 2.0)
    with torch.no_grad():  # reference: the full softmax at temperature 2 of the logits before each response token
        probs = torch.softmax(tiny(input_ids=ids, attention_mask=mask).logits[:, -4:-1].float() / 2.0, -1)
    expected = probs.square().sum(-1) * mask[:, -3:]
    torch.testing.assert_close(spp, expected, atol=1e-5, rtol=1e-5)
    assert spp[1, -1] == 0


# --- one step of each -------------------------------------------------------------------------------------------

QUICK = ["trainer.total_steps=1", "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2",
         "critic.ppo_mini_batch_size=2", "data.arith.train_size=512", "data.arith.val_size=2", "trainer.val_before_train=false",
         "trainer.save_every=0", "trainer.val_every=0", "trainer.progress=false", "logger.backends=[]"]
SMOKE = {
    "vapo": ("vapo", ["trainer.critic_warmup=0"]),
    "pf_ppo": ("pf_ppo", []),
    "sppo": ("sppo", ["algorithm.target=win_rate"]),
    "gdpo": ("gdpo", [f"reward.file={TWO_REWARDS}", "algorithm.reward_keys=[correct,numeric]"]),
    "otb": ("otb", []),
    "tir_otb": ("tir_otb", ["actor.policy_loss=bypass_mode"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SMOKE))
def test_one_step_runs(tmp_path, case):
    algo, extra = SMOKE[case]
    trainer = Trainer(load_config(algo, [*QUICK, f"trainer.runs_root={tmp_path}", *extra]))
    trainer.fit()
    (step,) = trainer.history
    assert "actor/pg_loss" in step and torch.isfinite(torch.tensor(step["actor/pg_loss"]))
