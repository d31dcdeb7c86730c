"""Tensor utilities of the forward passes: chunked log-probs/entropy, packed and trimmed layouts, micro-batch plans."""

from __future__ import annotations

import pytest
import torch

from rlforge.controller.microbatch import balanced_split, fixed_plan, token_budget_plan
from rlforge.models import load_model
from rlforge.ops import response_logprobs, response_values, token_logprobs


def test_token_logprobs_hand_computed():
    logits = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    logp, ent = token_logprobs(logits, torch.tensor([0, 1]), with_entropy=True)
    e = torch.tensor(torch.e)
    ln2, lse = torch.log(torch.tensor(2.0)), torch.log(1 + e)
    torch.testing.assert_close(logp, torch.stack([-ln2, 1 - lse]))
    p1 = e / (1 + e)  # entropy of softmax([0, 1])
    torch.testing.assert_close(ent, torch.stack([ln2, -(p1 * torch.log(p1) + (1 - p1) * torch.log(1 - p1))]))


def test_chunked_logprobs_equal_one_piece_with_gradients():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 50, requires_grad=True)
    labels = torch.randint(0, 50, (3, 7))
    results = []
    for chunk in (10**6, 4 * 50):  # one piece | chunks of 4 rows (6 chunks, recomputed in backward)
        logits.grad = None
        logp, ent = token_logprobs(logits, labels, with_entropy=True, chunk_elements=chunk)
        (logp.sum() + 0.3 * ent.sum()).backward()
        results.append((logp.detach(), ent.detach(), logits.grad.clone()))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)
    reference = torch.log_softmax(logits.detach(), -1)
    torch.testing.assert_close(results[0][0], reference.gather(-1, labels[..., None])[..., 0])
    torch.testing.assert_close(results[0][1], -(reference.exp() * reference).sum(-1))


def _padded_batch(vocab, seed=0):
    """Left-padded prompts (4..9 tokens) and right-padded responses (1..6 tokens), as the rollout builds them."""
    g = torch.Generator().manual_seed(seed)
    n, p, r = 6, 9, 6
    prompt_len = torch.tensor([9, 4, 7, 5, 9, 6])
    resp_len = torch.tensor([1, 6, 3, 2, 5, 4])
    prompt_mask = (torch.arange(p)[None] >= p - prompt_len[:, None]).long()
    resp_mask = (torch.arange(r)[None] < resp_len[:, None]).long()
    mask = torch.cat([prompt_mask, resp_mask], 1)
    ids = torch.randint(5, vocab, (n, p + r), generator=g) * mask  # 0 = pad
    return ids, mask, r


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("builtin:tiny-arith")


def test_packed_and_trimmed_logprobs_equal_the_full_padded_forward(tiny):
    ids, mask, r = _padded_batch(tiny.config.vocab_size)
    # reference: the whole padded batch through the model, every logit computed
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = tiny(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -r - 1 : -1] / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, -r:, None])[..., 0] * mask[:, -r:]
    for packed in (False, True):
        tiny.zero_grad()
        logp, ent = response_logprobs(tiny, ids, mask, r, temperature=0.7, with_entropy=True, remove_padding=packed)
        torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-5)
        assert (logp[mask[:, -r:] == 0] == 0).all() and (ent[mask[:, -r:] == 0] == 0).all()
        logp.sum().backward()
        grad = tiny.model.layers[0].mlp.up_proj.weight.grad.clone()
        if packed:
            torch.testing.assert_close(grad, padded_grad, rtol=1e-4, atol=1e-4 * padded_grad.abs().max().item())
        padded_grad = grad


def test_packed_values_equal_padded_values():
    from rlforge.models import load_value_model

    critic = load_value_model("builtin:tiny-arith")
    ids, mask, r = _padded_batch(critic.config.vocab_size, seed=1)
    padded = response_values(critic, ids, mask, r)
    torch.testing.assert_close(response_values(critic, ids, mask, r, remove_padding=True), padded, rtol=1e-5, atol=1e-5)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    full = critic(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -r - 1 : -1, 0] * mask[:, -r:]
    torch.testing.assert_close(padded, full, rtol=1e-5, atol=1e-5)


LENGTHS = [30, 5, 12, 12, 40, 7, 22, 3, 18, 9, 25, 11]


def _check_plan(plan, rows):
    assert sorted(i for b in plan for i in b) == list(range(rows))  # every row exactly once
    assert all(b == sorted(b) and b for b in plan)


def test_fixed_plan():
    assert fixed_plan(5, 2) == [[0, 1], [2, 3], [4]]


def test_packed_plan_fits_the_budget_and_balances():
    plan = token_budget_plan(LENGTHS, 64, packed=True)
    _check_plan(plan, len(LENGTHS))
    loads = [sum(LENGTHS[i] for i in b) for b in plan]
    assert len(plan) == 4 and max(loads) <= 64  # 194 tokens: 4 parts of at most 64
    assert max(loads) - min(loads) <= 3, loads


def test_padded_plan_counts_rows_times_the_longest():
    plan = token_budget_plan(LENGTHS, 64, packed=False)
    _check_plan(plan, len(LENGTHS))
    assert all(len(b) * max(LENGTHS[i] for i in b) <= 64 for b in plan), plan
    # rows of similar length go together: 40 alone, then 30 + 25, 22 + 18, ...
    assert plan[:3] == [[4], [0, 10], [6, 8]]


@pytest.mark.parametrize("packed", [True, False])
def test_a_forced_number_of_micro_batches(packed):
    for parts in (5, 9, 12):
        plan = token_budget_plan(LENGTHS, 64, packed=packed, parts=parts)
        _check_plan(plan, len(LENGTHS))
        assert len(plan) == parts


def test_a_row_longer_than_the_budget_travels_alone():
    assert token_budget_plan([100, 10, 10], 50, packed=True) == [[0], [1, 2]]
    assert token_budget_plan([100, 10, 10], 50, packed=False) == [[0], [1, 2]]


def test_balanced_split_for_ranks():
    groups = balanced_split(LENGTHS, 3)
    _check_plan(groups, len(LENGTHS))
    assert [len(g) for g in groups] == [4, 4, 4]
    loads = [sum(LENGTHS[i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= max(LENGTHS) // 2, loads
