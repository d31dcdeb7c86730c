"""rlforge.plugins.reward.sandbox: normal programs run; loops, fork and memory bombs, file writes outside the
working directory and network connections are contained, in both isolation modes."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from rlforge.plugins.reward.sandbox import (
    UID_BASE,
    UID_SPAN,
    SandboxError,
    isolation_mode,
    namespace_python,
    run_sandboxed,
)

NAMESPACES_AVAILABLE = isolation_mode() == "namespaces"
needs_namespaces = pytest.mark.skipif(not NAMESPACES_AVAILABLE, reason="namespaces need root and unshare(2)")


@pytest.fixture(params=["namespaces", "audit"])
def mode(request) -> str:
    if request.param == "namespaces" and not NAMESPACES_AVAILABLE:
        pytest.skip("namespaces need root and unshare(2)")
    return request.param


def _live_sandbox_processes() -> list[int]:
    """Pids of processes (zombies aside) running under a sandbox uid."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        except OSError:  # exited while we looked
            continue
        uid = int(status["Uid"].split()[0])
        if UID_BASE <= uid < UID_BASE + UID_SPAN and not status["State"].strip().startswith("Z"):
            found.append(int(pid))
    return found


# --- normal programs --------------------------------------------------------------------------------------


def test_program_reads_stdin_and_writes_output(mode) -> None:
    code = "import sys\nname = input()\nprint(f'hello {name}')\nprint('note', file=sys.stderr)\n"
    result = run_sandboxed(code, "world\n", timeout_s=5, isolation=mode)
    assert (result.stdout, result.stderr) == ("hello world\n", "note\n")
    assert (result.exit_code, result.timed_out, result.killed_reason, result.truncated) == (0, False, None, False)
    assert result.isolation == mode


def test_exit_status_and_traceback(mode) -> None:
    assert run_sandboxed("raise SystemExit(3)", isolation=mode).exit_code == 3
    result = run_sandboxed("1 / 0", isolation=mode)
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr
    assert result.killed_reason is None


