"""End to end: a few GRPO steps on the shipped tiny model, run folder contents, mlflow read-back, resume."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlforge import Trainer, hookimpl, load_config

FAST = [
    "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=16",
    "rollout.n=4", "data.arith.train_size=512", "data.arith.val_size=16", "trainer.val_every=0", "trainer.progress=false",
]


def _config(tmp_path, *extra, algo="grpo"):
    return load_config(algo, [*FAST, f"trainer.runs_root={tmp_path}", *extra])


class Recorder:
    def __init__(self):
        self.events = []
        self.reward_processes = []

    @hookimpl
    def rlforge_stage_end(self, stage):
        self.events.append(stage)

    @hookimpl
    def rlforge_advantage_end(self, batch):
        diff = (batch["rollout_log_probs"] - batch["old_log_probs"]).abs() * batch["response_mask"]
        self.events.append(("logprob_gap", diff.max().item()))

    @hookimpl
    def rlforge_step_end(self, trainer, step, metrics):
        self.events.append(("step", step, sorted(metrics)))
        self.reward_processes = [w.process for w in trainer.controller.reward.workers.workers]


def test_grpo_end_to_end_writes_run_folder_and_mlflow(tmp_path):
    rec = Recorder()
    cfg = _config(tmp_path, "trainer.total_steps=3", "trainer.save_every=2", "actor.reuse_rollout_log_probs=false")
    trainer = Trainer(cfg, callbacks=[rec])
    summary = trainer.fit()

    run = trainer.run_dir
    assert summary["steps"] == 3 and summary["accuracy_before"] is not None
    for name in ["config.yaml", "samples.jsonl", "val_samples.jsonl", "summary.json", "mlflow.db"]:
        assert (run / name).is_file(), name
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step_000002", "step_000003"]
    assert (run / "checkpoints" / "step_000003" / "actor" / "model.safetensors").is_file()
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert {"step", "prompt", "response", "ground_truth", "score"} <= set(sample)

    stages = [e for e in rec.events if isinstance(e, str)]
    assert stages[:7] == ["rollout", "reward", "filter", "old_logprob", "advantage", "update_actor", "sync_weights"]
    step_events = [e for e in rec.events if isinstance(e, tuple) and e[0] == "step"]
    assert [e[1] for e in step_events] == [1, 2, 3]
    keys = step_events[0][2]
    for k in ["critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl",
              "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step",
              "perf/throughput"]:
        assert k in keys, k
    # the rollout engine's log-probs match the trainer's recomputation with the same weights
    gaps = [e[1] for e in rec.events if isinstance(e, tuple) and e[0] == "logprob_gap"]
    assert len(gaps) == 3 and max(gaps) < 1e-4, gaps

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=summary["mlflow_uri"])
    run_id = (run / "mlflow_run_id").read_text().strip()
    data = client.get_run(run_id).data
    assert "val/accuracy" in data.metrics and "actor/pg_loss" in data.metrics
    assert len(client.get_metric_history(run_id, "critic/score/mean")) == 3
    assert data.params["algorithm.name"] == "grpo"
    # fit stopped the reward manager's worker processes
    assert rec.reward_processes and not [p for p in rec.reward_processes if p.is_alive()]


class CrashAt:
    """A callback that interrupts the run as step ``step`` starts (as Ctrl-C would)."""

    def __init__(self, step):
        self.step = step

    @hookimpl
    def rlforge_step_start(self, step):
        if step == self.step:
            raise KeyboardInterrupt


def _weights(path):
    return load_file(str(path / "actor" / "model.safetensors"))


@pytest.mark.parametrize("algo", ["grpo", "ppo", "dapo"])
def test_resume_is_bit_identical(tmp_path, algo):
    """grpo: the base case; ppo: critic weights and optimizer; dapo: extra prompt draws of dynamic sampling."""
    common = ["trainer.total_steps=3", "trainer.save_every=2", "trainer.keep_last_n=0", "logger.backends=[console]",
              "trainer.val_before_train=false"]
    full = Trainer(_config(tmp_path / "a", *common, algo=algo))
    full.fit()
    # interrupted after step 2 (a callback raises), then resumed with trainer.resume=auto
    with pytest.raises(KeyboardInterrupt):
        Trainer(_config(tmp_path / "b", *common, algo=algo), callbacks=[CrashAt(3)]).fit()
    resumed = Trainer(_config(tmp_path / "b", *common, "trainer.resume=auto", algo=algo))
    resumed.fit()
    assert resumed.run_dir.parent.parent == tmp_path / "b"

    a = _weights(full.run_dir / "checkpoints" / "step_000003")
    b = _weights(resumed.run_dir / "checkpoints" / "step_000003")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the same metrics history for the resumed steps
    assert [h["critic/score/mean"] for h in full.history[2:]] == [h["critic/score/mean"] for h in resumed.history]


def test_epoch_limit_stops_before_total_steps_and_the_schedule_keeps_its_length(tmp_path) -> None:
    """trainer.epoch_limit (verl's total_epochs next to total_training_steps): 16 rows in batches of 8 are 2 steps per
    epoch, so epoch_limit=1 stops after 2 of 5 steps; the linear schedule still decays over 5 steps, as verl's does."""
    cfg = _config(tmp_path, "data.arith.train_size=16", "trainer.total_steps=5", "trainer.epoch_limit=1",
                  "trainer.val_before_train=false", "trainer.save_every=0", "logger.backends=[console]",
                  "actor.lr_scheduler=linear", "actor.lr=1e-5")
    trainer = Trainer(cfg)
    summary = trainer.fit()
    assert summary["steps"] == 2 and trainer.config.trainer.schedule_steps == 5
    lrs = [h["actor/lr"] for h in trainer.history]
    assert lrs == pytest.approx([1e-5 * (1 - k / 5) for k in (0, 1)])  # the rates steps 1 and 2 of a 5-step decay ran at


def test_log_val_generations_hands_verls_pick_to_every_logger(tmp_path, monkeypatch) -> None:
    """trainer.log_val_generations=3: after the validation, val_generations/val_step<N>.json holds 3 of its samples
    ({input, output, score}) and every logger gets the file."""
    from rlforge.plugins.logger import console

    handed = []
    monkeypatch.setattr(console.ConsoleLogger, "log_artifact", lambda self, path: handed.append(path))
    cfg = _config(tmp_path, "data.arith.train_size=16", "trainer.total_steps=1", "trainer.val_before_train=false",
                  "trainer.save_every=0", "logger.backends=[console]", "trainer.log_val_generations=3",
                  "rollout.max_new_tokens=4")
    trainer = Trainer(cfg)
    trainer.fit()
    path = trainer.run_dir / "val_generations" / "val_step1.json"
    rows = json.loads(path.read_text())
    assert len(rows) == 3 and all(set(r) == {"input", "output", "score"} for r in rows)
    assert str(path) in handed


def test_no_validation_after_the_last_step_with_val_at_end_off(tmp_path) -> None:
    """trainer.val_at_end=false (verl's test_freq <= 0, which `rlforge verl` maps to it): the run validates neither
    during nor after training; the summary has no accuracy after."""
    seen = []

    class Validations:
        @hookimpl
        def rlforge_validation_end(self, trainer, step, metrics):
            seen.append(step)

    cfg = _config(tmp_path, "data.arith.train_size=16", "trainer.total_steps=1", "trainer.val_before_train=false",
                  "trainer.save_every=0", "logger.backends=[console]", "trainer.val_at_end=false")
    summary = Trainer(cfg, callbacks=[Validations()]).fit()
    assert seen == [] and summary["accuracy_after"] is None and summary["steps"] == 1
