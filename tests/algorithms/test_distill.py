"""On-policy distillation (``--algo opd``, algorithms/distill.py): the loss by hand, its configuration errors, and a
student that moves toward a teacher on the ``teacher`` role."""

from __future__ import annotations

import math

import pytest
import torch

from rlforge import Trainer, load_config
from rlforge import batch as B
from rlforge.algorithms import functional as F
from rlforge.algorithms.distill import OPD, TEACHER_LOG_PROBS
from rlforge.algorithms.grpo import GRPO
from rlforge.module import LossContext
from rlforge.errors import ConfigError, RLForgeError

S = torch.tensor([[-1.0, -2.0, -0.5]])  # the student's log-probs of three sampled tokens
T = torch.tensor([[-1.5, -0.5, -0.5]])  # the teacher's
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_the_direct_loss_is_the_kl_estimate_on_the_mask():
    loss, stats = F.distillation_loss(S, T, S, MASK, "k1")
    assert loss.tolist() == [[0.5, -1.5, 0.0]]  # log s - log t
    assert stats["abs_loss"].tolist() == [[0.5, 1.5, 0.0]]
    loss, _ = F.distillation_loss(S, T, S, MASK, "k3")
    # k3 = exp(t - s) - (t - s) - 1: row 0 t - s = -0.5 -> e^-0.5 - 0.5; t - s = 1.5 -> e^1.5 - 2.5
    assert loss[0, :2].tolist() == pytest.approx([math.exp(-0.5) - 0.5, math.exp(1.5) - 2.5])


def test_the_clamp_bounds_the_loss_both_ways():
    loss, stats = F.distillation_loss(S, T, S, MASK, "k1", loss_max_clamp=1.0)
    assert loss.tolist() == [[0.5, -1.0, 0.0]]
    assert stats["abs_loss"][0, 1].item() == 1.5  # before the clamp


def test_the_policy_gradient_form_is_ppo_clip_with_minus_d_as_the_advantage():
    s = S.clone().requires_grad_(True)
    loss, stats = F.distillation_loss(s, T, S, MASK, "k1", use_policy_gradient=True)
    # ratio 1 (old = new): the loss is -A = d per token, and its gradient is -A = d per log-prob
    assert loss.tolist() == [[0.5, -1.5, 0.0]]
    loss.sum().backward()
    assert s.grad.tolist() == [[0.5, -1.5, 0.0]]
    assert {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "abs_loss"} == set(stats)
    # a ratio above 1 + high where A > 0 is clipped: token 1's d is now -2.0 + 0.5 + 0.5 = -1, A = 1, ratio e^0.5 > 1.2
    # -> the loss is -1 * 1.2
    loss, stats = F.distillation_loss(S + 0.5, T, S, MASK, "k1", use_policy_gradient=True,
                                      clip_ratios=(0.2, 0.2, 3.0))
    assert loss[0, 1].item() == pytest.approx(-1.2)
    assert stats["pg_clipfrac"][0, 1].item() == 1.0


def _config(tmp_path, *extra):
    return load_config("opd", [f"trainer.runs_root={tmp_path}", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                               "rollout.n=2", "rollout.max_new_tokens=4", "trainer.val_before_train=false",
                               "trainer.val_every=0", "trainer.progress=false", "logger.backends=[jsonl]",
                               "trainer.save_every=0", *extra])


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    from rlforge.models import load_model, load_tokenizer

    tokenizer = load_tokenizer("builtin:tiny-arith")
    tokenizer.add_tokens(["<extra>"])
    folder = tmp_path / "other"
    model = load_model("builtin:tiny-arith")
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(RLForgeError, match="has another tokenizer than the policy"):
        Trainer(_config(tmp_path, f"algorithm.teacher.path={folder}", "trainer.total_steps=1")).fit()


def _teacher_batch(module):
    g = torch.Generator().manual_seed(0)
    batch = B.Batch({B.RESPONSE_MASK: torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
                     B.OLD_LOG_PROBS: -torch.rand(2, 3, generator=g), TEACHER_LOG_PROBS: -torch.rand(2, 3, generator=g),
                     B.TOKEN_LEVEL_REWARDS: torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])}, {B.UID: ["a", "a"]})
    return module.advantages(batch)


