"""Tensor utilities of the forward passes: chunked log-probs/entropy, packed, trimmed and shared-prefix layouts,
micro-batch plans."""

from __future__ import annotations

import pytest
import torch

from rlforge.errors import RLForgeError
from rlforge.lengths import length_groups
from rlforge.microbatch import balanced_split, fixed_plan, token_budget_plan
from rlforge.models import load_model
from rlforge.ops import (
    SHARE_ALWAYS,
    SHARE_REPEATED,
    prompt_groups,
    response_logprobs,
    response_values,
    share_prompts,
    token_logprobs,
    topk_logprobs,
)


@pytest.mark.parametrize("chunk", [1 << 24, 7 * 11])  # one chunk; chunks of 7 positions (11-token vocabulary)
def test_topk_logprobs_is_the_whole_log_softmax_in_chunks(chunk):
    """The log-probs at the labels and at given ids, the entropy and the K largest ids equal those of one whole
    log-softmax, and so do their gradients, chunked (recomputed in the backward pass) or not."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 10, 11, generator=g)  # fp32, as the function computes
    labels = torch.randint(0, 11, (3, 10), generator=g)
    ids = torch.randint(0, 11, (3, 10, 4), generator=g)
    a = logits.clone().requires_grad_()
    logp, ent, at_ids, own = topk_logprobs(a, labels, ids, chunk_elements=chunk)
    b = logits.clone().requires_grad_()
    whole = torch.log_softmax(b, -1)
    expected = (whole.gather(-1, labels[..., None]).squeeze(-1), -(whole.exp() * whole).sum(-1), whole.gather(-1, ids))
    for got, want in zip((logp, ent, at_ids), expected):
        torch.testing.assert_close(got, want)
    assert torch.equal(own, logits.topk(4, dim=-1).indices)
    weights = [torch.randn(x.shape, generator=g) for x in expected]
    sum((x * w).sum() for x, w in zip((logp, ent, at_ids), weights)).backward()
    sum((x * w).sum() for x, w in zip(expected, weights)).backward()
    torch.testing.assert_close(a.grad, b.grad)


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


def test_prompt_groups_hand_computed():
    ids = torch.tensor([[0, 7, 8], [5, 6, 7], [0, 7, 8], [5, 6, 7], [0, 7, 8], [9, 9, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
    # distinct (ids, mask), sorted: [0 7 8 | 0 1 1] (rows 0, 2), [0 7 8 | 1 1 1] (row 4: same ids, longer
    # prompt), [5 6 7 | 1 1 1] (rows 1, 3), [9 9 9 | 1 1 1] (row 5)
    first, inverse = prompt_groups(ids, mask)
    assert first.tolist() == [0, 4, 1, 5]
    assert inverse.tolist() == [0, 2, 0, 2, 1, 3]
    assert prompt_groups(ids[[0, 1, 4, 5]], mask[[0, 1, 4, 5]]) is None  # no prompt repeats


def _grouped_batch(vocab, resp_lens, seed=0):
    """4 prompts of 9, 4, 7 and 1 real tokens, each with ``len(resp_lens) // 4`` responses, rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    p, r = 9, max(resp_lens)
    prompt_mask = (torch.arange(p)[None] >= p - torch.tensor([9, 4, 7, 1])[:, None]).long()
    prompts = torch.randint(5, vocab, (4, p), generator=g) * prompt_mask
    n = len(resp_lens)
    resp_mask = (torch.arange(r)[None] < torch.tensor(resp_lens)[:, None]).long()
    mask = torch.cat([prompt_mask.repeat_interleave(n // 4, 0), resp_mask], 1)
    ids = torch.cat([prompts.repeat_interleave(n // 4, 0), torch.randint(5, vocab, (n, r), generator=g)], 1) * mask
    order = torch.randperm(n, generator=g)
    return ids[order], mask[order], r


def _logprobs_and_grad(model, ids, mask, r, when):
    share_prompts(model, when)
    model.zero_grad()
    try:
        logp, ent = response_logprobs(model, ids, mask, r, temperature=0.7, with_entropy=True)
    finally:
        share_prompts(model, None)
    (logp.sum() + 0.5 * ent.sum()).backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same_forward(a, b, tol=1e-5):
    """Log-probs, entropies and gradients (relative to each one's largest entry) of two ``_logprobs_and_grad``."""
    for x, y in zip(a[:2], b[:2]):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)
    for name, grad in a[2].items():
        torch.testing.assert_close(grad, b[2][name], rtol=tol, atol=tol * b[2][name].abs().max().item(), msg=name)


@pytest.mark.parametrize("resp_lens", [[1, 6, 3, 2, 5, 4, 6, 1, 2, 3, 4, 5], [1] * 8], ids=["1-6 tokens", "1 token"])
def test_shared_prefix_logprobs_and_gradients_equal_the_padded_forward(tiny, shared_calls, resp_lens):
    ids, mask, r = _grouped_batch(tiny.config.vocab_size, resp_lens)
    plain = _logprobs_and_grad(tiny, ids, mask, r, None)
    assert not shared_calls
    shared = _logprobs_and_grad(tiny, ids, mask, r, SHARE_REPEATED)
    assert len(shared_calls) == 1
    _assert_same_forward(shared, plain)
    logp, ent = shared[:2]
    assert (logp[mask[:, -r:] == 0] == 0).all() and (ent[mask[:, -r:] == 0] == 0).all()


@pytest.mark.parametrize("resp_lens", [[1, 6, 3, 2, 5, 4], [1] * 6], ids=["1-6 tokens", "1 token"])
def test_without_a_repeated_prompt_only_share_always_splits_the_forward(tiny, shared_calls, resp_lens):
    """A micro-batch of distinct prompts takes the plain path, or with ``SHARE_ALWAYS`` (the ranks of a sharded
    model) the same two forward passes as any other, with the same results."""
    ids, mask, r = _padded_batch(tiny.config.vocab_size)  # 6 distinct prompts
    mask[:, -r:] = (torch.arange(r)[None] < torch.tensor(resp_lens)[:, None]).long()
    ids = ids * mask
    plain = _logprobs_and_grad(tiny, ids, mask, r, None)
    repeated = _logprobs_and_grad(tiny, ids, mask, r, SHARE_REPEATED)
    assert not shared_calls
    for a, b in zip(repeated[:2], plain[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    always = _logprobs_and_grad(tiny, ids, mask, r, SHARE_ALWAYS)
    assert len(shared_calls) == 1
    _assert_same_forward(always, plain)


def test_shared_prefix_values_equal_padded_values(shared_calls):
    from rlforge.models import load_value_model

    critic = load_value_model("builtin:tiny-arith")
    ids, mask, r = _grouped_batch(critic.config.vocab_size, [1, 6, 3, 2, 5, 4, 6, 1], seed=1)
    padded = response_values(critic, ids, mask, r)
    share_prompts(critic)
    torch.testing.assert_close(response_values(critic, ids, mask, r), padded, rtol=1e-5, atol=1e-5)
    assert len(shared_calls) == 1


def test_shared_prefix_refuses_a_model_that_drops_the_cache():
    """transformers drops the KV cache in gradient-checkpointed layers in training mode (the workers then keep
    the plain path); a model marked anyway fails instead of computing responses without their prompts."""
    model = load_model("builtin:tiny-arith")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids, mask, r = _grouped_batch(model.config.vocab_size, [2] * 8)
    share_prompts(model)
    with pytest.raises(RLForgeError, match="did not fill the prompts' KV cache.*Set model.shared_prefix=false"):
        response_logprobs(model, ids, mask, r)


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


def test_length_groups_cut_where_padding_costs_more_than_a_pass():
    # 8 rows of 20 tokens and 2 of 600: one pass 10 x 608 = 6080 padded tokens, two 2 x 608 + 8 x 32 + 2 x 256
    assert length_groups([20, 600, 20, 20, 20, 600, 20, 20, 20, 20]) == [[1, 5], [0, 2, 3, 4, 6, 7, 8, 9]]
    assert length_groups([100] * 6) == [list(range(6))]  # uniform: one pass
    assert length_groups([30, 5, 12, 12, 40, 7]) == [list(range(6))]  # a split saves less than a pass costs
    # without a cost per pass, one group per distinct length rounded up to 16 (48, 32, 16)
    assert length_groups([30, 5, 12, 12, 40, 7], overhead=0) == [[4], [0], [1, 2, 3, 5]]


def _heavy_tailed_batch(vocab, shared_prompts):
    """10 rows: 8 responses of 6 tokens, 2 of 200 (left-padded prompts of 5..9 tokens, in pairs when shared)."""
    g = torch.Generator().manual_seed(3)
    prompt_len = torch.tensor([9, 5, 7, 6, 9, 8, 5, 6, 7, 8])
    resp_len = torch.tensor([6, 6, 200, 6, 6, 6, 6, 200, 6, 6])
    p, r = 9, 200
    mask = torch.cat([(torch.arange(p)[None] >= p - prompt_len[:, None]), torch.arange(r)[None] < resp_len[:, None]],
                     1).long()
    ids = torch.randint(5, vocab, (10, p + r), generator=g) * mask
    if shared_prompts:  # rows 2k and 2k+1 share a prompt
        ids[1::2, :p], mask[1::2, :p] = ids[0::2, :p], mask[0::2, :p]
    return ids, mask, r


@pytest.mark.parametrize("shared", [False, True])
def test_a_heavy_tailed_batch_runs_by_length_with_the_one_pass_results(tiny, shared, monkeypatch):
    import rlforge.ops

    ids, mask, r = _heavy_tailed_batch(tiny.config.vocab_size, shared)
    share_prompts(tiny, SHARE_REPEATED if shared else None)
    calls = []
    hook = tiny.register_forward_pre_hook(lambda module, args: calls.append(1))
    results = []
    try:
        for one_pass in (False, True):
            if one_pass:
                monkeypatch.setattr(rlforge.ops, "length_groups", lambda lengths: [list(range(len(lengths)))])
            tiny.zero_grad()
            calls.clear()
            logp, ent = response_logprobs(tiny, ids, mask, r, temperature=0.7, with_entropy=True)
            (logp.sum() + ent.sum()).backward()
            results.append((len(calls), logp.detach(), ent.detach(), tiny.model.layers[0].mlp.up_proj.weight.grad.clone()))
    finally:
        hook.remove()
        share_prompts(tiny, None)
    (grouped_calls, *grouped), (single_calls, *single) = results
    # two groups, the 200-token rows and the others; shared: the long rows' prompts do not repeat (plain pass: 1 call)
    assert (grouped_calls, single_calls) == ((3, 2) if shared else (2, 1))
    for a, b in zip(grouped, single):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    assert (grouped[0][mask[:, -r:] == 0] == 0).all()


def test_values_of_a_heavy_tailed_batch_run_by_length(monkeypatch):
    import rlforge.ops
    from rlforge.models import load_value_model

    critic = load_value_model("builtin:tiny-arith")
    ids, mask, r = _heavy_tailed_batch(critic.config.vocab_size, shared_prompts=False)
    grouped = response_values(critic, ids, mask, r)
    monkeypatch.setattr(rlforge.ops, "length_groups", lambda lengths: [list(range(len(lengths)))])
    torch.testing.assert_close(grouped, response_values(critic, ids, mask, r), rtol=1e-5, atol=1e-5)
