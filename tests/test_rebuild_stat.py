"""Issue 26: a no-change rebuild trusts the stat record (core/cache_stat.py) instead of reading the artifacts twice,
the cache entries to hash them and build/'s copies to compare them; and the record never hides a change. A file
edited in place with its size and mtime restored still has a new ctime: an output so edited is rewritten, a cache
entry so corrupted is not served. A file changed after the filesystem's clock was read is not recorded, and a hit
renews an entry's mtime only once it is a day old (a renewal sets a new ctime, so the entry is read again)."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest
from runtime_support import write_tiny_catalog

from mamba_forge.build import outputs
from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core import cache as cache_mod
from mamba_forge.core.cache import Cache
from mamba_forge.core.cache_stat import BuildRecord, StatRecord, fs_clock

TARGETS = ("sm_90a", "sm_80")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny catalog built once for two targets (its cache and output folder are copied by each test)."""
    root = tmp_path_factory.mktemp("stat")
    cat = write_tiny_catalog(root / "cat")
    (root / "cache").mkdir(mode=0o700)
    mp = pytest.MonkeyPatch()
    mp.setenv("MAMBA_FORGE_CACHE", str(root / "cache"))
    try:
        run(cat, root / "b", root / "cache")
    finally:
        mp.undo()
    return root, cat


@pytest.fixture
def fresh(built, tmp_path, monkeypatch):
    """(catalog, out, cache): copies of the first build's folder and of its cache, so a test may damage either."""
    root, cat = built
    shutil.copytree(root / "cache", tmp_path / "cache")
    shutil.copytree(root / "b", tmp_path / "b")
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))
    return cat, tmp_path / "b", tmp_path / "cache"


def run(cat: Path, out: Path, cache: Path):
    req = BuildRequest(
        load_catalog(cat), [get_target(t) for t in TARGETS], out, jobs=1, cache_location=cache, write_manifest=True
    )
    return build(req)