@pytest.mark.parametrize("task", [True, False])
def test_the_actor_loss_is_the_task_loss_plus_the_weighted_distillation_loss(tmp_path, task):
    keys = ["algorithm.teacher.path=builtin:tiny-arith", f"algorithm.distill.use_task_rewards={task}",
            "algorithm.distill.loss_mode=k3"]
    if not task:  # verl: the coefficient weighs it only beside the task loss; alone, a coefficient is refused
        with pytest.raises(ConfigError, match=r"'algorithm.distill.distillation_loss_coef' \(0.5\) weighs the "
                                              r"distillation loss beside the task loss"):
            _config(tmp_path, *keys, "algorithm.distill.distillation_loss_coef=0.5")
    module = OPD(_config(tmp_path, *keys, *(["algorithm.distill.distillation_loss_coef=0.5"] if task else [])))
    batch = _teacher_batch(module)
    log_probs = batch[B.OLD_LOG_PROBS] + 0.1
    mask = batch[B.RESPONSE_MASK].float()
    ctx = LossContext(global_tokens=float(mask.sum()), global_seqs=2.0)
    loss, metrics = module.policy_loss(batch, log_probs, None, ctx)
    d, _ = F.distillation_loss(log_probs, batch[TEACHER_LOG_PROBS], batch[B.OLD_LOG_PROBS], mask, "k3")
    distill = F.agg_loss(d, mask, "token-mean", float(mask.sum()), 2.0)
    task_loss = GRPO.policy_loss(module, batch, log_probs, None, ctx)[0]
    expected = task_loss + 0.5 * distill if task else distill  # verl: the coefficient weighs it only beside the task
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["distillation/loss"] == pytest.approx(distill.item(), rel=1e-6)
    assert ("actor/pg_loss" in metrics) is task


def test_two_steps_place_the_teacher_and_log_the_distillation(tmp_path):
    trainer = Trainer(_config(tmp_path, "algorithm.teacher.path=builtin:tiny-arith", "trainer.total_steps=2",
                              "algorithm.distill.use_policy_gradient=true", "algorithm.distill.loss_mode=k1"))
    trainer.fit()
    first, second = trainer.history[:2]
    # the teacher is the policy's initial weights: before the first update they agree to float rounding
    assert abs(first["distillation/reverse_kl_k1"]) < 1e-5
    assert second["distillation/abs_loss"] > 0
    assert {"distillation/loss", "distillation/pg_clipfrac", "actor/pg_loss"} <= set(second)


def test_a_bad_teacher_device_is_a_config_error(tmp_path):
    with pytest.raises(RLForgeError, match=r"'algorithm.teacher.device' is 'tpu'. Allowed: auto, cpu, cuda or cuda:N"):
        _config(tmp_path, "algorithm.teacher.device=tpu")


def test_the_teachers_batch_and_ranks_may_change_on_resume():
    from rlforge.resume import may_change

    assert may_change("algorithm.teacher.batch_size") and may_change("algorithm.teacher.num_workers")
    assert not may_change("algorithm.teacher.path") and not may_change("algorithm.teacher.dtype")


# --- verl's distillation.* -----------------------------------------------------------------------------------
def _verl(*args):
    from rlforge.config import verl
    from rlforge.config.verl_launch import prepare

    t = prepare(["trainer.n_gpus_per_node=4", "trainer.total_training_steps=5", "algorithm.adv_estimator=grpo",
                 "actor_rollout_ref.rollout.name=vllm",
                 "distillation.enabled=True", *args], refuse=False).translation
    return t, {f.key: f for f in t.fates}, verl


def test_verl_distillation_maps_to_opd_with_its_loss_keys():
    t, fates, verl = _verl("distillation.teacher_models.teacher_model.model_path=Org/Teacher",
                           "distillation.distillation_loss.loss_mode=k1",
                           "distillation.distillation_loss.use_policy_gradient=True",
                           "distillation.distillation_loss.use_task_rewards=False",
                           "distillation.distillation_loss.loss_max_clamp=10.0")
    assert t.algorithm == "opd" and not t.refused
    assert {k: t.overrides[k] for k in t.overrides if k.startswith("algorithm.distill") or k == "algorithm.teacher.path"} \
        == {"algorithm.teacher.path": "Org/Teacher", "algorithm.distill.loss_mode": "k1",
            "algorithm.distill.use_policy_gradient": True, "algorithm.distill.use_task_rewards": False,
            "algorithm.distill.loss_max_clamp": 10.0, "algorithm.distill.clip_ratio_low": 0.2,
            "algorithm.distill.clip_ratio_high": 0.2}
    assert fates["distillation.distillation_loss.distillation_loss_coef"].kind == verl.IGNORED  # no task rewards


