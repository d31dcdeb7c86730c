"""The update loop: splitting a mini-batch into micro-batches does not change the optimizer step."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.controller.worker import ActorWorker
from rlforge.algorithms.grpo import GRPO
from rlforge.plugin_manager import PluginManager

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _rollout_batch(module, n_seqs=16, resp_len=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = module.actor.config.vocab_size
    prompts = torch.randint(7, vocab, (n_seqs, 6), generator=g)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[: n_seqs // 2, :2] = 0  # some left padding
    responses = torch.randint(7, vocab, (n_seqs, resp_len), generator=g)
    lengths = torch.randint(1, resp_len + 1, (n_seqs,), generator=g)
    resp_mask = (torch.arange(resp_len)[None, :] < lengths[:, None]).long()
    batch = B.Batch({
        B.PROMPTS: prompts, B.PROMPT_MASK: prompt_mask, B.RESPONSES: responses, B.RESPONSE_MASK: resp_mask,
        B.INPUT_IDS: torch.cat([prompts, responses], 1), B.ATTENTION_MASK: torch.cat([prompt_mask, resp_mask], 1),
        B.ADVANTAGES: torch.randn(n_seqs, resp_len, generator=g) * resp_mask,
    })
    return batch


@pytest.fixture(scope="module")
def pm():
    return PluginManager(autoload=False)


class SGDGRPO(GRPO):
    """Plain SGD: Adam's first step is sign-like, which would amplify float noise in near-zero gradients."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.actor.parameters(), lr=self.config.actor.lr), None


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_split_gives_the_same_update(pm, mode):
    def run(micro):
        cfg = load_config("grpo", [
            "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", f"actor.ppo_micro_batch_size={micro}",
            f"actor.loss_agg_mode={mode}", "actor.lr=1e-2", "actor.entropy_coeff=0.01",
        ], plugins=pm)
        module = SGDGRPO(cfg)
        module.configure_model()
        torch.manual_seed(0)
        worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
        batch = _rollout_batch(module)
        batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch) + 0.05 * batch[B.RESPONSE_MASK]
        metrics = worker.update(batch)
        return {k: v.detach().clone() for k, v in module.actor.state_dict().items()}, metrics

    whole, m1 = run(16)
    split, m4 = run(4)
    for k in whole:
        torch.testing.assert_close(whole[k], split[k], rtol=1e-5, atol=1e-6, msg=k)
    for k in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert m1[k] == pytest.approx(m4[k], rel=1e-4, abs=1e-6), k
