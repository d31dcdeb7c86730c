"""A SIGTERM (a scheduler's preemption, ``kill``, ``docker stop``) stops an ``rlforge`` command as Ctrl-C does: the
checkpoint being written in the background is settled, the reward workers and loggers are closed, the command exits
with 143 and one line, and the run resumes. Sent to the whole process group, as a scheduler or ``timeout`` sends it
(the reward workers get it too: they end, their parent stops the run), and again while the clean-up runs (ignored).
Also under ``rlforge sft`` (Lightning's own handler passes it on and exits), and one that lands inside an import is
sent again after it (an exception there could leave a module half-imported)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from tests.test_e2e import FAST

COMMON = [*FAST, "logger.backends=[console]", "trainer.val_before_train=false", "trainer.save_every=1",
          "strategy.checkpoint=async", "trainer.keep_last_n=0", "reward.num_workers=2"]


def _fit(tmp_path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlforge.cli", "fit", "--algo", "grpo", *COMMON,
                             f"trainer.run_dir={tmp_path / 'run'}", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path)


def _group_gone(pgid: int) -> bool:
    for _ in range(100):  # the group's last processes may take a moment to be reaped
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_the_process_group_stops_the_run_as_ctrl_c_and_it_resumes(tmp_path) -> None:
    run = _fit(tmp_path, "trainer.total_steps=1000")
    assert run.stdout is not None
    for line in run.stdout:  # a step that has checkpointed behind it: training under way
        if re.match(r"step\s+3/", line):
            break
    else:
        raise AssertionError(run.stderr.read() if run.stderr else "no step line")
    os.killpg(run.pid, signal.SIGTERM)
    time.sleep(0.05)  # a repeat (a scheduler's, or a supervisor's) lets the clean-up the first one started finish
    os.killpg(run.pid, signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 143, err[-3000:]
    assert err.rstrip().endswith("rlforge: terminated (SIGTERM); stopped as after Ctrl-C"), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert _group_gone(run.pid)  # no reward worker left behind
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert checkpoints, checkpoints
    last = int(checkpoints[-1].split("_")[1])
    resumed = _fit(tmp_path, f"trainer.total_steps={last + 1}", "trainer.resume=auto")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"(step {last})" in err + out, (out[-2000:], err[-2000:])
    assert re.search(rf"step\s+{last + 1}/{last + 1}", out), out[-2000:]


def test_sigterm_stops_rlforge_sft_with_the_same_line_and_status(tmp_path) -> None:
    out = tmp_path / "sft"
    run = subprocess.Popen([sys.executable, "-m", "rlforge.cli", "sft", "sft.steps=100000", "sft.save_every=20",
                            f"sft.output_dir={out}", "sft.loggers=[]"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path)
    while not (out / "checkpoints" / "last.ckpt").exists():  # training under way
        assert run.poll() is None, run.stderr.read() if run.stderr else ""
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 143, err[-3000:]
    assert err.rstrip().endswith("rlforge: terminated (SIGTERM); stopped as after Ctrl-C"), err[-3000:]


KILLER = """import os, signal, time
os.kill(os.getpid(), signal.SIGTERM)  # lands while this module is being imported
time.sleep(0.3)
whole = True
"""


def test_a_sigterm_inside_an_import_is_sent_again_after_it(tmp_path) -> None:
    (tmp_path / "killer.py").write_text(KILLER)
    code = ("import importlib, sys, time\nfrom rlforge.cli import _run\n"
            "def command():\n    module = importlib.import_module('killer')\n    print('imported', module.whole, "
            "flush=True)\n    time.sleep(60)\n    return 0\nsys.exit(_run(command))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.returncode == 143, out.stderr[-3000:]
    assert out.stdout == "imported True\n" and "Traceback" not in out.stderr, (out.stdout, out.stderr[-3000:])
