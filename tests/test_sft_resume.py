"""``rlforge sft`` resume (``rlforge.sft.record``): a checkpoint records its config and training data, and a resume
that would train something else is refused key by key (``sft.resume_force`` continues); a longer ``sft.steps`` trains
on along the stretched schedule; ``sft.lr=0``."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from omegaconf import OmegaConf

from rlforge import load_config
from rlforge.config.schema import SFTConfig
from rlforge.errors import ConfigError
from rlforge.sft import record, run_sft
from rlforge.sft.run import check_config
from tests.test_sft import FAST, Rates, StopAt, save_small_model, weights, write_jsonl

ROWS = [{"prompt": f"What is {i}+1?", "response": str(i + 1)} for i in range(16)]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return save_small_model(tmp_path_factory.mktemp("small_model"))


@pytest.fixture
def sft(tmp_path, pm, small_model):
    """``sft(*overrides, callbacks=(), out="out")``: run ``rlforge sft`` into ``tmp_path/out`` (16 rows, batch 8,
    checkpoints every 2 steps) and return its metrics."""
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)

    def run(*extra, callbacks=(), out="out"):
        cfg = load_config(overrides=[*FAST, f"sft.init={small_model}", f"sft.output_dir={tmp_path / out}",
                                     f"sft.train_file={data}", "sft.save_every=2", *extra])
        return run_sft(cfg, pm, callbacks=list(callbacks))

    return run


def test_a_resume_that_changes_the_training_is_refused_naming_each_key(tmp_path, sft):
    sft("sft.steps=2")
    with pytest.raises(ConfigError) as err:
        sft("sft.steps=4", "sft.resume=auto", "sft.lr=0.05", "sft.batch_size=4", "model.lora.rank=2")
    last = tmp_path / "out" / "checkpoints" / "last.ckpt"
    assert str(err.value) == (
        f"Cannot resume from {last} (step 2): it was trained with a different config or data (model.lora.rank: 0 -> 2; "
        f"sft.batch_size: 8 -> 4; sft.lr: 0.001 -> 0.05). Continuing would mix two setups in one run. Start a new run "
        f"(sft.resume=never, or another sft.output_dir), or continue anyway with sft.resume_force=true.")
    # other responses in a file at the same path: the examples' fingerprint differs
    write_jsonl(tmp_path / "rows.jsonl", [{**row, "response": row["response"] + "0"} for row in ROWS])
    with pytest.raises(ConfigError, match=r"\(the training data: 16 examples \(sha256 \w{12}\) then, 16 examples "
                                          r"\(sha256 \w{12}\) now\)"):
        sft("sft.resume=auto")


def test_moved_data_and_a_longer_run_resume_and_are_printed(tmp_path, pm, small_model, capsys, caplog):
    moved = write_jsonl(tmp_path / "moved.jsonl", ROWS)
    out = tmp_path / "out"
    common = [*FAST, f"sft.init={small_model}", f"sft.output_dir={out}", "sft.save_every=2"]
    run_sft(load_config(overrides=[*common, f"sft.train_file={write_jsonl(tmp_path / 'rows.jsonl', ROWS)}"]), pm)
    with caplog.at_level(logging.WARNING, logger="rlforge.sft"):
        run_sft(load_config(overrides=[*common, f"sft.train_file={moved}", "sft.steps=6", "sft.resume=auto",
                                       "sft.log_every=1"]), pm)
    assert ("sft.steps 4 -> 6 changes the learning-rate schedule (sft.lr_scheduler=cosine, a warm-up of "
            "sft.warmup_steps=1 or sft.warmup_ratio=0.0): the steps from here on run at the rates of a 6-step run's "
            "schedule, not at the 4-step one's.") in caplog.text
    printed = capsys.readouterr().out
    assert (f"resuming from {out / 'checkpoints' / 'last.ckpt'} (step 4); sft.log_every: 10 -> 1; sft.resume: never -> "
            f"auto; sft.steps: 4 -> 6; sft.train_file: {tmp_path / 'rows.jsonl'} -> {moved}") in printed
    saved = record.read(str(out / "checkpoints" / "last.ckpt"))
    assert saved.step == 6 and saved.record is not None
    assert saved.record["config"]["sft"]["steps"] == 6
    assert [r["changed"]["sft.steps"] for r in saved.record["resumes"]] == [[4, 6]]


def test_resume_force_continues_with_the_new_values_and_warns(sft, caplog):
    sft("sft.steps=4", "sft.lr_scheduler=constant", "sft.warmup_steps=0", callbacks=[StopAt(2)])
    rates = Rates()
    with caplog.at_level(logging.WARNING, logger="rlforge.sft"):
        sft("sft.steps=4", "sft.lr_scheduler=constant", "sft.warmup_steps=0", "sft.resume=auto", "sft.lr=0.05",
            "sft.resume_force=true", callbacks=[rates])
    assert "although it changed (sft.resume_force=true): sft.lr: 0.001 -> 0.05" in caplog.text
    assert rates.values == [0.05, 0.05]  # the checkpoint's optimizer held 0.001


@pytest.mark.parametrize("interrupted", [True, False])
def test_a_larger_sft_steps_trains_on_along_the_schedule_over_the_new_length(sft, interrupted):
    """A run of 4 steps continued to 8 (cosine after 1 warm-up step): the rates of the resumed steps are those of an
    8-step run at the same steps; not the old schedule's (its last rate, or its rate at the first resumed step), and
    not a new warm-up. ``interrupted``: from step 2 of the 4; else the finished run (its Lightning epoch had ended:
    it trained nothing)."""
    whole = Rates()
    sft("sft.steps=8", "sft.save_every=0", callbacks=[whole], out="whole")
    sft("sft.steps=4", callbacks=[StopAt(2)] if interrupted else [])
    rates = Rates()
    sft("sft.steps=8", "sft.resume=auto", callbacks=[rates])
    assert rates.values == whole.values[2 if interrupted else 4:]


def test_a_checkpoint_without_a_record_resumes_with_a_warning(tmp_path, sft, caplog):
    sft("sft.steps=4", callbacks=[StopAt(2)])
    last = tmp_path / "out" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    del checkpoint[record.KEY]  # as rlforge wrote it before
    torch.save(checkpoint, last.resolve())
    with caplog.at_level(logging.WARNING, logger="rlforge.sft"):
        sft("sft.steps=4", "sft.resume=auto", "sft.lr=0.05")
    assert f"{last} (step 2) holds no record of the config and training data it was trained with" in caplog.text
    assert record.read(str(last)).step == 4


def test_another_save_every_keeps_last_ckpt_the_newest(tmp_path, sft):
    sft("sft.steps=4")
    sft("sft.steps=6", "sft.resume=auto", "sft.save_every=3")  # Lightning wrote last-v1.ckpt: auto went back to step 4
    checkpoints = tmp_path / "out" / "checkpoints"
    assert (checkpoints / "last.ckpt").resolve().name == "step_6.ckpt"
    assert not list(checkpoints.glob("*-v1.ckpt"))


def test_compared_keys_and_keys_added_since():
    cfg = load_config(overrides=["sft.steps=4"])
    old = record.of(cfg, [])
    new = json.loads(json.dumps(old))
    new["config"]["sft"].update(steps=8, save_every=5, seed=3)
    new["config"]["actor"]["lr"] = 1.0  # not read by rlforge sft
    new["config"]["model"]["precision"] = "bf16-mixed"
    assert record.compare(old, new) == (["model.precision: 'auto' -> 'bf16-mixed'", "sft.seed: 0 -> 3"],
                                        {"sft.save_every": [100, 5], "sft.steps": [4, 8]})
    del old["config"]["sft"]["num_cycles"]  # a key added since the checkpoint: it passes at its default only
    assert record.compare(old, record.of(cfg, [])) == ([], {})
    new["config"]["sft"]["num_cycles"] = 1.5
    assert "sft.num_cycles: (absent) -> 1.5" in record.compare(old, new)[0]


def test_lr_zero_trains_nothing_and_negative_is_refused(tmp_path, sft, small_model):
    sft("sft.steps=2", "sft.lr=0")
    before, after = weights(small_model), weights(tmp_path / "out")
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ConfigError, match=r"^sft.lr must be >= 0, got -1.0.$"):
        check_config(OmegaConf.structured(SFTConfig(lr=-1.0)))


def test_an_unreadable_last_checkpoint_is_named(tmp_path, sft):
    last = tmp_path / "out" / "checkpoints" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"cut short")
    with pytest.raises(ConfigError, match=f"sft.resume: the checkpoint {last} cannot be read"):
        sft("sft.resume=auto")


def test_a_warm_up_as_long_as_the_run_is_warned_about() -> None:
    """sft.warmup_steps defaults to 20: a 10-step run never reached sft.lr, silently (helper-59)."""
    from omegaconf import OmegaConf

    from rlforge.config.schema import SFTConfig
    from rlforge.sft.run import warmup_note

    def note(**kw):
        return warmup_note(OmegaConf.merge(OmegaConf.structured(SFTConfig), kw))

    assert note(steps=10).startswith("The warm-up (20 steps: sft.warmup_steps=20, sft.warmup_ratio=0.0) is not shorter "
                                     "than the run (sft.steps=10)")
    assert note(steps=21) == "" and note(steps=10, warmup_steps=5) == "" and note(steps=10, lr=0) == ""
    assert note(steps=10, warmup_steps=0, warmup_ratio=1.0).startswith("The warm-up (10 steps")