def test_verl_topk_distillation_maps_with_its_keys():
    t, fates, verl = _verl("distillation.teacher_models.teacher_model.model_path=Org/Teacher",
                           "distillation.distillation_loss.loss_mode=forward_kl_topk",
                           "distillation.distillation_loss.topk=16",
                           "distillation.distillation_loss.log_prob_min_clamp=-10.0")
    assert t.algorithm == "opd" and not t.refused
    assert {k: t.overrides[k] for k in ("algorithm.distill.loss_mode", "algorithm.distill.topk",
                                        "algorithm.distill.log_prob_min_clamp")} \
        == {"algorithm.distill.loss_mode": "forward_kl_topk", "algorithm.distill.topk": 16,
            "algorithm.distill.log_prob_min_clamp": -10.0}
    _, fates, _ = _verl("distillation.teacher_models.teacher_model.model_path=Org/Teacher",
                        "distillation.distillation_loss.topk=16")  # k3: the top-k keys are not read
    assert fates["distillation.distillation_loss.topk"].kind == verl.IGNORED


@pytest.mark.parametrize("args, refused, text", [
    (["distillation.teacher_models.teacher_model.model_path=T", "algorithm.adv_estimator=gae"],
     "distillation.enabled", "on-policy distillation on adv_estimator=gae"),
    (["+distillation.teacher_models.a.model_path=T", "+distillation.teacher_models.b.model_path=U",
      "+distillation.teacher_models.a.key=x", "+distillation.teacher_models.b.key=y", "distillation.teacher_key=task"],
     "distillation.teacher_key", "by the dataset column 'task'"),
    (["distillation.teacher_models.teacher_model.model_path=T", "distillation.distillation_loss.loss_mode=bogus"],
     "distillation.distillation_loss.loss_mode", "which verl 0.9.1 does not have either"),
    (["distillation.teacher_models.teacher_model.model_path=T", "distillation.distillation_loss.loss_mode=kl"],
     "distillation.distillation_loss.loss_mode", "verl 0.9.1 refuses it under the name k1 only"),
    (["+distillation.teacher_models.a.model_path=T", "+distillation.teacher_models.b.model_path=U",
      "+distillation.teacher_models.a.key=x", "+distillation.teacher_models.b.key=''"],
     "distillation.teacher_models.b.key", "rows whose data_source is empty"),
    (["distillation.teacher_models.teacher_model.model_path=T", "distillation.distillation_loss.policy_loss_mode=gspo"],
     "distillation.distillation_loss.policy_loss_mode", "which verl 0.9.1 refuses too"),  # without the policy gradient
])
def test_verl_distillation_refusals_name_the_missing_feature(args, refused, text):
    t, fates, verl = _verl(*args)
    assert fates[refused].kind == verl.REFUSED and text in fates[refused].text, fates[refused]


@pytest.mark.parametrize(("args", "says"), [
    ([], r"teacher_models.teacher_model.model_path is unset.*'model_path must be specified'"),
    (["+distillation.teacher_models.a.key=x"], r"teacher_models.a.model_path is unset"),
    (["+distillation.teacher_models.a.model_path=T", "+distillation.teacher_models.b.model_path=U",
      "+distillation.teacher_models.a.key=x"], r"teacher_models.b.key is unset.*'key must be specified'"),
    (["+distillation.teacher_models.a.model_path=T"], r"teacher_models.a.key is unset"),  # one entry besides the default
    (["+distillation.teacher_models.a.model_path=T", "+distillation.teacher_models.b.model_path=U",
      "+distillation.teacher_models.a.key=1", "+distillation.teacher_models.b.key='1'"],
     r"teacher_models.a.key and distillation.teacher_models.b.key are both '1'.*'Duplicate teacher key'"),
    (["~distillation.teacher_models.teacher_model"], r"distillation.teacher_models has no entry"),
    (["distillation.teacher_models.teacher_model.model_path=T", "distillation.distillation_loss.loss_mode=k1"],
     r"loss_mode=k1 with use_policy_gradient=False: verl 0.9.1 refuses it too"),
])
def test_verl_launches_that_verl_refuses_are_errors(args, says):
    """verl 0.9.1's DistillationConfig raises for these: a teacher without model_path, an entry without key (the
    default entry excepted), two entries with one key (compared as the text rlforge routes by)."""
    with pytest.raises(RLForgeError, match=says):
        _verl(*args)


