"""``algorithm.mask_truncated``: DAPO's overlong filtering (TRL's ``mask_truncated_completions``)."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.algorithms import functional as F
from rlforge.algorithms import shaping
from rlforge.errors import ConfigError
from rlforge.testing import fake_controller, step_context
from rlforge.trainer import Trainer

EOS, EOT = 2, 7


def test_truncated_rows_are_those_whose_last_generated_token_is_no_stop_token():
    responses = torch.tensor([
        [5, 6, EOS, 0],  # ended by EOS before the limit
        [5, 6, 6, 6],  # cut at the limit
        [5, 6, 6, EOT],  # ended at the limit by the other stop token
        [5, 9, 9, 0],  # an agent's turn ended (EOT, masked 1) and the loop inserted tokens (masked 0) after it
        [0, 0, 0, 0],  # nothing generated
        [5, 9, 6, 0],  # inserted tokens, then a turn cut off
    ])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]])
    responses[3, 0] = EOT
    got = F.truncated_rows(responses, mask, [EOS, EOT])
    assert got.tolist() == [False, True, False, False, False, True]
    assert F.truncated_rows(responses, mask, [EOS]).tolist() == [False, True, True, True, False, True]
    with pytest.raises(ValueError, match="no stop_ids, so every response would count as truncated"):
        F.truncated_rows(responses, mask, [])
    with pytest.raises(ValueError, match=r"responses \(6, 4\) and mask \(6, 3\) must both be \[B, R\]"):
        F.truncated_rows(responses, mask[:, :3], [EOS])


def _batch():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    responses = torch.tensor([[4, EOS, 0], [4, 4, 4], [4, 4, EOS], [4, 0, 0]])
    return B.Batch({B.RESPONSES: responses, B.RESPONSE_MASK: mask, B.OLD_LOG_PROBS: torch.zeros(4, 3),
                    B.ADVANTAGES: torch.ones(4, 3)}, {B.UID: ["a", "a", "b", "b"]})


def test_the_update_gets_the_cut_rows_masked_and_the_flow_keeps_the_whole_batch(pm):
    cfg = load_config("grpo", ["algorithm.mask_truncated=true"], plugins=pm)
    trained = []
    controller = fake_controller(workers={"actor": {"update": lambda batch, step: trained.append(batch) or {}}})
    ctx = step_context(cfg, controller=controller)
    stage = shaping.MaskTruncated()
    stage._stop_ids = [EOS]  # the model's, read from its folder when not set
    batch = _batch()
    out = stage.run(ctx, batch)
    assert out is batch and batch[B.RESPONSE_MASK][1].tolist() == [1, 1, 1]  # metrics and later stages: unmasked
    (seen,) = trained
    assert seen[B.RESPONSE_MASK].tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0]]
    assert seen[B.RESPONSE_MASK].dtype == batch[B.RESPONSE_MASK].dtype
    assert ctx.metrics["actor/truncated_masked_ratio"] == 0.5


def test_agent_trajectories_the_token_budget_ended_between_turns_are_masked_and_warmup_steps_log_nothing(pm):
    """A trajectory whose last turn ended with its stop token but whose tool reply did not fit the budget
    (stop_reason max_tokens) is cut too; max_turns and done are not. While the critic warms up nothing is logged."""
    cfg = load_config("grpo", ["algorithm.mask_truncated=true"], plugins=pm)
    trained = []
    controller = fake_controller(workers={"actor": {"update": lambda batch, step: trained.append(batch) or {}}})
    ctx = step_context(cfg, controller=controller)
    stage = shaping.MaskTruncated()
    stage._stop_ids = [EOS]
    batch = _batch()
    batch[B.STOP_REASON] = ["max_tokens", "done", "max_turns", "done"]
    stage.run(ctx, batch)
    assert trained[0][B.RESPONSE_MASK].sum(-1).tolist() == [0, 0, 3, 0]
    assert ctx.metrics["actor/truncated_masked_ratio"] == 0.75
    warm = load_config("ppo", ["algorithm.mask_truncated=true", "trainer.critic_warmup=1"], plugins=pm)
    ctx = step_context(warm, controller=controller, step=1)
    assert stage.run(ctx, batch) is batch and ctx.metrics == {} and len(trained) == 1


def test_the_policy_gradient_flow_takes_it_in_place_of_the_update_and_other_algorithms_refuse_the_key(pm):
    grpo = pm.registry.algorithm.get("grpo")
    flow = grpo(load_config("grpo", ["algorithm.mask_truncated=true"], plugins=pm)).flow().compile()
    assert flow.names()[-2:] == ["update_actor", "sync_weights"]
    assert isinstance(flow.stages[-2], shaping.MaskTruncated)
    assert not isinstance(grpo(load_config("grpo", plugins=pm)).flow().stages[-2], shaping.MaskTruncated)
    with pytest.raises(ConfigError, match="algorithm.mask_truncated"):
        load_config("dpo", ["algorithm.mask_truncated=true"], plugins=pm)


def test_ignore_eos_is_refused(pm):
    with pytest.raises(ConfigError, match=r"'algorithm.mask_truncated' with 'rollout.ignore_eos'"):
        load_config("grpo", ["algorithm.mask_truncated=true", "rollout.ignore_eos=true"], plugins=pm)


@pytest.mark.slow
def test_a_run_masks_the_responses_cut_at_max_new_tokens(tmp_path):
    """3 new tokens: the tiny model's answers that end there with EOS are kept, the others masked."""
    quick = ["trainer.total_steps=1", "data.train_batch_size=8", "rollout.n=4", "actor.ppo_mini_batch_size=8",
             "trainer.val_before_train=false", "trainer.save_every=0", "trainer.val_every=0", "trainer.progress=false",
             "logger.backends=[]", f"trainer.runs_root={tmp_path}"]
    trainer = Trainer(load_config("grpo", [*quick, "algorithm.mask_truncated=true", "rollout.max_new_tokens=3"]))
    trainer.fit()
    (step,) = trainer.history
    assert 0 < step["actor/truncated_masked_ratio"] <= step["response_length/clip_ratio"]
    assert torch.isfinite(torch.tensor(step["actor/pg_loss"]))
