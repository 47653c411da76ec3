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
    tmp = stage_file(path, payload, mode=mode)
    try:
        if exclusive:
            os.link(tmp, path)  # fails with FileExistsError where the name exists (a symlink included)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def write_if_changed(path: Path, data: bytes) -> bool:
    """Atomic write unless `path` already holds exactly `data` (keeps mtimes of unchanged artifacts)."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    write_atomic(path, data)
    return True


def fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class AtomicSetError(OSError):
    """write_atomic_set's failure: the file it was at and the system's reason."""

    def __init__(self, path: Path, exc: OSError):
        reason = exc.strerror or str(exc)
        super().__init__(exc.errno, reason)
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.strerror}"


def stage_file(path: Path, payload: bytes, *, mode: int = 0o644) -> Path:
    """A complete, fsynced temp file (of `mode`, applied before any byte is written) in `path`'s folder, to be renamed
    over `path` by the caller."""
    import tempfile  # here, not at import: the runtime loader imports this module and never writes

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(tmp)


def write_atomic_set(files: list[tuple[Path, bytes]]) -> None:
    """Files that belong together (a manifest and its runtime table): every one staged complete first, then renamed
    in order; when a staging or a rename fails (or anything stops it), the ones already renamed get their old files
    back, so the old set or the new set is in place, never a mix (only a crash between two renames can leave one).
    An OSError comes out as AtomicSetError naming the file."""
    staged: list[tuple[Path, Path]] = []
    renamed: list[tuple[Path, Path | None]] = []  # (path, a second name of its old file, None: there was none)
    at = files[0][0]  # the file being written: the one a failure names
    try:
        for path, payload in files:
            at = path
            try:
                staged.append((path, stage_file(path, payload)))
            except OSError as exc:
                raise AtomicSetError(path, exc) from None
        for path, tmp in staged:
            at = path
            backup, moved = _keep_old(path)
            try:
                os.replace(tmp, path)
            except BaseException:
                if backup is not None:  # moved aside: put it back; linked: the old file is still in place
                    with contextlib.suppress(OSError):
                        if moved:
                            os.replace(backup, path)
                        else:
                            os.unlink(backup)
                raise
            renamed.append((path, backup))
    except BaseException as exc:
        for done, backup in reversed(renamed):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, done)
                else:
                    os.unlink(done)  # it did not exist before this write
        if isinstance(exc, OSError) and not isinstance(exc, AtomicSetError):
            raise AtomicSetError(at, exc) from None
        raise
    finally:
        for _, tmp in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # renamed already: gone; else the stray temp file
    for _, backup in renamed:
        if backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(backup)
    fsync_dir(files[0][0].parent)


def _keep_old(path: Path) -> tuple[Path | None, bool]:
    """A second name for `path`'s current file (None when there is none), so a failed pair can put it back: a
    hard link (of a symlink itself, not followed), else, on a file system without hard links, the file moved
    aside (the path is then briefly absent, never mismatched; the second value says so)."""
    if not (path.exists() or path.is_symlink()):
        return None, False
    import secrets

    backup = path.with_name(f".{path.name}.{secrets.token_hex(6)}.old")
    try:
        try:
            os.link(path, backup, follow_symlinks=False)
            return backup, False
        except OSError:
            os.replace(path, backup)
            return backup, True
    except OSError as exc:
        raise AtomicSetError(path, exc) from None


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
