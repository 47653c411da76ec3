"""The one way files are written: atomically (a temp file in the same folder, fsync, rename), so a reader never
sees half a file and a crash leaves the old file or the new one, never a mix; and exclusively where a file must
not be overwritten (keys). Standard library only: the runtime may import it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644, exclusive: bool = False) -> Path:
    """Write `data` to `path` through a temp file in the same folder, fsynced, then renamed over `path`.

    `exclusive`: refuse (FileExistsError) when `path` exists, also when another process creates it meanwhile
    (the rename is a link(2), which fails on an existing name, never a replace). `mode` is applied before
    any byte is written, so a private file is never readable by others, even half-written.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    if exclusive and (path.exists() or path.is_symlink()):
        raise FileExistsError(f"{path} exists")
    import tempfile  # here, not at import: the runtime loader imports this module and never writes

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)  # fails with FileExistsError where the name exists (a symlink included)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def write_if_changed(path: Path, data: bytes) -> bool:
    """Atomic write unless `path` already holds exactly `data` (keeps mtimes of unchanged artifacts)."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    write_atomic(path, data)
    return True


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic_at(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600) -> None:
    """`write_atomic` inside an already opened folder (a descriptor): the temp file is created there with
    O_EXCL|O_NOFOLLOW and renamed over `name` there, so a folder swapped for a symlink after it was opened is
    never written through."""
    import secrets

    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode,
                 dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)