def artifacts(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.cubin")) + sorted(out.rglob("*.ptx"))}


def state(out: Path) -> dict[str, tuple[bytes, int, int]]:
    """Bytes, mtime and inode of the manifest and every artifact."""
    return {
        rel: (data, (out / rel).stat().st_mtime_ns, (out / rel).stat().st_ino)
        for rel, data in {**artifacts(out), "manifest.toml": (out / "manifest.toml").read_bytes()}.items()
    }


def stored(out: Path, cache: Path) -> BuildRecord:
    return BuildRecord(Cache(cache), out, lambda: None, lambda: None)


def settle(cat: Path, out: Path, cache: Path):
    """Rebuild until the record holds every artifact and every entry (a build records what it read and checked,
    not what it wrote; the first rebuild does it unless a file changed in the very tick the clock was read)."""
    for _ in range(3):
        manifest = run(cat, out, cache)
        rec = stored(out, cache)
        if set(rec.outputs.known) == set(artifacts(out)) and len(rec.entries.known) == len(manifest.modules):
            return manifest
        time.sleep(0.05)
    raise AssertionError("the record never settled")


class Reads:
    """What a build reads: each artifact it compares byte for byte (outputs._holds), the bytes it reads from
    cache entries (core.cache._read_entry's file), and which of `artifacts` it hashes."""

    def __init__(self, monkeypatch, artifacts: dict[str, bytes]):
        self.compared: list[str] = []
        self.entry_bytes = 0
        self.hashed: list[int] = []  # sizes of the artifacts hashed
        real_holds, real_read = outputs._holds, cache_mod._read_entry

        def holds(path, data, note=None):
            self.compared.append(Path(path).name)
            return real_holds(path, data, note)

        reads = self

        class Counted:
            def __init__(self, f):
                self.f = f

            def read(self, n=-1):
                got = self.f.read(n)
                reads.entry_bytes += len(got)
                return got

            def seek(self, *a):
                return self.f.seek(*a)

        def read_entry(f, *a, **k):
            return real_read(Counted(f), *a, **k)

        real_sha = hashlib.sha256

        sizes = {len(a) for a in artifacts.values()}

        def sha(data=b"", **k):
            if len(data) in sizes and bytes(data) in artifacts.values():
                self.hashed.append(len(data))
            return real_sha(data, **k)

        monkeypatch.setattr(outputs, "_holds", holds)
        monkeypatch.setattr(cache_mod, "_read_entry", read_entry)
        monkeypatch.setattr(cache_mod.hashlib, "sha256", sha)


def test_a_no_change_rebuild_reads_no_artifact_once_recorded(fresh, monkeypatch):
    cat, out, cache = fresh
    size = sum(len(d) for d in artifacts(out).values())
    before = state(out)
    with monkeypatch.context() as mp:  # the control: a folder the record knows nothing of is read in full
        reads = Reads(mp, artifacts(out))
        run(cat, out, cache)
        assert sorted(reads.compared) == sorted(["manifest.toml", *(Path(r).name for r in artifacts(out))])
        assert reads.entry_bytes > size and sum(reads.hashed) == size
    assert state(out) == before
    settle(cat, out, cache)
    entry_file = cache / "stat" / stored(out, cache).key
    entry_stat = entry_file.stat()
    reads = Reads(monkeypatch, artifacts(out))
    manifest = run(cat, out, cache)
    assert all(m.cached for m in manifest.modules) and reads.compared == ["manifest.toml"]
    assert reads.entry_bytes < size / 4 and reads.hashed == [], (reads.entry_bytes, reads.hashed, size)
    assert state(out) == before  # the manifest's and every artifact's bytes, mtime and inode
    after = entry_file.stat()  # and the record itself was not written again
    assert (after.st_ino, after.st_mtime_ns) == (entry_stat.st_ino, entry_stat.st_mtime_ns)
    assert [a.sha256 for m in manifest.modules for a in m.artifacts] == [
        hashlib.sha256(artifacts(out)[a.path]).hexdigest() for m in manifest.modules for a in m.artifacts
    ]


def edit_in_place(path: Path, offset: int) -> None:
    """Flip one byte of `path` in place, then put its mtime back: only the ctime tells."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x20]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_ctime_ns != st.st_ctime_ns


@pytest.mark.parametrize("suffix", [".cubin", ".ptx"])
def test_an_output_edited_in_place_with_its_mtime_restored_is_rewritten(fresh, suffix):
    cat, out, cache = fresh
    settle(cat, out, cache)
    good = artifacts(out)
    rel = next(r for r in good if r.endswith(suffix))
    edit_in_place(out / rel, len(good[rel]) // 2)
    assert (out / rel).read_bytes() != good[rel]
    run(cat, out, cache)
    assert artifacts(out) == good
    mtimes = {r: (out / r).stat().st_mtime_ns for r in good}
    run(cat, out, cache)  # the control: an artifact left as the build wrote it stays (its mtime too)
    assert {r: (out / r).stat().st_mtime_ns for r in good} == mtimes


def entry_layout(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (offset, size) of each part of an entry file ("header" too)."""
    import json
    import struct

    data = path.read_bytes()
    (hlen,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12 : 12 + hlen])
    pos, out = 12 + hlen, {"header": (12, hlen)}
    for name, size, _ in header["parts"]:
        out[name] = (pos, size)
        pos += size
    return out


