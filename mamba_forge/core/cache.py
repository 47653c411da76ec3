"""The private, content-addressed build cache.

Key: sha256 over everything that affects the bytes (composed source, every header's content, the exact option
list, the target, the NVRTC version and library identity, the catalog entry, the tool version); the caller
builds it with :func:`cache_key`. Entries are single files, 0600, written atomically (temp file, fsync, rename)
and carry their full key and a sha256 of each part, all checked on every full read: a corrupted entry, or one
copied over another key's name, is dropped and rebuilt, never loaded. A build may skip reading an entry's large
parts where its stat record (core/cache_stat.py) says the file is exactly as when it was last read and checked.
Only regular files are read (a symlink or a folder in an entry's place is refused, never followed), and no more
than ``MAX_ENTRY_BYTES``. A cache that cannot
be written (a full disk, a read-only folder) is a warning: the build goes on without storing. Per-key ``fcntl.flock`` locks serialise concurrent builders of the same entry and die with their
process, so no lock can go stale.

The location must be private: a path with a symlinked component, a group- or world-writable ancestor that
neither root nor you own, or a final folder that is not yours with mode 0700 is refused (one warning, then the
build goes on without a cache).

Housekeeping (`mamba-forge cache size|clean|prune`, :mod:`mamba_forge.build.cache_admin`) touches only regular
files named like entries under ``<root>/v1/<xx>/`` (and, for `clean`, the builds' stat records under
``<root>/stat/``), never follows a symlink and leaves the folders and locks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import struct
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from mamba_forge.core.cache_location import (  # noqa: F401  (re-exported)
    DISABLED_VALUES,
    CacheRefused,
    check_private,
    default_location,
)
from mamba_forge.core.cache_memo import memo_cache, memo_writes, memo_writes_off, memos_off  # noqa: F401  (re-exported)
from mamba_forge.core.cache_stat import Clock, StatRecord, fs_clock
from mamba_forge.core.fsio import write_atomic_at

MAGIC = b"MFCACHE2"  # 2: each part carries its own sha256 (a hit needs no second hash for the manifest)
DIGEST_PREFIX = "sha256."  # a hit returns each part's verified digest as part "sha256.<name>" (hex, ASCII)
SIZE_PREFIX = "size."  # a part left unread (`get(lazy=...)`) comes as its digest and "size.<name>" (decimal, ASCII)
MAX_ENTRY_BYTES = 1 << 28  # 256 MiB: far above any module's cubin + PTX + log, far below what would hurt
# A hit renews an entry's mtime (for `cache prune`) once it is this old, not on every hit: a renewal changes the
# file's ctime, which makes the next build read and hash the entry in full instead of trusting its stat record.
RENEW_AFTER_NS = 24 * 3600 * 10**9
_RESERVED = (DIGEST_PREFIX, SIZE_PREFIX)  # names a hit adds beside the parts: never a part's own name


def cache_key(parts: Mapping[str, object]) -> str:
    """sha256 of a canonical JSON encoding of the parts (sorted keys, no whitespace variance)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupted: int = 0


