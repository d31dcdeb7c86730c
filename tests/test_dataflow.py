"""rlforge.dataflow: the step's stages as data, validated by compile()."""

from __future__ import annotations

import pytest

from rlforge import batch as B
from rlforge.dataflow import BUILTIN_STAGES, DataFlow, FunctionStage, Stage, StepContext
from rlforge.errors import RLForgeError
from rlforge.testing import fake_controller

GRPO_STAGES = [
    Stage.ROLLOUT, Stage.REWARD, Stage.FILTER, Stage.OLD_LOGPROB, Stage.ADVANTAGE, Stage.UPDATE_ACTOR,
    Stage.SYNC_WEIGHTS,
]
PPO_STAGES = [
    Stage.ROLLOUT, Stage.REWARD, Stage.OLD_LOGPROB, Stage.REF_LOGPROB, Stage.VALUES, Stage.ADVANTAGE,
    Stage.UPDATE_CRITIC, Stage.UPDATE_ACTOR, Stage.SYNC_WEIGHTS,
]


def test_every_builtin_stage_is_a_named_stage_object() -> None:
    names = [s.name for s in BUILTIN_STAGES]
    assert len(set(names)) == len(names) == 10
    for stage in BUILTIN_STAGES:
        assert isinstance(stage, Stage) and stage.name
        assert isinstance(stage.requires, frozenset) and isinstance(stage.produces, frozenset)
    assert Stage.ROLLOUT.produces >= {B.RESPONSES, B.RESPONSE_MASK}


def test_grpo_module_flow_compiles(default_config) -> None:
    from rlforge.algorithms.grpo import GRPO

    flow = GRPO(default_config).flow()
    assert flow.compile() is flow
    assert flow.names() == [s.name for s in GRPO_STAGES]
    assert "ref_logprob" not in flow.names()
    assert Stage.VALUES not in flow


def test_grpo_flow_with_kl_loss_has_reference(registry) -> None:
    from rlforge.algorithms.grpo import GRPO
    from rlforge.config import compose

    cfg = compose(registry, None, None, ["actor.use_kl_loss=true"])
    flow = GRPO(cfg).flow().compile()
    names = flow.names()
    assert names.index("ref_logprob") < names.index("advantage") < names.index("update_actor")


@pytest.mark.parametrize("stages", [GRPO_STAGES, PPO_STAGES])
def test_valid_flows_compile(stages) -> None:
    DataFlow("ok", stages).compile()


def test_advantage_before_reward_fails_naming_stage_and_columns() -> None:
    flow = DataFlow("broken", [Stage.ROLLOUT, Stage.ADVANTAGE, Stage.REWARD, Stage.OLD_LOGPROB, Stage.UPDATE_ACTOR])
    with pytest.raises(RLForgeError) as info:
        flow.compile()
    msg = str(info.value)
    assert "'broken'" in msg
    assert "stage 'advantage'" in msg
    assert B.TOKEN_LEVEL_REWARDS in msg
    assert "rollout -> advantage -> reward" in msg


def test_missing_old_logprob_fails_at_update_actor() -> None:
    flow = DataFlow("no_old", [Stage.ROLLOUT, Stage.REWARD, Stage.ADVANTAGE, Stage.UPDATE_ACTOR])
    with pytest.raises(RLForgeError, match=r"stage 'update_actor' needs \['old_log_probs'\]"):
        flow.compile()


def test_critic_update_without_values_fails() -> None:
    flow = DataFlow("ppo", [s for s in PPO_STAGES if s is not Stage.VALUES])
    with pytest.raises(RLForgeError, match=r"stage 'update_critic' needs \['values'\]"):
        flow.compile()


def test_insert_after_user_callable() -> None:
    def shape_rewards(batch):
        return batch

    shape_rewards.requires = {B.SCORES}
    shape_rewards.produces = {"shaped_rewards"}

    def uses_shaped(batch):
        return batch

    uses_shaped.requires = {"shaped_rewards"}

    flow = DataFlow("custom", GRPO_STAGES)
    assert flow.insert_after(Stage.REWARD, shape_rewards) is flow
    flow.insert_before(Stage.UPDATE_ACTOR, uses_shaped)
    assert flow.names()[:3] == ["rollout", "reward", "shape_rewards"]
    assert flow.names().index("uses_shaped") == flow.names().index("update_actor") - 1
    flow.compile()
    step = flow.stages[2]
    assert isinstance(step, FunctionStage) and step.fn is shape_rewards
    assert step.requires == frozenset({B.SCORES}) and step.produces == frozenset({"shaped_rewards"})
    assert shape_rewards in flow
    assert "shape_rewards" in flow


