"""rlforge.diskio and the writers that use it: full disks and file-size limits give one message naming the file
and the space, and no write goes through a link planted in a run folder (lock, samples, config, checkpoints)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

from rlforge import diskio
from rlforge.diskio import WriteFailure
from rlforge.errors import RLForgeError
from rlforge.runlock import RunLock


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# --- recognizing a failed write ---------------------------------------------------------------------------
def _torch_style() -> Exception:
    """What torch's writer raises when the file object it writes to fails: its own error, the OSError chained."""
    try:
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as exc:
        return exc


def _background_write(exc: BaseException) -> BaseException:
    """What torch.distributed.checkpoint raises when a rank's write fails: each rank's exception collected into a
    CheckpointException (a BaseException), not chained."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("write failed", {0: (exc, traceback.StackSummary())})


@pytest.mark.parametrize("exc, code", [
    (OSError(errno.ENOSPC, "No space left on device", "/r/x"), errno.ENOSPC),
    (_torch_style(), errno.EFBIG),
    (_background_write(_torch_style()), errno.EFBIG),
    (_background_write(PermissionError(errno.EPERM, "Operation not permitted", "/r/.staged_step_2")), errno.EPERM),
    (RuntimeError("Error while serializing: I/O error: File too large (os error 27)"), errno.EFBIG),
    (Exception("(sqlite3.OperationalError) database or disk is full"), errno.ENOSPC),
])
def test_failed_writes_are_found_in_the_chain_and_in_native_messages(exc, code):
    assert diskio.failed_write(exc)[0] == code
    assert diskio.failed_write(KeyError("x")) is None


def test_the_message_names_the_file_and_the_space(tmp_path, monkeypatch):
    monkeypatch.setattr(diskio, "free_bytes", lambda path: 3 * 1024 * 1024)
    with pytest.raises(WriteFailure) as err, diskio.disk_errors("write it", "Free space.", where=tmp_path,
                                                                needed=12 * 1024 * 1024, current=["/r/state.pt"]):
        _enospc()
    assert str(err.value) == ("Cannot write it: No space left on device (/r/state.pt). It needs about 12.0 MiB; "
                              "3.0 MiB are free there. Free space.")
    monkeypatch.setattr(diskio, "file_size_limit", lambda: 1024 * 1024)
    with pytest.raises(WriteFailure) as err, diskio.disk_errors("write it", where=tmp_path, needed=9 << 20,
                                                                largest=8 << 20, current=["/r/state.pt"]):
        raise _torch_style()
    assert str(err.value) == ("Cannot write it: File too large (/r/state.pt). The file-size limit of this process "
                              "(ulimit -f) is 1.0 MiB and the largest file needs about 8.0 MiB: raise it (ulimit -f "
                              "unlimited).")
    with pytest.raises(WriteFailure, match=r"^Cannot write it: File too large \(/r/state.pt\)"), \
            diskio.disk_errors("write it", where=tmp_path, current=["/r/state.pt"]):
        raise _background_write(_torch_style())


def test_a_write_refused_by_permissions_is_not_told_to_free_space(tmp_path):
    with pytest.raises(WriteFailure) as err, diskio.disk_errors("write it", "Free space, then resume.", where=tmp_path):
        raise _background_write(PermissionError(errno.EPERM, "Operation not permitted", "/r/.staged_step_2"))
    assert str(err.value) == ("Cannot write it: Operation not permitted (/r/.staged_step_2). Make the folder "
                              "writable, then resume.")


# --- links -----------------------------------------------------------------------------------------------
@pytest.fixture
def precious(tmp_path) -> Path:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    return target


def test_a_lock_file_that_is_a_symlink_is_refused_not_followed(tmp_path, precious):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".rlforge.lock").symlink_to(precious)
    with pytest.raises(RLForgeError, match=rf"Refusing to write {run / '.rlforge.lock'}: it is a symbolic link "
                                           rf"\(to {precious}\)"):
        RunLock(run)
    assert precious.read_text() == "keep me"


def test_a_lock_file_that_is_a_hard_link_or_a_fifo_is_refused(tmp_path, precious):
    run = tmp_path / "run"
    run.mkdir()
    os.link(precious, run / ".rlforge.lock")
    with pytest.raises(RLForgeError, match=r"it is a hard link \(2 names for one file\)"):
        RunLock(run)
    assert precious.read_text() == "keep me"
    (run / ".rlforge.lock").unlink()
    os.mkfifo(run / ".rlforge.lock")
    with pytest.raises(RLForgeError, match=r"it is not a regular file"):
        RunLock(run)


def test_appends_and_atomic_writes_never_follow_a_link(tmp_path, precious):
    (tmp_path / "samples.jsonl").symlink_to(precious)
    with pytest.raises(RLForgeError, match="samples.jsonl: it is a symbolic link"):
        diskio.open_text(tmp_path / "samples.jsonl", append=True)
    (tmp_path / "config.yaml").symlink_to(precious)  # the final name and the temporary one: replaced, not written
    (tmp_path / ".summary.json.tmp").symlink_to(precious)
    diskio.write_atomic(tmp_path / "config.yaml", "a: 1\n")
    diskio.write_atomic(tmp_path / "summary.json", "{}")
    assert precious.read_text() == "keep me"
    assert (tmp_path / "config.yaml").read_text() == "a: 1\n" and not (tmp_path / "config.yaml").is_symlink()


# --- checkpoints under a file-size limit (a real one, in a child process) -----------------------------------
SAVE_UNDER_LIMIT = """
import resource, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from rlforge import checkpoint as ckpt
from rlforge.diskio import WriteFailure

class Model(torch.nn.Linear):  # what ckpt.save needs of a Hugging Face model, without importing transformers
    def save_pretrained(self, folder, safe_serialization=True):
        folder.mkdir(parents=True)
        save_file(self.state_dict(), str(folder / "model.safetensors"))

class Tokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")

run = Path(sys.argv[1])
model = Model(256, 256)
opt = torch.optim.AdamW(model.parameters())
model(torch.ones(1, 256)).sum().backward()
opt.step()
state = {"step": 1, "optimizer": opt.state_dict()}
ckpt.save(run, 1, model, Tokenizer(), state, keep_last_n=2)
weights = (run / "checkpoints" / "step_000001" / "actor" / "model.safetensors").stat().st_size
# ulimit -f between the weights and the optimizer state (twice the weights): the state file cannot be written
resource.setrlimit(resource.RLIMIT_FSIZE, (weights + 65536, resource.RLIM_INFINITY))
try:
    ckpt.save(run, 2, model, Tokenizer(), state, keep_last_n=2)
except WriteFailure as exc:
    print("ERROR", exc)
"""


def test_a_file_size_limit_below_the_optimizer_state_is_one_message(tmp_path):
    from rlforge import checkpoint as ckpt

    done = subprocess.run([sys.executable, "-c", SAVE_UNDER_LIMIT, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    folder = tmp_path / "checkpoints"
    assert line.startswith(f"ERROR Cannot write checkpoint step 2 into {folder}: File too large "
                           f"({folder / '.tmp_step_000002' / 'trainer_state.pt'}). The file-size limit of this "
                           f"process (ulimit -f) is "), line
    assert f"The previous checkpoint {folder / 'step_000001'} is intact" in line
    assert sorted(p.name for p in folder.iterdir()) == ["step_000001"]  # no temporary folder left
    ckpt.read(folder / "step_000001")
