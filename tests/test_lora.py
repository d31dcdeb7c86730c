"""LoRA through peft (model.lora.*): only the adapter trains and is checkpointed, the reference is the base model
with the adapter off (no second copy), engines get merged weights, export merges or keeps the adapter, resume is
bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config, lora
from rlforge.cli import main
from rlforge.controller.worker import ActorWorker
from rlforge.errors import ConfigError
from rlforge.models import load_model
from rlforge.plugin_manager import PluginManager

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "actor.lr=5e-3"]
SMALL = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2", "data.arith.train_size=512", "data.arith.val_size=4",
         "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[console]"]


@pytest.fixture(scope="module")
def pm():
    return PluginManager(autoload=False)


def _module(pm, extra=()):
    cfg = load_config("grpo", [*LORA, "actor.use_kl_loss=true", *SMALL, *extra], plugins=pm)
    module = pm.registry.algorithm.get("grpo")(cfg)
    module.configure_model()
    return cfg, module


def _nbytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_only_the_adapter_trains_and_no_reference_copy_is_held(pm) -> None:
    cfg, module = _module(pm)
    assert lora.is_lora(module.actor) and module.ref is None and module.reference_is_base()
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    held = {id(p) for g in worker.optimizer.param_groups for p in g["params"]}
    names = [n for n, p in module.actor.named_parameters() if id(p) in held]
    assert names and all("lora_" in n for n in names)
    # memory: the full-fine-tuning run holds the actor and a reference copy; the LoRA run the actor + adapter
    full = load_model(cfg.model.path)
    saved = 2 * _nbytes(full) - _nbytes(module.actor)
    assert saved >= 0.9 * _nbytes(full)  # the reference's copy, minus the small adapter


def test_reference_log_probs_are_the_base_models_after_updates(pm) -> None:
    cfg, module = _module(pm)
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    g = torch.Generator().manual_seed(0)
    vocab = module.actor.config.vocab_size
    prompts, responses = torch.randint(7, vocab, (8, 5), generator=g), torch.randint(7, vocab, (8, 3), generator=g)
    batch = B.Batch({B.PROMPTS: prompts, B.PROMPT_MASK: torch.ones_like(prompts), B.RESPONSES: responses,
                     B.RESPONSE_MASK: torch.ones_like(responses), B.INPUT_IDS: torch.cat([prompts, responses], 1),
                     B.ATTENTION_MASK: torch.ones(8, 8, dtype=torch.long),
                     B.ADVANTAGES: torch.randn(8, 3, generator=g)})
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch)
    batch[B.REF_LOG_PROBS] = worker.compute_log_probs(batch, "ref")
    for _ in range(3):
        worker.update(batch)
    base_cfg = load_config("grpo", ["actor.use_kl_loss=true", *SMALL], plugins=pm)
    base = pm.registry.algorithm.get("grpo")(base_cfg)
    base.configure_model()
    expected = ActorWorker(base_cfg, base, pm.registry.strategy.get("single")(base_cfg)).compute_log_probs(batch, "ref")
    assert torch.equal(worker.compute_log_probs(batch, "ref"), expected)  # the base model, exactly
    assert not torch.allclose(worker.compute_log_probs(batch), expected)  # the adapter has learned something


def test_engines_get_merged_weights_under_the_base_names(pm) -> None:
    _, module = _module(pm)
    with torch.no_grad():
        for name, p in module.actor.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # a trained adapter (B starts at 0)
    merged = dict(lora.merged_weights(module.actor))
    reference = {k: v.clone() for k, v in module.actor.merge_and_unload().state_dict().items()}
    assert set(merged) <= set(reference) and "model.layers.0.self_attn.q_proj.weight" in merged
    for name, tensor in merged.items():
        assert torch.allclose(tensor, reference[name], atol=1e-6), name


def test_lora_needs_one_device_and_valid_options(pm) -> None:
    with pytest.raises(ConfigError, match="model.lora.rank' must be >= 0"):
        load_config("grpo", ["model.lora.rank=-1"], plugins=pm)
    with pytest.raises(ConfigError, match="runs on one device so far"):
        load_config("grpo", ["model.lora.rank=4", "strategy.num_processes=2", "strategy.name=fsdp",
                             "trainer.controller=ray"], plugins=pm)
    with pytest.raises(ConfigError, match="LoRA cannot be applied"):
        _module(pm, ["model.lora.target_modules=[no_such_proj]"])


def _fit(tmp_path: Path, steps: int, extra=()) -> Path:
    assert main(["fit", *LORA, *SMALL, f"trainer.runs_root={tmp_path}", f"trainer.total_steps={steps}",
                 "trainer.save_every=2", "trainer.keep_last_n=0", *extra]) == 0
    return next(tmp_path.glob("default/*"))


def test_checkpoints_hold_the_adapter_resume_exactly_and_export_both_ways(tmp_path: Path, capsys) -> None:
    straight = _fit(tmp_path / "a", 4)
    ckpt = straight / "checkpoints" / "step_000004" / "actor"
    assert (ckpt / lora.ADAPTER_WEIGHTS).is_file() and not (ckpt / "model.safetensors").exists()
    from safetensors.torch import load_file

    final = load_file(str(ckpt / lora.ADAPTER_WEIGHTS))
    assert all("lora_" in k for k in final)
    # resume: 2 steps, then 2 more from the checkpoint of step 2
    run = _fit(tmp_path / "b", 2)
    assert main(["fit", *LORA, *SMALL, f"trainer.runs_root={tmp_path / 'b'}", "trainer.total_steps=4",
                 "trainer.save_every=2", "trainer.keep_last_n=0", f"trainer.resume={run / 'checkpoints' / 'step_000002'}"]) == 0
    resumed = load_file(str(run / "checkpoints" / "step_000004" / "actor" / lora.ADAPTER_WEIGHTS))
    assert set(resumed) == set(final) and all(torch.equal(resumed[k], final[k]) for k in final)
    # export: merged (a plain model that computes what the adapter model computes), or the adapter itself
    assert main(["export", str(straight), str(tmp_path / "merged")]) == 0
    assert main(["export", str(straight), str(tmp_path / "adapter"), "--adapter"]) == 0
    from peft import PeftModel

    base = load_model("builtin:tiny-arith")
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = load_model(str(tmp_path / "merged")).eval()
    ids = torch.randint(7, 90, (2, 9))
    assert torch.allclose(merged(ids).logits, with_adapter(ids).logits, atol=1e-4)


@pytest.mark.slow
@pytest.mark.learning_matrix  # the adapter-only and bf16 updates are checked in the default suite
def test_grpo_with_lora_learns(tmp_path) -> None:
    from rlforge import Trainer

    cfg = load_config("grpo", ["model.lora.rank=16", "model.lora.alpha=32", "actor.lr=3e-4",
                               f"trainer.runs_root={tmp_path}", "trainer.total_steps=30",
                               "trainer.val_before_train=false", "trainer.save_every=0", "trainer.val_every=0",
                               "data.arith.val_size=16", "trainer.progress=false", "logger.backends=[]"])
    trainer = Trainer(cfg)
    trainer.fit()
    scores = [h["critic/score/mean"] for h in trainer.history]
    assert sum(scores[-10:]) / 10 > sum(scores[:10]) / 10 + 0.03, scores


def test_sft_with_lora_trains_the_adapter_and_writes_the_merged_model(tmp_path: Path, pm) -> None:
    from safetensors.torch import load_file

    from rlforge.sft import run_sft

    out = tmp_path / "out"
    cfg = load_config(overrides=["data.arith.train_size=32", "data.arith.val_size=8", "sft.batch_size=8", "sft.steps=3",
                                 "sft.warmup_steps=1", "sft.progress=false", "sft.loggers=[]", "sft.save_every=0",
                                 "sft.val_accuracy=false", "sft.init=builtin:tiny-arith", f"sft.output_dir={out}",
                                 "sft.lr=1e-2", "model.lora.rank=4"], plugins=pm)
    run_sft(cfg, pm, log=lambda *_: None)
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    trained, base = load_file(str(out / "model.safetensors")), load_model("builtin:tiny-arith").state_dict()
    assert set(trained) <= set(base) and any(not torch.equal(trained[k], base[k]) for k in trained)
    assert torch.equal(trained["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # not adapted
