"""The build's output folder: held by one build at a time, and written all or nothing.

Two builds into one `--out` at once would interleave their artifacts and leave a manifest that disagrees with
them, so a build holds an exclusive `fcntl.flock` on `<out>/.mamba-forge.lock` (released when it ends or its
process dies: it never goes stale) and a second one is refused with one line. Artifacts are written beside their
final names (temp files, fsynced) and renamed over them only once every artifact and the manifest were written:
a full disk, a read-only remount or a folder where a file goes ends the build with one line and leaves the
previous build as it was (renames need no space).

An artifact that already holds its bytes is left alone (its mtime stays). Whether it does is read from the
folder's stat record (core/cache_stat.py) where the file's stat is exactly as recorded, else by reading it; a file
read and found current is recorded for the next build.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from mamba_forge.core.cache_stat import StatRecord
from mamba_forge.core.errors import BuildError

LOCK_NAME = ".mamba-forge.lock"
_HINT = "free space on the disk of --out, or choose another --out; the previous build there is unchanged"


@contextlib.contextmanager
def hold_out(out: Path) -> Iterator[int]:
    """Exclusive hold of an output folder for one build; a second build is refused at once (one line). Yields
    the lock file's descriptor (core.cache_stat.fs_clock reads the folder's filesystem clock through it)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise BuildError(f"--out {out} cannot be used ({exc.strerror or exc})", hint="choose another --out") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BuildError(f"--out {out}: {LOCK_NAME} is not a regular file", hint="remove it or choose another --out")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(f"--out {out} is being written by another build right now",
                             hint="wait for it to finish, or choose another --out") from None
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class OutputStage:
    """Files of one build, staged beside their final names; `commit` renames them all, `abort` removes them."""

    def __init__(self, out: Path, record: StatRecord | None = None):
        self.out = Path(out)
        self.pending: list[tuple[str, Path]] = []  # (temp name, final path)
        self.record = record  # the folder's stat record (by path inside it), or None: every file is read
        self.written: list[tuple[str, str]] = []  # (path inside out, sha256) of the artifacts staged

    def current(self, rel: str, digest: str) -> bool:
        """Whether `out/rel` holds the bytes of sha256 `digest` by the stat record alone (nothing read)."""
        if self.record is None:
            return False
        try:
            st = os.lstat(self.out / rel)
        except OSError:
            return False
        return self.record.trusted(rel, st) == digest

    def add(self, rel: str, data: bytes, digest: str | None = None) -> bool:
        """Stage `data` for `out/rel`; False when the file already holds exactly these bytes (its mtime stays).
        `digest` (their sha256): the stat record may say so without a read, and a file read is recorded."""
        final = self.out / rel
        try:
            if digest is not None and self.current(rel, digest):
                return False
            if _holds(final, data, (rel, digest, self.record) if digest is not None else None):
                return False
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.is_dir() and not final.is_symlink():
                raise IsADirectoryError(errno.EISDIR, "a folder is in the way")
            self.pending.append((_write_temp(final, data), final))
            if digest is not None:
                self.written.append((rel, digest))
        except OSError as exc:
            self.abort()
            raise BuildError(f"cannot write {final}: {exc.strerror or exc}", hint=_HINT) from None
        return True

    def commit(self) -> None:
        """Rename every staged file over its name. Each file about to be replaced is first hard-linked aside (no
        data written) and the old manifest removed before any artifact changes, so a rename that fails midway is
        rolled back; where even the rollback fails, the folder holds no manifest.toml (never one that disagrees
        with the artifacts) and the message names the kept copy."""
        backups: list[tuple[Path, Path]] = []
        done: list[Path] = []
        try:
            for _, final in self.pending:
                if os.path.lexists(final):
                    backup = final.parent / f".{final.name}.previous"
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(backup)
                    os.link(final, backup, follow_symlinks=False)
                    backups.append((final, backup))
            for final, _ in backups:
                if final.name == "manifest.toml" and final.parent == self.out:
                    os.unlink(final)  # the old manifest goes first: it never describes half-replaced artifacts
            for tmp, final in self.pending:
                os.replace(final.parent / tmp, final)
                done.append(final)
        except OSError as exc:
            restored = _roll_back(done, backups)
            self.abort()
            where = self.out / "manifest.toml"
            hint = (_HINT if restored else f"{self.out} now holds no manifest.toml (the previous one is kept as "
                    f"{where.parent / ('.' + where.name + '.previous')}); free the disk and build again")
            raise BuildError(f"cannot write {final}: {exc.strerror or exc}", hint=hint) from None
        for _, backup in backups:
            with contextlib.suppress(OSError):
                os.unlink(backup)
        for folder in {final.parent for _, final in self.pending}:
            _fsync_dir(folder)
        self.pending = []

    def record_written(self) -> None:
        """After `commit`: read back each artifact this build wrote, once the folder's clock has moved past it, and
        record the ones that hold what was written (the next no-change rebuild then reads none of them)."""
        if self.record is None or not self.written:
            return
        newest = 0
        for rel, _ in self.written:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(self.out / rel).st_ctime_ns)
        self.record.reclock(newest)
        for rel, digest in self.written:
            with contextlib.suppress(OSError):
                _holds_digest(self.out / rel, rel, digest, self.record)
        self.written = []

    def abort(self) -> None:
        for tmp, final in self.pending:
            with contextlib.suppress(OSError):
                os.unlink(final.parent / tmp)
        self.pending = []


def _roll_back(done: list[Path], backups: list[tuple[Path, Path]]) -> bool:
    """Put the previous files back; True when every one is back."""
    ok = True
    saved = dict(backups)
    for final in done:
        if final not in saved:
            try:
                os.unlink(final)
            except OSError:
                ok = False
    for final, backup in backups:
        try:
            if final in done or not os.path.lexists(final):  # replaced, or the old manifest taken away first
                os.replace(backup, final)
            else:  # never touched: the backup is only a second name of it
                os.unlink(backup)
        except OSError:
            ok = False
    return ok


def _holds(path: Path, data: bytes, note: tuple[str, str, StatRecord | None] | None = None) -> bool:
    """Whether `path` is a regular file of exactly `data`, read to see; `note` (name, sha256 of `data`, record):
    a file that does is recorded there when its stat allows (asked before the read: core/cache_stat.py)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):  # a device is never opened
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):  # absent, or swapped for a link since lstat
            return False
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        record = note[2] if note else None
        settled = record is not None and record.may_note(st)
        with os.fdopen(fd, "rb", closefd=False) as f:
            same = f.read(len(data) + 1) == data
        if same and settled:
            record.note(note[0], st, note[1])  # type: ignore[union-attr, index]
        return same
    finally:
        os.close(fd)


def _holds_digest(path: Path, rel: str, digest: str, record: StatRecord) -> None:
    """Record `rel` when `path` is a regular file whose bytes hash to `digest` and its stat allows (asked before
    the read)."""
    import hashlib

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not record.may_note(st):
            return
        with os.fdopen(fd, "rb", closefd=False) as f:
            same = hashlib.file_digest(f, "sha256").hexdigest() == digest
        if same:
            record.note(rel, st, digest)
    finally:
        os.close(fd)


def _write_temp(final: Path, data: bytes) -> str:
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".pending", dir=final.parent)
    try:
        os.fchmod(fd, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return os.path.basename(tmp)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
