"""Atomic file writes: a crash or a kill at any moment leaves either the old file or the new one, never half.

Every file the library writes for later reading (checkpoints, latent shards and manifests, run configs,
benchmark records) goes through :func:`atomic_write`: write a temporary file in the same folder, flush and
fsync it, rename it over the target (a rename within one file system is atomic), then fsync the folder, so
that the rename itself survives a power cut (POSIX keeps a file's name in its folder's data). The temporary
names start with ``.<name>.tmp-`` so that a folder's clean-up can recognise what a killed writer left behind.

A full disk (``ENOSPC``, or a quota: ``EDQUOT``) is reported as a :class:`DiskFullError`: which file, how many
bytes it tried to write, how many were free. The old file is untouched (the temporary one is removed), so the
callers add what that means for them: the trainer says which checkpoint is intact and how to resume, the latent
extraction how far it got.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
_fdopen = os.fdopen  # the tests replace it to simulate a full disk


def format_size(n: float) -> str:
    """Bytes as a short human figure (decimal units, as ``df -H`` and disk vendors count)."""
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent); None if unknown."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class DiskFullError(OSError):
    """A write that ran out of disk space: which file, how many bytes it needed, how many were free.

    ``needed`` is the size of the file being written (exact, or the caller's estimate); ``written`` how far the
    write got. :meth:`add` returns the same error with the caller's advice appended (what is intact, how to
    continue).
    """

    def __init__(self, path, needed: int | None = None, free: int | None = None, written: int | None = None,
                 advice: str = ""):
        self.path, self.needed, self.free, self.written, self.advice = Path(path), needed, free, written, advice
        super().__init__(errno.ENOSPC, self._message())

    def _message(self) -> str:
        parts = [f"disk full: writing {self.path} failed (no space left on its file system)."]
        if self.needed:
            parts.append(f"The file needs about {format_size(self.needed)} ({self.needed:,} bytes)")
            parts[-1] += (f"; {format_size(self.free)} are free." if self.free is not None else ".")
        elif self.free is not None:
            parts.append(f"{format_size(self.free)} are free.")
        if self.written:
            parts.append(f"{format_size(self.written)} were written before the disk filled; that partial file "
                         "was removed.")
        if self.advice:
            parts.append(self.advice)
        return " ".join(parts)

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self):  # picklable (DataLoader workers, multiprocessing)
        return (type(self), (self.path, self.needed, self.free, self.written, self.advice))

    def add(self, advice: str) -> "DiskFullError":
        """This error with ``advice`` appended to its message."""
        err = DiskFullError(self.path, self.needed, self.free, self.written,
                            f"{self.advice} {advice}".strip())
        err.__cause__ = self.__cause__
        return err


def disk_full_cause(err: BaseException) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` error behind ``err``, if any: writers such as ``torch.save`` wrap the
    ``OSError`` of the failed write in their own exception, so the chain is followed."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return err
        err = err.__cause__ or err.__context__
    return None


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename or a new file in ``folder`` durable (a no-op where folders cannot be opened: Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (and Windows) do not fsync folders; the rename is still atomic
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO], object], binary: bool = True,
                 size_hint: int | None = None) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync it, rename it over ``path``, fsync the
    folder. A full disk raises :class:`DiskFullError` (``size_hint``: the expected size, for its message)
    and leaves ``path`` as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with _fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        written = os.path.getsize(tmp) if os.path.exists(tmp) else None
        if os.path.exists(tmp):
            os.unlink(tmp)
        full = disk_full_cause(err)
        if full is not None:
            needed = max(size_hint or 0, written or 0) or None
            raise DiskFullError(path, needed, free_bytes(path.parent), written) from full
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text.encode()))


def replace_dir(tmp: str | os.PathLike, out_dir: str | os.PathLike, same: Callable[[Path], bool]) -> None:
    """Rename the finished folder ``tmp`` to ``out_dir`` (a rename: readers see the old folder or the new one,
    never half), moving an older ``out_dir`` aside first and removing it afterwards. When another process put
    its own folder in place first, that one is kept if ``same(out_dir)`` says it holds the same result; else the
    rename's error is raised."""
    tmp, out_dir = Path(tmp), Path(out_dir)
    old = None
    if out_dir.exists() and any(out_dir.iterdir()):  # an older generation: moved aside, removed at the end
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
    elif out_dir.exists():
        try:
            out_dir.rmdir()
        except OSError:  # another process got there first; the rename below decides
            pass
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if not same(out_dir):  # someone else finished first with the same result: fine
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
