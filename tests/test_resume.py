"""Resume never continues the wrong thing (docs/reliability.md, "Resuming"): trainer.resume=auto binds to the
newest run only, a changed config or training data is refused, a corrupt newest checkpoint falls back to the
newest good one, a damaged config.yaml says so, one process writes a run folder at a time; `rlforge eval RUN`
runs with the run's own config. Through the CLI where a user would meet it."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rlforge import Trainer, hookimpl, load_config
from rlforge.cli import main
from rlforge.config import compose
from rlforge.errors import RLForgeError
from rlforge.resume import compare_configs, compare_fingerprints, fingerprint
from rlforge.runlock import RunLock
from tests.test_bad_inputs import QUICK, _error, _jsonl, _row

ROWS = [_row(f"What is {a}+{b}?", str(a + b)) for a, b in zip(range(16), range(3, 19))]
RUN = [*QUICK, "data.name=files", "trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_last_n=0",
       "rollout.max_new_tokens=6"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 2-step run on a jsonl file, with checkpoints step_1 and step_2 (never modified: tests copy it)."""
    root = tmp_path_factory.mktemp("trained")
    train = _jsonl(root / "train.jsonl", ROWS)
    val = _jsonl(root / "val.jsonl", ROWS[:3])
    overrides = [*RUN, f"data.train_files=[{train}]", f"data.val_files=[{val}]", f"trainer.runs_root={root / 'runs'}"]
    assert main(["fit", *overrides]) == 0
    (run,) = (root / "runs" / "default").iterdir()
    return {"run": run, "train": train, "overrides": overrides}


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run in a runs root of its own; ``run.overrides`` resume it with trainer.resume=auto."""
    copy = tmp_path / "runs" / "default" / trained["run"].name
    shutil.copytree(trained["run"], copy)
    return copy, [*trained["overrides"], f"trainer.runs_root={tmp_path / 'runs'}", "trainer.resume=auto"]


def _state(run_dir, step):
    return run_dir / "checkpoints" / f"step_{step:06d}" / "trainer_state.pt"


def _weights(path):
    return load_file(str(path / "actor" / "model.safetensors"))


class StopAt:
    """Interrupts a run at the start of a step (before that step's checkpoint)."""

    def __init__(self, step):
        self.step = step

    @hookimpl
    def rlforge_step_start(self, step):
        if step == self.step:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_auto_continues_the_newest_run_only(capsys, run, tmp_path):
    finished, overrides = run
    record = {p.relative_to(finished): p.read_bytes() for p in sorted(finished.rglob("*")) if p.is_file()}
    # a new run of the experiment, stopped before its first checkpoint
    new = [o for o in overrides if o != "trainer.resume=auto"] + ["actor.lr=1e-4"]
    with pytest.raises(KeyboardInterrupt):
        Trainer(load_config("grpo", new), callbacks=[StopAt(1)]).fit()
    stopped = max((tmp_path / "runs" / "default").iterdir())
    assert stopped != finished and not (stopped / "checkpoints").exists()
    capsys.readouterr()
    # auto binds to that newest run: a changed learning rate is refused, naming the run and the key ...
    err = _error(capsys, ["fit", *overrides, "actor.lr=1e-5"])
    assert f"Cannot resume {stopped} (it has no checkpoint: from step 0)" in err
    assert "actor.lr: 0.0001 -> 1e-05" in err and "trainer.resume_force=true" in err
    # ... and the same config restarts it from step 0; the older, finished run is never touched
    assert main(["fit", *overrides, "actor.lr=1e-4"]) == 0
    assert f"rlforge: restarting {stopped} from step 0" in capsys.readouterr().out
    assert (stopped / "checkpoints" / "step_000002").is_dir()
    assert {p.relative_to(finished): p.read_bytes() for p in sorted(finished.rglob("*")) if p.is_file()} == record


def test_changed_config_or_training_data_is_refused(capsys, run, tmp_path):
    run_dir, overrides = run
    err = _error(capsys, ["fit", *overrides, "rollout.temperature=0.9"])
    assert f"Cannot resume {run_dir} from step_000002" in err and "rollout.temperature: 1.0 -> 0.9" in err
    # the same file with other rows, or another file: the training data changed
    changed = _jsonl(tmp_path / "changed.jsonl", ROWS[::-1])
    err = _error(capsys, ["fit", *overrides, f"data.train_files=[{changed}]"])
    assert "the training data: 16 examples (sha256" in err
    shorter = _jsonl(tmp_path / "shorter.jsonl", ROWS[:8])
    assert "16 examples (sha256" in _error(capsys, ["fit", *overrides, f"data.train_files=[{shorter}]"])
    assert "data.shuffle: True -> False" in _error(capsys, ["fit", *overrides, "data.shuffle=false"])


def test_the_reward_file_contents_are_fingerprinted(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(*a): return 1.0\n")
    cfg = OmegaConf.create({"reward": {"file": str(reward)}})
    before = fingerprint([], cfg)
    assert compare_fingerprints(before, fingerprint([], cfg)) == []
    reward.write_text("def compute_score(*a): return 0.0\n")
    (change,) = compare_fingerprints(before, fingerprint([], cfg))
    assert change.startswith("the contents of reward.file: sha256 ")


def test_changed_builtin_task_is_refused(registry):
    """data.arith.* (size, operands, held-out size), shuffle and seed are compared key by key."""
    def plain(*overrides):
        return OmegaConf.to_container(compose(registry, "grpo", None, list(overrides)), resolve=True)

    saved = plain()
    for key, value in [("data.arith.train_size", 500), ("data.arith.max_operand", 9), ("data.arith.val_size", 10),
                       ("data.shuffle", False), ("trainer.seed", 2), ("actor.clip_ratio_high", 0.28)]:
        blocking, _ = compare_configs(saved, plain(f"{key}={value}"), lambda: saved)
        assert len(blocking) == 1 and blocking[0].startswith(f"{key}: "), (key, blocking)
    blocking, changed = compare_configs(saved, plain("trainer.total_steps=9", "logger.backends=[console]",
                                                     "trainer.save_every=3", "strategy.checkpoint=async",
                                                     "rollout.weight_sync=memory"), lambda: saved)
    assert blocking == [] and sorted(changed) == ["logger.backends", "rollout.weight_sync", "strategy.checkpoint",
                                                  "trainer.save_every", "trainer.total_steps"]
    # a key added since the checkpoint passes at its default, not at another value
    older = {**saved, "actor": {k: v for k, v in saved["actor"].items() if k != "entropy_coeff"}}
    assert compare_configs(older, saved, lambda: saved) == ([], {})
    assert compare_configs(older, plain("actor.entropy_coeff=0.1"), lambda: saved)[0] == [
        "actor.entropy_coeff: (absent) -> 0.1"]


@pytest.mark.slow
def test_moved_data_and_forced_changes_continue(capsys, caplog, run, trained, tmp_path):
    run_dir, overrides = run
    moved = tmp_path / "elsewhere.jsonl"
    shutil.copy(trained["train"], moved)
    assert main(["fit", *overrides, f"data.train_files=[{moved}]", "trainer.total_steps=3"]) == 0
    out = capsys.readouterr().out
    assert f"rlforge: resumed from {run_dir / 'checkpoints' / 'step_000002'} (step 2)" in out
    assert "trainer.total_steps: 2 -> 3" in out
    assert main(["fit", *overrides, "trainer.total_steps=3", "actor.lr=1e-3", "trainer.resume_force=true"]) == 0
    assert "actor.lr: 5e-05 -> 0.001" in caplog.text and "trainer.resume_force=true" in caplog.text
    records = [json.loads(line) for line in (run_dir / "resumes.jsonl").read_text().splitlines()]
    assert records[-1]["forced"] == ["actor.lr: 5e-05 -> 0.001"] and records[-1]["checkpoint"] == "step_000003"
    assert OmegaConf.load(run_dir / "config.yaml").actor.lr == 5e-5  # the run's record is never rewritten


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_to_the_newest_good_one(capsys, caplog, run, trained):
    run_dir, overrides = run
    _state(run_dir, 2).write_bytes(b"")
    err = _error(capsys, ["fit", *overrides, f"trainer.resume={_state(run_dir, 2).parent}"])  # named: no fallback
    assert f"{_state(run_dir, 2)} is empty (0 bytes)" in err
    assert main(["fit", *overrides]) == 0
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000001'} (step 1)" in capsys.readouterr().out
    assert f"{_state(run_dir, 2)} is empty (0 bytes)" in caplog.text
    assert (run_dir / "checkpoints" / "set_aside" / "step_000002").is_dir()
    # step 2, trained again from step 1, is the same as the original step 2
    a, b = _weights(trained["run"] / "checkpoints" / "step_000002"), _weights(_state(run_dir, 2).parent)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_trainer_state_of_another_step_is_a_corrupt_checkpoint(capsys, run):
    run_dir, overrides = run
    shutil.copy(_state(run_dir, 1), _state(run_dir, 2))
    err = _error(capsys, ["fit", *overrides, f"trainer.resume={_state(run_dir, 2).parent}"])
    assert (f"{_state(run_dir, 2)} holds the trainer state of step 1, not of step 2 (meta.json): it was copied from "
            f"another checkpoint") in err


def test_a_refused_resume_leaves_the_run_folder_as_it_was(capsys, run):
    run_dir, overrides = run
    _state(run_dir, 2).write_bytes(b"")  # auto would fall back over it; a named step_1 is older than step_2
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    for resume in ("auto", str(_state(run_dir, 1).parent)):
        err = _error(capsys, ["fit", *overrides, f"trainer.resume={resume}", "actor.lr=1e-3"])
        assert "Cannot resume" in err and "actor.lr: 5e-05 -> 0.001" in err
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


def test_no_readable_checkpoint_and_truncated_weights(capsys, run):
    run_dir, overrides = run
    weights = run_dir / "checkpoints" / "step_000002" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    _state(run_dir, 1).write_bytes(_state(run_dir, 1).read_bytes()[:5000])
    err = _error(capsys, ["fit", *overrides])
    assert f"No readable checkpoint in {run_dir / 'checkpoints'}" in err
    assert f"{weights} cannot be read: it is truncated or corrupted" in err
    assert f"{_state(run_dir, 1)} cannot be read: it is truncated or corrupted" in err


def test_a_foreign_checkpoint_without_meta_json_is_never_resumed(caplog, run):
    from rlforge.resume import _pick_checkpoint, _set_aside

    run_dir, _ = run
    good = run_dir / "checkpoints" / "step_000002"
    foreign, renamed = good.with_name("step_000003"), good.with_name("step_000004")
    shutil.copytree(good, foreign)
    (foreign / "meta.json").unlink()  # another tool's folder, or one copied in by hand
    shutil.copytree(good, renamed)  # a checkpoint renamed to a later step
    checkpoint, state, meta, aside = _pick_checkpoint(run_dir, None)
    assert checkpoint == good and meta["step"] == 2
    assert f"{foreign / 'meta.json'} is missing: {foreign} is not a checkpoint rlforge wrote" in caplog.text
    assert f"{renamed / 'meta.json'} names step 2, not 4" in caplog.text
    assert not (run_dir / "checkpoints" / "set_aside").exists()  # moved only once the resume is accepted
    _set_aside(*aside)
    assert sorted(p.name for p in (run_dir / "checkpoints" / "set_aside").iterdir()) == ["step_000003", "step_000004"]
    with pytest.raises(RLForgeError, match="is not a checkpoint rlforge wrote"):  # named explicitly: refused too
        shutil.copytree(run_dir / "checkpoints" / "set_aside" / "step_000003", foreign)
        _pick_checkpoint(run_dir, foreign)


@pytest.mark.parametrize("damage, says", [(lambda t: "", "is empty (0 bytes)"),
                                          (lambda t: t[: len(t) // 2], "is truncated: it does not end with")])
def test_damaged_run_config_says_so(capsys, run, damage, says):
    run_dir, overrides = run
    config = run_dir / "config.yaml"
    config.write_text(damage(config.read_text()))
    err = _error(capsys, ["fit", *overrides])
    assert f"{config} {says}" in err and "trainer.resume_force=true" in err


def test_a_second_writer_is_refused(capsys, run):
    run_dir, overrides = run
    lock = RunLock(run_dir)
    try:
        err = _error(capsys, ["fit", *overrides])
    finally:
        lock.release()
    assert f"Run folder {run_dir} is in use by another rlforge process (pid {os.getpid()} on" in err
    err = _error(capsys, ["fit", *overrides, "trainer.resume=never", f"trainer.run_dir={run_dir}"])
    assert f"trainer.run_dir={run_dir} already holds a run" in err
    step = run_dir / "checkpoints" / "step_000001"
    err = _error(capsys, ["fit", *overrides, f"trainer.resume={step}", f"trainer.run_dir={run_dir.parent / 'other'}"])
    assert f"trainer.resume={step} belongs to the run {run_dir}, not to trainer.run_dir=" in err


HOLD = "import sys, time; from pathlib import Path; from rlforge.runlock import RunLock; RunLock(Path(sys.argv[1])); " \
       "print('locked', flush=True); time.sleep(600)"


def test_the_lock_dies_with_its_holder_even_on_kill_9(tmp_path, caplog):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RLForgeError, match=rf"in use by another rlforge process \(pid {proc.pid} on"):
            RunLock(tmp_path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with caplog.at_level(logging.WARNING, logger="rlforge.run"):
        RunLock(tmp_path).release()
    assert f"the previous writer (pid {proc.pid} on" in caplog.text and "did not exit cleanly" in caplog.text


def _sleep(started) -> None:
    started.set()
    time.sleep(60)


def test_forked_children_do_not_keep_the_lock(tmp_path):
    lock = RunLock(tmp_path)
    fork = multiprocessing.get_context("fork")
    started = fork.Event()
    child = fork.Process(target=_sleep, args=(started,), daemon=True)
    child.start()
    try:
        assert started.wait(60)
        lock.release()
        RunLock(tmp_path).release()  # free although the child (a forked reward worker, say) still runs
    finally:
        child.kill()
        child.join()


def test_eval_of_a_run_uses_its_training_config(capsys, trained, tmp_path):
    out = tmp_path / "eval.json"
    assert main(["eval", str(trained["run"]), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["dataset"], report["rows"], report["max_new_tokens"]) == ("files", 3, 6)
    checkpoint = trained["run"] / "checkpoints" / "step_000001" / "actor"
    assert main(["eval", str(checkpoint), "--out", str(out), "rollout.max_new_tokens=4", "--limit", "1"]) == 0
    report = json.loads(out.read_text())
    assert (report["dataset"], report["rows"], report["max_new_tokens"]) == ("files", 1, 4)


def test_a_start_that_fails_frees_its_run_folder(capsys, tmp_path):
    """A reward file that does not import fails the start after the run folder was made: nothing was trained, so
    the same trainer.run_dir starts again once the file is fixed (no 'already holds a run')."""
    reward = tmp_path / "score.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return (\n")
    overrides = [*QUICK, f"reward.file={reward}", f"trainer.run_dir={tmp_path / 'run'}", "trainer.resume=never",
                 "trainer.total_steps=1"]
    assert "has a syntax error at line" in _error(capsys, ["fit", *overrides])
    assert not (tmp_path / "run" / "config.yaml").exists()
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    assert main(["fit", *overrides]) == 0 and (tmp_path / "run" / "config.yaml").exists()


def test_a_run_dir_with_files_that_are_not_a_run_is_refused(capsys, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text("my own")
    err = _error(capsys, ["fit", *QUICK, f"trainer.run_dir={mine}", "trainer.total_steps=1"])
    assert f"trainer.run_dir={mine} is a folder with files that are not a run's (summary.json)" in err
    assert sorted(p.name for p in mine.iterdir()) == ["summary.json"] and (mine / "summary.json").read_text() == "my own"


def test_the_checkpoint_a_resume_would_continue_from_is_found_without_taking_the_run(run, tmp_path, caplog) -> None:
    """verl's val_only validates it (rlforge.tools.evaluate.evaluate_launch): resume=auto the run folder's newest
    readable checkpoint (a corrupt newer one is passed over, as a training resume passes it), a checkpoint path
    itself, a run folder's newest; never, or a folder without checkpoints: none."""
    from rlforge.resume import resumed_checkpoint

    run_dir, _ = run
    step, before = run_dir / "checkpoints", sorted(run_dir.rglob("*"))

    def found(*overrides):
        return resumed_checkpoint(load_config("grpo", [f"trainer.runs_root={tmp_path}", *overrides]))

    assert found(f"trainer.run_dir={run_dir}", "trainer.resume=auto") == step / "step_000002"
    assert found(f"trainer.resume={step / 'step_000001'}") == step / "step_000001"
    assert found(f"trainer.resume={run_dir}") == step / "step_000002"
    assert found(f"trainer.run_dir={run_dir}", "trainer.resume=never") is None
    assert found(f"trainer.run_dir={tmp_path / 'fresh'}", "trainer.resume=auto") is None
    _state(run_dir, 2).write_bytes(b"")
    assert found(f"trainer.run_dir={run_dir}", "trainer.resume=auto") == step / "step_000001"
    assert "is empty (0 bytes)" in caplog.text
    assert sorted(run_dir.rglob("*")) == before  # nothing written, set aside or moved


def test_a_run_of_another_module_class_is_not_continued() -> None:
    """Trainer(cfg).fit(MyGRPO(cfg)) records its class: rlforge fit (the built-in GRPO, the same algorithm.name)
    does not continue it as its own (helper-51); a checkpoint from before the record passes."""
    from rlforge.resume import compare_fingerprints

    now = {"data": {"n": 1}, "files": {}, "module": "rlforge.algorithms.grpo.GRPO"}
    then = {**now, "module": "my_algos.MyGRPO"}
    assert compare_fingerprints(then, now) == [
        "the algorithm's class: my_algos.MyGRPO then, rlforge.algorithms.grpo.GRPO now"]
    assert compare_fingerprints(now, now) == [] and compare_fingerprints({"data": {"n": 1}, "files": {}}, now) == []


def test_a_checkpoint_records_which_plugin_gave_each_component(trained) -> None:
    """meta.json's ``plugins``: each component the config names, with the plugin that registered it (a record of
    where the algorithm, reward manager, engine... came from; helper-55: two plugins could claim one name)."""
    import json

    meta = json.loads((trained["run"] / "checkpoints" / "step_000002" / "meta.json").read_text())
    assert meta["plugins"]["algorithm:grpo"].startswith("rlforge.algorithms.grpo")
    assert meta["plugins"]["dataset:files"] and meta["plugins"]["reward manager:rule"]


def test_a_longer_run_continues_on_the_longer_runs_schedule(tmp_path, caplog) -> None:
    """A cosine run of 2 steps resumed to 4 (trainer.total_steps may change): step 3 runs at the 4-step schedule's
    rate for step 3, as after verl's resume, and a warning says so (helper-56: it ran at the 2-step schedule's last
    rate, 0, then jumped up); the first two steps are those of the 2-step run."""
    import math

    base = [*QUICK, "trainer.save_every=1", "trainer.keep_last_n=0", "actor.lr_scheduler=cosine", "actor.lr=1e-3",
            "actor.min_lr_ratio=0", f"trainer.runs_root={tmp_path}", "trainer.resume=auto"]

    def fit(steps: int) -> list[dict[str, float]]:
        trainer = Trainer(load_config("grpo", [*base, f"trainer.total_steps={steps}"]))
        trainer.fit()
        return trainer.history

    assert [h["actor/lr"] for h in fit(2)] == pytest.approx([1e-3, 0.5e-3])  # cosine over 2: 1, (1 + cos(pi / 2)) / 2
    with caplog.at_level(logging.WARNING, logger="rlforge.run"):
        resumed = fit(4)
    assert [h["actor/lr"] for h in resumed] == pytest.approx([1e-3 * (1 + math.cos(math.pi * k / 4)) / 2
                                                              for k in (2, 3)])
    # the resume gave the engine the checkpoint's weights: that sync is logged with step 3's own
    assert [h["weight_sync/count"] for h in resumed] == [2.0, 1.0]
    assert ("trainer.total_steps 2 -> 4 changes the learning-rate schedule (actor.lr_scheduler=cosine): steps 3-4 run "
            "at the rates a run of 4 steps has at them") in caplog.text


def test_a_forced_resume_trains_at_the_rate_it_was_given(tmp_path) -> None:
    """trainer.resume_force=true with another actor.lr (and weight decay): the resumed steps run at this run's rate
    and decay, not at those the checkpoint's optimizer and schedule held (helper-58: they were kept, silently)."""
    base = [*QUICK, "trainer.save_every=1", "trainer.keep_last_n=0", f"trainer.runs_root={tmp_path}",
            "trainer.resume=auto"]

    def fit(steps: int, *extra: str) -> Trainer:
        trainer = Trainer(load_config("grpo", [*base, f"trainer.total_steps={steps}", *extra]))
        trainer.fit()
        return trainer

    fit(1, "actor.lr=1e-3")
    trainer = fit(2, "actor.lr=2e-4", "actor.weight_decay=0.5", "trainer.resume_force=true")
    assert [h["actor/lr"] for h in trainer.history] == pytest.approx([2e-4])
    group = trainer.controller.ranks["actor"].worker.optimizer.param_groups[0]
    assert group["weight_decay"] == 0.5 and group["initial_lr"] == pytest.approx(2e-4)
