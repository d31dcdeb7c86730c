"""Run untrusted (model-written) Python in a separate, confined process: ``run_sandboxed``.

Every run gets a fresh temporary directory, resource limits (CPU time, address space, file size, processes,
open files, no core dumps), totals for its working directory (bytes and files) in every mode, a wall-clock
backstop that kills the whole process group, capped output and a minimal environment. The isolation mode adds
the rest (docs/reliability.md states what each guarantees):

- ``namespaces`` (root): new PID, mount, network and IPC namespaces; a read-only root holding only the
  system directories and the interpreter, a size-limited tmpfs working directory; a fresh unprivileged uid.
- ``userns`` (any user, where unprivileged user namespaces work): the same jail, entered through a user
  namespace; the program runs as a non-root uid of a second user namespace, without capabilities.
- ``audit`` (weak, only with ``allow_weak=True``): a Python audit hook in the child. Not a security boundary.

``auto`` picks the first of ``namespaces`` and ``userns`` whose probe run succeeds here; where neither
works it refuses (``SandboxError``) unless ``allow_weak`` is set. The child side is ``sandbox_child.py``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from rlforge.errors import RLForgeError

log = logging.getLogger("rlforge.reward.sandbox")

ISOLATION_MODES = ("auto", "namespaces", "userns", "audit")
STRONG_MODES = ("namespaces", "userns")  # the order ``auto`` tries them in
UID_BASE, UID_SPAN = 2_000_000, 1 << 20  # a run that drops host root gets a fresh uid from this range
WALL_BACKSTOP = 10.0  # default wall-clock limit, as a multiple of the CPU-time limit
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
PROBE = "import decimal, json\nprint('ok')"  # loads standard-library files, as the sandbox's user
SETUP_WAIT_S = 5.0
DISK_POLL_S = 0.01  # audit mode: how often the working directory's total is measured while the program runs
STOP_SIGNALS = {"namespaces": signal.SIGTERM, "userns": signal.SIGTERM, "audit": signal.SIGKILL}  # see _kill  # how long to wait for the child's set-up report after the program is gone


class SandboxError(RLForgeError):
    """The sandbox refuses to run: no isolation works here and the weak mode is not allowed, or the mode
    asked for does not work. A configuration problem: a reward run stops with this message."""


class SandboxSetupError(RuntimeError):
    """A run could not be set up (a system call failed). For a reward, one failed sample."""


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # the program's exit status; negative: killed by that signal (as in ``subprocess``)
    timed_out: bool  # stopped for time: over its CPU-time limit or the wall-clock backstop
    killed_reason: str | None  # why the program was stopped, None when it exited by itself
    truncated: bool  # stdout or stderr was longer than the output cap
    isolation: str  # the mode it ran under: namespaces | userns | audit


@dataclass(frozen=True)
class _Limits:
    cpu_s: int  # RLIMIT_CPU of each process (SIGXCPU), whole seconds
    wall_s: float  # the process group is killed after this
    memory_mb: int
    max_file_mb: int
    max_processes: int
    max_open_files: int
    max_total_mb: int = 16  # bytes in the working directory
    max_files: int = 64  # files and directories created in the working directory


def run_sandboxed(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    wall_timeout_s: float | None = None,
    max_output_kib: int = 64,
    max_file_mb: int = 16,
    max_total_mb: int = 16,
    max_files: int = 64,
    max_processes: int = 16,
    max_open_files: int = 64,
    isolation: str = "auto",
    allow_weak: bool = False,
) -> SandboxResult:
    """Run ``code`` as a Python program with ``stdin`` as its input, confined and limited.

    :param timeout_s: CPU-time limit of each process of the program (rounded up to whole seconds): the
        verdict does not depend on how loaded the machine is.
    :param wall_timeout_s: wall-clock backstop for a program that waits without using CPU (a ``sleep``);
        default ``10 * timeout_s``.
    :param memory_mb: address-space limit of each process (``RLIMIT_AS``).
    :param max_output_kib: stdout and stderr are each cut to this size (the rest is read and dropped).
    :param max_file_mb: largest file the program may write (``RLIMIT_FSIZE``).
    :param max_total_mb: most bytes its working directory may hold, all files together (the jail modes: the size
        of its tmpfs; ``audit``: measured every ``DISK_POLL_S`` and at the end, the run killed when over).
    :param max_files: most files and directories it may create there (the jail modes: the tmpfs's inodes;
        ``audit``: counted by the audit hook).
    :param max_processes: processes and threads the program may run at once (``RLIMIT_NPROC``).
    :param isolation: ``auto``, ``namespaces``, ``userns`` or ``audit`` (see the module docstring).
    :param allow_weak: allow the ``audit`` mode (``reward.code.sandbox_allow_weak``); without it a machine with
        no real isolation refuses to run the program.
    """
    mode = _resolve(isolation, allow_weak)
    wall = WALL_BACKSTOP * timeout_s if wall_timeout_s is None else wall_timeout_s
    limits = _Limits(max(1, math.ceil(timeout_s)), wall, memory_mb, max_file_mb, max_processes, max_open_files,
                     max_total_mb, max_files)
    python = _probe(mode, os.geteuid()).python
    assert python is not None  # _resolve checked it
    return _run(code, stdin, limits, mode, python, max_output_kib * 1024)


def isolation_mode(allow_weak: bool = False) -> str:
    """The mode ``auto`` uses on this machine; ``SandboxError`` where it would refuse."""
    return _resolve("auto", allow_weak)


@dataclass(frozen=True)
class _Probe:
    python: str | None  # the interpreter that works in this mode here; None: the mode does not work
    reason: str  # why not ("" when it works)


@functools.cache
def _probe(mode: str, euid: int) -> _Probe:
    """Can ``mode`` run a program here (as ``euid``), and with which interpreter? Checked by a real run.

    The sandbox's uid must be able to run the interpreter, so the candidates (this interpreter, then
    ``python3`` on the system path) are tried in turn.
    """
    if mode == "namespaces" and euid != 0:
        return _Probe(None, "needs root")
    probe = _Limits(10, 30.0, 64, 1, 4, 16, 1, 16)
    reasons = []
    for python in _python_candidates():
        try:
            result = _run(PROBE, "", probe, mode, python, 1024)
        except SandboxSetupError as exc:
            reasons.append(str(exc))
            continue
        if result.exit_code == 0 and result.stdout.strip() == "ok":
            return _Probe(python, "")
        reasons.append(f"{python}: exit {result.exit_code}: {result.stderr.strip()[-300:]}")
    log.debug("Code sandbox: mode %s unavailable: %s", mode, "; ".join(reasons))
    return _Probe(None, "; ".join(dict.fromkeys(reasons)))


def _resolve(isolation: str, allow_weak: bool) -> str:
    if isolation not in ISOLATION_MODES:
        raise SandboxError(f"Unknown sandbox isolation '{isolation}'. Available: {', '.join(ISOLATION_MODES)}.")
    if isolation == "audit" or (isolation == "auto" and not _strong_modes()):
        if not allow_weak:
            raise SandboxError(_refusal(isolation))
        _warn_weak()
        _require("audit")
        return "audit"
    mode = _strong_modes()[0] if isolation == "auto" else isolation
    _require(mode)
    return mode


def _strong_modes() -> list[str]:
    return [m for m in STRONG_MODES if _probe(m, os.geteuid()).python]


def _require(mode: str) -> None:
    reason = _probe(mode, os.geteuid()).reason
    if reason:
        raise SandboxError(f"Sandbox isolation '{mode}' does not work here: {reason}.")


def _refusal(isolation: str) -> str:
    weak = ("the weak audit-hook isolation, which is not a security boundary, runs only with "
            "reward.code.sandbox_allow_weak=true (run_sandboxed(..., allow_weak=True))")
    if isolation == "audit":
        return f"Sandbox isolation 'audit' was asked for, but {weak}."
    why = "; ".join(f"{m}: {_probe(m, os.geteuid()).reason}" for m in STRONG_MODES)
    return (f"No real isolation works here, so the code sandbox refuses to run model-written code ({why}). Run "
            f"the trainer as root, or allow unprivileged user namespaces (user.max_user_namespaces > 0, and "
            f"kernel.unprivileged_userns_clone=1 where that sysctl exists; in Docker: --security-opt "
            f"seccomp=unconfined). Otherwise {weak}.")


@functools.cache
def _warn_weak() -> None:
    log.warning("Code sandbox: running model-written code under the weak 'audit' isolation "
                "(reward.code.sandbox_allow_weak=true). A Python audit hook is not a security boundary: a "
                "determined program can escape it. See docs/reliability.md.")


def _own_python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)


def _python_candidates() -> list[str]:
    found = [_own_python(), shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    return list(dict.fromkeys(os.path.realpath(p) for p in found if p))


# --- one run ----------------------------------------------------------------------------------------------


def _run(code: str, stdin: str, limits: _Limits, mode: str, python: str, output_cap: int) -> SandboxResult:
    top = os.path.realpath(tempfile.mkdtemp(prefix="rlforge-sandbox-"))  # as /proc/self/mountinfo spells it
    work, root, program = (os.path.join(top, name) for name in ("work", "root", "main.py"))
    uid = UID_BASE + secrets.randbelow(UID_SPAN)
    report_r, report_w = os.pipe()
    try:
        os.mkdir(work)
        os.mkdir(root)
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(top, 0o755)
        os.chmod(program, 0o644)
        if mode == "audit" and os.geteuid() == 0:
            os.chown(work, uid, uid)  # the program runs as that uid
        config = {"mode": mode, "report_fd": report_w, "parent": os.getpid(), "python": python, "uid": uid,
                  "program": program, "work": work, "root": root, "limits": asdict(limits),
                  "binds": [*SYSTEM_PATHS, os.path.dirname(os.path.dirname(python))]}
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LC_ALL": "C.UTF-8"}
        proc = _start([python, "-I", "-S", "-B", CHILD, json.dumps(config)], stdin, work, env, report_w)
        os.close(report_w)
        report_w = -1
        try:
            disk = (work, limits.max_total_mb << 20) if mode == "audit" else None  # the jails' tmpfs has the cap
            out, err, truncated, timed_out, over_disk = _collect(proc, time.monotonic() + limits.wall_s, output_cap,
                                                                 disk)
        finally:
            _kill(proc, mode)
        problem = _read_report(report_r)
        if problem:
            raise SandboxSetupError(f"The code sandbox could not start ({mode} isolation, {python}): {problem}")
        exit_code = proc.returncode
        over_disk = disk is not None and (over_disk or _disk_usage(work) > disk[1])
        if over_disk:
            exit_code = -signal.SIGKILL  # reported as stopped, also when the program exited before it was seen
        reason = _killed_reason(exit_code, timed_out, over_disk, limits)
        return SandboxResult(out, err, exit_code, timed_out or exit_code == -signal.SIGXCPU, reason, truncated, mode)
    finally:
        for fd in (report_r, report_w):
            if fd >= 0:
                os.close(fd)
        _remove_tree(top)


def _start(argv: list[str], stdin: str, cwd: str, env: dict[str, str], report_fd: int) -> subprocess.Popen:
    with tempfile.TemporaryFile() as stdin_file:
        stdin_file.write(stdin.encode("utf-8"))
        stdin_file.seek(0)
        try:
            return subprocess.Popen(argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                    env=env, start_new_session=True, pass_fds=(report_fd,))
        except OSError as exc:
            raise SandboxSetupError(f"Could not start the sandboxed program with {argv[0]}: {exc}") from None


def _collect(proc: subprocess.Popen, deadline: float, cap: int, disk: tuple[str, int] | None
             ) -> tuple[str, str, bool, bool, bool]:
    """Read stdout/stderr (keeping ``cap`` bytes of each) until the program exits or the deadline passes; with
    ``disk`` (a directory, its limit in bytes), also until the directory holds more than the limit. Returns
    (stdout, stderr, truncated, timed out, over the disk limit)."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated, exited, over_disk = False, False, False
    pidfd = os.pidfd_open(proc.pid)
    with selectors.DefaultSelector() as sel:
        for fd in (*bufs, pidfd):
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if disk is not None and not exited and _disk_usage(disk[0]) > disk[1]:
                over_disk = True
                break
            wait = remaining if disk is None else min(remaining, DISK_POLL_S)
            events = sel.select(0 if exited else wait)
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
    return out, err, truncated, not (exited or over_disk) and proc.poll() is None, over_disk