def test_verl_several_teachers_map_to_routes_by_data_source():
    """verl's MOPD launch: each entry's key routes samples (by data_source) to its model_path; verl drops the default
    entry teacher_model once others are named, even with a model_path, and so does the translation."""
    t, fates, verl = _verl("distillation.teacher_models.teacher_model.model_path=Dropped",
                           "distillation.teacher_key=data_source",
                           "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
                           "+distillation.teacher_models.gsm8k.model_path=Qwen/Qwen3-32B",
                           "+distillation.teacher_models.geo3k.key=hiyouga/geometry3k",
                           "+distillation.teacher_models.geo3k.model_path=Qwen/Qwen3-VL-32B-Instruct",
                           "+distillation.teacher_models.geo3k.num_replicas=1")
    assert t.algorithm == "opd" and not t.refused
    assert t.overrides["algorithm.teacher.routes"] == {"openai/gsm8k": "Qwen/Qwen3-32B",
                                                       "hiyouga/geometry3k": "Qwen/Qwen3-VL-32B-Instruct"}
    assert t.overrides["algorithm.teacher.route_by"] == "data_source" and "algorithm.teacher.path" not in t.overrides
    dropped = fates["distillation.teacher_models.teacher_model.model_path"]
    assert dropped.kind == verl.IGNORED and "drops its default entry" in dropped.text
    assert fates["distillation.teacher_models.geo3k.num_replicas"].kind == verl.IGNORED
    # one named entry besides the default: that one is the teacher, and routing is not read
    t, fates, verl = _verl("distillation.teacher_models.teacher_model.model_path=Dropped",
                           "+distillation.teacher_models.only.key=k", "+distillation.teacher_models.only.model_path=T")
    assert t.overrides["algorithm.teacher.path"] == "T" and "algorithm.teacher.routes" not in t.overrides
    assert fates["distillation.teacher_models.only.key"].kind == verl.IGNORED
    # Hydra's ~ deletes the default entry: the same routes
    t, _, _ = _verl("~distillation.teacher_models.teacher_model", "+distillation.teacher_models.a.key=x",
                    "+distillation.teacher_models.a.model_path=T", "+distillation.teacher_models.b.key=y",
                    "+distillation.teacher_models.b.model_path=U")
    assert t.overrides["algorithm.teacher.routes"] == {"x": "T", "y": "U"}


# --- forward_kl_topk ------------------------------------------------------------------------------------------------
def test_forward_kl_topk_by_hand():
    """sum_k p_T,k (log p_T,k - log p_S,k) over the teacher's top-k; clamped below at 0 and at log_prob_min_clamp."""
    teacher = torch.tensor([[[math.log(0.6), math.log(0.3)], [math.log(0.5), math.log(0.1)]]])
    student = torch.tensor([[[math.log(0.5), math.log(0.25)], [math.log(0.9), math.log(0.05)]]])
    d, stats = F.forward_kl_topk(student, teacher)
    first = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.25)
    second = 0.5 * math.log(0.5 / 0.9) + 0.1 * math.log(0.1 / 0.05)  # negative: the truncated sum
    assert d[0].tolist() == pytest.approx([first, max(second, 0.0)], rel=1e-5) and second < 0
    assert stats["teacher_mass"][0].tolist() == pytest.approx([0.9, 0.6]) and stats["student_mass"][0].tolist() \
        == pytest.approx([0.75, 0.95])
    far = torch.tensor([[[math.log(0.6), -30.0]]])  # a student log-prob below the clamp counts as the clamp
    clamped, _ = F.forward_kl_topk(far, torch.tensor([[[math.log(0.6), math.log(0.3)]]]), log_prob_min_clamp=-10.0)
    assert clamped.item() == pytest.approx(0.3 * (math.log(0.3) + 10.0), rel=1e-5)


