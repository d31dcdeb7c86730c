"""``rlforge export``: a checkpoint (or a run's newest one) to a plain Hugging Face folder; strategy exporters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.tools.export import export_checkpoint, model_folder

pytestmark = pytest.mark.usefixtures("no_autoload")


def test_export_loads_with_from_pretrained_and_matches_the_actor(fitted_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer, _ = fitted_run
    out = tmp_path / "hf"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0  # a run folder: its newest checkpoint
    assert f"exported to {out}" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template
    trained = trainer.module.actor.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained[name].cpu()), name
    assert model_folder(str(out)) == str(out)  # an exported folder is a model folder


def test_export_a_step_folder(fitted_run, tmp_path):
    trainer, _ = fitted_run
    step1 = trainer.run_dir / "checkpoints" / "step_000001"
    out = export_checkpoint(step1, tmp_path / "s1", PluginManager(autoload=False).registry)
    assert (out / "model.safetensors").read_bytes() == (step1 / "actor" / "model.safetensors").read_bytes()


def test_a_checkpoint_with_truncated_weights_is_refused_and_nothing_is_written(fitted_run, tmp_path, capsys):
    import shutil

    trainer, _ = fitted_run
    step1 = tmp_path / "step_000001"
    shutil.copytree(trainer.run_dir / "checkpoints" / "step_000001", step1)
    weights = step1 / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    assert main(["export", str(step1), str(tmp_path / "out")]) == 2
    assert f"{weights} cannot be read: it is truncated or corrupted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]


def test_a_checkpoint_with_an_unreadable_config_or_an_export_inside_it_is_refused(fitted_run, tmp_path, capsys):
    import shutil

    trainer, _ = fitted_run
    step1 = tmp_path / "step_000001"
    shutil.copytree(trainer.run_dir / "checkpoints" / "step_000001", step1)
    assert main(["export", str(step1), str(step1 / "exported")]) == 2
    assert f"Output folder {step1 / 'exported'} is inside the checkpoint {step1}" in capsys.readouterr().err
    (step1 / "actor" / "config.json").write_text("{")
    assert main(["export", str(step1), str(tmp_path / "out")]) == 2
    assert f"{step1 / 'actor' / 'config.json'} cannot be read: it is not JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_errors(fitted_run, tmp_path, capsys):
    trainer, _ = fitted_run
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    assert main(["export", str(trainer.run_dir), str(busy)]) == 2
    assert f"Output folder {busy} exists and is not empty" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "none"), str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    broken = tmp_path / "run" / "checkpoints" / "step_000003"
    (broken / "actor").mkdir(parents=True)
    assert main(["export", str(broken), str(tmp_path / "o2")]) == 2
    assert f"{broken}/actor/model.safetensors is missing: the checkpoint is incomplete" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists() and not (tmp_path / ".o2.partial").exists()


class ShardedStrategy:
    """A strategy whose checkpoints need their own exporter (as a sharded one would)."""

    calls: list[tuple[Path, Path]] = []

    @staticmethod
    def export_checkpoint(checkpoint: Path, out: Path) -> None:
        ShardedStrategy.calls.append((checkpoint, out))
        (out / "config.json").write_text("{}")


class ShardedPlugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.strategy.register("sharded_test", ShardedStrategy)


def test_the_strategy_that_wrote_a_checkpoint_exports_it(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    (tmp_path / "run" / "config.yaml").write_text("strategy:\n  name: sharded_test\n")
    pm = PluginManager(autoload=False)
    pm.register(ShardedPlugin(), name="sharded")
    export_checkpoint(tmp_path / "run", tmp_path / "out", pm.registry)
    # the strategy writes into a folder renamed to out once the export is complete
    assert ShardedStrategy.calls == [(checkpoint, tmp_path / ".out.partial")] and (tmp_path / "out").is_dir()
    with pytest.raises(RLForgeError, match="Unknown strategy 'sharded_test'"):
        export_checkpoint(checkpoint, tmp_path / "out2", PluginManager(autoload=False).registry)


# --- the model as loaded: dtypes and tokenizer; LoRA checkpoints in eval, generate and export --------------------------
@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    """A tiny Llama saved in bfloat16, with a tokenizer that has no pad token (as Llama-3's and Mistral's)."""
    from rlforge.models import build_char_tokenizer, build_tiny_llama

    folder = tmp_path_factory.mktemp("bf16_model")
    tokenizer = build_char_tokenizer()
    tokenizer.pad_token = None
    build_tiny_llama(tokenizer, hidden=64, layers=1, heads=1, ffn=128).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_weight_the_source_lacks_takes_the_dtype_its_config_names(bf16_model, tmp_path):
    """A reward model's score head is new: written as trained (fp32), it is cast to the source config's bf16 as the
    source's own weights are, so the export holds one dtype."""
    from safetensors.torch import load_file, save_file

    from rlforge.as_loaded import as_loaded

    out = tmp_path / "rm"
    shutil.copytree(bf16_model, out)
    trained = {n: t.float() for n, t in load_file(str(out / "model.safetensors")).items()}
    save_file({**trained, "score.weight": torch.randn(1, 64)}, str(out / "model.safetensors"), metadata={"format": "pt"})
    as_loaded(out, bf16_model)
    assert {n: t.dtype for n, t in load_file(str(out / "model.safetensors")).items()} == {
        n: torch.bfloat16 for n in [*trained, "score.weight"]}


