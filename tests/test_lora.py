"""LoRA through peft (model.lora.*): only the adapter trains and is checkpointed, the reference is the base model
with the adapter off (no second copy), engines get merged weights, export merges or keeps the adapter, resume is
bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config, lora
from rlforge.cli import main
from rlforge.errors import ConfigError
from rlforge.models import load_model
from rlforge.plugin_manager import PluginManager
from rlforge.worker import ActorWorker

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
    with pytest.raises(ConfigError, match=r"'model.lora.exclude_modules' \('\(mlp'\) is not a regular expression"):
        load_config("grpo", ["model.lora.rank=4", "model.lora.exclude_modules=(mlp"], plugins=pm)


def test_exclude_modules_leaves_the_matching_modules_without_adapters(pm) -> None:
    """model.lora.exclude_modules (verl's model.exclude_modules): a regular expression of whole module names."""
    _, module = _module(pm, ["model.lora.exclude_modules=.*mlp.*"])
    adapted = {n.split(".lora_")[0] for n, _ in module.actor.named_parameters() if ".lora_" in n}
    assert adapted and not any("mlp" in n for n in adapted) and any("self_attn" in n for n in adapted)
    _, everything = _module(pm)
    assert any("mlp" in n for n, _ in everything.actor.named_parameters() if ".lora_" in n)


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
    for folder in (ckpt, tmp_path / "adapter"):  # the base as model.path named it: the folder loads on any machine
        assert json.loads((folder / lora.ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == "builtin:tiny-arith"
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "from `builtin:tiny-arith` by `grpo` for 4 steps." in card and "machine that trained it" not in card
    assert main(["eval", str(tmp_path / "adapter"), "--limit", "2", "--out", str(tmp_path / "report.json")]) == 0
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


# --- a LoRA adapter as the model (model.path, sft.init) -----------------------------------------------------------
@pytest.fixture(scope="module")
def adapter(tmp_path_factory, pm) -> Path:
    """A trained-looking adapter folder of the tiny model, laid out as a LoRA run's checkpoint actor/ (peft's
    save_pretrained and the tokenizer), rank 4, alpha 8, all linear layers."""
    from rlforge.models import load_tokenizer

    cfg = load_config("grpo", LORA, plugins=pm)
    model = lora.wrap(load_model(cfg.model.path), cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    folder = tmp_path_factory.mktemp("adapter") / "actor"
    model.save_pretrained(folder)
    load_tokenizer(cfg.model.path).save_pretrained(folder)
    return folder


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(7, 20).reshape(1, 13)).logits


def _with_adapter(folder: Path):
    from peft import PeftModel

    return PeftModel.from_pretrained(load_model("builtin:tiny-arith"), folder).eval()


def test_an_adapter_folder_is_its_base_model_with_the_adapter_merged(adapter) -> None:
    from rlforge.models import ASSETS, load_tokenizer, load_value_model, resolve_model_path

    assert resolve_model_path(str(adapter)) == ASSETS / "tiny-arith"  # its config.json is the base's
    merged = load_model(str(adapter)).eval()
    assert not lora.is_lora(merged)
    expected = _logits(_with_adapter(adapter))
    assert torch.allclose(_logits(merged), expected, atol=1e-5)
    assert not torch.allclose(_logits(load_model("builtin:tiny-arith").eval()), expected, atol=1e-3)
    assert load_tokenizer(str(adapter)).name_or_path == str(adapter)  # the checkpoint's own tokenizer
    critic = load_value_model(str(adapter))  # critic.path defaults to model.path: the body of the merged policy
    body = merged.state_dict()
    assert all(torch.equal(t, body[k]) for k, t in critic.state_dict().items() if k.startswith("model."))


def test_fit_from_an_adapter_goes_on_training_it_or_trains_the_merged_model_in_full(adapter, pm, tmp_path) -> None:
    from safetensors.torch import load_file

    saved = load_file(str(adapter / lora.ADAPTER_WEIGHTS))
    _, module = _module(pm, [f"model.path={adapter}"])  # model.lora as the adapter was made: its training goes on
    assert lora.is_lora(module.actor) and module.reference_is_base()  # the reference: the base, adapter off
    from peft import get_peft_model_state_dict

    assert all(torch.equal(t, saved[k]) for k, t in get_peft_model_state_dict(module.actor).items())
    assert torch.allclose(_logits(module.actor.eval()), _logits(_with_adapter(adapter)), atol=1e-5)
    _, module = _module(pm, [f"model.path={adapter}", f"model.ref_path={adapter}"])  # KL to the starting policy
    assert not module.reference_is_base() and not lora.is_lora(module.ref)
    assert torch.allclose(_logits(module.ref), _logits(_with_adapter(adapter)), atol=1e-5)
    full = load_config("grpo", [f"model.path={adapter}", "actor.use_kl_loss=true", *SMALL], plugins=pm)
    module = pm.registry.algorithm.get("grpo")(full)  # model.lora.rank=0: the merged model, every weight trained
    module.configure_model()
    assert not lora.is_lora(module.actor) and all(p.requires_grad for p in module.actor.parameters())
    assert torch.allclose(_logits(module.ref), _logits(_with_adapter(adapter)), atol=1e-5)  # the starting policy
    # rlforge fit, 2 steps: the checkpoint is the adapter trained further, on the same base (export merges it there)
    run = _fit(tmp_path, 2, [f"model.path={adapter}"])
    actor = run / "checkpoints" / "step_000002" / "actor"
    trained = load_file(str(actor / lora.ADAPTER_WEIGHTS))
    assert trained.keys() == saved.keys() and any(not torch.equal(trained[k], saved[k]) for k in saved)
    base = json.loads((actor / lora.ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    assert Path(base) == Path(json.loads((adapter / lora.ADAPTER_CONFIG).read_text())["base_model_name_or_path"])


def test_sft_from_an_adapter_goes_on_training_it(adapter, pm) -> None:
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from rlforge.sft.module import build_model, build_tokenizer

    cfg = load_config(overrides=[f"sft.init={adapter}", *LORA], plugins=pm)
    model = build_model(cfg, build_tokenizer(cfg))
    saved = load_file(str(adapter / lora.ADAPTER_WEIGHTS))
    assert lora.is_lora(model) and all(torch.equal(t, saved[k]) for k, t in get_peft_model_state_dict(model).items())


@pytest.mark.parametrize(("extra", "message"), [
    (["model.lora.rank=8"], r"model.lora.rank=8 but the adapter's r is 4"),
    (["model.lora.alpha=16", "model.lora.dropout=0.1"],
     r"model.lora.alpha=16 but the adapter's lora_alpha is 8; model.lora.dropout=0.1 but the adapter's lora_dropout"),
    (["model.lora.target_modules=[q_proj,v_proj]"], r"does not adapt the modules that model.lora.target_modules=.*"
                                                    r"the adapter has \[.base_model.model.model.layers.0.mlp"),
])
def test_an_adapter_that_model_lora_would_not_make_is_refused(adapter, pm, extra, message) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        _module(pm, [f"model.path={adapter}", *extra])
    assert "model.lora.rank=0 to train the merged model in full" in str(info.value)


def test_folders_that_are_neither_a_model_nor_an_adapter(adapter, tmp_path) -> None:
    import shutil

    from rlforge.errors import RLForgeError
    from rlforge.models import resolve_model_path

    (tmp_path / "step_000004" / "actor").mkdir(parents=True)
    with pytest.raises(RLForgeError, match=r"has no config.json: not a Hugging Face model folder, and no "
                                           r"adapter_config.json: not a LoRA adapter \(model.path\). It holds actor/"):
        resolve_model_path(str(tmp_path / "step_000004"))
    (tmp_path / "run" / "checkpoints" / "step_000004").mkdir(parents=True)
    with pytest.raises(RLForgeError, match=r"It is a run folder: its latest checkpoint's model is model.path=.*run/"
                                           r"checkpoints/step_000004/actor\."):
        resolve_model_path(str(tmp_path / "run"))
    orphan = tmp_path / "orphan"
    shutil.copytree(adapter, orphan)
    config = json.loads((orphan / lora.ADAPTER_CONFIG).read_text())
    (orphan / lora.ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(RLForgeError, match=r"names no base model \(base_model_name_or_path\) \(model.path\)"):
        resolve_model_path(str(orphan))
    (orphan / lora.ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(adapter)}))
    with pytest.raises(RLForgeError, match=r"has no config.json: the base must be .* not another adapter"):
        resolve_model_path(str(orphan))
    weights = orphan / lora.ADAPTER_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(RLForgeError, match=r"Cannot load the LoRA adapter .* cannot be read: it is truncated"):
        resolve_model_path(str(orphan))