def test_topk_overlap_diagnostics_by_hand():
    """verl's overlap diagnostics: how many of the teacher's top-k ids the student's top-k holds, and the mean of
    -p_T (log p_T - log p_S) over those tokens (0 where none overlap)."""
    teacher = torch.tensor([[[math.log(0.6), math.log(0.3)], [math.log(0.5), math.log(0.1)]]])
    student = torch.tensor([[[math.log(0.5), math.log(0.25)], [math.log(0.9), math.log(0.05)]]])
    teacher_ids = torch.tensor([[[4, 7], [1, 2]]])
    student_ids = torch.tensor([[[7, 9], [3, 5]]])  # position 0 shares token 7 (the teacher's second), position 1 none
    _, stats = F.forward_kl_topk(student, teacher, None, teacher_ids, student_ids)
    assert stats["overlap_count"].tolist() == [[1.0, 0.0]]
    assert stats["overlap_token_advantage"][0].tolist() == pytest.approx([-0.3 * math.log(0.3 / 0.25), 0.0], rel=1e-5)


def test_the_topk_loss_flows_into_the_direct_and_policy_gradient_forms():
    student = torch.log_softmax(torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(1)), -1).requires_grad_()
    teacher = torch.log_softmax(torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(2)), -1).topk(2, -1)
    d, _ = F.forward_kl_topk(student.gather(-1, teacher.indices), teacher.values)
    cap = float(d.detach()[0, :2].mean())  # the clamp bounds the larger of the two valid tokens only
    loss, _ = F.distillation_loss(S, None, S, MASK, "forward_kl_topk", cap, divergence=d)
    assert loss[0].tolist() == pytest.approx([min(x, cap) for x in d[0].tolist()[:2]] + [0.0], rel=1e-6)
    loss.sum().backward()
    assert student.grad is not None and student.grad.abs().sum() > 0  # the direct form trains the student's logits
    pg, stats = F.distillation_loss(S, None, S, MASK, "forward_kl_topk", use_policy_gradient=True,
                                    divergence=d.detach())
    assert pg[0].tolist() == pytest.approx(d[0].tolist()[:2] + [0.0], rel=1e-6)  # ratio 1: the loss is -A = d
    assert "pg_clipfrac" in stats


def test_topk_distillation_from_the_initial_weights_starts_at_zero_and_logs_the_masses(tmp_path):
    """The teacher is the policy's initial weights: before the first update the top-k KL is 0 and both top-k hold the
    same mass; the teacher's sampled-token log-probs from the top-k pass are those of the estimator pass."""
    trainer = Trainer(_config(tmp_path, "algorithm.distill.loss_mode=forward_kl_topk", "algorithm.distill.topk=4",
                              "algorithm.distill.use_task_rewards=false", "trainer.total_steps=2",
                              "actor.ppo_micro_batch_size=16"))
    trainer.fit()
    first, second = trainer.history[:2]
    assert first["distillation/loss"] == pytest.approx(0.0, abs=1e-5)
    assert first["distillation/student_mass"] == pytest.approx(first["distillation/teacher_mass"], abs=1e-5)
    assert 0 < first["distillation/teacher_mass"] <= 1 and second["distillation/loss"] > 0
    # the same model on both sides: the student's top-4 is the teacher's, and no overlapping token has a KL term
    assert first["distillation/overlap_ratio"] == pytest.approx(1.0)
    assert first["distillation/overlap_token_advantage"] == pytest.approx(0.0, abs=1e-6)
    assert second["distillation/overlap_ratio"] <= 1.0 and "distillation/overlap_count" not in second
    assert abs(first["distillation/reverse_kl_k1"]) < 1e-5


