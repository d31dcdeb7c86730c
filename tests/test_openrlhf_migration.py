"""docs/migration-from-openrlhf.md as an OpenRLHF user follows it: its conversion and reward wrapper run, its
command's keys train, and the rows it marks *compared* hold against transcriptions of OpenRLHF 0.11's formulas
(written here from its ``experience_maker.py``, ``loss.py`` and ``models/utils.py``: group baselines, whitening with
the population variance, GAE, the clipped loss with its dual clip, the k3 estimator clamped to +-10, TIS and IcePop
weights)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlforge import Trainer, load_config
from rlforge.algorithms import functional as F
from rlforge.algorithms.rollout_correction import rollout_is_weights
from tests.migration_pages import doc_command_keys, run_page

PAGE = "migration-from-openrlhf.md"

# an OpenRLHF-style reward function (reward_func(queries, prompts, labels) -> dict of tensors), as users write them
OPENRLHF_REWARD = '''
import torch


def reward_func(queries, prompts, labels, **kwargs):
    rewards = []
    for query, prompt, label in zip(queries, prompts, labels):
        response = query[len(prompt):] if prompt and prompt in query else query
        rewards.append(1.0 if response.strip() == str(label) else 0.0)
    rewards = torch.tensor(rewards)
    out = {"rewards": rewards, "extra_logs": {"exact": rewards.mean()}}
    return out if prompts[0].startswith("no scores") else {**out, "scores": rewards / 2}
'''


@pytest.fixture
def converted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The doc's conversion and wrapper, run in ``tmp_path`` on OpenRLHF prompt rows (string and chat prompts,
    labels of two types)."""
    rows = [{"input": f"What is {a}+{a}?" if a % 2 else [{"role": "user", "content": f"What is {a}+{a}?"}],
             "label": 2 * a if a % 3 else str(2 * a)} for a in range(8)]
    rows[6]["label"], rows[7] = None, {"input": "What is 7+7?"}  # a null label, a row without one
    run_page(PAGE, tmp_path, "openrlhf_prompts.jsonl", rows, "my_openrlhf_project.reward_func", OPENRLHF_REWARD,
             "openrlhf_reward.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_converted_rows_keep_labels_as_written(converted: Path) -> None:
    rows = [json.loads(line) for line in (converted / "train.jsonl").read_text().splitlines()]
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    assert truths == ["0", 2, 4, "6", 8, 10, "", ""]  # each label's own type; null or missing: ""
    assert rows[1]["prompt"] == "What is 1+1?" and rows[1]["extra_info"] == {"prompt": "What is 1+1?"}
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 0+0?"}]
    assert rows[0]["extra_info"] == {"prompt": ""}
    assert rows[0]["data_source"] == "default"


def test_wrapper_scores_with_the_openrlhf_function(converted: Path) -> None:
    from rlforge.plugins.reward.user_file import load_user_function

    score = load_user_function(str(converted / "openrlhf_reward.py"))
    assert score("default", " 4", 4, {"prompt": "What is 2+2?"}) == {"score": 1.0, "acc": 0.5, "exact": 1.0}
    assert score("default", "5", "4", {"prompt": ""}) == {"score": 0.0, "acc": 0.0, "exact": 0.0}
    # without scores, OpenRLHF's filter reads the rewards: so does the wrapper's acc
    assert score("default", "4", "4", {"prompt": "no scores: "}) == {"score": 1.0, "acc": 1.0, "exact": 1.0}


def test_a_run_trains_on_the_converted_rows_with_the_doc_command(converted: Path) -> None:
    keys = doc_command_keys(PAGE)
    assert {"algorithm.epsilon=1e-9", "actor.clip_ratio_c=1e9", "actor.kl_loss_type=k3", "data.name=files",
            "data.train_files=[train.jsonl]", "reward.file=openrlhf_reward.py", "trainer.total_epochs=1"} <= set(keys)
    sizes = ("model.path=", "data.train_batch_size=", "actor.ppo_mini_batch_size=", "data.max_prompt_length=",
             "rollout.max_new_tokens=", "trainer.total_epochs=", "data.train_files=", "reward.file=")
    keys = [k for k in keys if not k.startswith((*sizes, "PYTHONPATH="))]  # tiny model and batches, converted files
    cfg = load_config("grpo", [
        *keys, "data.train_batch_size=2", "actor.ppo_mini_batch_size=1", "rollout.n=4", "rollout.max_new_tokens=4",
        f"data.train_files=[{converted / 'train.jsonl'}]", "trainer.total_steps=2",
        f"reward.file={converted / 'openrlhf_reward.py'}", f"trainer.runs_root={converted}/runs",
        "trainer.val_before_train=false", "trainer.val_every=0", "trainer.progress=false", "logger.backends=[]",
    ])
    assert list(cfg.actor.betas) == [0.9, 0.95] and cfg.actor.lr_scheduler == "cosine"
    trainer = Trainer(cfg)
    trainer.fit()
    assert len(trainer.history) == 2
    assert all(h["reward/error_share"] == 0 for h in trainer.history)
    assert "actor/kl_loss" in trainer.history[-1] and "reward/extra/exact/mean" in trainer.history[-1]


# --- the rows marked *compared*: OpenRLHF's formulas, transcribed ----------------------------------------------

def _batch(seed: int, groups: int = 4, n: int = 4, width: int = 6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (groups * n,), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    scores = torch.randint(0, 3, (groups * n,), generator=g).float() / 2
    token_rewards = torch.zeros(groups * n, width)
    token_rewards[torch.arange(groups * n), lengths - 1] = scores
    uids = [i // n for i in range(groups * n)]
    return scores, token_rewards, mask, uids, n


def _openrlhf_whiten(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-weighted mean and population variance over the batch, rsqrt(max(var, 1e-8))."""
    mean = (adv * mask).sum() / mask.sum()
    var = ((adv - mean) ** 2 * mask).sum() / mask.sum()
    return (adv - mean) * torch.rsqrt(var.clamp(min=1e-8))


@pytest.mark.parametrize("seed", range(3))
def test_group_estimators_match_openrlhf(seed: int) -> None:
    scores, token_rewards, mask, uids, n = _batch(seed)
    grouped = scores.view(-1, n)
    mean = grouped.mean(-1, keepdim=True)
    expected = {
        "group_norm": ((grouped - mean) / (grouped.std(-1, keepdim=True) + 1e-9)).flatten(),
        "dr_grpo": (grouped - mean).flatten(),
        "rloo": (grouped - (grouped.sum(-1, keepdim=True) - grouped) / (n - 1)).flatten(),
    }
    ours = {
        "group_norm": F.grpo_outcome_advantage(token_rewards, mask, uids, epsilon=1e-9)[0],
        "dr_grpo": F.grpo_outcome_advantage(token_rewards, mask, uids, norm_adv_by_std=False)[0],
        "rloo": F.rloo_outcome_advantage(token_rewards, mask, uids)[0],
    }
    for name, want in expected.items():  # OpenRLHF puts the scalar on the last token; with gamma 1 every token has it
        torch.testing.assert_close(ours[name], want[:, None] * mask, msg=name)
    # reinforce_baseline (no KL in the reward): centred, then whitened over the batch's tokens
    want = _openrlhf_whiten((grouped - mean).flatten()[:, None] * mask, mask) * mask
    got = F.reinforce_pp_baseline_advantage(token_rewards, mask, uids)[0]
    tokens = mask.sum()
    torch.testing.assert_close(got, want * math.sqrt((tokens - 1) / tokens), rtol=1e-5, atol=1e-6)


def test_gae_matches_openrlhf() -> None:
    _, token_rewards, mask, _, _ = _batch(7)
    values = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    gamma, lam = 0.9, 0.8
    rewards = token_rewards * mask
    adv, last = torch.zeros_like(rewards), torch.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    returns = adv + values
    ours_adv, ours_returns = F.gae_advantage(token_rewards, values, mask, gamma, lam)
    torch.testing.assert_close(ours_returns, returns * mask)
    tokens = mask.sum()
    torch.testing.assert_close(ours_adv, _openrlhf_whiten(adv, mask) * mask * math.sqrt((tokens - 1) / tokens),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_loss_matches_openrlhf(dual_clip: float | None) -> None:
    g = torch.Generator().manual_seed(3)
    log_prob, old, adv = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    mask = torch.ones(8, 5)
    ratio = (log_prob - old).clamp(-20, 20).exp()
    s1, s2 = ratio * adv, ratio.clamp(0.8, 1.28) * adv
    kept = torch.minimum(s1, s2)
    want = -kept if dual_clip is None else -torch.where(adv < 0, torch.maximum(kept, dual_clip * adv), kept)
    got, _ = F.clipped_policy_loss(log_prob, old, adv, mask, 0.2, 0.28, 1e9 if dual_clip is None else dual_clip)
    torch.testing.assert_close(got, want)


def test_k3_kl_matches_openrlhf() -> None:
    x = torch.linspace(-15, 15, 61)  # log pi - log pi_ref
    want = (torch.exp(-x) - 1 + x).clamp(-10, 10)
    torch.testing.assert_close(F.kl_penalty(x, torch.zeros_like(x), "k3"), want)


def test_tis_and_icepop_weights_match_openrlhf_within_the_documented_difference() -> None:
    old = torch.log(torch.tensor([[0.3, 0.5, 1.0, 4.0, 6.0]]))  # w = pi_old / pi_vllm with log pi_vllm = 0
    vllm, mask = torch.zeros(1, 5), torch.ones(1, 5)
    w = old.exp()
    icepop = rollout_is_weights(old, vllm, mask, "token", "0.5_5.0")
    torch.testing.assert_close(icepop, w * ((w >= 0.5) & (w <= 5.0)))
    tis = rollout_is_weights(old, vllm, mask, "token", "5.0")
    want = w.clamp(0.5, 5.0)
    torch.testing.assert_close(tis[w >= 0.5], want[w >= 0.5])  # OpenRLHF also lifts weights below 0.5 to 0.5
    assert tis[0, 0] == pytest.approx(0.3)
