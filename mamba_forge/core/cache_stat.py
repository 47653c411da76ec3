"""Stat-keyed records: what a file held when its bytes were last read and checked, so that a build can trust a
file whose stat is exactly as it was then without reading it again (issue 26: a no-change rebuild read the 171 MB
of artifacts twice, the cache entries to hash them and build/'s files to compare them).

A file's key is (st_size, st_mtime_ns, st_ctime_ns, st_ino, st_dev). Any change to a file's bytes sets its ctime to
the filesystem's clock, and no user can set a ctime (os.utime sets it too); so a file whose key is as recorded
holds what it held then, unless the change fell in the same clock tick as the recorded ctime (a coarse clock ticks
every few ms). Hence a file is recorded only when its ctime is older than a reading of that filesystem's own clock
(`fs_clock`: touch a file there, read its ctime) taken before its bytes were read: any later change gets a ctime
at least that reading, never the recorded one. What a build writes itself is read back once the clock has moved
past it (`reclock`), and recorded then.

The record of one output folder (its artifacts, and the cache entries its programs came from) is kept in the
private cache, in ``<root>/stat/`` (`BuildRecord`): written atomically, read back bounded (MAX_RECORD_BYTES, no
link followed), checked against its own sha256, and one that is corrupt, truncated, too large or of another
shape is treated as absent. It is as private as the cache: only its owner can write it (and could as well write
the entries). A row is believed only for a file whose stat is exactly the recorded one, and its digest is
always compared with what the build expects (an artifact's sha256, the hash of an entry's header as read), so a
damaged row costs a full read, never a wrong file. Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mamba_forge.core.fsio import write_atomic_at

if TYPE_CHECKING:
    from mamba_forge.core.cache import Cache

StatKey = tuple[int, int, int, int, int]
Clock = tuple[int, int]  # (st_dev, ctime_ns) of a filesystem's clock read through a file touched there

FORMAT = 1
RECORDS = "stat"  # <cache root>/stat/<key>: one record per output folder, beside the entries' v1/
MAX_RECORD_BYTES = 1 << 20  # about 5000 files; the default catalog's build names 123
MAX_NAME = 300
_DIGEST = re.compile(r"[0-9a-f]{64}")
_INT_RANGE = 1 << 64


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def fs_clock(fd: int) -> Clock | None:
    """The clock of the filesystem holding `fd`'s file (a file of ours, opened for writing): touched, so its ctime
    is that filesystem's "now". None where it cannot be touched (nothing is recorded then)."""
    try:
        os.utime(fd)
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ctime_ns


class StatRecord:
    """name -> (stat key, sha256) of files read and checked. `trusted` answers from the record loaded at the
    start of a build; `note` adds what this build checked. Only what this build trusted or noted is kept, so a
    record never outgrows one build's files."""

    def __init__(
        self, known: dict[str, tuple[StatKey, str]] | None = None, clock: Callable[[], Clock | None] | None = None
    ):
        self.known = known or {}
        self.kept: dict[str, tuple[StatKey, str]] = {}
        self._read_clock = clock
        self._clock: Clock | None = None
        self._clock_read = False

    def trusted(self, name: str, st: os.stat_result) -> str | None:
        """The recorded sha256 of `name` when `st` (a regular file's) is exactly the recorded key, else None."""
        entry = self.known.get(name)
        if entry is None or not stat.S_ISREG(st.st_mode) or entry[0] != stat_key(st):
            return None
        self.kept[name] = entry
        return entry[1]

    def may_note(self, st: os.stat_result) -> bool:
        """Asked before a file's bytes are read: whether, once checked, they may be recorded under `st` (changed
        before the filesystem's clock reading, on its filesystem). The clock is read once, on first ask."""
        if not self._clock_read:
            self._clock_read = True
            self._clock = self._read_clock() if self._read_clock else None
        return (
            self._clock is not None
            and stat.S_ISREG(st.st_mode)
            and st.st_dev == self._clock[0]
            and st.st_ctime_ns < self._clock[1]
        )

    def reclock(self, newer_than: int) -> None:
        """Read the clock again, after this build's own writes: until it is past `newer_than` (the newest ctime
        they left; a clock ticks every few ms, where it is coarse), for at most about 50 ms. The files written
        can then be read back and recorded, so the next build need not read them."""
        self._clock_read = True
        for _ in range(25):
            self._clock = self._read_clock() if self._read_clock else None
            if self._clock is None or self._clock[1] > newer_than:
                return
            time.sleep(0.002)

    def note(self, name: str, st: os.stat_result, digest: str) -> None:
        """Record that `name`, as `st` says, holds `digest` (its bytes checked after `may_note(st)` said yes)."""
        self.kept[name] = (stat_key(st), digest)

    def forget(self, name: str) -> None:
        self.kept.pop(name, None)

    def changed(self) -> bool:
        return self.kept != self.known

    def plain(self) -> dict[str, list]:
        return {name: [*key, digest] for name, (key, digest) in sorted(self.kept.items())}


