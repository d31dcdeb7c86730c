"""One writer per run folder: an exclusive ``flock`` on ``<run>/.rlforge.lock``.

The lock belongs to the open file, so the kernel drops it when the holder exits in any way, ``kill -9``
included: a lock is never stale. The file keeps the holder's pid, host and start time so a refused second
writer can say who holds the folder; on a clean release the file is emptied, so a non-empty file found by the
next holder means the previous writer did not exit cleanly (it was killed). Processes forked by the holder
(reward workers) close their inherited copy at fork, so they never keep the folder locked after it dies.

The lock file is opened with ``O_NOFOLLOW`` and must be a regular file with one link: a ``.rlforge.lock`` that
is a symbolic or hard link to another file is refused, never written through (``rlforge.diskio.open_regular``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from rlforge import diskio
from rlforge.errors import RLForgeError

LOCK_FILE = ".rlforge.lock"
log = logging.getLogger("rlforge.run")
_HELD: set[int] = set()  # descriptors of the locks this process holds (closed in forked children)


def _close_in_child() -> None:
    for fd in list(_HELD):
        os.close(fd)  # closing a copy leaves the parent's lock in place (it is released only by its last copy)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunLock:
    """Hold ``<run_dir>/.rlforge.lock`` exclusively until :meth:`release` (or the process ends).

    :raises RLForgeError: another process holds it; the message names the folder and that process.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        try:
            self.fd: int | None = diskio.open_regular(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise RLForgeError(f"Cannot create the lock file {self.path}: {exc.strerror}.") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder() or "pid not recorded yet"
            self._close()
            raise RLForgeError(
                f"Run folder {run_dir} is in use by another rlforge process ({holder}). Two writers would mix their "
                f"checkpoints and logs: wait for it to end or stop it, or start a new run (trainer.resume=never)."
            ) from None
        except OSError as exc:  # a file system without locks (some network or FUSE mounts)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("The file system of %s does not support locks (%s): nothing stops a second process from "
                        "writing into this run folder at the same time.", run_dir, exc.strerror)
        _HELD.add(self.fd)
        previous = self._holder()
        if previous:
            log.warning("Run folder %s: the previous writer (%s) did not exit cleanly (killed or crashed); its "
                        "unfinished checkpoint, if any, is discarded.", run_dir, previous)
        try:
            with diskio.disk_errors(f"write the lock file {self.path}", "Free space, then start again.", where=run_dir):
                self._write({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")})
        except RLForgeError:
            self._close()
            raise

    def _holder(self) -> str:
        """The recorded holder in words, '' if none."""
        try:
            raw = os.pread(self.fd, 4096, 0).decode("utf-8", "replace") if self.fd is not None else ""
            info = json.loads(raw) if raw.strip() else {}
        except (OSError, ValueError):
            return "pid unknown: the lock file is unreadable"
        if not info:
            return ""
        return f"pid {info.get('pid')} on {info.get('host')}, since {info.get('started')}"

    def _write(self, info: dict[str, object]) -> None:
        assert self.fd is not None
        data = json.dumps(info).encode() if info else b""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def _close(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)
            self.fd = None

    def release(self) -> None:
        """Empty the record (a clean exit) and drop the lock. Safe to call twice."""
        if self.fd is None:
            return
        try:
            self._write({})
        except OSError:
            pass  # the lock is dropped below all the same; the next holder only sees an old record
        self._close()
