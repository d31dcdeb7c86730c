"""kill -9 at random points (rollout, reward, update, mid-checkpoint), resume with trainer.resume=auto:
the final weights are bit-identical to an uninterrupted run (also with trainer.pipeline=async, whose checkpoints
hold the batches generated ahead)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from rlforge import Trainer, load_config

DRIVER = textwrap.dedent('''
    import json, os, signal, sys
    from rlforge import Trainer, hookimpl, load_config
    from rlforge import checkpoint

    def main():
        spec = json.loads(sys.argv[1])
        kill = spec["kill"]

        def die():
            os.kill(os.getpid(), signal.SIGKILL)

        class Killer:
            @hookimpl
            def rlforge_stage_start(self, trainer, stage):
                if kill and trainer.step == kill["step"] and stage == kill["stage"]:
                    die()

        if kill and kill["stage"] == "checkpoint":
            real_save = checkpoint.torch.save

            def half_then_die(obj, fh, *a, **k):  # the state file is half written when the process dies
                real_save(obj, fh, *a, **k)  # (checkpoint.save writes it through a file object)
                if isinstance(obj, dict) and obj.get("step") == kill["step"]:
                    fh.flush()
                    fh.truncate(max(1, fh.tell() // 2))
                    die()

            checkpoint.torch.save = half_then_die
        Trainer(load_config("grpo", spec["overrides"]), callbacks=[Killer()]).fit()

    if __name__ == "__main__":
        main()
''')

COMMON = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.arith.train_size=512", "data.arith.val_size=8",
          "trainer.val_before_train=false", "trainer.val_every=0", "trainer.progress=false",
          "logger.backends=[console]", "trainer.total_steps=6", "trainer.save_every=1", "trainer.keep_last_n=2"]


def _final_weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "actor" / "model.safetensors"))


def _shuffled_kills(stages, steps):
    rng = random.Random(7)
    stages = list(stages)
    rng.shuffle(stages)
    return [{"step": step, "stage": stage} for step, stage in zip(steps, stages)]


# sync: kills at every kind of point; async (max_staleness 2), with batches generated ahead in the rollout thread:
# while the trainer copies its weights for that thread (which may still be generating step 3's batch), and half-way
# through a checkpoint (which holds the batches ahead), over 4 steps
@pytest.mark.slow
@pytest.mark.parametrize(("extra", "kills"), [
    ([], _shuffled_kills(["rollout", "reward", "update_actor", "checkpoint"], [2, 3, 4, 5])),
    (["trainer.pipeline=async", "trainer.max_staleness=2", "trainer.total_steps=4"],
     [{"step": 2, "stage": "deliver_weights"}, {"step": 3, "stage": "checkpoint"}]),
], ids=["sync", "async-2"])
def test_kill_9_anywhere_then_resume_is_bit_identical(tmp_path, extra, kills):
    common = [*COMMON, *extra]
    reference = Trainer(load_config("grpo", [*common, f"trainer.runs_root={tmp_path / 'ref'}"]))
    reference.fit()
    last = reference.step

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    overrides = [*common, f"trainer.runs_root={tmp_path / 'killed'}", "trainer.resume=auto"]
    for kill in [*kills, None]:
        proc = subprocess.run([sys.executable, str(script), json.dumps({"overrides": overrides, "kill": kill})],
                              capture_output=True, text=True, timeout=600)
        expected = -signal.SIGKILL if kill else 0
        assert proc.returncode == expected, (kill, proc.stderr[-3000:])

    runs = list((tmp_path / "killed" / "default").iterdir())
    assert len(runs) == 1  # every resume continued the same run folder
    ckpts = sorted(p.name for p in (runs[0] / "checkpoints").iterdir())
    assert ckpts == [f"step_{last - 1:06d}", f"step_{last:06d}"]  # half-written ones never became checkpoints
    a, b = _final_weights(reference.run_dir, last), _final_weights(runs[0], last)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
