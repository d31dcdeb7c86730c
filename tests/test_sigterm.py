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


DROPPED = """import os, signal, sys, time
from rlforge.cli import _run

class Doomed:
    def __del__(self):  # Python ignores what a finalizer raises, printing its traceback
        os.kill(os.getpid(), signal.SIGTERM)

def command():
    Doomed()
    print("dropped", flush=True)
    time.sleep(60)
    return 0

sys.exit(_run(command))
"""


def test_a_sigterm_that_lands_in_a_finalizer_is_sent_again_quietly(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-c", DROPPED], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 143, out.stderr[-3000:]
    assert out.stdout == "dropped\n", out.stdout
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-3000:]


def test_a_sigterm_python_dropped_is_not_taken_for_a_repeat() -> None:
    """Python drops an exception raised where it ignores them (a weakref callback the garbage collector runs): until
    the run's clean-up has the interrupt (errors.STOP_UNDERWAY) every SIGTERM raises; after, a repeat is ignored."""
    from rlforge import cli
    from rlforge.errors import STOP_UNDERWAY, Terminated

    cli._TERMINATED.clear()
    STOP_UNDERWAY.clear()
    try:
        for _ in range(2):  # the first one dropped, the second raises again
            try:
                cli._terminate(signal.SIGTERM, sys._getframe())
            except Terminated:
                pass
            else:
                raise AssertionError("no Terminated")
        STOP_UNDERWAY.set()
        assert cli._terminate(signal.SIGTERM, sys._getframe()) is None
    finally:
        cli._TERMINATED.clear()
        STOP_UNDERWAY.clear()


def test_an_interrupted_wait_for_a_background_checkpoint_leaves_it_to_the_clean_up(tmp_path) -> None:
    """The trainer's and the worker's: an interrupt of the wait keeps the write tracked (the clean-up waits again and
    makes the checkpoint); a failed write is raised once and forgotten."""
    from types import SimpleNamespace

    from rlforge.trainer.trainer import Trainer
    from rlforge.worker import TrainWorker

    def raising(error):
        def wait(*args):
            raise error
        return wait

    for error, kept in ((KeyboardInterrupt(), True), (RuntimeError("disk"), False)):
        trainer = SimpleNamespace(_writing=(4, {}, {}), run_dir=tmp_path,
                                  controller=SimpleNamespace(finish_checkpoint=raising(error)))
        worker = SimpleNamespace(_writing=(SimpleNamespace(result=raising(error)), 0.0, None))
        for call, owner in ((Trainer.finish_checkpoint, trainer), (TrainWorker.finish_sharded, worker)):
            try:
                call(owner)  # type: ignore[arg-type]
            except type(error):
                pass
            assert (owner._writing is not None) == kept, (call, error)


def test_sft_resume_auto_takes_the_newest_step_where_last_links_to_a_removed_one(tmp_path, caplog) -> None:
    """Lightning removes the older step_N.ckpt before it links last.ckpt to the newer one: a run stopped in between
    left a broken link, and sft.resume=auto started from scratch over the newer checkpoint (helper-68)."""
    from omegaconf import OmegaConf

    from rlforge.sft.run import resume_from

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (10, 9):
        (folder / f"step_{step}.ckpt").write_bytes(b"")
    (folder / "last.ckpt").symlink_to(folder / "step_5.ckpt")  # gone
    with caplog.at_level("WARNING", logger="rlforge.sft"):
        assert resume_from(OmegaConf.create({"resume": "auto", "output_dir": str(tmp_path)})) == str(
            folder / "step_10.ckpt")
    assert "links to a checkpoint that is gone" in caplog.text and "step_10.ckpt" in caplog.text


STOPPING_FAILS = """import os, signal, sys, time
from rlforge.cli import _run
def command():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    finally:
        raise RuntimeError("unexpected pos 64 vs 0")  # as torch.save cut mid-file raises on its way out
sys.exit(_run(command))
"""


def test_an_error_raised_while_a_sigterm_stops_the_command_is_printed_before_the_line() -> None:
    out = subprocess.run([sys.executable, "-c", STOPPING_FAILS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 143, out.stderr[-3000:]
    assert out.stderr.splitlines()[-2:] == ["rlforge: error while stopping: RuntimeError: unexpected pos 64 vs 0",
                                            "rlforge: terminated (SIGTERM); stopped as after Ctrl-C"], out.stderr


SHIELDED_BLOCK = """import os, signal, sys, time
from rlforge.cli import _run
from rlforge.errors import SHIELDED
def command():
    SHIELDED.set()  # as while the trainer makes a background checkpoint whole
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        print("shielded block finished", flush=True)
    finally:
        SHIELDED.clear()
    time.sleep(60)
    return 0
sys.exit(_run(command))
"""


def test_a_sigterm_in_a_shielded_block_waits_for_its_end() -> None:
    out = subprocess.run([sys.executable, "-c", SHIELDED_BLOCK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 143, out.stderr[-3000:]
    assert out.stdout == "shielded block finished\n", out.stdout
