"""Run untrusted (model-written) Python in a separate, confined process: ``run_sandboxed``.

Every run gets a fresh temporary directory, resource limits (CPU time, address space, file size, processes,
open files, no core dumps), a wall-clock timeout that kills the whole process group, capped output and a
minimal environment. Two isolation modes add the rest (docs/reliability.md states what each guarantees):

- ``namespaces`` (root, where ``unshare`` works): new network, mount and IPC namespaces; every mount
  remounted read-only except a size-limited tmpfs working directory; a fresh unprivileged uid per run,
  whose processes are all killed when the run ends.
- ``audit`` (anywhere else): a Python audit hook in the child refuses sockets, subprocesses, ``ctypes``
  and file changes outside the working directory. Best effort: not a security boundary.

``auto`` picks ``namespaces`` when a probe run succeeds and ``audit`` otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import re
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from rlforge.errors import RLForgeError

log = logging.getLogger("rlforge.reward.sandbox")

ISOLATION_MODES = ("auto", "namespaces", "audit")
UID_BASE, UID_SPAN = 2_000_000, 1 << 20  # each namespaced run gets a fresh uid from this range

# Linux constants (sched.h, sys/mount.h, sys/prctl.h)
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_KEPT_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                     "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}

_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child must not dlopen after fork

# The child's entry point in ``audit`` mode: install the hook, then run main.py as __main__.
_AUDIT_BOOTSTRAP = r"""
import os, runpy, sys
ROOT = os.getcwd()
DENY = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
        "os.system", "os.kill", "os.killpg", "os.link", "os.symlink", "signal.pthread_kill", "ctypes.", "pty.")
DENY_IMPORTS = {"_posixsubprocess", "_posixshmem"}  # they spawn processes / create files without audit events
PATHS = {"os.remove": [(0, 1)], "os.rmdir": [(0, 1)], "os.mkdir": [(0, 2)], "os.chmod": [(0, 2)],
         "os.chown": [(0, 3)], "os.utime": [(0, 3)], "os.rename": [(0, 2), (1, 3)], "os.truncate": [(0, None)]}
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def inside(path, dir_fd=None):
    if isinstance(path, int):
        return True  # an open descriptor: checked when it was opened
    base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd not in (None, -1) else os.getcwd()
    real = os.path.realpath(os.path.join(base, os.fsdecode(path)))
    return real == os.devnull or real == ROOT or real.startswith(ROOT + os.sep)

def hook(event, args):
    if event.startswith(DENY):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args[0] in DENY_IMPORTS:
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    if event == "open":
        path, mode, flags = args
        if ((flags or 0) & WRITE or any(c in (mode or "") for c in "wax+")) and not inside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the working directory is not allowed")
    for path_at, fd_at in PATHS.get(event, ()):
        if not inside(args[path_at], None if fd_at is None else args[fd_at]):
            raise PermissionError(f"sandbox: {event} on {args[path_at]!r} outside the working directory")