class CacheUnsafe(OSError):
    """A folder or file inside the cache is a symlink, not a folder, or not private: the cache is not used."""

    def __init__(self, message: str):
        super().__init__(errno.EPERM, message)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Cache:
    """Entries: ``<root>/v1/<key[:2]>/<key>``; locks: ``<root>/v1/locks/<key>.lock``.

    The root's privacy is checked once (:meth:`open`); every folder under it, and the root itself again, is opened
    where it is used, without following a symlink (O_NOFOLLOW|O_DIRECTORY, relative to its parent's descriptor),
    and must be a folder of yours that nobody else can write: a `v1`, shard or locks folder swapped for a link to
    another folder, before or during a build, is never read from or written through (an OSError: the caller
    warns and builds without the cache)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.entries = self.root / "v1"
        self.stats = CacheStats()
        self.warnings: list[str] = []
        self.uid = os.getuid()
        # set by a build (core/cache_stat.py): entries it may trust by their stat, and where it notes those it
        # read and checked in full; None (workers, memos): every hit is read and hashed
        self.record: StatRecord | None = None

    @classmethod
    def open(cls, location: Path | None) -> Cache | None:
        if location is None:
            return None
        check_private(location)
        return cls(location)

    def _path(self, key: str) -> Path:
        return self.entries / key[:2] / key

    def _check_dir(self, fd: int, shown: Path) -> None:
        st = os.fstat(fd)
        if st.st_uid != self.uid or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CacheUnsafe(f"cache folder {shown} is not private (owner uid {st.st_uid}, mode "
                              f"{stat.S_IMODE(st.st_mode):04o})")

    @contextlib.contextmanager
    def _folder(self, *names: str, create: bool) -> Iterator[int]:
        """A descriptor of ``root/names...``, each component opened without following a link (made 0700 when
        missing and `create`). FileNotFoundError when missing and not `create`; CacheUnsafe for a link or a
        foreign folder."""
        fds: list[int] = []
        shown = self.root
        try:
            try:
                fds.append(os.open(self.root, _DIR_FLAGS))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CacheUnsafe(f"cache folder {shown} is a symlink or not a folder") from None
                raise
            self._check_dir(fds[-1], shown)
            for name in names:
                shown = shown / name
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=fds[-1])
                try:
                    fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise CacheUnsafe(f"cache folder {shown} is a symlink or not a folder") from None
                    raise
                self._check_dir(fds[-1], shown)
            yield fds[-1]
        finally:
            for fd in reversed(fds):
                os.close(fd)

    def _lock_file(self, name: str) -> int:
        """A descriptor of ``v1/locks/<name>`` (created 0600), opened without following a link; CacheUnsafe where
        it is not a regular file."""
        shown = self.entries / "locks" / name
        with self._folder("v1", "locks", create=True) as locks:
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                             | getattr(os, "O_CLOEXEC", 0), 0o600, dir_fd=locks)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise CacheUnsafe(f"cache lock {shown} is not a regular file") from None
                raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CacheUnsafe(f"cache lock {shown} is not a regular file")
        return fd

    def clock(self) -> Clock | None:
        """The cache filesystem's clock (core/cache_stat.py's fs_clock, through ``v1/locks/clock``); None where
        it cannot be read (then no entry is recorded)."""
        try:
            fd = self._lock_file("clock")
        except OSError:
            return None
        try:
            return fs_clock(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-key lock; released when the block ends or the process dies. The lock file is opened
        without following a link and must be a regular file (an OSError otherwise)."""
        fd = self._lock_file(f"{key}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def has(self, key: str) -> bool:
        """Whether an entry exists, touching nothing (`build --dry-run`); `get` still decides whether it is good."""
        try:
            with self._folder("v1", key[:2], create=False) as shard:
                return stat.S_ISREG(os.stat(key, dir_fd=shard, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def get(self, key: str, accept: Callable[[dict[str, bytes]], str | None] | None = None, *,
            lazy: Collection[str] = ()) -> dict[str, bytes] | None:
        """The entry's parts, or None on a miss. A corrupted, foreign or non-regular entry is refused, removed
        where it can be, and counted as a miss; so is one whose parts `accept` finds a problem with (a warning).
        A cache folder that is a link or not private is a miss and a warning, never read.

        `lazy`: parts left unread where `self.record` trusts the entry (its stat exactly as when a build read,
        hashed and accepted it); they come as their digest and size ("sha256.<name>", "size.<name>"), and
        `accept` sees them so. Any other entry is read and hashed in full."""
        try:
            with self._folder("v1", key[:2], create=False) as shard:
                return self._get_at(shard, key, accept, lazy)
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError as exc:
            self.stats.misses += 1
            self._warn(f"build cache not usable ({exc.strerror or exc}); built without it")
            return None

    def _get_at(self, shard: int, key: str, accept, lazy: Collection[str]) -> dict[str, bytes] | None:
        try:
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=shard)
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError:  # a symlink (ELOOP), a folder we cannot open, no permission
            return self._refuse(shard, key)
        record = self.record
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
                return self._refuse(shard, key)
            header_sha = record.trusted(key, st) if record is not None and lazy else None
            settled = record is not None and header_sha is None and record.may_note(st)  # before any byte is read
            with os.fdopen(fd, "rb", closefd=False) as f:
                # each part read into its own bytes and hashed as it comes (no whole-entry buffer to copy parts
                # out of: 130 MB of artifacts were read, then copied); the size fstat saw, a byte more to see growth
                got = _read_entry(f, st.st_size, key, lazy, header_sha) if header_sha else None
                light = got is not None
                if got is None:  # not trusted (or not as recorded after all): read and hash it all
                    f.seek(0)
                    got = _read_entry(f, st.st_size, key)
            if got is None:
                return self._refuse(shard, key)
            parts, header_digest = got
            renewed = time.time_ns() - st.st_mtime_ns > RENEW_AFTER_NS
            if renewed:  # so that `cache prune` drops the least recently used
                with contextlib.suppress(OSError):
                    os.utime(fd)
        except OSError:
            return self._refuse(shard, key)
        finally:
            os.close(fd)
        problem = accept(parts) if accept else None
        if problem:
            self._warn(f"build cache entry {key[:16]}… refused ({problem}); rebuilt")
            return self._refuse(shard, key)
        if record is not None and (renewed or not light):
            record.forget(key)  # renewed: its ctime is new, the next build reads it in full (and records it)
            if settled and not renewed:
                record.note(key, st, header_digest)
        self.stats.hits += 1
        return parts

    def record_written(self, checks: Mapping[str, Callable[[dict[str, bytes]], str | None]]) -> None:
        """Read back in full (hashed, then `checks[key]` must accept it) each entry this build's workers wrote,
        once this cache's clock has moved past them, so that `self.record` holds them: the next no-change rebuild
        then trusts them unread. No record: nothing to do."""
        if self.record is None or not checks:
            return
        newest = 0
        for key in checks:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(self._path(key), follow_symlinks=False).st_ctime_ns)
        self.record.reclock(newest)
        for key, accept in checks.items():
            self.get(key, accept)

    def _refuse(self, shard: int, key: str) -> None:
        if self.record is not None:
            self.record.forget(key)
        self.stats.corrupted += 1
        self.stats.misses += 1
        with contextlib.suppress(OSError):
            if not stat.S_ISDIR(os.stat(key, dir_fd=shard, follow_symlinks=False).st_mode):
                os.unlink(key, dir_fd=shard)
        return None

    def put(self, key: str, parts: Mapping[str, bytes]) -> str | None:
        """Store an entry; a cache that cannot be written (ENOSPC, EROFS, a folder in the entry's place, a cache
        folder swapped for a link) returns a warning instead of raising: the cache is an optimisation, never a
        reason for a build to fail."""
        path = self._path(key)
        try:
            with self._folder("v1", key[:2], create=True) as shard:
                write_atomic_at(shard, key, _encode(parts, key), mode=0o600)
        except OSError as exc:
            return f"build cache not written ({exc.strerror or exc}): {path}; the build goes on without storing"
        return None


def _encode(parts: Mapping[str, bytes], key: str) -> bytes:
    names = sorted(n for n in parts if not n.startswith(_RESERVED))
    payload = b"".join(parts[n] for n in names)
    header = json.dumps(
        {"key": key, "parts": [[n, len(parts[n]), hashlib.sha256(parts[n]).hexdigest()] for n in names]},
        separators=(",", ":"),
    ).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


def _read_entry(f, size: int, key: str, lazy: Collection[str] = (),
                header_sha: str | None = None) -> tuple[dict[str, bytes], str] | None:
    """An entry's parts read from `f` (a file of `size` bytes when fstat looked), each checked against its sha256
    as _decode checks them, and the sha256 of its header (magic, length and the JSON that lists each part's
    digest); None for anything _decode refuses, and for a file that is not exactly `size` bytes.

    `header_sha` (the header a stat record says this file holds; the header must hash to it): the parts named
    in `lazy` are skipped, not read, and come as their digest and size."""
    try:
        head = f.read(len(MAGIC) + 4)
        if len(head) != len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            return None
        (hlen,) = struct.unpack_from("<I", head, len(MAGIC))
        if hlen > size - len(head):
            return None
        raw = f.read(hlen)
        if len(raw) != hlen:
            return None
        header_digest = hashlib.sha256(head + raw).hexdigest()
        if header_sha is not None and header_digest != header_sha:
            return None
        skip = lazy if header_sha is not None else ()
        header = json.loads(raw)
        if header.get("key") != key:  # an entry copied over another key's name: never served
            return None
        todo, remaining = [], size - len(head) - hlen
        for name, psize, digest in header["parts"]:
            if type(name) is not str or name.startswith(_RESERVED) or type(psize) is not int or psize < 0:
                return None
            todo.append((name, psize, digest))
            remaining -= psize
        if remaining != 0:  # the parts must fill the file exactly
            return None
        out = {}
        for name, psize, digest in todo:
            if name in skip:  # its digest was checked when the record was made, and the header still names it
                f.seek(psize, os.SEEK_CUR)
                out[DIGEST_PREFIX + name], out[SIZE_PREFIX + name] = digest.encode(), str(psize).encode()
                continue
            part = f.read(psize)
            if len(part) != psize or hashlib.sha256(part).hexdigest() != digest:
                return None
            out[name], out[DIGEST_PREFIX + name] = part, digest.encode()
        if f.read(1):  # it grew while it was read
            return None
        return out, header_digest
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _decode(blob: bytes, key: str) -> dict[str, bytes] | None:
    try:
        if blob[: len(MAGIC)] != MAGIC:
            return None
        (hlen,) = struct.unpack_from("<I", blob, len(MAGIC))
        start = len(MAGIC) + 4
        if hlen > len(blob) - start:
            return None
        header = json.loads(blob[start : start + hlen])
        if header.get("key") != key:  # an entry copied over another key's name: never served
            return None
        payload = memoryview(blob)[start + hlen :]  # parts are hashed and copied out of it once each
        out, pos = {}, 0
        for name, size, digest in header["parts"]:
            if type(name) is not str or name.startswith(_RESERVED) or type(size) is not int or size < 0:
                return None
            part = payload[pos : pos + size]
            if len(part) != size or hashlib.sha256(part).hexdigest() != digest:
                return None
            out[name], out[DIGEST_PREFIX + name] = part.tobytes(), digest.encode()
            pos += size
        if pos != len(payload):
            return None
        return out
    except (struct.error, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
