"""The algorithms of issue 30 learn: a 40-step run on the built-in task raises the sampled reward (the pattern of
test_learning_matrix.py). Long runs: only in the learning-matrix command (``scripts/test.sh --learning-matrix``).

PF-PPO's batch is resampled before the step's metrics are taken (as in verl), so its ``critic/score/mean`` is the
score of the resampled batch; the test reads the score before resampling (``pf_ppo/score_before/mean``). The figures
of the last runs are in docs/algorithms/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge import Trainer, load_config

STEPS, WINDOW = 40, 10
TWO_REWARDS = Path(__file__).parent / "data" / "two_rewards.py"  # correct + numeric: GDPO's two components

CASES = {
    # the preset's lam_alpha=0.05 (the paper's, for long answers) gives lambda_policy = 0 on 8-token answers;
    # 2.0 gives 0.5 (1 token) to 0.94 (8 tokens), the paper's range for its lengths
    "vapo": ("vapo", ["algorithm.lam_alpha=2.0"]),
    "pf_ppo": ("pf_ppo", []),
    "pf_ppo_filter": ("pf_ppo", ["algorithm.pf_mode=filter"]),
    "sppo": ("sppo", []),
    "sppo_win_rate": ("sppo", ["algorithm.target=win_rate"]),
    "gdpo": ("gdpo", [f"reward.file={TWO_REWARDS}", "algorithm.reward_keys=[correct,numeric]"]),
    "otb": ("otb", []),
    "tir_otb": ("tir_otb", []),
}
SCORE = {"pf_ppo": "pf_ppo/score_before/mean"}
# algorithms whose learning test below is not "the sampled reward rises" in the generic form: PRIME's needs single-digit
# sums for its PRM; OPD's teacher is by default the policy's own initial weights (a self-distillation anchor that holds
# the task reward back), so its test brings a flattened student toward a teacher instead
OWN_TESTS = {"prime", "opd"}


def run(tmp_path: Path, algo: str, extra: list[str]) -> list[dict[str, float]]:
    cfg = load_config(algo, [
        f"trainer.runs_root={tmp_path}", f"trainer.total_steps={STEPS}", "trainer.val_before_train=false",
        "trainer.save_every=0", "trainer.val_every=0", "data.arith.val_size=16", "trainer.progress=false",
        "logger.backends=[]", *extra,
    ])
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer.history


@pytest.mark.learning_matrix
@pytest.mark.parametrize("case", sorted(CASES))
def test_new_algorithm_raises_the_reward(tmp_path, case):
    algo, extra = CASES[case]
    history = run(tmp_path, algo, extra)
    key = SCORE.get(algo, "critic/score/mean")
    rewards = [h[key] for h in history]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.01, f"{case}: mean sampled reward {first:.3f} (first {WINDOW} steps) -> {last:.3f}"


@pytest.mark.learning_matrix
def test_prime_learns(tmp_path):
    """PRIME on single-digit sums (docs/algorithms/prime.md): the sampled reward rises. The tiny PRM's held-out ranking
    (``prm/heldout_pairwise_acc``) is not asserted: in four runs of this setting it ended above chance once and below
    it three times (the figures are in prime.md); the PRM's updates are checked in test_prime_role.py."""
    history = run(tmp_path, "prime", ["data.arith.max_operand=9", "algorithm.prm.lr=1e-5", "trainer.total_steps=60"])
    rewards = [h["critic/score/mean"] for h in history]
    assert sum(rewards[-20:]) / 20 > sum(rewards[:20]) / 20 + 0.05, rewards


@pytest.mark.learning_matrix
def test_opd_brings_a_flattened_student_toward_its_teacher(tmp_path):
    """On-policy distillation: the student is the tiny policy with its output layer halved (a flatter distribution),
    the teacher the tiny policy itself; the on-policy KL(student || teacher) estimate falls over 100 steps (the direct
    k3 loss, the policy-gradient k1 form and the top-k forward KL; slowly on this model: docs/algorithms/opd.md gives
    the figures)."""
    import torch

    from rlforge.models import load_model, load_tokenizer

    student = tmp_path / "student"
    model = load_model("builtin:tiny-arith")
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)
    model.save_pretrained(student)
    load_tokenizer("builtin:tiny-arith").save_pretrained(student)
    for form in (["algorithm.distill.loss_mode=k3"],
                 ["algorithm.distill.loss_mode=k1", "algorithm.distill.use_policy_gradient=true"],
                 ["algorithm.distill.loss_mode=forward_kl_topk", "algorithm.distill.topk=16"]):
        history = run(tmp_path / form[0].rsplit("=", 1)[1], "opd", [
            f"model.path={student}", "algorithm.teacher.path=builtin:tiny-arith", "algorithm.distill.use_task_rewards=false",
            "actor.lr=3e-4", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8", "rollout.n=4",
            "trainer.total_steps=100", *form])
        kl = [h["distillation/reverse_kl_k1"] for h in history]
        first, last = sum(kl[:WINDOW]) / WINDOW, sum(kl[-WINDOW:]) / WINDOW
        print(f"opd {form}: KL(student || teacher) {first:.3f} (first {WINDOW} steps) -> {last:.3f} (last {WINDOW})")
        assert last < first, f"{form}: KL(student || teacher) {first:.3f} (first {WINDOW} steps) -> {last:.3f}"
