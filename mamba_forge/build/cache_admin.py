"""Cache housekeeping: size, clean, prune to a cap (least recently used first; a hit renews an entry's mtime once
it is a day old).

Only regular files named like entries (``<root>/v1/<key[:2]>/<key>``, 64 hex digits) count or are removed;
folders are opened with O_NOFOLLOW and files unlinked relative to them, so a symlink planted anywhere under the
cache is neither followed nor removed. The folders themselves, their 0700 modes and the lock files stay.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from mamba_forge.core.cache import CacheRefused, check_private, default_location
from mamba_forge.core.cache_stat import RECORDS
from mamba_forge.core.errors import ForgeError

MAX_ENV = "MAMBA_FORGE_CACHE_MAX"
_KEY = re.compile(r"^[0-9a-f]{64}$")
_SHARD = re.compile(r"^[0-9a-f]{2}$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)$", re.IGNORECASE | re.ASCII)
_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass(frozen=True)
class Entry:
    shard: str
    name: str
    size: int
    last_used: float  # the later of atime and mtime


@dataclass(frozen=True)
class Usage:
    bytes: int
    entries: int


def parse_size(text: str, source: str = "--max-size") -> int:
    """Bytes from `1048576`, `500M`/`2G` (powers of 1024, like du), `1.5GiB`, `500MB` (powers of 1000)."""
    m = _SIZE.match(text.strip())
    if m is None or (m.group(3) and not m.group(2)):
        raise ForgeError(f"{source} {text[:40]!r} is not a size", hint="e.g. 500M, 2G, 1.5GiB or a byte count")
    number, unit, binary, b = m.groups()
    base = 1000 if (b and not binary and unit) else 1024
    value = int(float(number) * base ** _POWER[unit.lower()])
    if value >= 1 << 63:
        raise ForgeError(f"{source} {text[:40]!r} is too large", hint="e.g. 500M, 2G, 1.5GiB or a byte count")
    return value


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The configured cache folder; bad input when the cache is disabled or misconfigured."""
    try:
        root = default_location(env)
    except CacheRefused as exc:
        raise ForgeError(str(exc)) from None
    if root is None:
        raise ForgeError("the build cache is disabled (MAMBA_FORGE_CACHE=0/off)",
                         hint="unset MAMBA_FORGE_CACHE or point it at an absolute folder")
    return root


def safety(root: Path) -> str | None:
    """None when `root` passes the privacy checks (an absent folder does: it would be made 0700), else why not."""
    if not root.exists() and not root.is_symlink():
        return None
    try:
        check_private(root)
    except CacheRefused as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def _open_dir(name: str | Path, dir_fd: int | None = None) -> Iterator[int | None]:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:  # absent, a symlink (ELOOP), not a folder, no permission: nothing of ours in it
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def entries(root: Path) -> list[Entry]:
    out = []
    with _open_dir(Path(root) / "v1") as top:
        if top is None:
            return out
        for shard in sorted(os.listdir(top)):
            if not _SHARD.match(shard):
                continue  # locks/ and anything else
            with _open_dir(shard, top) as sub:
                if sub is None:
                    continue
                for name in sorted(os.listdir(sub)):
                    if not (_KEY.match(name) and name.startswith(shard)):
                        continue
                    with contextlib.suppress(OSError):
                        st = os.stat(name, dir_fd=sub, follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            out.append(Entry(shard, name, st.st_size, max(st.st_atime, st.st_mtime)))
    return out


def usage(root: Path) -> Usage:
    found = entries(root)
    return Usage(sum(e.size for e in found), len(found))


def _require_safe(root: Path) -> None:
    why = safety(root)
    if why is not None:
        raise ForgeError(f"refusing to remove anything: {why}")


def _remove(root: Path, doomed: list[Entry]) -> Usage:
    removed = Usage(0, 0)
    with _open_dir(Path(root) / "v1") as top:
        if top is None:
            return removed
        for e in doomed:
            with _open_dir(e.shard, top) as sub, contextlib.suppress(OSError):
                if sub is None:
                    continue
                if stat.S_ISREG(os.stat(e.name, dir_fd=sub, follow_symlinks=False).st_mode):
                    os.unlink(e.name, dir_fd=sub)
                    removed = Usage(removed.bytes + e.size, removed.entries + 1)
    return removed


def clean(root: Path) -> Usage:
    """Remove every entry, and the builds' stat records (``<root>/stat/``: they name entries); returns what was
    removed (entries only). Bad input when the folder is unsafe."""
    _require_safe(root)
    removed = _remove(root, entries(root))
    with _open_dir(Path(root) / RECORDS) as records:
        for name in os.listdir(records) if records is not None else ():
            with contextlib.suppress(OSError):
                if _KEY.match(name) and stat.S_ISREG(os.stat(name, dir_fd=records, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=records)
    return removed


def prune(root: Path, max_bytes: int) -> Usage:
    """Remove least recently used entries until the total is at most `max_bytes`; returns what was removed."""
    _require_safe(root)
    found = sorted(entries(root), key=lambda e: (e.last_used, e.name))
    total = sum(e.size for e in found)
    doomed = []
    for e in found:
        if total <= max_bytes:
            break
        doomed.append(e)
        total -= e.size
    return _remove(root, doomed)
