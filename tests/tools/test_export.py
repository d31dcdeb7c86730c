"""``rlforge export``: a checkpoint (or a run's newest one) to a plain Hugging Face folder; strategy exporters."""

from __future__ import annotations

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
    assert f"Checkpoint {broken} has no actor/config.json" in capsys.readouterr().err


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
    assert ShardedStrategy.calls == [(checkpoint, tmp_path / "out")]
    with pytest.raises(RLForgeError, match="Unknown strategy 'sharded_test'"):
        export_checkpoint(checkpoint, tmp_path / "out2", PluginManager(autoload=False).registry)