def _entries(section: object) -> dict[str, tuple[StatKey, str]] | None:
    """A section of a stored record, checked field by field; None for anything of another shape."""
    if not isinstance(section, dict):
        return None
    out = {}
    for name, value in section.items():
        if (
            len(name) > MAX_NAME
            or type(value) is not list
            or len(value) != 6
            or any(type(v) is not int or not -_INT_RANGE < v < _INT_RANGE for v in value[:5])
            or type(value[5]) is not str
            or not _DIGEST.fullmatch(value[5])
        ):
            return None
        out[name] = (tuple(value[:5]), value[5])
    return out


def decode(data: bytes) -> dict[str, dict[str, tuple[StatKey, str]]] | None:
    """A stored record's sections ("outputs", "entries"), or None for anything that is not one (never raises)."""
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or set(doc) != {"format", "outputs", "entries"} or doc["format"] != FORMAT:
        return None
    sections = {name: _entries(doc[name]) for name in ("outputs", "entries")}
    return None if any(s is None for s in sections.values()) else sections  # type: ignore[return-value]


class BuildRecord:
    """One output folder's record in the private cache: `outputs` (its artifacts, by path inside it) and `entries`
    (the cache entries its programs came from, by key), each a StatRecord. The folder is named by its real path,
    device and inode, so a copy or a new folder at the same path starts without a record."""

    def __init__(
        self, cache: Cache, out: Path, out_clock: Callable[[], Clock | None], entry_clock: Callable[[], Clock | None]
    ):
        self.cache = cache
        try:
            st = os.stat(out)
            self.key: str | None = _record_key(out, st)
        except OSError:
            self.key = None
        found = self._load() if self.key else None
        self.outputs = StatRecord(found["outputs"] if found else None, out_clock)
        self.entries = StatRecord(found["entries"] if found else None, entry_clock)

    def _load(self) -> dict | None:
        payload = _read_record(self.cache, self.key)  # type: ignore[arg-type]
        return decode(payload) if payload is not None else None

    def save(self) -> None:
        """Store what this build trusted and checked, where it differs from what was loaded (a no-change rebuild
        writes nothing). A cache that cannot be written leaves the old record; the next build reads in full."""
        if self.key is None or not (self.outputs.changed() or self.entries.changed()):
            return
        doc = {"format": FORMAT, "outputs": self.outputs.plain(), "entries": self.entries.plain()}
        data = json.dumps(doc, separators=(",", ":")).encode()
        if len(data) <= MAX_RECORD_BYTES:
            _write_record(self.cache, self.key, data)


# A record file: magic, the sha256 of the JSON that follows (a damaged file is absent, never half-believed), JSON.
_MAGIC = b"MFSTAT1\n"
_HEAD = len(_MAGIC) + 65


def _framed(payload: bytes) -> bytes:
    return _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def _read_record(cache: Cache, key: str) -> bytes | None:
    """The JSON of ``<root>/stat/<key>``, or None: absent, not a regular file (no link followed), over the bound
    (refused by its size, unread), or not as it was written."""
    try:
        with cache._folder(RECORDS, create=False) as folder:  # the cache's one way in: no link, private
            fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES + _HEAD:
                    return None
                with os.fdopen(fd, "rb", closefd=False) as f:
                    blob = f.read(st.st_size + 1)
            finally:
                os.close(fd)
    except OSError:
        return None
    payload = blob[_HEAD:]
    return payload if blob[:_HEAD] == _framed(payload)[:_HEAD] else None


def _write_record(cache: Cache, key: str, payload: bytes) -> None:
    """Write ``<root>/stat/<key>`` atomically (0600); a cache that cannot be written keeps the old one."""
    with contextlib.suppress(OSError), cache._folder(RECORDS, create=True) as folder:
        write_atomic_at(folder, key, _framed(payload), mode=0o600)


def _record_key(out: Path, st: os.stat_result) -> str:
    from mamba_forge.core.cache import cache_key

    return cache_key(
        {
            "kind": "build-stat-record",
            "format": FORMAT,
            "out": os.path.realpath(out),
            "device": st.st_dev,
            "inode": st.st_ino,
        }
    )