@pytest.mark.parametrize(("extra", "says"), [
    (["algorithm.distill.loss_mode=k1"], r"loss_mode=k1 as a direct loss \(use_policy_gradient=false\) does not learn"),
    (["algorithm.distill.loss_mode=kl"], "use_policy_gradient=true"),
    (["strategy.name=fabric", "trainer.controller=ray"], "does not run yet"),
    (["strategy.name=fsdp", "strategy.fsdp.sequence_parallel_size=2", "strategy.num_processes=2",
      "trainer.controller=ray", "model.remove_padding=true"],
     "Ulysses sequence parallelism"),
])
def test_distillation_refuses_what_it_cannot_run(tmp_path, extra, says):
    with pytest.raises(RLForgeError, match=says):
        _config(tmp_path, "algorithm.distill.loss_mode=forward_kl_topk", *extra)


def test_a_topk_teacher_with_a_larger_output_layer_is_refused(tmp_path):
    """The same tokenizer, a padded vocabulary (as Qwen2.5's sizes differ): the teacher's top-k ids could fall outside
    the policy's output, so forward_kl_topk refuses it when the teacher loads; the estimator losses read only the
    sampled tokens and keep working."""
    from rlforge.models import load_model, load_tokenizer

    folder = tmp_path / "padded"
    model = load_model("builtin:tiny-arith")
    model.resize_token_embeddings(model.config.vocab_size + 7)
    model.save_pretrained(folder)
    load_tokenizer("builtin:tiny-arith").save_pretrained(folder)
    with pytest.raises(RLForgeError, match=r"has an output layer of 110 tokens and the policy one of 103"):
        Trainer(_config(tmp_path, f"algorithm.teacher.path={folder}", "trainer.total_steps=1",
                        "algorithm.distill.loss_mode=forward_kl_topk")).fit()


# --- several teachers (MOPD) ----------------------------------------------------------------------------------------
def _halved_teacher(tmp_path):
    """The tiny policy with its output layer halved: another teacher of the same tokenizer."""
    from rlforge.models import load_model, load_tokenizer

    folder = tmp_path / "halved"
    model = load_model("builtin:tiny-arith")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(0.5)
    model.save_pretrained(folder)
    load_tokenizer("builtin:tiny-arith").save_pretrained(folder)
    return folder


