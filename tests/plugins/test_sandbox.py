"""rlforge.plugins.reward.sandbox: normal programs run; escapes (the realpath-replacement bypass, ctypes, reading
or writing outside the working directory, network, fork/memory bombs, infinite loops, signalling the parent,
the trainer's environment) fail in every isolation mode that works here; the weak mode needs its flag; a
non-root trainer gets real isolation through user namespaces."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from rlforge.plugins.reward import sandbox
from rlforge.plugins.reward.sandbox import UID_BASE, UID_SPAN, SandboxError, isolation_mode, run_sandboxed

JAILS = [m for m in sandbox.STRONG_MODES if sandbox._probe(m, os.geteuid()).python]
MODES = [*JAILS, "audit"]
NOBODY = 65534


@pytest.fixture(params=["namespaces", "userns", "audit"])
def mode(request) -> str:
    if request.param not in MODES:
        pytest.skip(f"isolation {request.param} does not work here: {sandbox._probe(request.param, os.geteuid())}")
    return request.param


def run(code: str, mode: str, **kwargs) -> sandbox.SandboxResult:
    """``run_sandboxed`` in ``mode`` (the weak mode with its opt-in flag)."""
    return run_sandboxed(code, isolation=mode, allow_weak=mode == "audit", **kwargs)


def attempts(*lines: str) -> str:
    """A program that tries each statement and prints ``ALLOWED <i>`` or ``refused <i> <error>`` for it."""
    body = "".join(f"try:\n    {line}\n    print('ALLOWED', {i}, flush=True)\nexcept BaseException as exc:\n"
                   f"    print('refused', {i}, type(exc).__name__, exc, flush=True)\n" for i, line in enumerate(lines))
    return "import os, sys\n" + body


def refused(result: sandbox.SandboxResult, count: int) -> list[str]:
    lines = result.stdout.splitlines()
    assert len(lines) == count and all(line.startswith("refused") for line in lines), (result.stdout, result.stderr)
    return lines


def _processes_left() -> set[int]:
    """Live processes in another PID namespace than ours, or running as a sandbox uid."""
    own = os.readlink("/proc/self/ns/pid")
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            other_ns = os.readlink(f"/proc/{pid}/ns/pid") != own
        except OSError:  # exited while we looked
            continue
        uid = int(status["Uid"].split()[0])
        if (other_ns or UID_BASE <= uid < UID_BASE + UID_SPAN) and not status["State"].strip().startswith("Z"):
            found.add(int(pid))
    return found


@pytest.fixture
def no_leftovers():
    before = _processes_left()
    yield
    assert _processes_left() - before == set()


# --- normal programs --------------------------------------------------------------------------------------


def test_program_reads_stdin_and_writes_output(mode) -> None:
    code = "import sys, json, decimal\nname = input()\nprint(f'hello {name}')\nprint('note', file=sys.stderr)\n"
    result = run(code, mode, stdin="world\n")
    assert (result.stdout, result.stderr) == ("hello world\n", "note\n")
    assert (result.exit_code, result.timed_out, result.killed_reason, result.truncated) == (0, False, None, False)
    assert result.isolation == mode


def test_exit_status_and_traceback(mode) -> None:
    assert run("raise SystemExit(3)", mode).exit_code == 3
    result = run("1 / 0", mode)
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
    result = run(code, mode, timeout_s=2.5, memory_mb=300, max_file_mb=3, max_processes=7, max_open_files=20)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["CPU"] == "3 4"  # ceil(timeout) soft, one more hard
    assert lines["AS"] == f"{300 << 20} {300 << 20}"
    assert lines["FSIZE"] == f"{3 << 20} {3 << 20}"
    assert (lines["NPROC"], lines["NOFILE"], lines["CORE"]) == ("7 7", "20 20", "0 0")
    assert lines["env"] == "HOME LC_ALL PATH TMPDIR"
    workdir, content = lines["cwd"].split()
    assert content == "inside"
    assert not Path(workdir).exists()  # removed after the run


def test_output_is_capped(mode) -> None:
    result = run("import sys\nsys.stdout.write('x' * 1_000_000)\nprint('tail', file=sys.stderr)", mode,
                 max_output_kib=4)
    assert result.stdout == "x" * 4096
    assert result.stderr == "tail\n"
    assert result.truncated and result.exit_code == 0


# --- choosing the mode ------------------------------------------------------------------------------------


@pytest.mark.skipif(not JAILS, reason="no jail mode works here")
def test_auto_picks_the_strongest_mode_that_works() -> None:
    assert isolation_mode() == JAILS[0] == ("namespaces" if os.geteuid() == 0 else "userns")
    assert run_sandboxed("print(1)").isolation == JAILS[0]


def test_without_real_isolation_auto_refuses_unless_weak_is_allowed(monkeypatch, caplog) -> None:
    real_probe = sandbox._probe
    monkeypatch.setattr(sandbox, "_probe", lambda mode, euid: sandbox._Probe(None, "unshare failed: Operation not "
                        "permitted") if mode in sandbox.STRONG_MODES else real_probe(mode, euid))
    with pytest.raises(SandboxError, match=r"No real isolation works here.*namespaces: unshare failed.*"
                                           r"reward.code.sandbox_allow_weak=true"):
        run_sandboxed("print(1)")
    sandbox._warn_weak.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rlforge.reward.sandbox"):
        assert run_sandboxed("print(1)", allow_weak=True).isolation == "audit"
    assert "weak 'audit' isolation" in caplog.text and "not a security boundary" in caplog.text


def test_weak_mode_needs_its_flag() -> None:
    with pytest.raises(SandboxError, match="'audit' was asked for, but the weak audit-hook isolation.*"
                                           "reward.code.sandbox_allow_weak=true"):
        run_sandboxed("print(1)", isolation="audit")


def test_unknown_isolation_is_refused() -> None:
    with pytest.raises(SandboxError, match="Unknown sandbox isolation 'docker'. Available: auto, namespaces, userns, "
                                           "audit"):
        run_sandboxed("print(1)", isolation="docker")


# --- containment ------------------------------------------------------------------------------------------


def test_busy_loop_stops_at_the_cpu_time_limit(mode, no_leftovers) -> None:
    result = run("while True:\n    pass", mode, timeout_s=1.0)
    assert result.timed_out and result.exit_code == -signal.SIGXCPU
    assert result.killed_reason == "CPU time limit (1 s)"


def test_sleeping_program_stops_at_the_wall_clock_backstop(mode, no_leftovers) -> None:
    start = time.monotonic()
    result = run("import time\ntime.sleep(60)", mode, timeout_s=1.0, wall_timeout_s=1.0)
    assert time.monotonic() - start < 8.0
    assert result.timed_out and result.exit_code == -signal.SIGKILL
    assert result.killed_reason == "wall-clock backstop (1 s)"


def test_fork_bomb_is_contained(mode, no_leftovers) -> None:
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
    result = run(code, mode, timeout_s=1, wall_timeout_s=1.5, max_processes=8)
    assert result.timed_out
    forks, error = result.stdout.split()
    if mode == "audit":
        assert (forks, error) == ("0", "PermissionError")  # the audit hook refuses os.fork
    else:
        assert 0 < int(forks) < 8 and error == "BlockingIOError"  # EAGAIN from RLIMIT_NPROC


@pytest.mark.skipif(not JAILS, reason="no jail mode works here")
def test_processes_that_leave_the_group_die_with_the_namespace(no_leftovers) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')\n"
    for mode in JAILS:
        result = run(code, mode)
        assert result.stdout == "parent done\n" and not result.timed_out


@pytest.mark.parametrize("code", ["x = bytearray(2 << 30)", "x = []\nwhile True:\n    x.append(bytearray(1 << 20))"],
                         ids=["one-block", "growing"])
def test_memory_bomb_is_contained(mode, code) -> None:
    result = run(code, mode, timeout_s=10, memory_mb=128)
    assert result.exit_code == 1 and not result.timed_out
    assert "MemoryError" in result.stderr


def test_file_size_is_limited(mode) -> None:
    result = run("open('big', 'wb').write(b'0' * (2 << 20))", mode, max_file_mb=1)
    assert result.exit_code == 1
    assert "File too large" in result.stderr or "No space left" in result.stderr


def test_working_directory_total_size_is_limited(mode) -> None:
    """Many files each under the per-file limit (audit mode once wrote 320 MB this way): the total is capped."""
    code = "for i in range(20):\n    open(f'f{i}', 'wb').write(b'0' * (1 << 20))\n"
    result = run(code, mode, max_file_mb=2, max_total_mb=4)
    if mode == "audit":  # measured while it runs: the run is stopped
        assert (result.exit_code, result.killed_reason) == (-signal.SIGKILL, "disk limit (4 MiB in the working "
                                                                             "directory)")
    else:  # the jail's tmpfs is that size
        assert result.exit_code == 1 and "No space left" in result.stderr
    assert run("open('f', 'wb').write(b'0' * (3 << 20))", mode, max_file_mb=4, max_total_mb=4).exit_code == 0


@pytest.mark.parametrize("make", ["open(f'g{i}', 'w').close()", "os.mkdir(f'd{i}')"], ids=["files", "directories"])
def test_number_of_files_is_limited(mode, make) -> None:
    code = (f"import os\nn = 0\ntry:\n    for i in range(10):\n        {make}\n        n += 1\n"
            "except OSError as exc:\n    print(n, type(exc).__name__, exc)\n")
    made, error = run(code, mode, max_files=5).stdout.split(" ", 1)
    assert made == "5"  # the jail's tmpfs has that many inodes; the audit hook counts
    assert error.startswith("PermissionError sandbox: the program may create at most 5 files and directories"
                            if mode == "audit" else "OSError [Errno 28] No space left on device")


def test_writes_outside_the_working_directory_fail(mode, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o777)  # even a directory anyone may write to stays untouched
    targets = [tmp_path / "outside.txt", Path(f"/tmp/rlforge-escape-{uuid.uuid4().hex}"), Path("../main.py")]
    result = run(attempts(*[f"open({str(t)!r}, 'w').write('escaped')" for t in targets],
                          "os.mkdir('/tmp/rlforge-escape-dir')", "os.remove('/etc/hostname')",
                          f"os.rename('/etc/hostname', {str(tmp_path / 'moved')!r})"), mode)
    refused(result, 6)
    assert not targets[0].exists() and not targets[1].exists()
    assert not Path("/tmp/rlforge-escape-dir").exists() and Path("/etc/hostname").exists()


def test_reads_outside_the_working_directory_fail(mode, tmp_path: Path) -> None:
    secret = tmp_path / "train.jsonl"
    secret.write_text("expected outputs")
    secret.chmod(0o644)
    os.chmod(tmp_path, 0o755)  # world-readable, yet out of reach
    result = run(attempts("print(open('/etc/shadow').read())", f"print(open({str(secret)!r}).read())",
                          "print(open(f'/proc/{os.getppid()}/environ').read())", "print(os.listdir('/var'))",
                          f"print(os.listdir({str(tmp_path)!r}))"), mode)
    refused(result, 5)


def test_network_connection_is_refused(mode) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'leak')\n"
        result = run(code, mode, timeout_s=5)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever connected
    assert result.exit_code == 1
    assert ("sandbox: socket." if mode == "audit" else "Network is unreachable") in result.stderr


def test_program_runs_unprivileged(mode) -> None:
    result = run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())", mode)
    uid, gid, groups = result.stdout.split(maxsplit=2)
    if mode == "userns":
        assert (uid, gid) == ("1000", "1000")  # of its own user namespace, without capabilities
    elif os.geteuid() == 0:
        assert UID_BASE <= int(uid) < UID_BASE + UID_SPAN and gid == uid
    else:
        assert int(uid) == os.geteuid()
    assert groups.strip() == "[]" or os.geteuid() != 0


# --- escapes ----------------------------------------------------------------------------------------------


REALPATH_BYPASS = ("import os.path\n"
                   "os.path.realpath = lambda path, **kw: os.getcwd() + '/harmless'\n"
                   "open('{target}', 'w').write('escaped')\n")


def test_replacing_realpath_does_not_unlock_writes(mode) -> None:
    target = f"/tmp/rlforge-escape-{uuid.uuid4().hex}"
    result = run(REALPATH_BYPASS.format(target=target), mode)
    assert result.exit_code == 1 and not Path(target).exists()


def test_replacing_builtins_and_os_helpers_does_not_unlock_writes(mode) -> None:
    target = f"/tmp/rlforge-escape-{uuid.uuid4().hex}"
    code = ("import builtins, os, os.path, posixpath\n"
            "builtins.isinstance = lambda *a: True\nbuiltins.any = lambda *a: False\n"
            "os.fsdecode = posixpath.realpath = os.path.abspath = lambda p: os.getcwd()\n"
            "os.lstat = lambda p: os.stat('.')\n"
            f"open({target!r}, 'w').write('escaped')\n")
    result = run(code, mode)
    assert result.exit_code == 1 and not Path(target).exists()


def test_ctypes_gives_no_way_out(mode) -> None:
    with subprocess.Popen(["sleep", "60"]) as victim:
        try:
            result = run(attempts(
                "import ctypes; libc = ctypes.CDLL(None, use_errno=True)",
                f"assert libc.kill({victim.pid}, 9) == 0, ctypes.get_errno()",
                "assert libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0, ctypes.get_errno()",
                "assert libc.setuid(0) == 0, ctypes.get_errno()",
            ), mode)
            time.sleep(0.1)
            assert victim.poll() is None  # still alive
        finally:
            victim.kill()
    lines = result.stdout.splitlines()
    if mode == "audit":
        assert all(line.startswith("refused") for line in lines) and "importing _ctypes" in lines[0]
    else:  # ctypes loads, but the kernel refuses what it asks
        assert lines[0] == "ALLOWED 0" and all(line.startswith("refused") for line in lines[1:])


def test_signals_reach_nothing_outside(mode) -> None:
    with subprocess.Popen(["sleep", "60"]) as victim:
        try:
            result = run(attempts(f"os.kill({victim.pid}, 9)", f"os.kill({os.getpid()}, 9)",
                                  "os.kill(os.getppid(), 9) if os.getppid() > 1 else 1 / 0", "os.kill(-1, 9)",
                                  f"os.killpg({os.getpgid(0)}, 9)"), mode)
            time.sleep(0.1)
            assert victim.poll() is None
        finally:
            victim.kill()
    refused(result, 5)


def test_trainer_environment_does_not_leak(mode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFORGE_SECRET_TOKEN", "s3cret")
    code = ("import os\nprint(sorted(os.environ.values()))\n" + attempts(
        "print(open('/proc/self/environ').read())", "print(open(f'/proc/{os.getppid()}/environ').read())",
        "print(open('/proc/1/environ').read())"))
    result = run(code, mode)
    assert "s3cret" not in result.stdout + result.stderr
    assert result.stdout.count("refused") == 3


def test_audit_hook_resists_known_tricks() -> None:
    code = attempts(
        "import importlib.machinery as m, importlib.util as u; "
        "u.module_from_spec(m.BuiltinImporter.find_spec('posix')).pidfd_open",  # a fresh copy of posix
        "os.pidfd_open(os.getppid())",  # no audit event: removed
        "os.mkfifo('/tmp/rlforge-escape-fifo')",  # no audit event: removed
        "import gc; gc.get_objects()",  # would find the hook
        "import types; types.TracebackType(None, sys._getframe(), 0, 0).tb_frame",  # frames may be the hook's
        "sys.settrace(lambda *a: None)",
        "import marshal; marshal.loads(marshal.dumps(compile('1', 'x', 'eval')))",  # crafted bytecode
        "(lambda: 1).__code__.replace(co_consts=(2,))",
        "os.chdir('/')",
        "os.mkdir('d'); fd = os.open('d', os.O_RDONLY); os.open('../../etc/hostname', os.O_RDONLY, dir_fd=fd)",
        "open('x.cpython-311-x86_64-linux-gnu.so', 'wb').close(); sys.path.insert(0, os.getcwd()); import x",
        "import subprocess",
        "import _imp, types; _imp.create_dynamic(types.SimpleNamespace(name='y', origin='x.so'))",
    )
    result = run_sandboxed(code, isolation="audit", allow_weak=True)
    lines = refused(result, 13)
    assert "loading the module 'posix' is not allowed" in lines[0]
    assert not Path("/tmp/rlforge-escape-fifo").exists()


# --- a non-root trainer -----------------------------------------------------------------------------------


def _as_nobody(programs: dict[str, str]) -> dict:
    """Run each program through ``run_sandboxed`` in a forked child that dropped to uid ``nobody``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            report = {"mode": isolation_mode()}
            for name, code in programs.items():
                result = run_sandboxed(code, timeout_s=1, wall_timeout_s=5, max_processes=8)
                report[name] = [result.stdout, result.stderr, result.exit_code, result.isolation]
            os.write(write, json.dumps(report).encode())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(os.geteuid() != 0 or "userns" not in JAILS,
                    reason="needs root (to drop to another uid) and user namespaces")
def test_non_root_trainer_gets_user_namespace_isolation(tmp_path: Path, no_leftovers) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    secret.chmod(0o644)
    os.chmod(tmp_path, 0o755)
    target = f"/tmp/rlforge-escape-{uuid.uuid4().hex}"
    report = _as_nobody({
        "hello": "print(input.__name__, 6 * 7)",
        "realpath": REALPATH_BYPASS.format(target=target),
        "escapes": attempts(f"open({str(secret)!r}).read()", "open('/etc/passwd').read()",
                            "os.kill(os.getppid(), 9) if os.getppid() > 1 else 1 / 0",
                            "__import__('socket').create_connection(('127.0.0.1', 22), timeout=1)"),
        "fork_bomb": "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            os.pause()\n"
                     "        n += 1\nexcept OSError as exc:\n    print(n, type(exc).__name__)\n",
    })
    assert report.get("mode") == "userns", report
    assert report["hello"][:3] == ["input 42\n", "", 0]
    assert report["realpath"][2] == 1 and not Path(target).exists()
    assert report["escapes"][0].count("refused") == 4, report["escapes"]
    forks, error = report["fork_bomb"][0].split()
    assert 0 < int(forks) < 8 and error == "BlockingIOError"