def _fit_one_step(tmp_path, model, *extra):
    from rlforge import Trainer
    from rlforge.testing import fast_config

    trainer = Trainer(fast_config("grpo", tmp_path, f"model.path={model}", "trainer.total_steps=1",
                                  "trainer.save_every=1", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                                  "actor.ppo_micro_batch_size=8", "rollout.n=2", "data.arith.train_size=16", *extra))
    trainer.fit()
    return trainer.run_dir


def check_as_loaded(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.pad_token is None and tokenizer.eos_token == "<|end|>"  # its own: no pad = eos written in
    return weights


def test_an_export_keeps_the_dtypes_and_the_tokenizer_of_the_model_as_loaded(bf16_model, tmp_path, capsys):
    from safetensors.torch import load_file

    run = _fit_one_step(tmp_path, bf16_model)
    actor = run / "checkpoints" / "step_000001" / "actor"
    trained = load_file(str(actor / "model.safetensors"))
    assert {t.dtype for t in trained.values()} == {torch.float32}  # trained in fp32 on the CPU
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out)]) == 0
    weights = check_as_loaded(out)
    assert all(torch.equal(weights[n], t.to(torch.bfloat16)) for n, t in trained.items())
    assert (out / "model.safetensors").stat().st_size < 0.6 * (actor / "model.safetensors").stat().st_size
    capsys.readouterr()


def test_a_lora_checkpoint_is_its_base_plus_the_adapter_in_eval_generate_and_export(bf16_model, tmp_path, capsys):
    run = _fit_one_step(tmp_path, bf16_model, "model.lora.rank=4", "model.lora.alpha=8")
    checkpoint = run / "checkpoints" / "step_000001"
    assert not (checkpoint / "actor" / "config.json").exists()  # an adapter folder, not a model
    assert main(["eval", str(run), "--limit", "2", "--out", str(tmp_path / "report.json")]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["prompts"] == 2
    assert main(["generate", str(checkpoint / "actor"), "--limit", "2", "--out", str(tmp_path / "g.jsonl")]) == 0
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 2
    out = tmp_path / "merged"
    assert main(["export", str(checkpoint), str(out)]) == 0
    check_as_loaded(out)
    capsys.readouterr()
    assert main(["export", str(checkpoint), str(tmp_path / "adapter"), "--adapter"]) == 0
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "adapter").pad_token is None
    # the base is a local folder (model.path as given): kept, and both the CLI and the card say it loads only here
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        bf16_model)
    assert f"The adapter's base model is the local path {bf16_model}" in capsys.readouterr().err
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "for 1 step." in card and "is a path on the machine that trained it" in card


def test_an_export_whose_base_model_moved_keeps_the_checkpoint_as_it_is_and_says_so(fitted_run, tmp_path, capsys):
    trainer, _ = fitted_run
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    shutil.copytree(trainer.run_dir / "checkpoints" / "step_000002", checkpoint)
    (tmp_path / "run" / "config.yaml").write_text(f"model:\n  path: {tmp_path / 'gone'}\n")
    assert main(["export", str(checkpoint), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"rlforge: warning: Model path '{tmp_path / 'gone'}' does not exist (the run's model.path)." in err
    assert "The export keeps the checkpoint's dtypes and tokenizer" in err


def test_an_export_that_rounds_away_the_training_says_so_and_dtype_keeps_it(bf16_model, tmp_path, capsys):
    """A bf16 model trained in fp32 with a tiny learning rate: casting back to bf16 puts most changed weights back at
    their bf16 values (helper-56: 98% of a DPO run's update, silently); the export warns with the counts, and
    --dtype float32 writes the trained weights as they are."""
    from safetensors.torch import load_file

    run = _fit_one_step(tmp_path, bf16_model, "actor.lr=1e-7", "actor.entropy_coeff=0.01")  # a gradient whatever the rewards
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "bf16")]) == 0
    err = capsys.readouterr().err
    assert "round back to the source model's values in bfloat16" in err and "--dtype float32" in err
    assert main(["export", str(run), str(tmp_path / "fp32"), "--dtype", "float32"]) == 0
    assert "round back" not in capsys.readouterr().err
    trained = load_file(str(run / "checkpoints" / "step_000001" / "actor" / "model.safetensors"))
    weights = load_file(str(tmp_path / "fp32" / "model.safetensors"))
    assert all(torch.equal(weights[n], t) for n, t in trained.items())
    assert json.loads((tmp_path / "fp32" / "config.json").read_text())["dtype"] == "float32"
    assert main(["export", str(run), str(tmp_path / "adapter"), "--adapter", "--dtype", "float32"]) == 2
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "fp16"), "--dtype", "float16"]) == 0
    err = capsys.readouterr().err
    assert "values in float16: the saved model keeps little" in err and "loaded in" not in err  # the dtype asked for


def test_rounding_counts_changes_lost_against_the_source_in_the_dtype_written(tmp_path) -> None:
    """An fp32 source exported in bf16 (--dtype bfloat16): a change is lost where the trained weight and the source's
    weight are the same bf16 number (helper-59: compared in fp32, no change ever counted as lost, no warning)."""
    from safetensors.torch import save_file

    from rlforge.as_loaded import _rounded

    source = torch.linspace(0.1, 1.0, 100)
    save_file({"w": source}, str(tmp_path / "model.safetensors"))
    trained = source.clone()
    trained[:90] += 1e-6  # far below bf16's step at these sizes
    trained[90:] += 0.5
    found = _rounded(trained, trained.to(torch.bfloat16), tmp_path / "model.safetensors", "w")
    found.dtype, found.chosen = "bfloat16", True  # as as_loaded records what it wrote
    assert (found.changed, found.lost) == (100, 90) and "90 (90%) round back" in found.warning()