@pytest.mark.parametrize("where", ["cubin", "ptx", "meta", "header"])
def test_a_cache_entry_corrupted_in_place_is_not_served(fresh, where):
    cat, out, cache = fresh
    manifest = settle(cat, out, cache)
    good = artifacts(out)
    key = manifest.modules[0].cache_key
    path = Cache(cache)._path(key)
    offset, size = entry_layout(path)[where]
    edit_in_place(path, offset + size // 2)
    again = run(cat, out, cache)
    assert [m.cached for m in again.modules] == [False] + [True] * (len(again.modules) - 1)  # compiled again
    assert artifacts(out) == good
    parts = Cache(cache).get(key)  # rewritten whole by the compile
    assert parts is not None and parts["cubin"] == good[manifest.modules[0].artifacts[0].path]
    assert all(m.cached for m in run(cat, out, cache).modules)  # the control: an intact entry is served


def test_a_build_records_what_it_wrote_once_read_back(fresh, monkeypatch):
    """What a build writes is read back after the commit, once the folder's clock has moved past it, and then
    recorded: the next no-change rebuild reads none of it. A file changed before it is read back, or a clock
    that never moves past it, leaves it unrecorded (the next build reads it)."""
    cat, out, cache = fresh
    good = artifacts(out)
    for p in out.rglob("*.cubin"):
        p.unlink()
    run(cat, out, cache)
    assert set(stored(out, cache).outputs.known) == set(good) and artifacts(out) == good
    reads = Reads(monkeypatch, good)
    run(cat, out, cache)
    assert reads.compared == ["manifest.toml"]  # the rewritten cubins too: trusted unread

    real = outputs._holds_digest

    def changed_first(path, rel, digest, record):  # another process edits it between the commit and the read-back
        edit_in_place(path, 100)
        return real(path, rel, digest, record)

    for p in out.rglob("*.cubin"):
        p.unlink()
    with monkeypatch.context() as mp:
        mp.setattr(outputs, "_holds_digest", changed_first)
        run(cat, out, cache)
    assert not any(r.endswith(".cubin") for r in stored(out, cache).outputs.known)
    assert any(r.endswith(".ptx") for r in stored(out, cache).outputs.known)  # the control: read, recorded
    run(cat, out, cache)
    assert artifacts(out) == good  # the edit is seen and undone

    for p in out.rglob("*.cubin"):
        p.unlink()
    with monkeypatch.context() as mp:  # a clock stuck before the writes: nothing written is recorded
        mp.setattr(outputs.os, "utime", lambda *a, **k: None)  # fs_clock's touch does nothing: the lock's ctime
        run(cat, out, cache)
    assert not any(r.endswith(".cubin") for r in stored(out, cache).outputs.known)


def test_only_a_file_changed_before_the_clock_reading_may_be_recorded(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    st = f.stat()
    clock_file = tmp_path / "clock"
    clock_file.write_bytes(b"")
    fd = os.open(clock_file, os.O_RDWR)
    try:
        clock = fs_clock(fd)
    finally:
        os.close(fd)
    assert clock is not None and clock[0] == st.st_dev and clock[1] >= st.st_ctime_ns
    assert StatRecord(clock=lambda: clock).may_note(st) == (st.st_ctime_ns < clock[1])
    assert StatRecord(clock=lambda: (clock[0], st.st_ctime_ns + 1)).may_note(st)
    assert not StatRecord(clock=lambda: (clock[0], st.st_ctime_ns)).may_note(st)  # the same tick: never
    assert not StatRecord(clock=lambda: (clock[0] + 1, st.st_ctime_ns + 10**9)).may_note(st)  # another filesystem
    assert not StatRecord(clock=lambda: None).may_note(st)  # no clock: nothing recorded
    assert not StatRecord(clock=lambda: (clock[0], 1 << 62)).may_note(tmp_path.stat())  # a folder
    rec = StatRecord({"f": ((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev), "a" * 64)})
    assert rec.trusted("f", st) == "a" * 64
    with open(f, "r+b") as h:  # same size, same byte even: the ctime moved
        h.write(b"x")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert rec.trusted("f", f.stat()) is None


def test_a_hit_renews_only_an_entry_a_day_old_and_a_renewed_one_is_read_again(fresh):
    cat, out, cache = fresh
    manifest = settle(cat, out, cache)
    path = Cache(cache)._path(manifest.modules[0].cache_key)
    kept = path.stat()
    run(cat, out, cache)  # the control: a recent entry's hit changes nothing of it
    assert path.stat().st_ctime_ns == kept.st_ctime_ns and path.stat().st_mtime_ns == kept.st_mtime_ns
    old = time.time_ns() - 2 * cache_mod.RENEW_AFTER_NS
    os.utime(path, ns=(old, old))
    run(cat, out, cache)
    assert path.stat().st_mtime_ns > time.time_ns() - 60 * 10**9  # renewed, for `cache prune`
    assert manifest.modules[0].cache_key not in stored(out, cache).entries.known
    settle(cat, out, cache)  # and recorded again by the next build that reads it
