"""The child side of rlforge's code sandbox, run as ``python -I -S -B sandbox_child.py CONFIG_JSON``.

``rlforge.plugins.reward.sandbox`` starts this file in a fresh interpreter (standard library only: it never
imports rlforge). CONFIG_JSON says the mode and the limits; the program to run is ``config["program"]``,
its working directory ``config["work"]``. docs/reliability.md states what each mode guarantees.

``namespaces`` (root) and ``userns`` (any user, where unprivileged user namespaces work) build a jail:

1. this process (the launcher) enters a new PID namespace, for ``userns`` also a new user namespace in
   which it is root, and forks;
2. the child, pid 1 of the new PID namespace, enters new mount, network and IPC namespaces and pivots
   into a fresh root: a read-only tmpfs holding read-only bind mounts of the system directories and the
   interpreter, a few device nodes, the program (read-only) and a size-limited tmpfs working directory;
   then it forks the program's process and waits for it;
3. the program's process drops to an unprivileged user (``namespaces``: a fresh uid of the host;
   ``userns``: uid 1000 of a second user namespace, so ``exec`` clears every capability), sets the
   resource limits and ``exec``s the interpreter on the program.

When pid 1 exits, the kernel kills every process left in the namespace. The launcher reports the
program's exit status as its own (a program killed by a signal kills the launcher with that signal).

``audit`` (weak, opt-in) runs the program in this interpreter under a Python audit hook.

Set-up failures are written to file descriptor ``config["report_fd"]``, never to the program's stderr.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
# flags a remount must keep: the kernel refuses to clear them on mounts inherited from a more privileged namespace
KEPT_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
INNER_ID = 1000  # the program's uid and gid inside its user namespace (userns mode)

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not be built; the message goes to the report descriptor."""


def main() -> None:
    cfg = json.loads(sys.argv[1])
    os.set_inheritable(cfg["report_fd"], False)  # the program never gets it
    try:
        program = MODES[cfg["mode"]](cfg)
    except (SetupError, OSError) as exc:
        os.write(cfg["report_fd"], f"{cfg['mode']}: {exc}".encode())
        os._exit(125)
    program()


# --- jail modes: launcher (host side) ------------------------------------------------------------------------


def launch(cfg: dict) -> None:
    """Enter the PID (and user) namespace, fork pid 1, wait; exit like the program did."""
    if cfg["mode"] == "userns" and os.getuid() == 0:
        _drop_to(cfg["uid"])  # never host root: RLIMIT_NPROC does not bind uid 0, and root owns the host's files
    _die_with_parent(cfg["parent"])  # after any setuid, which clears the parent-death signal
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # this process re-raises the program's fatal signal
    if cfg["mode"] == "userns":
        uid, gid = os.getuid(), os.getgid()
        _unshare(CLONE_NEWUSER | CLONE_NEWPID, "a user and PID namespace")
        _map_ids(None, 0, uid, gid)
    else:
        _unshare(CLONE_NEWPID, "a PID namespace")
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()  # pid 1 sees EOF on alive_r once this process is gone
    init: list[int] = []
    # the parent stops a run with SIGTERM: kill pid 1, then wait below until the namespace is empty
    signal.signal(signal.SIGTERM, lambda *_: init and os.kill(init[0], signal.SIGKILL))
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(status_r)
        os.close(alive_w)
        _run_init(cfg, alive_r, status_w)
    init.append(pid)
    os.close(status_w)
    os.close(alive_r)
    _, init_status = os.waitpid(pid, 0)  # returns once every process of the namespace is gone
    report = os.read(status_r, 64)
    _exit_as(int(report) if report else init_status)


def _exit_as(status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        if -code != signal.SIGKILL:  # which has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


# --- jail modes: pid 1 of the new namespace ------------------------------------------------------------------


def _run_init(cfg: dict, alive_r: int, status_w: int) -> None:
    try:
        _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        if select.select([alive_r], [], [], 0)[0]:  # the launcher died before the line above
            os._exit(1)
        _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")  # no ptrace by the program
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)  # for the program's uid map, after the pivot
        _build_jail(cfg)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            _run_program(cfg, proc)
        os.close(proc)
        while True:  # pid 1 reaps every orphan of the namespace
            done, status = os.wait()
            if done == pid:
                break
    except (SetupError, OSError) as exc:
        os.write(cfg["report_fd"], f"{cfg['mode']}: {exc}".encode())
        os._exit(125)
    os.write(status_w, str(status).encode())
    os._exit(0)


