"""The private build cache: hits, misses, corruption, concurrency, and every refusal of an unsafe location."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core.cache import Cache, CacheRefused, cache_key, check_private, default_location

BASIC = Path(__file__).parent / "fixtures" / "build_basic" / "catalog.toml"
OTHER_UID = 54321


def request(out: Path, cache: Path | None, targets=("sm_90a",)) -> BuildRequest:
    return BuildRequest(load_catalog(BASIC), [get_target(t) for t in targets], out, jobs=1, cache_location=cache)


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def test_location_from_environment(tmp_path):
    assert default_location({"MAMBA_FORGE_CACHE": "/x/y"}) == Path("/x/y")
    assert default_location({"MAMBA_FORGE_CACHE": "off"}) is None
    assert default_location({"MAMBA_FORGE_CACHE": "0"}) is None
    assert default_location({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/mamba-forge")
    assert default_location({"HOME": "/h"}) == Path("/h/.cache/mamba-forge")
    with pytest.raises(CacheRefused, match="not an absolute path"):
        default_location({"MAMBA_FORGE_CACHE": "relative/dir"})


def test_miss_then_hit_gives_same_bytes(tmp_path):
    cache_dir = private_dir(tmp_path / "cache")
    first = build(request(tmp_path / "a", cache_dir))
    assert not any(m.cached for m in first.modules)
    second = build(request(tmp_path / "b", cache_dir))
    assert all(m.cached for m in second.modules)
    assert [a.sha256 for m in first.modules for a in m.artifacts] == [a.sha256 for m in second.modules for a in m.artifacts]
    assert [s.resources for _, s in first.symbols()] == [s.resources for _, s in second.symbols()]
    entries = [p for p in (cache_dir / "v1").rglob("*") if p.is_file() and p.parent.name != "locks"]
    assert entries and all((p.stat().st_mode & 0o777) == 0o600 for p in entries)


def test_a_hit_allocates_about_its_entry_not_the_size_cap(tmp_path):
    """Reading an entry takes its own size, not MAX_ENTRY_BYTES (read(n) allocates n: a hit cost 256 MiB)."""
    import tracemalloc

    cache = Cache(private_dir(tmp_path / "cache"))
    key = cache_key({"x": 1})
    assert cache.put(key, {"a": b"x" * 1000}) is None
    tracemalloc.start()
    try:
        got = cache.get(key)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got["a"] == b"x" * 1000
    assert peak < 4 << 20, peak


def test_key_changes_with_every_input(tmp_path):
    base = {"source": "a", "options": ["-x"], "target": "sm_90a"}
    assert cache_key(base) == cache_key(dict(reversed(list(base.items()))))
    assert cache_key(base) != cache_key({**base, "options": ["-x", "-y"]})
    assert cache_key(base) != cache_key({**base, "target": "sm_80"})


def test_header_change_misses(tmp_path):
    import shutil

    src = tmp_path / "cat"
    shutil.copytree(BASIC.parent, src)
    cache_dir = private_dir(tmp_path / "cache")
    req = BuildRequest(load_catalog(src / "catalog.toml"), [get_target("sm_90a")], tmp_path / "o", jobs=1,
                       cache_location=cache_dir)
    build(req)
    header = src / "include" / "fx" / "scale.cuh"
    header.write_text(header.read_text() + "\n// a comment changes the key\n")
    again = build(BuildRequest(load_catalog(src / "catalog.toml"), [get_target("sm_90a")], tmp_path / "o", jobs=1,
                               cache_location=cache_dir))
    assert not any(m.cached for m in again.modules)


def test_corrupted_entry_is_rebuilt_never_loaded(tmp_path):
    cache_dir = private_dir(tmp_path / "cache")
    first = build(request(tmp_path / "a", cache_dir))
    [entry] = [p for p in (cache_dir / "v1").rglob("*") if p.is_file() and p.parent.name != "locks"]
    blob = bytearray(entry.read_bytes())
    blob[-100] ^= 0x40  # inside the cubin payload
    entry.write_bytes(bytes(blob))
    req = request(tmp_path / "b", cache_dir)
    cache = Cache(cache_dir)
    assert cache.get(first.modules[0].cache_key) is None and cache.stats.corrupted == 1
    entry.write_bytes(bytes(blob))
    second = build(req)
    assert not second.modules[0].cached
    assert [a.sha256 for a in second.modules[0].artifacts] == [a.sha256 for a in first.modules[0].artifacts]
    assert Cache(cache_dir).get(first.modules[0].cache_key) is not None  # rewritten whole


def test_truncated_and_foreign_entries_are_misses(tmp_path):
    cache = Cache(private_dir(tmp_path / "c"))
    cache.put("ab" * 32, {"cubin": b"x" * 100, "meta": b"{}"})
    path = cache.entries / "ab" / ("ab" * 32)
    path.write_bytes(path.read_bytes()[:-10])
    assert cache.get("ab" * 32) is None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a cache entry at all")
    assert cache.get("ab" * 32) is None


def test_refuses_symlinked_component(tmp_path):
    real = private_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CacheRefused, match="symlinked component"):
        check_private(tmp_path / "link" / "cache")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hand a folder to another uid")
def test_refuses_foreign_writable_ancestor(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, OTHER_UID, OTHER_UID)
    shared.chmod(0o777)
    with pytest.raises(CacheRefused, match="group- or world-writable"):
        check_private(shared / "cache")


def test_sticky_world_writable_root_owned_ancestor_is_fine(tmp_path):
    if os.stat(tmp_path).st_uid not in (0, os.getuid()):
        pytest.skip("tmp folder owned by someone else")
    check_private(tmp_path / "mine" / "cache")  # /tmp is world-writable but root's: allowed
    assert (os.stat(tmp_path / "mine" / "cache").st_mode & 0o777) == 0o700


def test_refuses_loose_mode(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    d.chmod(0o755)
    with pytest.raises(CacheRefused, match="not 0700"):
        check_private(d)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hand a folder to another uid")
def test_refuses_foreign_owner(tmp_path):
    d = private_dir(tmp_path / "cache")
    os.chown(d, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheRefused, match="owned by uid 54321"):
        check_private(d)


def test_unsafe_cache_warns_once_and_builds_without_it(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    d.chmod(0o777)
    req = request(tmp_path / "o", d)
    m = build(req)
    assert len(req.warnings) == 1 and "build cache disabled" in req.warnings[0] and "0700" in req.warnings[0]
    assert all(mod.status == "compiled" and not mod.cached for mod in m.modules)
    assert not (d / "v1").exists()


def _hold_lock(root: str, key: str, ready, release) -> None:
    with Cache(Path(root)).lock(key):
        ready.set()
        release.wait(10)


def test_lock_excludes_other_processes_and_dies_with_them(tmp_path):
    cache = Cache(private_dir(tmp_path / "c"))
    key = "cd" * 32
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(cache.root), key, ready, release))
    proc.start()
    assert ready.wait(10)
    fd = os.open(cache.entries / "locks" / f"{key}.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc.kill()  # dies holding the lock: the kernel releases it
        proc.join(10)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_concurrent_builds_share_one_cache(tmp_path):
    cache_dir = private_dir(tmp_path / "cache")
    env = dict(os.environ, MAMBA_FORGE_CACHE=str(cache_dir))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "mamba_forge.cli", "build", "--catalog", str(BASIC), "--out", str(tmp_path / f"o{i}"),
             "-q", "--arch", "sm_80,sm_90a", "-j", "2"],
            env=env, stderr=subprocess.PIPE, text=True,
        )
        for i in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "warning" not in err
    digests = [(tmp_path / f"o{i}" / "sm_90a" / "Basic.cubin").read_bytes() for i in range(3)]
    assert digests[0] == digests[1] == digests[2]
    cache = Cache(cache_dir)
    entries = [p for p in (cache_dir / "v1").rglob("*") if p.is_file() and p.parent.name != "locks"]
    parts = [cache.get(p.name) for p in entries]
    assert all(x is not None for x in parts)  # compile results and the build's memos (catalog, library, text)
    assert sum("cubin" in x for x in parts) == 2  # one compile per program, shared by the three builds
    assert not list((cache_dir / "v1").rglob(".tmp-*"))


def test_warm_rebuild_of_fixture_is_fast(tmp_path):
    cache_dir = private_dir(tmp_path / "cache")
    build(request(tmp_path / "o", cache_dir, targets=("sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a")))
    t0 = time.perf_counter()
    m = build(request(tmp_path / "o", cache_dir, targets=("sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a")))
    assert all(mod.cached for mod in m.modules)
    assert time.perf_counter() - t0 < 1.0