def _disk_usage(top: str) -> int:
    """Bytes of disk the files under ``top`` use (allocated blocks; a directory the program made unreadable is
    opened up first, as the run's owner may)."""
    total, todo = 0, [top]
    while todo:
        path = todo.pop()
        try:
            entries = list(os.scandir(path))
        except PermissionError:
            os.chmod(path, 0o700)
            entries = list(os.scandir(path))
        except FileNotFoundError:  # removed by the program meanwhile
            continue
        for entry in entries:
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            total += stat.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                todo.append(entry.path)
    return total


def _kill(proc: subprocess.Popen, mode: str) -> None:
    """Stop the run and reap it. In the jail modes the launcher, on SIGTERM, kills pid 1 of the program's PID
    namespace (the kernel then kills every process left in it) and exits once the namespace is empty; the
    process group is killed in any case."""
    if proc.poll() is None:
        os.kill(proc.pid, STOP_SIGNALS[mode])
        try:
            proc.wait(timeout=SETUP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _read_report(fd: int) -> str:
    """The child's set-up error, if any. Waits for EOF: every holder of the pipe (launcher and pid 1 in the
    jail modes) is then gone, so the namespace has been torn down when this returns."""
    chunks = []
    deadline = time.monotonic() + SETUP_WAIT_S
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0 and sel.select(remaining):
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _killed_reason(exit_code: int, timed_out: bool, over_disk: bool, limits: _Limits) -> str | None:
    if timed_out:
        return f"wall-clock backstop ({limits.wall_s:g} s)"
    if over_disk:
        return f"disk limit ({limits.max_total_mb} MiB in the working directory)"
    if exit_code == -signal.SIGXCPU:
        return f"CPU time limit ({limits.cpu_s} s)"
    if exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    return None


def _remove_tree(top: str) -> None:
    """Remove the run's directory even if the program made parts of it unreadable (audit mode)."""
    os.chmod(top, 0o700)
    for base, dirs, _ in os.walk(top):
        for d in dirs:
            path = os.path.join(base, d)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(top)