def test_user_callable_in_the_wrong_place_fails() -> None:
    def shape_rewards(batch):
        return batch

    shape_rewards.requires = [B.SCORES]

    flow = DataFlow("custom", GRPO_STAGES).insert_after(Stage.ROLLOUT, shape_rewards)
    flow.insert_before("shape_rewards", lambda b: b)
    with pytest.raises(RLForgeError, match=r"stage 'shape_rewards' needs \['scores'\]"):
        flow.compile()


def test_user_stage_name_attribute_and_callable_object() -> None:
    class Filter:
        stage_name = "my_filter"
        requires = (B.UID,)

        def __call__(self, batch):
            return batch

    flow = DataFlow("f", GRPO_STAGES).insert_after("reward", Filter())
    assert flow.names()[2] == "my_filter"
    flow.compile()


def test_callable_without_io_attributes_always_compiles() -> None:
    flow = DataFlow("f", [lambda b: b, *GRPO_STAGES])
    flow.compile()


def test_user_stage_can_provide_a_stage_input() -> None:
    def fake_rollout(batch):
        return batch

    fake_rollout.produces = {B.RESPONSES, B.RESPONSE_MASK, B.INPUT_IDS, B.ATTENTION_MASK}
    flow = DataFlow("f", [fake_rollout, Stage.REWARD, Stage.OLD_LOGPROB, Stage.ADVANTAGE, Stage.UPDATE_ACTOR])
    flow.compile()


def test_remove_and_replace() -> None:
    flow = DataFlow("f", GRPO_STAGES)
    flow.remove(Stage.FILTER)
    assert "filter" not in flow.names()

    def my_sync(batch):
        return batch

    flow.replace(Stage.SYNC_WEIGHTS, my_sync)
    assert flow.names()[-1] == "my_sync"
    flow.compile()


def test_unknown_anchor() -> None:
    flow = DataFlow("f", GRPO_STAGES)
    with pytest.raises(RLForgeError, match="not in dataflow 'f'"):
        flow.insert_after(Stage.VALUES, lambda b: b)
    with pytest.raises(RLForgeError, match="not in dataflow"):
        flow.remove("nope")


def test_non_callable_stage_rejected() -> None:
    with pytest.raises(RLForgeError, match="must be a Stage or a callable"):
        DataFlow("f", [Stage.ROLLOUT, 42])


def test_repr_shows_order() -> None:
    assert repr(DataFlow("f", [Stage.ROLLOUT, Stage.REWARD])) == "DataFlow('f', rollout -> reward)"


# --- stage objects, the step context, and the flow-edit hook ---------------------------------------


class CountTokens(Stage):
    """A user stage object: reads the context, logs a metric, adds a column."""

    name = "count_tokens"
    requires = frozenset({B.RESPONSE_MASK})
    produces = frozenset({"n_tokens"})

    def run(self, ctx, batch):
        batch["n_tokens"] = batch[B.RESPONSE_MASK].sum(-1)
        ctx.log({"custom/tokens": float(batch["n_tokens"].sum())})
        return batch


def test_stage_object_subclass_in_a_flow() -> None:
    flow = DataFlow("f", GRPO_STAGES).insert_after(Stage.ROLLOUT, CountTokens())
    assert flow.names()[1] == "count_tokens"
    flow.compile()
    bad = DataFlow("f", [CountTokens(), *GRPO_STAGES])
    with pytest.raises(RLForgeError, match=r"stage 'count_tokens' needs \['response_mask'\]"):
        bad.compile()


def test_duplicate_stage_names_are_refused() -> None:
    flow = DataFlow("f", GRPO_STAGES).insert_after(Stage.ROLLOUT, CountTokens()).insert_after(Stage.REWARD,
                                                                                               CountTokens())
    with pytest.raises(RLForgeError, match="two stages named 'count_tokens'"):
        flow.compile()


class _Hook:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name):
        return lambda **kw: self.calls.append((name, kw))


def _ctx(flow, draw=None):
    import torch

    from rlforge.sampling import SamplingParams

    hook = _Hook()
    ctx = StepContext(config=None, controller=None, module=None, hook=hook, step=3, sampling=SamplingParams(),
                      flow=flow, draw=draw or (lambda: B.Batch({B.RESPONSE_MASK: torch.ones(2, 3)})),
                      hook_trainer="T")
    return ctx, hook


