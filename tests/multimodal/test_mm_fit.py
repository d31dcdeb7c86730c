"""``rlforge fit --algo grpo --config builtin:vision``: two GRPO steps on the tiny vision-language model, with the
reference model (KL loss), micro-batches of 8 samples and the vision tower frozen; its checkpoint loads as a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlforge.cli import main

pytestmark = pytest.mark.slow  # ~10 s: a whole fit, the only way to see every stage take the images


def test_two_grpo_steps_on_the_vision_task(tmp_path: Path) -> None:
    assert main(["fit", "--algo", "grpo", "--config", "builtin:vision", f"trainer.runs_root={tmp_path}",
                 "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "data.train_batch_size=4",
                 "rollout.n=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8", "actor.use_kl_loss=true",
                 "model.freeze_vision_tower=true", "data.vision.train_size=16", "data.vision.val_size=4",
                 "logger.backends=[console]"]) == 0
    run = next(tmp_path.glob("vision/*"))
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {s["prompt"] for s in samples} == {"<image>How many squares?"}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    # the checkpoint's actor folder is a complete vision-language model folder: it loads with its processor
    from rlforge.models import load_model, load_processor, load_tokenizer
    from rlforge.multimodal import is_multimodal

    actor = next(run.glob("checkpoints/step_*/actor"))
    assert load_processor(str(actor), load_tokenizer(str(actor))) is not None and is_multimodal(load_model(str(actor)))


def test_an_engine_without_image_support_is_refused(vlm) -> None:
    from rlforge.capabilities import RolloutCapabilities
    from rlforge.data import tokenize_rows
    from rlforge.errors import RLForgeError
    from rlforge.multimodal import check_engine
    from tests.multimodal.test_mm_data import _row

    _, tok, proc = vlm
    prompts = tokenize_rows([_row()], tok, 64, False, "t", processor=proc)

    with pytest.raises(RLForgeError, match="the rollout engine 'text' \\(rollout.name\\) does not take them"):
        check_engine(prompts, RolloutCapabilities(), "text")  # a plugin's engine that does not declare supports_images


def test_a_vision_run_resumed_after_its_first_step_ends_bit_identical(tmp_path: Path) -> None:
    """The checkpoint of a run on image rows continues it exactly: the data fingerprint covers the images (by digest)
    and the resumed step 2 gives the weights of an uninterrupted run."""
    import torch
    from safetensors.torch import load_file

    from rlforge import Trainer, load_config
    from tests.test_e2e import CrashAt

    def config(name: str, *extra: str):
        return load_config("grpo", [
            "model.path=builtin:tiny-vlm", "data.name=vision", "data.max_prompt_length=48", "rollout.max_new_tokens=4",
            "data.vision.train_size=16", "data.vision.val_size=4", "data.train_batch_size=4", "rollout.n=4",
            "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8", "trainer.total_steps=2",
            "trainer.save_every=1", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.progress=false",
            "logger.backends=[console]", f"trainer.run_dir={tmp_path / name}", *extra])

    Trainer(config("full")).fit()
    with pytest.raises(KeyboardInterrupt):
        Trainer(config("cut"), callbacks=[CrashAt(2)]).fit()
    assert Trainer(config("cut", "trainer.resume=auto")).fit()["steps"] == 2
    a, b = (load_file(str(tmp_path / n / "checkpoints" / "step_000002" / "actor" / "model.safetensors"))
            for n in ("full", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_lora_vision_checkpoint_exports_merged_with_its_processor(tmp_path: Path) -> None:
    from rlforge.models import load_model, load_processor, load_tokenizer
    from rlforge.multimodal import is_multimodal

    assert main(["fit", "--algo", "grpo", "--config", "builtin:vision", f"trainer.runs_root={tmp_path}",
                 "trainer.total_steps=1", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.save_every=1",
                 "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8",
                 "model.lora.rank=4", "data.vision.train_size=16", "data.vision.val_size=4",
                 "logger.backends=[console]"]) == 0
    step = next(tmp_path.glob("vision/*/checkpoints/step_000001"))
    assert main(["export", str(step), str(tmp_path / "merged")]) == 0
    out = str(tmp_path / "merged")
    assert load_processor(out, load_tokenizer(out)) is not None and is_multimodal(load_model(out))
