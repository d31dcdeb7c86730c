"""Multi-turn trajectories, hand-checked token by token: which positions the response mask marks as the model's,
where log-probs and rewards go, and the batch layout everything downstream reads."""

from __future__ import annotations

import torch

from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS, pad_rows, to_batch
from rlforge.agent.types import Trajectory
from tests.agent.conftest import LOGPROB, Scripted, calculator_then_answer, prompt_batch, sampling


def test_tool_trajectory_mask_hand_checked(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, calculator_then_answer))

    # prompt: <|system|> "tools: calculator" (17 chars) <|end|> <|user|> "2+3?" (4) <|end|> <|assistant|> = 26 tokens
    assert tok.decode(out[B.PROMPTS][0]) == "<|system|>tools: calculator<|end|><|user|>2+3?<|end|><|assistant|>"
    assert out[B.PROMPT_MASK][0].tolist() == [1] * 26
    # response: turn 1 = the call (11 + 58 + 12 = 81 chars) + <|end|> = 82 model tokens (positions 0..81);
    # inserted = "<|tool|>" (8 chars) "5" <|end|> <|assistant|> = 11 tokens (82..92); turn 2 = "5" <|end|> (93, 94)
    expected_text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call><|end|>'
                     "<|tool|>5<|end|><|assistant|>5<|end|>")
    assert tok.decode(out[B.RESPONSES][0]) == expected_text
    mask = [1] * 82 + [0] * 11 + [1] * 2
    assert out[B.RESPONSE_MASK][0].tolist() == mask
    assert out[B.ROLLOUT_LOG_PROBS][0].tolist() == [LOGPROB * m for m in mask]
    # every real token is attended, the inserted ones included
    assert out[B.ATTENTION_MASK][0].tolist() == [1] * (26 + 95)
    assert torch.equal(out[B.INPUT_IDS][0], torch.cat([out[B.PROMPTS][0], out[B.RESPONSES][0]]))
    assert out[B.SOLUTION_TEXT] == ["5"]  # the last model turn, without EOS
    assert out[AGENT_REWARDS].sum() == 0
    assert metrics["num_turns/mean"] == 4  # verl's count: prompt + 2 model turns + 1 tool turn
    assert out[B.NUM_TURNS] == [4]  # per row, for the reward function (extra_info["num_turns"], as in verl)
    assert metrics["agent/model_turns/mean"] == 2 and metrics["tool_call_counts/mean"] == 1
    assert metrics["agent/response_tokens_per_turn"] == 84 / 2
    assert metrics["agent/tool_errors"] == 0 and metrics["agent/turn_limit_ratio"] == 0


def test_answer_from_response_scores_the_whole_response_as_verl_does(make_runner, tok):
    """verl's reward managers decode the whole response without special tokens (tool replies included)."""
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                            "rollout.agent.answer_from=response")
    out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, calculator_then_answer))
    assert out[B.SOLUTION_TEXT] == [tok.decode(out[B.RESPONSES][0], skip_special_tokens=True)]
    assert out[B.SOLUTION_TEXT][0].startswith("<tool_call>") and out[B.SOLUTION_TEXT][0].endswith("55")


def test_interaction_trajectory_mask_and_turn_rewards(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor")
    answers = iter(["4", "5"])
    out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, lambda _: next(answers)))

    # prompt: <|user|> "2+3?" <|end|> <|assistant|> = 7 tokens (the loader's ids: no tools)
    assert out[B.PROMPT_MASK][0].tolist() == [1] * 7
    # turn 1 "4" <|end|> (0, 1); inserted <|user|> "Wrong, try again." (17 chars) <|end|> <|assistant|> = 20
    # tokens (2..21); turn 2 "5" <|end|> (22, 23)
    assert tok.decode(out[B.RESPONSES][0]) == "4<|end|><|user|>Wrong, try again.<|end|><|assistant|>5<|end|>"
    assert out[B.RESPONSE_MASK][0].tolist() == [1, 1] + [0] * 20 + [1, 1]
    # the tutor's reward (1.0 for the right answer) goes on the last token of turn 2
    rewards = torch.zeros(24)
    rewards[23] = 1.0
    assert torch.equal(out[AGENT_REWARDS][0], rewards)
    assert metrics["num_turns/mean"] == 4


def test_batch_of_uneven_trajectories_pads_prompts_left_and_responses_right(tok):
    short = Trajectory([7, 8], [9], [1], [-1.0])
    long = Trajectory([5, 6, 7], [1, 2, 3, 4], [1, 0, 0, 1], [-1.0, 0.0, 0.0, -2.0], turn_rewards=[0.5, 0.25],
                      reward=2.0)
    rows = B.Batch(lists={B.UID: ["a", "a"]})
    out = to_batch(rows, [short, long], ["x", "y"], pad_id=0)
    assert out[B.PROMPTS].tolist() == [[0, 7, 8], [5, 6, 7]]
    assert out[B.PROMPT_MASK].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out[B.RESPONSES].tolist() == [[9, 0, 0, 0], [1, 2, 3, 4]]
    assert out[B.RESPONSE_MASK].tolist() == [[1, 0, 0, 0], [1, 0, 0, 1]]
    assert out[B.ATTENTION_MASK].tolist() == [[0, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]]
    assert out[B.ROLLOUT_LOG_PROBS].tolist() == [[-1.0, 0, 0, 0], [-1.0, 0, 0, -2.0]]
    # turn 1 (position 0) gets 0.5; turn 2 (position 3) gets 0.25 + the final 2.0
    assert out[AGENT_REWARDS].tolist() == [[0, 0, 0, 0], [0.5, 0, 0, 2.25]]
    assert out[B.UID] == ["a", "a"]


def test_rollout_n_groups_share_the_uid_and_concat_keeps_inserted_tokens_attended(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    batch = prompt_batch(tok, [("2+3?", "5"), ("1+1?", "2")])
    out, _ = runner.rollout(batch, sampling(n=3), Scripted(tok, calculator_then_answer))
    assert out[B.UID] == ["u0"] * 3 + ["u1"] * 3
    assert out[B.DATA_SOURCE] == ["arith"] * 6
    joined = B.Batch.concat([out.select([0]), out.select([1, 2])])
    assert torch.equal(joined[B.ATTENTION_MASK], out[B.ATTENTION_MASK][:3])
    assert (joined[B.ATTENTION_MASK][:, 26:] > joined[B.RESPONSE_MASK]).any()  # holes stay attended


def test_reward_manager_scores_the_answer_on_the_last_model_token(pm, make_runner, tok):
    runner, cfg = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, calculator_then_answer))
    manager = pm.registry.reward_manager.get("rule")(cfg, tok, pm.registry)
    try:
        scored = manager.score(out)
    finally:
        manager.close()
    assert scored[B.SCORES].tolist() == [1.0]  # arith scores "5", not the whole response
    assert scored[B.TOKEN_LEVEL_SCORES][0].nonzero().flatten().tolist() == [94]


def test_pad_rows_keeps_width_one_for_empty_rows():
    assert pad_rows([[], []], 0).shape == (2, 1)
