"""model.precision on CPU (bf16 and fp16 autocast run here): fp32 master weights and optimizer state, updates
close to fp32's (stated tolerances), loss scaling for 16-mixed with its state resumed exactly."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config, precision
from rlforge.algorithms.grpo import GRPO
from rlforge.errors import ConfigError
from rlforge.plugin_manager import PluginManager
from rlforge.worker import ActorWorker


@pytest.fixture(scope="module")
def pm():
    return PluginManager(autoload=False)


def test_the_table_and_auto() -> None:
    assert precision.resolve("auto", "cuda").name == "bf16-mixed"
    assert precision.resolve("auto", torch.device("cpu")).name == "32-true"
    p = precision.resolve("16-mixed")
    assert (p.weights, p.compute, p.scaler, p.frozen) == ("float32", "float16", True, "float16")
    assert precision.resolve("bf16-true").frozen == "bfloat16"
    with pytest.raises(ConfigError, match=r"'model.precision' is 'fp8'. Allowed: auto, 32-true, bf16-mixed"):
        precision.resolve("fp8")


def _batch(module, n=8, resp=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = module.actor.config.vocab_size
    prompts = torch.randint(7, vocab, (n, 5), generator=g)
    responses = torch.randint(7, vocab, (n, resp), generator=g)
    mask = torch.ones(n, resp, dtype=torch.long)
    return B.Batch({B.PROMPTS: prompts, B.PROMPT_MASK: torch.ones_like(prompts), B.RESPONSES: responses,
                    B.RESPONSE_MASK: mask, B.INPUT_IDS: torch.cat([prompts, responses], 1),
                    B.ATTENTION_MASK: torch.ones(n, 5 + resp, dtype=torch.long),
                    B.ADVANTAGES: torch.randn(n, resp, generator=g)})


class SGDGRPO(GRPO):
    """Plain SGD: Adam's first step is sign-like, which would turn float noise in near-zero gradients into
    full-size differences; SGD's update is the gradient itself, what the precision changes."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.actor.parameters(), lr=self.config.actor.lr, momentum=0.9), None


def _update(pm, prec: str, steps: int = 1, extra=(), seeds=None):
    cfg = load_config("grpo", ["data.train_batch_size=2", "rollout.n=4", "actor.ppo_mini_batch_size=2",
                               "actor.lr=1e-2", f"model.precision={prec}", "actor.use_kl_loss=true", *extra],
                      plugins=pm)
    module = SGDGRPO(cfg)
    module.configure_model()
    before = {k: v.detach().float().clone() for k, v in module.actor.state_dict().items()}
    torch.manual_seed(0)
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    for step in seeds if seeds is not None else range(steps):
        batch = _batch(module, seed=step)
        batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch).detach()
        batch[B.REF_LOG_PROBS] = worker.compute_log_probs(batch, "ref").detach()
        worker.update(batch)
    after = {k: v.detach().float().clone() for k, v in module.actor.state_dict().items()}
    return module, worker, {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("prec,tol", [("bf16-mixed", 0.08), ("16-mixed", 0.02)])
def test_mixed_precision_updates_match_fp32_and_keep_fp32_masters(pm, prec: str, tol: float) -> None:
    _, _, ref = _update(pm, "32-true")
    # 16-mixed: the loss scaler starts at 2^16, so its first step overflows and is skipped (the scale halves),
    # as with any dynamic loss scaling; the same batch then gives the compared update
    module, worker, got = _update(pm, prec, seeds=[0, 0] if prec == "16-mixed" else [0])
    assert all(p.dtype == torch.float32 for p in module.actor.parameters())  # master weights
    moments = [v for s in worker.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    assert moments and all(v.dtype == torch.float32 for v in moments)  # optimizer state in fp32
    assert next(module.ref.parameters()).dtype == precision.resolve(prec).dtype("frozen")  # the frozen reference
    flat_ref = torch.cat([d.flatten() for d in ref.values()])
    flat_got = torch.cat([d.flatten() for d in got.values()])
    cos = torch.nn.functional.cosine_similarity(flat_ref, flat_got, dim=0)
    rel = (flat_got - flat_ref).norm() / flat_ref.norm()
    assert cos > 0.99 and rel < tol, (float(cos), float(rel))  # the stated tolerance (relative, of the update)


def test_16_mixed_scales_the_loss_and_its_state_resumes(pm) -> None:
    module, worker, _ = _update(pm, "16-mixed", steps=2)
    scaler = worker.strategy.scaler
    assert scaler is not None and scaler.get_scale() > 1
    state = worker.state_dict()
    assert state["precision"]["scale"] == scaler.get_scale()
    _, fresh, _ = _update(pm, "16-mixed", steps=0)
    fresh.load_state_dict(state)
    assert fresh.strategy.scaler.get_scale() == scaler.get_scale()
    assert fresh.strategy.scaler.state_dict()["_growth_tracker"] == scaler.state_dict()["_growth_tracker"]


def test_bf16_true_trains_bf16_weights(pm) -> None:
    module, worker, delta = _update(pm, "bf16-true")
    assert all(p.dtype == torch.bfloat16 for p in module.actor.parameters())
    assert worker.strategy.autocast().__class__.__name__ == "nullcontext"
    assert any(d.abs().sum() > 0 for d in delta.values())


@pytest.mark.slow
@pytest.mark.learning_matrix  # the adapter-only and bf16 updates are checked in the default suite
def test_grpo_learns_in_bf16_mixed(tmp_path) -> None:
    from rlforge import Trainer

    cfg = load_config("grpo", [f"trainer.runs_root={tmp_path}", "trainer.total_steps=30", "model.precision=bf16-mixed",
                               "trainer.val_before_train=false", "trainer.save_every=0", "trainer.val_every=0",
                               "data.arith.val_size=16", "trainer.progress=false", "logger.backends=[]"])
    trainer = Trainer(cfg)
    trainer.fit()
    scores = [h["critic/score/mean"] for h in trainer.history]
    assert sum(scores[-10:]) / 10 > sum(scores[:10]) / 10 + 0.03, scores