def test_limits_environment_and_working_directory(mode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFORGE_SECRET_TOKEN", "s3cret")
    code = (
        "import os, resource\n"
        "for name in ('CPU', 'AS', 'FSIZE', 'NPROC', 'NOFILE', 'CORE'):\n"
        "    print(name, *resource.getrlimit(getattr(resource, 'RLIMIT_' + name)))\n"
        "print('env', *sorted(os.environ))\n"
        "open('scratch.txt', 'w').write('inside')\n"
        "print('cwd', os.getcwd(), open('scratch.txt').read())\n"
    )
    result = run_sandboxed(code, timeout_s=2.5, memory_mb=300, max_file_mb=3, max_processes=7, max_open_files=20,
                           isolation=mode)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["CPU"] == "4 5"  # ceil(timeout) + 1 soft, one more hard
    assert lines["AS"] == f"{300 << 20} {300 << 20}"
    assert lines["FSIZE"] == f"{3 << 20} {3 << 20}"
    assert (lines["NPROC"], lines["NOFILE"], lines["CORE"]) == ("7 7", "20 20", "0 0")
    assert lines["env"] == "HOME LC_ALL PATH TMPDIR"
    workdir, content = lines["cwd"].split()
    assert content == "inside"
    assert not Path(workdir).exists()  # removed after the run


def test_output_is_capped(mode) -> None:
    result = run_sandboxed("import sys\nsys.stdout.write('x' * 1_000_000)\nprint('tail', file=sys.stderr)",
                           max_output_kib=4, isolation=mode)
    assert result.stdout == "x" * 4096
    assert result.stderr == "tail\n"
    assert result.truncated and result.exit_code == 0


def test_without_root_auto_falls_back_to_the_audit_hook(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    namespace_python.cache_clear()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    try:
        with caplog.at_level(logging.WARNING, logger="rlforge.reward.sandbox"):
            assert isolation_mode() == "audit"
        assert "not running as root" in caplog.text and "weaker audit-hook isolation" in caplog.text
        assert run_sandboxed("print(1)").isolation == "audit"
        with pytest.raises(SandboxError, match="'namespaces' needs root"):
            run_sandboxed("print(1)", isolation="namespaces")
    finally:
        monkeypatch.undo()
        namespace_python.cache_clear()


def test_unknown_isolation_is_refused() -> None:
    with pytest.raises(SandboxError, match="Unknown sandbox isolation 'docker'. Available: auto, namespaces, audit"):
        run_sandboxed("print(1)", isolation="docker")


# --- containment ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)"], ids=["busy", "sleep"])
def test_infinite_loop_is_killed_at_the_timeout(mode, code) -> None:
    start = time.monotonic()
    result = run_sandboxed(code, timeout_s=1.0, isolation=mode)
    assert time.monotonic() - start < 5.0
    assert result.timed_out
    assert result.killed_reason == "wall-clock timeout (1 s)"
    assert result.exit_code == -9


def test_fork_bomb_is_contained(mode) -> None:
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(n, type(exc).__name__, flush=True)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    result = run_sandboxed(code, timeout_s=1.5, max_processes=8, isolation=mode)
    assert time.monotonic() - start < 6.0
    assert result.timed_out
    forks, error = result.stdout.split()
    if mode == "namespaces":
        assert 0 < int(forks) < 8 and error == "BlockingIOError"  # EAGAIN from RLIMIT_NPROC
    else:
        assert (forks, error) == ("0", "PermissionError")  # the audit hook refuses os.fork
    assert _live_sandbox_processes() == []


@needs_namespaces
def test_processes_that_leave_the_group_are_killed_too() -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n"
    result = run_sandboxed(code, timeout_s=5, isolation="namespaces")
    assert result.stdout == "parent done\n" and not result.timed_out
    assert _live_sandbox_processes() == []


@pytest.mark.parametrize("code", ["x = bytearray(2 << 30)", "x = []\nwhile True:\n    x.append(bytearray(1 << 20))"],
                         ids=["one-block", "growing"])
def test_memory_bomb_is_contained(mode, code) -> None:
    result = run_sandboxed(code, timeout_s=10, memory_mb=128, isolation=mode)
    assert result.exit_code == 1 and not result.timed_out
    assert "MemoryError" in result.stderr


def test_file_size_is_limited(mode) -> None:
    result = run_sandboxed("open('big', 'wb').write(b'0' * (2 << 20))", max_file_mb=1, isolation=mode)
    assert result.exit_code == 1
    assert "File too large" in result.stderr or "No space left" in result.stderr


def test_file_writes_outside_the_sandbox_are_contained(mode, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o777)  # even a directory anyone may write to stays untouched
    targets = [tmp_path / "outside.txt", Path(f"/tmp/rlforge-escape-{uuid.uuid4().hex}"), Path("../main.py")]
    code = (
        "import os\n"
        f"for path in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('escaped')\n"
        "        print('WROTE', path)\n"
        "    except OSError as exc:\n"
        "        print('refused', type(exc).__name__)\n"
        "for op in (lambda: os.mkdir('/tmp/rlforge-escape-dir'), lambda: os.remove('/etc/hostname')):\n"
        "    try:\n"
        "        op()\n"
        "        print('CHANGED')\n"
        "    except OSError as exc:\n"
        "        print('refused', type(exc).__name__)\n"
    )
    result = run_sandboxed(code, isolation=mode)
    assert result.exit_code == 0, result.stderr
    assert "WROTE" not in result.stdout and "CHANGED" not in result.stdout
    assert result.stdout.count("refused") == 5
    assert not targets[0].exists() and not targets[1].exists()
    assert not Path("/tmp/rlforge-escape-dir").exists() and Path("/etc/hostname").exists()


def test_network_connection_is_refused(mode) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'leak')\n"
        result = run_sandboxed(code, timeout_s=5, isolation=mode)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever connected
    assert result.exit_code == 1
    expected = "Network is unreachable" if mode == "namespaces" else "sandbox: socket."
    assert expected in result.stderr


@needs_namespaces
def test_namespaced_program_runs_as_an_unprivileged_uid() -> None:
    result = run_sandboxed("import os\nprint(os.getuid(), os.getgid(), os.getgroups())", isolation="namespaces")
    uid, gid, groups = result.stdout.split(maxsplit=2)
    assert UID_BASE <= int(uid) < UID_BASE + UID_SPAN and gid == uid and groups.strip() == "[]"


def test_audit_hook_refuses_subprocesses_ctypes_and_signals() -> None:
    code = (
        "import os\n"
        "for op in (lambda: __import__('subprocess'), lambda: os.system('true'), lambda: os.fork(),\n"
        "           lambda: __import__('ctypes'), lambda: os.kill(os.getppid(), 9), lambda: os.symlink('/', 'root')):\n"
        "    try:\n"
        "        op()\n"
        "        print('ALLOWED')\n"
        "    except PermissionError as exc:\n"
        "        print(exc)\n"
    )
    result = run_sandboxed(code, isolation="audit")
    assert result.stdout.splitlines() == [
        "sandbox: importing _posixsubprocess is not allowed",
        "sandbox: os.system is not allowed",
        "sandbox: os.fork is not allowed",
        "sandbox: ctypes.dlopen is not allowed",
        "sandbox: os.kill is not allowed",
        "sandbox: os.symlink is not allowed",
    ]
