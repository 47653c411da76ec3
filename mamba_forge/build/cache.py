"""The private, content-addressed build cache.

Key: sha256 over everything that affects the bytes (composed source, every header's content, the exact option
list, the target, the NVRTC version and library identity, the catalog entry, the tool version); the caller
builds it with :func:`cache_key`. Entries are single files, 0600, written atomically (temp file, fsync, rename)
and carry their full key and a sha256 of their payload, both checked on every read: a corrupted entry, or one
copied over another key's name, is dropped and rebuilt, never loaded. Only regular files are read (a symlink or a
folder in an entry's place is refused, never followed), and no more than ``MAX_ENTRY_BYTES``. A cache that cannot
be written (a full disk, a read-only folder) is a warning: the build goes on without storing. Per-key ``fcntl.flock`` locks serialise concurrent builders of the same entry and die with their
process, so no lock can go stale.

The location must be private: a path with a symlinked component, a group- or world-writable ancestor that
neither root nor you own, or a final folder that is not yours with mode 0700 is refused (one warning, then the
build goes on without a cache).

Housekeeping (`mamba-forge cache size|clean|prune`, :mod:`mamba_forge.build.cache_admin`) touches only regular
files named like entries under ``<root>/v1/<xx>/``, never follows a symlink and leaves the folders and locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from mamba_forge.fsio import write_atomic
from mamba_forge.safety import PathRefused, check_components

MAGIC = b"MFCACHE2"  # 2: each part carries its own sha256 (a hit needs no second hash for the manifest)
DIGEST_PREFIX = "sha256."  # a hit returns each part's verified digest as part "sha256.<name>" (hex, ASCII)
DISABLED_VALUES = {"0", "off"}
MAX_ENTRY_BYTES = 1 << 28  # 256 MiB: far above any module's cubin + PTX + log, far below what would hurt


class CacheRefused(Exception):
    """The cache location is unsafe or unusable; the message says why and what to do."""


def cache_key(parts: Mapping[str, object]) -> str:
    """sha256 of a canonical JSON encoding of the parts (sorted keys, no whitespace variance)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def default_location(env: Mapping[str, str] | None = None) -> Path | None:
    """The configured location, or None when the cache is disabled. Raises CacheRefused for a relative path."""
    env = os.environ if env is None else env
    explicit = env.get("MAMBA_FORGE_CACHE")
    if explicit is not None and explicit != "":
        if explicit.strip().lower() in DISABLED_VALUES:
            return None
        p = Path(explicit)
        if not p.is_absolute():
            raise CacheRefused(f"MAMBA_FORGE_CACHE={explicit!r} is not an absolute path; set an absolute path, or 0/off")
        return p
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "mamba-forge"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "mamba-forge"


def check_private(path: Path, *, uid: int | None = None) -> None:
    """Refuse an unsafe cache path (see module doc). Creates missing folders with mode 0700."""
    uid = os.getuid() if uid is None else uid
    try:  # the rule shared with the trust folders: no symlinked component, no foreign writable ancestor
        path = check_components(path, uid=uid, what="cache path")
    except PathRefused as exc:
        raise CacheRefused(f"{exc}; point MAMBA_FORGE_CACHE at a folder only you can write") from None
    if not path.exists():
        try:
            # parents too, each 0700 as it is made (umask cannot widen them)
            missing = [p for p in [path, *path.parents] if not p.exists()]
            for p in reversed(missing):
                os.mkdir(p, 0o700)
        except OSError as exc:
            raise CacheRefused(f"cannot create cache folder {path}: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CacheRefused(f"cache path {path} is not a plain folder")
    if st.st_uid != uid:
        raise CacheRefused(f"cache folder {path} is owned by uid {st.st_uid}, not you ({uid}); use a folder of your own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        raise CacheRefused(
            f"cache folder {path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700; run `chmod 700 {path}` or choose another"
        )


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    corrupted: int = 0


class Cache:
    """Entries: ``<root>/v1/<key[:2]>/<key>``; locks: ``<root>/v1/locks/<key>.lock``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.entries = self.root / "v1"
        self.stats = CacheStats()

    @classmethod
    def open(cls, location: Path | None) -> Cache | None:
        if location is None:
            return None
        check_private(location)
        return cls(location)

    def _path(self, key: str) -> Path:
        return self.entries / key[:2] / key

    def _mkdirs(self, p: Path) -> None:
        for d in reversed([p, *p.parents]):
            if d == self.root or self.root in d.parents:
                if not d.exists():
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(d, 0o700)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive per-key lock; released when the block ends or the process dies."""
        lockdir = self.entries / "locks"
        self._mkdirs(lockdir)
        fd = os.open(lockdir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def has(self, key: str) -> bool:
        """Whether an entry exists, touching nothing (`build --dry-run`); `get` still decides whether it is good."""
        return self._path(key).is_file()

    def get(self, key: str) -> dict[str, bytes] | None:
        """The entry's parts, or None on a miss. A corrupted, foreign or non-regular entry is refused, removed
        where it can be, and counted as a miss."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError:  # a symlink (ELOOP), a folder we cannot open, no permission
            return self._refuse(path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
                return self._refuse(path)
            with os.fdopen(fd, "rb", closefd=False) as f:
                blob = f.read(MAX_ENTRY_BYTES + 1)
            with contextlib.suppress(OSError):  # a hit renews the entry's mtime, so `cache prune` drops the LRU
                os.utime(fd)
        except OSError:
            return self._refuse(path)
        finally:
            os.close(fd)
        parts = _decode(blob, key)
        if parts is None:
            return self._refuse(path)
        self.stats.hits += 1
        return parts

    def _refuse(self, path: Path) -> None:
        self.stats.corrupted += 1
        self.stats.misses += 1
        with contextlib.suppress(OSError):
            if not path.is_dir() or path.is_symlink():
                path.unlink()
        return None

    def put(self, key: str, parts: Mapping[str, bytes]) -> str | None:
        """Store an entry; a cache that cannot be written (ENOSPC, EROFS, a folder in the entry's place) returns
        a warning instead of raising: the cache is an optimisation, never a reason for a build to fail."""
        path = self._path(key)
        try:
            self._mkdirs(path.parent)
            write_atomic(path, _encode(parts, key), mode=0o600)
        except OSError as exc:
            return f"build cache not written ({exc.strerror or exc}): {path}; the build goes on without storing"
        return None


def _encode(parts: Mapping[str, bytes], key: str) -> bytes:
    names = sorted(n for n in parts if not n.startswith(DIGEST_PREFIX))
    payload = b"".join(parts[n] for n in names)
    header = json.dumps(
        {"key": key, "parts": [[n, len(parts[n]), hashlib.sha256(parts[n]).hexdigest()] for n in names]},
        separators=(",", ":"),
    ).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


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
            if type(name) is not str or name.startswith(DIGEST_PREFIX) or type(size) is not int or size < 0:
                return None
            part = payload[pos : pos + size]
            if len(part) != size or hashlib.sha256(part).hexdigest() != digest:
                return None
            out[name], out[DIGEST_PREFIX + name] = part.tobytes(), digest.encode()
            pos += size
        if pos != len(payload):
            return None
        return out
    except (struct.error, ValueError, KeyError, TypeError, AttributeError):
        return None
