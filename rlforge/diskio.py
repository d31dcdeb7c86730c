"""Writing into a run folder safely: failed writes in words, space and file-size limits, no symlinks followed.

- :func:`disk_errors` turns a failed write (a full disk, a file-size limit, no permission, a read-only file
  system) into one ``RLForgeError``: "Cannot <what>: <reason> (<file>). <how much space>. <hint>". The failure is
  found anywhere in the exception's chain, and in the text of libraries that write in native code (torch's
  ``PytorchStreamWriter`` wraps the ``OSError`` of the file object it was given, safetensors reports
  ``File too large (os error 27)``, sqlite ``database or disk is full``), and in each rank's exception that
  torch.distributed.checkpoint collects into a ``CheckpointException`` (a background checkpoint write).
- :func:`open_regular` opens a file to write with ``O_NOFOLLOW`` and refuses anything but a regular file with
  one link: a ``samples.jsonl`` or ``.rlforge.lock`` planted as a symbolic or hard link to another file (or a
  FIFO) is refused, never written through.
- :func:`write_atomic` writes a whole file through a flushed temporary file and a rename.
- :func:`output_file` checks a command's output file before its work starts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from rlforge.errors import RLForgeError

FULL = (errno.ENOSPC, errno.EDQUOT)
DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)  # permissions, a read-only file system, an immutable folder
# how libraries that write in native code spell a failed write, and the errno each means
TEXT_SIGNS = {"No space left on device": errno.ENOSPC, "StorageFull": errno.ENOSPC,
              "database or disk is full": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
              "File too large": errno.EFBIG, "FileTooLarge": errno.EFBIG}


class WriteFailure(RLForgeError):
    """A write into the run folder failed (full disk, file-size limit, permissions); the message says which."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop(0)
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo += [cur.__cause__, cur.__context__]
        # torch.distributed.checkpoint's CheckpointException: each rank's exception, as (exception, traceback)
        failures = getattr(cur, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def failed_write(exc: BaseException) -> tuple[int | None, str, str] | None:
    """``(errno, reason in words, file)`` if ``exc`` (or an exception in its chain) is a failed file write, else
    None. The errno is None for an ``OSError`` without one; the file is '' when the error does not name it."""
    for cur in _chain(exc):
        if isinstance(cur, OSError) and cur.errno is not None:
            return cur.errno, cur.strerror or os.strerror(cur.errno), str(cur.filename or "")
    for cur in _chain(exc):
        text = str(cur)
        for sign, code in TEXT_SIGNS.items():
            if sign in text:
                return code, os.strerror(code), ""
    return None


def size_words(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def free_bytes(path: Path) -> int | None:
    """Free space for this user on the file system that holds ``path`` (its nearest existing ancestor)."""
    for folder in [path, *path.parents]:
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def file_size_limit() -> int | None:
    """This process's file-size limit (``ulimit -f``, ``RLIMIT_FSIZE``) in bytes, None when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def space_words(code: int | None, where: Path, needed: int | None = None) -> str:
    """What a full disk or a file-size limit means for this write, in one sentence (or '')."""
    need = f"about {size_words(needed)}" if needed else ""
    if code == errno.EFBIG:
        limit = file_size_limit()
        if limit is None:
            return f"The file needs {need}." if need else ""
        return (f"The file-size limit of this process (ulimit -f) is {size_words(limit)}"
                f"{f' and the largest file needs {need}' if need else ''}: raise it (ulimit -f unlimited).")
    if code in FULL:
        if code == errno.EDQUOT:
            have = "the disk quota of this user is used up"
        else:
            free = free_bytes(where)
            have = f"{size_words(free)} {'is' if free == 1 else 'are'} free there" if free is not None else ""
        parts = [p for p in (f"It needs {need}" if need else "", have) if p]
        return "; ".join(parts) + "." if parts else ""
    return ""


@contextlib.contextmanager
def disk_errors(what: str, hint: str = "", where: Path | None = None, needed: int | None = None,
                largest: int | None = None, current: list[str] | None = None) -> Iterator[None]:
    """Turn a failed write into a ``WriteFailure``: "Cannot <what>: <reason> (<file>). <space>. <hint>". The
    hint's advice to free space reads "make the folder writable" for a write refused by permissions.

    :param where: the folder written to (for the free space); :param needed: the bytes the whole write needs;
    :param largest: the bytes of its largest file (against a file-size limit; default ``needed``);
    :param current: a one-item list the caller updates with the file it is writing, named when the error does
        not name one (native writers do not).
    """
    try:
        yield
    except (RLForgeError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        found = failed_write(exc)
        if found is None:
            raise
        code, reason, filename = found
        filename = filename or (current[0] if current else "")
        space = space_words(code, where, (largest or needed) if code == errno.EFBIG else needed) if where else ""
        if code in DENIED:
            hint = hint.replace("Free space", "Make the folder writable").replace("free space", "make the folder "
                                                                                               "writable")
        raise WriteFailure(f"Cannot {what}: {reason}{f' ({filename})' if filename else ''}."
                           f"{' ' + space if space else ''}{' ' + hint if hint else ''}") from None


def open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for writing that never follows a symbolic link and refuses anything but a regular file with
    one link (a hard link would write into another file; a FIFO would block). ``O_TRUNC`` is applied only after
    the checks, so a refused file is left as it was. Returns the descriptor (``O_CLOEXEC``)."""
    truncate = bool(flags & os.O_TRUNC)
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENXIO and path.is_fifo()):
            raise _not_regular(path) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise _not_regular(path, st.st_nlink if stat.S_ISREG(st.st_mode) else 0)
    os.set_blocking(fd, True)
    if truncate:
        os.ftruncate(fd, 0)
    return fd


def refuse_links(path: Path) -> None:
    """For files a library opens itself (mlflow's sqlite store): refuse ``path`` when it exists and is a link
    or not a regular file, as :func:`open_regular` would."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        raise _not_regular(path, st.st_nlink if stat.S_ISREG(st.st_mode) else 0)


def _not_regular(path: Path, links: int = 0) -> RLForgeError:
    if path.is_symlink():
        what = f"a symbolic link (to {os.readlink(path)})"
    elif links > 1:
        what = f"a hard link ({links} names for one file)"
    else:
        what = "not a regular file"
    return RLForgeError(f"Refusing to write {path}: it is {what}. rlforge writes only regular files of its own in a "
                        f"run folder, never through a link into another file; remove it, or use another run folder.")


def open_text(path: Path, append: bool = False) -> IO[str]:
    """A text file opened to write (``append``: at the end) through :func:`open_regular`."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(open_regular(path, flags), "a" if append else "w", encoding="utf-8")


def open_binary(path: Path) -> IO[bytes]:
    """A new binary file (truncated) opened through :func:`open_regular`, e.g. for ``torch.save``."""
    return os.fdopen(open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a flushed temporary file and a rename: readers see all or nothing, and
    a link planted at either name is replaced, never written through."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover (or a planted link) goes; unlink never follows a link
    try:
        with open_text(tmp) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot sync a folder; the files themselves are synced
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in a nested state (dicts, lists, tuples): about what ``torch.save`` writes."""
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    numel, size = getattr(obj, "numel", None), getattr(obj, "element_size", None)
    return int(numel() * size()) if callable(numel) and callable(size) else 0


def output_file(out: str | Path, inputs: Iterable[str | Path], flag: str, folders: Iterable[str | Path] = ()) -> Path:
    """The file ``out`` a command writes (``flag`` names its option in errors), checked before its work starts: a
    file name, not a folder, none of the files the command reads (``inputs``) nor inside a folder it reads
    (``folders``: a model, run or checkpoint folder), as the path resolves once written (``a/../rows.jsonl`` is
    ``rows.jsonl``, links followed), in a folder that can be made (made here) and written."""
    if not str(out).strip():
        raise RLForgeError(f"{flag} is empty: give the path of a file to write.")
    path = Path(out).expanduser()
    real = Path(os.path.realpath(path))  # what a write lands on: missing folders of the path read lexically
    if real.is_dir():
        raise RLForgeError(f"{flag} {out} is a folder: give the path of a file to write.")
    same = next((given for given in inputs if _same_file(real, Path(given).expanduser())), None)
    if same is not None:
        raise RLForgeError(f"{flag} {out} is the file the command reads ({same}): writing it would replace that data. "
                           f"Give another output file.")
    inside = next((f for f in folders if Path(f).expanduser().is_dir()
                   and real.is_relative_to(os.path.realpath(Path(f).expanduser()))), None)
    if inside is not None:
        raise RLForgeError(f"{flag} {out} is inside {inside}, which the command reads: writing there could replace "
                           f"its files. Give an output file outside it.")
    with disk_errors(f"make the folder of {flag} {out}", "Give an output path in a writable folder."):
        real.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(real.parent, os.W_OK) or (real.exists() and not os.access(real, os.W_OK)):
        raise RLForgeError(f"{flag} {out}: {real if real.exists() else real.parent} is not writable. Give an output "
                           f"path in a writable folder.")
    return real


def _same_file(real: Path, given: Path) -> bool:
    """Whether writing ``real`` (a resolved path) would write ``given``: the same path resolved, or a hard link."""
    return Path(os.path.realpath(given)) == real or (real.is_file() and given.is_file() and real.samefile(given))
