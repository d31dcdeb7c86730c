"""rlforge.dataflow: the step's stages as data, validated by compile()."""

from __future__ import annotations

import pytest

from rlforge import batch as B
from rlforge.dataflow import STAGE_IO, DataFlow, Stage
from rlforge.errors import RLForgeError

GRPO_STAGES = [
    Stage.ROLLOUT, Stage.REWARD, Stage.FILTER, Stage.OLD_LOGPROB, Stage.ADVANTAGE, Stage.UPDATE_ACTOR,
    Stage.SYNC_WEIGHTS,
]
PPO_STAGES = [
    Stage.ROLLOUT, Stage.REWARD, Stage.OLD_LOGPROB, Stage.REF_LOGPROB, Stage.VALUES, Stage.ADVANTAGE,
    Stage.UPDATE_CRITIC, Stage.UPDATE_ACTOR, Stage.SYNC_WEIGHTS,
]


def test_every_stage_has_io() -> None:
    assert set(STAGE_IO) == set(Stage)


def test_grpo_module_flow_compiles(default_config) -> None:
    from rlforge.algorithms.grpo import GRPO

    flow = GRPO(default_config).flow()
    assert flow.compile() is flow
    assert flow.names() == [s.value for s in GRPO_STAGES]
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
    step = flow.steps[2]
    assert step.fn is shape_rewards and step.stage is None
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