def _routed_batch(values):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 100, (len(values), 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    return B.Batch({B.INPUT_IDS: ids, B.ATTENTION_MASK: mask, B.RESPONSES: ids[:, -3:]},
                   {B.DATA_SOURCE: ["arith"] * len(values), B.UID: [str(i) for i in range(len(values))],
                    B.EXTRA_INFO: [{"a": v} for v in values]})


def test_route_values_and_what_keeps_a_row_from_a_teacher():
    from types import SimpleNamespace

    from rlforge.algorithms.distill_routes import route_problem, route_value

    assert route_value("gsm8k", None, "data_source") == "gsm8k" and route_value("", None, "data_source") == ""
    assert route_value("x", {"task": 1}, "extra_info.task") == "1"  # as text: routes' keys are text
    assert route_value("x", {"task": None}, "extra_info.task") is None
    teacher = SimpleNamespace(route_by="extra_info.task", routes={"1": "a"})
    assert route_problem("x", {"task": 1}, teacher) == ""
    assert "has no extra_info (route_by=extra_info.task)" == route_problem("x", None, teacher)
    assert "has an extra_info that is a list" in route_problem("x", [1], teacher)
    assert "has no field 'task' in its extra_info (its fields: ['other']" in route_problem("x", {"other": 1}, teacher)
    assert "has extra_info.task='2', for which algorithm.teacher.routes names no teacher (its keys: ['1'])" \
        == route_problem("x", {"task": 2}, teacher)
    assert "has data_source=''" in route_problem("", None, SimpleNamespace(route_by="data_source", routes={"a": "b"}))


def test_each_row_is_scored_by_the_teacher_its_route_names(tmp_path):
    """Rows routed by extra_info.a to two teachers: each row's log-probs (and top-k) are its own teacher's, in the
    batch's row order, whatever the sub-batch size."""
    from rlforge import ops
    from rlforge.algorithms.distill_worker import TeacherWorker
    from rlforge.models import load_model

    first, second = load_model("builtin:tiny-arith").eval(), load_model(str(_halved_teacher(tmp_path))).eval()
    worker = TeacherWorker("teacher", 0, 1)
    worker.models, worker.device = {"0": first, "1": second}, torch.device("cpu")
    worker.options = _config(tmp_path, "algorithm.teacher.routes={'0': a, '1': b}",
                             "algorithm.teacher.route_by=extra_info.a", "algorithm.teacher.batch_size=1"
                             ).algorithm.teacher
    batch = _routed_batch([1, 0, 1, 0, 0])
    with torch.no_grad():
        got = worker.teacher_log_probs(batch)
        alone = {m: ops.response_logprobs(m, batch[B.INPUT_IDS], batch[B.ATTENTION_MASK], 3)[0] for m in (first, second)}
        top = worker.teacher_topk(batch, 4)
    for i, a in enumerate([1, 0, 1, 0, 0]):
        assert torch.allclose(got[i], alone[second if a else first][i], atol=1e-6), i
    assert not torch.allclose(alone[first][0], alone[second][0])  # the two teachers differ
    assert torch.allclose(top[TEACHER_LOG_PROBS], got, atol=1e-6)
    assert top["teacher_topk_log_probs"].shape == (5, 3, 4)


def test_several_teachers_train_and_a_row_without_a_teacher_is_named(tmp_path):
    halved = _halved_teacher(tmp_path)
    routes = f"algorithm.teacher.routes={{'0': builtin:tiny-arith, '1': {halved}}}"
    trainer = Trainer(_config(tmp_path, routes, "algorithm.teacher.route_by=extra_info.a", "data.arith.max_operand=1", "data.arith.val_size=0",
                              "trainer.total_steps=1"))
    trainer.fit()
    assert trainer.history[0]["distillation/reverse_kl_k1"] != 0  # rows of a=1 read the halved teacher
    # a prompt without a teacher is found when the data loads, before any model: named by its row
    with pytest.raises(RLForgeError, match=r"arith \(train\), row \d+: the row has extra_info.a='1', for which "
                                           r"algorithm.teacher.routes names no teacher \(its keys: \['0'\]\)"):
        Trainer(_config(tmp_path / "b", "algorithm.teacher.routes={'0': builtin:tiny-arith}",
                        "algorithm.teacher.route_by=extra_info.a", "data.arith.max_operand=1", "data.arith.val_size=0",
                        "trainer.total_steps=1")).fit()
    assert not list((tmp_path / "b").rglob("step_*"))


def test_a_step_row_without_a_teacher_is_named_in_the_driver():
    """Rows that did not come from the loaded prompts (an agent loop's) are checked again at each step."""
    from types import SimpleNamespace

    from rlforge.algorithms.distill_routes import check_batch_routes

    batch = B.Batch({B.INPUT_IDS: torch.zeros(2, 1)}, {B.UID: ["u0", "u1"], B.DATA_SOURCE: ["a", "z"],
                                                        B.EXTRA_INFO: [None, None]})
    with pytest.raises(RLForgeError, match=r"A row of this step \(uid 'u1', data_source 'z'\) has data_source='z'"):
        check_batch_routes(batch, SimpleNamespace(route_by="data_source", routes={"a": "m"}))


@pytest.mark.parametrize(("extra", "says"), [
    (["algorithm.teacher.path=builtin:tiny-arith", "algorithm.teacher.routes={x: builtin:tiny-arith}"],
     "are both set: one teacher"),
    (["algorithm.teacher.routes={x: builtin:tiny-arith}", "algorithm.teacher.route_by=task"],
     r"route_by='task': a row's teacher is picked by data_source or extra_info.<name>"),
    (["algorithm.teacher.routes={x: ''}"], r"algorithm.teacher.routes\['x'\] is '': each route names"),
    (["algorithm.teacher.routes.a.b=builtin:tiny-arith"],  # a dotted override nests the key
     r"routes\['a'\] is \{'b': 'builtin:tiny-arith'\}.*must be written in the mapping form"),
    (["algorithm.teacher.routes={'': builtin:tiny-arith}"], "algorithm.teacher.routes has an empty key"),
    (["algorithm.teacher.route_by=extra_info.task"], "is read only with algorithm.teacher.routes"),
])
def test_bad_routes_are_config_errors(tmp_path, extra, says):
    with pytest.raises(RLForgeError, match=says):
        _config(tmp_path, *extra)


def test_the_routes_may_not_change_on_resume():
    from rlforge.resume import may_change

    assert not may_change("algorithm.teacher.routes.gsm8k") and not may_change("algorithm.teacher.route_by")