sys.addaudithook(hook)
sys.argv = [sys.argv[-1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class SandboxError(RLForgeError):
    """The sandbox could not be set up (for example ``namespaces`` requested where they are unavailable)."""


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # the program's exit status; negative: killed by that signal (as in ``subprocess``)
    timed_out: bool  # still running at the wall-clock timeout (then killed)
    killed_reason: str | None  # why the program was stopped, None when it exited by itself
    truncated: bool  # stdout or stderr was longer than the output cap
    isolation: str  # the mode it ran under: namespaces | audit


def run_sandboxed(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    max_output_kib: int = 64,
    max_file_mb: int = 16,
    max_processes: int = 16,
    max_open_files: int = 64,
    isolation: str = "auto",
) -> SandboxResult:
    """Run ``code`` as a Python program with ``stdin`` as its input, confined and limited.

    :param timeout_s: wall-clock limit; the process group is killed after it (CPU time is limited too).
    :param memory_mb: address-space limit of each process (``RLIMIT_AS``).
    :param max_output_kib: stdout and stderr are each cut to this size (the rest is read and dropped).
    :param max_file_mb: largest file the program may write (in ``namespaces`` mode also the total size
        of its working directory).
    :param max_processes: processes and threads the program may run at once (``RLIMIT_NPROC``).
    :param isolation: ``auto``, ``namespaces`` or ``audit`` (see the module docstring).
    """
    mode = _resolve_isolation(isolation)
    limits = _Limits(timeout_s, memory_mb, max_file_mb, max_processes, max_open_files)
    return _run(code, stdin, limits, mode, namespace_python() if mode == "namespaces" else _own_python(),
                max_output_kib * 1024)


def isolation_mode() -> str:
    """The mode ``auto`` uses on this machine: ``namespaces`` or ``audit``."""
    return "namespaces" if namespace_python() else "audit"


@functools.cache
def namespace_python() -> str | None:
    """The interpreter that works inside the namespace sandbox here, or None where namespaces are unavailable.

    The sandboxed uid must be able to reach the interpreter and its standard library, so the candidates
    (this interpreter's base, then ``python3`` on the system path) are tried with a probe run.
    """
    if os.geteuid() != 0:
        log.warning("Code sandbox: not running as root, so no namespaces; using the weaker audit-hook isolation.")
        return None
    probe = _Limits(10.0, 256, 1, 4, 16)
    for python in _python_candidates():
        try:
            result = _run("print('ok')", "", probe, "namespaces", python, 1024)
        except SandboxError as exc:
            log.debug("Namespace sandbox probe failed: %s", exc)
            continue
        if result.exit_code == 0 and result.stdout.strip() == "ok":
            return python
        log.debug("Namespace sandbox probe with %s failed: %s", python, result.stderr[-500:])
    log.warning("Code sandbox: namespaces are unavailable here (unshare/mount failed or no interpreter the "
                "sandbox uid can run); using the weaker audit-hook isolation.")
    return None


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_mb: int
    max_file_mb: int
    max_processes: int
    max_open_files: int


def _resolve_isolation(isolation: str) -> str:
    if isolation not in ISOLATION_MODES:
        raise SandboxError(f"Unknown sandbox isolation '{isolation}'. Available: {', '.join(ISOLATION_MODES)}.")
    if isolation == "auto":
        return isolation_mode()
    if isolation == "namespaces" and namespace_python() is None:
        raise SandboxError("Sandbox isolation 'namespaces' needs root and working unshare(2)/mount(2); "
                           "use isolation='audit' or 'auto'.")
    return isolation


def _own_python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)


def _python_candidates() -> list[str]:
    found = [_own_python(), shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    return list(dict.fromkeys(os.path.realpath(p) for p in found if p))


def _run(code: str, stdin: str, limits: _Limits, mode: str, python: str, output_cap: int) -> SandboxResult:
    top = os.path.realpath(tempfile.mkdtemp(prefix="rlforge-sandbox-"))  # as /proc/self/mountinfo spells it
    work = os.path.join(top, "work")
    os.mkdir(work)
    uid = UID_BASE + secrets.randbelow(UID_SPAN) if mode == "namespaces" else None
    try:
        program = os.path.join(top, "main.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        if mode == "namespaces":
            os.chmod(top, 0o755)
            os.chmod(program, 0o644)
            argv = [python, "-I", "-S", "-B", program]
            confine = functools.partial(_confine_namespaces, work, uid, limits)
        else:
            argv = [python, "-I", "-S", "-B", "-c", _AUDIT_BOOTSTRAP, program]
            confine = functools.partial(_confine_limits, limits)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LC_ALL": "C.UTF-8"}
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            try:
                proc = subprocess.Popen(argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        cwd=work, env=env, start_new_session=True, preexec_fn=confine)
            except (OSError, subprocess.SubprocessError) as exc:
                raise SandboxError(f"Could not start the sandboxed program with {python} ({mode} isolation: "
                                   f"namespaces, mounts, uid or resource limits failed): {exc}") from None
        try:
            out, err, truncated, timed_out = _collect(proc, time.monotonic() + limits.timeout_s, output_cap)
        finally:
            _kill_everything(proc, uid)
        return SandboxResult(out, err, proc.returncode, timed_out, _killed_reason(proc.returncode, timed_out, limits),
                             truncated, mode)
    finally:
        _remove_tree(top)


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[str, str, bool, bool]:
    """Read stdout/stderr (keeping ``cap`` bytes of each) until the program exits or the deadline passes."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated, exited = False, False
    pidfd = os.pidfd_open(proc.pid)
    with selectors.DefaultSelector() as sel:
        for fd in (*bufs, pidfd):
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            events = sel.select(0 if exited else remaining)
            if exited and not events:
                break  # the program is gone and its pipes are drained (a leftover child may hold them open)
            for key, _ in events:
                if key.fd == pidfd:
                    exited = True
                    sel.unregister(pidfd)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                keep = max(0, cap - len(buf))
                buf += chunk[:keep]
                truncated |= len(chunk) > keep
    os.close(pidfd)
    out, err = (bytes(b).decode("utf-8", errors="replace") for b in bufs.values())
    return out, err, truncated, not exited and proc.poll() is None


def _kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the program's process group and, for a namespaced run, every process of its uid; reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if uid is not None:
        _kill_uid(uid)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _kill_uid(uid: int) -> None:
    """``kill(-1, SIGKILL)`` as ``uid``: kills all its processes at once, even ones that left the group."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _killed_reason(exit_code: int, timed_out: bool, limits: _Limits) -> str | None:
    if timed_out:
        return f"wall-clock timeout ({limits.timeout_s:g} s)"
    if exit_code == -signal.SIGXCPU:
        return f"CPU time limit ({_cpu_seconds(limits)} s)"
    if exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    return None


def _cpu_seconds(limits: _Limits) -> int:
    return math.ceil(limits.timeout_s) + 1


# --- run in the child between fork and exec (keep to system calls: no imports, no dlopen) -------------------


def _confine_namespaces(work: str, uid: int, limits: _Limits) -> None:
    """New network/mount/IPC namespaces, a tmpfs working dir, everything else read-only, then drop to ``uid``."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = f"size={limits.max_file_mb}m,mode=0700,uid={uid},gid={uid}"
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, size)
    for point, flags in _mounts():
        if point != work:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags)
    os.chdir(work)  # the tmpfs now covers the directory Popen entered
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _confine_limits(limits)


def _confine_limits(limits: _Limits) -> None:
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")  # after any setuid
    cpu = _cpu_seconds(limits)
    for res, soft, hard in ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_CPU, cpu, cpu + 1),
                            (resource.RLIMIT_FSIZE, limits.max_file_mb << 20, limits.max_file_mb << 20),
                            (resource.RLIMIT_NPROC, limits.max_processes, limits.max_processes),
                            (resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
                            (resource.RLIMIT_AS, limits.memory_mb << 20, limits.memory_mb << 20)):  # AS last
        ceiling = resource.getrlimit(res)[1]  # an unprivileged process cannot raise its hard limit
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(res, (soft, hard))


def _mounts() -> list[tuple[str, int]]:
    """(mount point, per-mount flags to keep) for every mount this process sees."""
    with open("/proc/self/mountinfo") as f:
        rows = [line.split() for line in f]
    return [(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), row[4]),
             sum(_KEPT_MOUNT_FLAGS.get(opt, 0) for opt in row[5].split(","))) for row in rows]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data))
    _check(rc, f"mount {target}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _remove_tree(top: str) -> None:
    """Remove the run's directory even if the program made parts of it unreadable (audit mode, same uid)."""
    os.chmod(top, 0o700)
    for root, dirs, _ in os.walk(top):
        for d in dirs:
            path = os.path.join(root, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(top)