def _build_jail(cfg: dict) -> None:
    """New mount/network/IPC namespaces; pivot into a read-only root with only the program's needs."""
    _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC, "mount, network and IPC namespaces")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    root, work = cfg["root"], cfg["work"]
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for path in [*cfg["binds"], *DEVICES]:
        _expose(root, path)
    _expose(root, cfg["program"])
    os.makedirs(root + work, mode=0o755)
    owner = f",uid={cfg['uid']},gid={cfg['uid']}" if cfg["mode"] == "namespaces" else ""
    limits = cfg["limits"]  # the totals of the working directory: bytes, and files (+ 1: its own root inode)
    _mount("tmpfs", root + work, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={limits['max_total_mb']}m,nr_inodes={limits['max_files'] + 1},mode=0700{owner}")
    for point, flags in _mounts():
        if (point == root or point.startswith(root + "/")) and point != root + work:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags)
    os.chdir(root)
    syscall = SYS_PIVOT_ROOT.get(os.uname().machine)
    if syscall is None:
        raise SetupError(f"pivot_root: unknown system call number on {os.uname().machine}")
    _check(libc.syscall(syscall, b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount of the old root")
    os.chdir(work)


def _expose(root: str, path: str) -> None:
    """Make ``path`` of the host appear at the same place under ``root`` (a symlink is copied as a symlink)."""
    if not os.path.lexists(path):
        return
    target = root + path
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if os.path.islink(path):
        os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(path, target, None, MS_BIND | MS_REC)


def _mounts() -> list[tuple[str, int]]:
    """(mount point, per-mount flags to keep) for every mount this process sees."""
    with open("/proc/self/mountinfo") as f:
        rows = [line.split() for line in f]
    return [(_unescape(row[4]), sum(KEPT_MOUNT_FLAGS.get(opt, 0) for opt in row[5].split(","))) for row in rows]


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (``\\040``)."""
    parts = field.split("\\")
    return parts[0] + "".join(chr(int(p[:3], 8)) + p[3:] for p in parts[1:])


# --- jail modes: the program's process -------------------------------------------------------------------------


def _run_program(cfg: dict, proc: int) -> None:
    try:
        if cfg["mode"] == "userns":
            _unshare(CLONE_NEWUSER, "the program's user namespace")
            _map_ids(proc, INNER_ID, 0, 0)
            _write(proc, "sys/user/max_user_namespaces", "0")  # no nested user namespaces
        else:
            _drop_to(cfg["uid"])
        os.close(proc)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _set_limits(cfg["limits"])
        os.execv(cfg["python"], [cfg["python"], "-I", "-S", "-B", cfg["program"]])
    except (SetupError, OSError) as exc:
        os.write(cfg["report_fd"], f"{cfg['mode']}: {exc}".encode())
    os._exit(125)


def _map_ids(proc: int | None, inside: int, uid: int, gid: int) -> None:
    """Map ``inside`` of this process's (new) user namespace to ``uid``/``gid`` of the parent namespace."""
    _check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(DUMPABLE)")  # else /proc/self belongs to root
    _write(proc, "self/setgroups", "deny")
    _write(proc, "self/uid_map", f"{inside} {uid} 1")
    _write(proc, "self/gid_map", f"{inside} {gid} 1")


def _write(proc: int | None, name: str, text: str) -> None:
    fd = os.open(name if proc is not None else f"/proc/{name}", os.O_WRONLY, dir_fd=proc)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _set_limits(limits: dict) -> None:
    """No new privileges, die with the parent, and the resource limits (address space last)."""
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")  # after any setuid
    cpu, files = limits["cpu_s"], limits["max_file_mb"] << 20
    for res, value in ((resource.RLIMIT_CORE, (0, 0)), (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_FSIZE, (files, files)),
                       (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
                       (resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2),
                       (resource.RLIMIT_AS, (limits["memory_mb"] << 20,) * 2)):
        ceiling = resource.getrlimit(res)[1]  # an unprivileged process cannot raise its hard limit
        if ceiling != resource.RLIM_INFINITY:
            value = (min(value[0], ceiling), min(value[1], ceiling))
        resource.setrlimit(res, value)


# --- helpers ---------------------------------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _unshare(flags: int, what: str) -> None:
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"unshare({what}) failed: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = libc.mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data))
    _check(rc, f"mount {target}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise SetupError(f"{what} failed: {os.strerror(ctypes.get_errno())}")


# --- audit mode (weak, opt-in): a Python audit hook in this interpreter ------------------------------------

# events refused outright (prefixes): processes, signals, sockets, links, tracing and object enumeration (ways
# to the hook's state), code objects built from bytes (crafted bytecode corrupts memory), raised limits, and
# C-level file access that bypasses the "open" event
DENIED_EVENTS = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
                 "os.system", "os.kill", "os.killpg", "os.link", "os.symlink", "os.chdir", "signal.pthread_kill",
                 "ctypes.", "pty.", "gc.", "sys._current_frames", "sys.settrace", "sys.setprofile", "marshal.load",
                 "code.__new__", "resource.setrlimit", "resource.prlimit", "sqlite3.", "syslog.")
# modules that act without raising audit events (spawn processes, create files or run foreign code)
DENIED_MODULES = ("_posixsubprocess", "_posixshmem", "_ctypes", "_dbm", "_gdbm", "readline", "_multiprocessing",
                  "_sqlite3", "_testcapi", "_testinternalcapi", "_testmultiphase", "_xxsubinterpreters")
UNAUDITED = {"posix": ("pidfd_open", "mkfifo", "mknod"), "os": ("pidfd_open", "mkfifo", "mknod"),
             "_signal": ("pidfd_send_signal",), "signal": ("pidfd_send_signal",)}  # no audit event: removed
CHANGED_PATHS = {"os.remove": [(0, 1)], "os.rmdir": [(0, 1)], "os.mkdir": [(0, 2)], "os.chmod": [(0, 2)],
                 "os.chown": [(0, 3)], "os.utime": [(0, 3)], "os.rename": [(0, 2), (1, 3)],
                 "os.truncate": [(0, None)], "os.setxattr": [(0, None)], "os.removexattr": [(0, None)]}
READ_PATHS = {"os.listdir": [(0, None)], "os.scandir": [(0, None)], "os.getxattr": [(0, None)],
              "os.listxattr": [(0, None)]}
CREATE_MODULE = "rlforge.sandbox.create_module"


def audit(cfg: dict):
    """Limits, then the audit hook; returns the function that runs the program."""
    if os.getuid() == 0:
        _drop_to(cfg["uid"])  # kernel-enforced at least: root's files, other processes, RLIMIT_NPROC
    _die_with_parent(cfg["parent"])
    _set_limits(cfg["limits"])
    program = cfg["program"]
    with open(program, "rb") as f:
        source = f.read()
    library = tuple(os.path.realpath(p) for p in sys.path)  # -I -S: the standard library only
    readable = (os.path.realpath(cfg["work"]), program, *DEVICES, *library)
    import builtins
    import types

    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=program, __builtins__=builtins)
    for name in [n for n in sys.modules if n.partition(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]  # loaded by this file; the program must import (and be refused) its own
    for name, attributes in UNAUDITED.items():
        for attribute in attributes:
            vars(sys.modules[name]).pop(attribute, None)
    sys.addaudithook(_audit_hook(cfg["work"], readable, library, frozenset(sys.modules), cfg["limits"]))
    _guard_module_creation()
    sys.pycache_prefix = program + ".pycache"  # unreadable: imports compile from source, never unmarshal
    os.close(cfg["report_fd"])
    sys.argv = [program]
    sys.modules["__main__"] = module
    return lambda: exec(compile(source, program, "exec"), module.__dict__)  # noqa: S102 - the program itself


# ``_imp.create_builtin``/``create_dynamic`` replacements; compiled with globals that hold nothing of this file
_CREATOR = """
def create(spec):
    box = []
    audit(event, kind, spec.name, getattr(spec, "origin", None), box)
    return box[0]
"""


def _guard_module_creation() -> None:
    """Route ``_imp.create_builtin``/``create_dynamic`` through the hook, which holds the only references left
    to the originals: a program can neither load a refused extension directly nor make a fresh copy of
    ``posix`` or ``_signal`` with the functions removed above."""
    import _imp
    import types

    proxy = types.ModuleType("_imp")
    vars(proxy).update(vars(_imp))
    for kind in ("builtin", "dynamic"):
        scope = {"__builtins__": {}, "audit": sys.audit, "getattr": getattr, "event": CREATE_MODULE, "kind": kind}
        exec(_CREATOR, scope)  # noqa: S102 - our constant source, compiled with globals free of this file
        setattr(proxy, f"create_{kind}", scope["create"])
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "_imp", None) is _imp:
            loaded._imp = proxy
    sys.modules["_imp"] = proxy


def _audit_hook(work: str, readable: tuple[str, ...], library: tuple[str, ...], loaded: frozenset[str], limits: dict):
    """The hook. Everything it uses is bound here, out of the program's reach: it calls no function the
    program could replace (``os.path.realpath``, ``os.fsdecode``, builtins such as ``isinstance``), and it
    checks the exact type of every argument before using it, so no code of the program ever runs inside it
    (such code could reach the hook's frame and change its closure). It also counts what the kernel cannot
    limit here: the files and directories created in the working directory (``max_files``)."""
    import _imp
    import posix
    import types

    lstat, readlink, getcwd, denied, os_error = posix.lstat, posix.readlink, posix.getcwd, PermissionError, OSError
    namespace = types.SimpleNamespace
    type_, str_, bytes_, int_, list_, reversed_ = type, str, bytes, int, list, reversed
    encoding = sys.getfilesystemencoding()
    creators = {"builtin": _imp.create_builtin, "dynamic": _imp.create_dynamic}
    path_events = {**{e: (tuple(a), True) for e, a in CHANGED_PATHS.items()},
                   **{e: (tuple(a), False) for e, a in READ_PATHS.items()}}
    refused_imports = frozenset(DENIED_MODULES) - loaded
    refused_modules = refused_imports | loaded  # none of the list, and no second copy of a loaded module
    denied_events, create_event = DENIED_EVENTS, CREATE_MODULE
    writable = (work, *DEVICES)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    max_files = limits["max_files"]
    created = [0]  # files and directories made in the working directory

    def resolve(path: str, base: str) -> str:
        """``realpath`` from system calls: symlinks resolved, missing components kept as written."""
        todo = list_(reversed_((path if path.startswith("/") else base + "/" + path).split("/")))
        done: list[str] = []
        links = 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            here = "/" + "/".join(done + [part])
            try:
                mode = lstat(here).st_mode
            except os_error:
                done.append(part)
                continue
            if mode & 0o170000 != 0o120000:
                done.append(part)
                continue
            links += 1
            if links > 40:
                raise denied(f"sandbox: too many symbolic links in {path!r}")
            target = readlink(here)
            if target.startswith("/"):
                done = []
            todo.extend(reversed_(target.split("/")))
        return "/" + "/".join(done)

    def check(event: str, path, dir_fd, roots: tuple[str, ...]) -> str | None:
        if type_(path) is int_:
            return  # an open descriptor: checked when it was opened
        if type_(path) is bytes_:
            path = bytes_.decode(path, encoding, "surrogateescape")
        if type_(path) is not str_:  # a path-like object could name another file on its next __fspath__ call
            raise denied(f"sandbox: {event} needs a str or bytes path here")
        if dir_fd is None or (type_(dir_fd) is int_ and dir_fd == -1):
            base = getcwd()
        elif type_(dir_fd) is int_:
            base = readlink(f"/proc/self/fd/{dir_fd}")
        else:
            raise denied(f"sandbox: {event} with an unexpected dir_fd")
        real = resolve(path, base)
        for root in roots:
            if real == root or real.startswith(root + "/"):
                return real
        raise denied(f"sandbox: {event} on {path!r} outside the working directory is not allowed")

    def count_new(real) -> None:
        """A file or directory about to be made at ``real`` (a str path, or an open descriptor: None)."""
        if type_(real) is not str_ or not (real == work or real.startswith(work + "/")):
            return
        try:
            lstat(real)
            return  # it exists: opened, not created
        except os_error:
            pass
        if created[0] >= max_files:
            raise denied(f"sandbox: the program may create at most {max_files} files and directories")
        created[0] += 1

    def writes(mode, flags) -> bool:
        if not (mode is None or type_(mode) is str_) or not (flags is None or type_(flags) is int_):
            raise denied("sandbox: open with unexpected arguments")
        if flags and flags & write_flags:
            return True
        for c in mode or "":
            if c in "wax+":
                return True
        return False

    def create_module(kind, name, origin, box) -> None:
        if type_(kind) is not str_ or type_(name) is not str_ or type_(box) is not list_ or name in refused_modules:
            raise denied(f"sandbox: loading the module {name!r} is not allowed" if type_(name) is str_ else
                         "sandbox: loading a module with unexpected arguments")
        if kind == "dynamic":  # native code: only the interpreter's own extension modules
            check("loading an extension module", origin, None, library)
        list_.append(box, creators[kind](namespace(name=name, origin=origin)))

    def hook(event, args) -> None:
        if type_(event) is not str_:
            raise denied("sandbox: audit events must be named by a str")
        if event == "open":
            path, mode, flags = args
            if writes(mode, flags):
                count_new(check(event, path, None, writable))
            else:
                check(event, path, None, readable)
        elif event in path_events:
            positions, changes = path_events[event]
            for path_at, fd_at in positions:
                real = check(event, args[path_at], None if fd_at is None else args[fd_at],
                             writable if changes else readable)
                if event == "os.mkdir":
                    count_new(real)

        elif event == "import" and type_(args[0]) is str_ and args[0] in refused_imports:
            raise denied(f"sandbox: importing {args[0]} is not allowed")
        elif event == "object.__getattr__" and type_(args[1]) is str_ and args[1] == "tb_frame":
            raise denied("sandbox: tb_frame is not allowed")  # frames of a traceback may be the hook's
        elif event == create_event:
            create_module(*args)
        elif event.startswith(denied_events):
            raise denied(f"sandbox: {event} is not allowed")

    return hook


MODES = {"namespaces": launch, "userns": launch, "audit": audit}

if __name__ == "__main__":
    main()