def test_context_runs_a_stage_with_hooks_timing_and_metrics() -> None:
    import torch

    flow = DataFlow("f", [CountTokens()])
    ctx, hook = _ctx(flow)
    out = ctx.run(flow.stages[0], B.Batch({B.RESPONSE_MASK: torch.ones(2, 4)}))
    assert out["n_tokens"].tolist() == [4, 4]
    assert ctx.metrics["custom/tokens"] == 8.0 and ctx.metrics["timing_s/count_tokens"] >= 0
    assert [c[0] for c in hook.calls] == ["rlforge_stage_start", "rlforge_stage_end"]
    assert all(c[1]["trainer"] == "T" and c[1]["stage"] == "count_tokens" for c in hook.calls)


def test_context_regenerate_runs_the_stages_before_the_given_one() -> None:
    seen: list[str] = []

    def first(batch):
        seen.append("first")
        return batch

    def second(batch):
        seen.append("second")
        return batch

    later = CountTokens()
    flow = DataFlow("f", [first, later, second])
    ctx, _ = _ctx(flow)
    batch = ctx.regenerate(before=later)
    assert seen == ["first"] and "n_tokens" not in batch
    with pytest.raises(RLForgeError, match="not in dataflow"):
        ctx.regenerate(before=CountTokens())


def test_a_stage_that_runs_others_is_timed_without_them() -> None:
    import time

    class Slow(Stage):
        name = "slow"

        def run(self, ctx, batch):
            time.sleep(0.05)
            return batch

    class Outer(Stage):
        name = "outer"

        def run(self, ctx, batch):
            return ctx.run(Slow(), batch)

    ctx, _ = _ctx(DataFlow("f", []))
    ctx.run(Outer(), B.Batch())
    assert ctx.metrics["timing_s/slow"] >= 0.05
    assert ctx.metrics["timing_s/outer"] < ctx.metrics["timing_s/slow"]  # its own few microseconds only


def test_recomputed_old_log_probs_log_verls_rollout_probability_diff() -> None:
    """With the actor's recomputation (not the engine's log-probs reused), the old-log-prob stage logs verl's
    training/rollout_probs_diff_* (|p_actor - p_rollout| over response tokens) and their Pearson correlation."""
    import math

    import torch
    from omegaconf import OmegaConf

    from rlforge.dataflow import OldLogProbStage, rollout_probs_diff

    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.8, 0.1]]))
    actor = torch.log(torch.tensor([[0.6, 0.2, 0.3], [0.1, 0.7, 0.1]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    m = rollout_probs_diff(rollout, actor, mask)
    diffs = torch.tensor([0.1, 0.0, 0.3, 0.1, 0.0])  # the masked-out 0.9 vs 0.3 does not count
    assert m["training/rollout_probs_diff_valid"] == 1.0
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.3) and m["training/rollout_probs_diff_mean"] == \
        pytest.approx(0.1) and m["training/rollout_probs_diff_std"] == pytest.approx(float(diffs.std()))
    a, r = [0.6, 0.2, 0.1, 0.7, 0.1], [0.5, 0.2, 0.4, 0.8, 0.1]
    ma, mr = sum(a) / 5, sum(r) / 5
    cov = sum((x - ma) * (y - mr) for x, y in zip(a, r))
    corr = cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mr) ** 2 for y in r))
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(corr, rel=1e-5)
    assert rollout_probs_diff(rollout, actor, torch.zeros_like(mask)) == {"training/rollout_probs_diff_valid": 0.0}
    batch = B.Batch({B.ROLLOUT_LOG_PROBS: rollout, B.RESPONSE_MASK: mask, B.INPUT_IDS: mask, B.ATTENTION_MASK: mask})
    for reuse, logged in ((False, True), (True, False)):
        ctx, _ = _ctx(DataFlow("t", []))
        ctx.config = OmegaConf.create({"actor": {"reuse_rollout_log_probs": reuse}})
        ctx.controller = fake_controller(workers={"actor": {"compute_log_probs": lambda b, role: actor}})
        OldLogProbStage().run(ctx, batch)
        assert ("training/rollout_probs_diff_mean" in ctx.metrics) is logged  # reused: the same numbers, no diff
