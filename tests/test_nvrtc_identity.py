"""The compiler's identity (build/nvrtc.py library_identity: NVRTC's version, the wheels' versions, the sha256 of
the loaded libnvrtc) goes into every cache key and every build manifest. Its memo skips hashing the 109 MB library
on each build, and must never serve the digest of other bytes: a write to the file (even one that keeps its size
and mtime), a file put in its place, another wheel version, a file changed just before it was hashed, a bad entry
or no cache all mean hashing again. A stand-in library file and version are used; the last test checks the real one."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from mamba_forge.build import nvrtc
from mamba_forge.core.cache import Cache


@pytest.fixture
def lib(tmp_path, monkeypatch):
    """A stand-in libnvrtc (settled: hashed before any change is made), a private cache, a count of hashes."""
    path = tmp_path / "libnvrtc.so.13"
    path.write_bytes(b"A" * 8192)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(cache))
    monkeypatch.setattr(nvrtc, "_loaded_library_path", lambda: str(path))
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    # the file is new: settled whatever the file clock says (a file time a little ahead of time.time_ns() made the
    # memo's "older than SETTLE_NS" test fail now and then); the settle rule has its own test
    monkeypatch.setattr(nvrtc, "SETTLE_NS", -10 * 10**9)
    hashed: list[str] = []
    real = nvrtc._file_digest
    monkeypatch.setattr(nvrtc, "_file_digest", lambda p: hashed.append(p) or real(p))
    nvrtc.library_identity.cache_clear()
    yield path, hashed, cache
    nvrtc.library_identity.cache_clear()


def _identity() -> dict[str, str]:
    nvrtc.library_identity.cache_clear()  # a new process, as far as the memo is concerned
    return nvrtc.library_identity()


def test_the_second_process_does_not_hash_and_gets_the_same_identity(lib):
    path, hashed, _ = lib
    first = _identity()
    assert first["libnvrtc_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and len(hashed) == 1
    second = _identity()
    assert second == first and list(second) == list(first) and len(hashed) == 1  # same keys, same order
    assert list(first) == ["nvrtc_version", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "cuda-bindings",
                           "libnvrtc_sha256"]


def test_a_read_that_moves_the_access_time_still_leaves_the_identity_remembered(lib, monkeypatch):
    """Hashing reads the library, which may move its access time (relatime); the memo compares the file's identity
    (device, inode, size, mtime, ctime), not the whole stat result, so the next process does not hash again."""
    import types

    path, hashed, _ = lib
    real, calls = nvrtc._stat, []

    def stat_read_moved(p):
        st = real(p)
        calls.append(p)
        if st is None or len(calls) % 2:  # the stat before the hash: as it is
            return st
        fields = {k: getattr(st, k) for k in dir(st) if k.startswith("st_")}
        return types.SimpleNamespace(**{**fields, "st_atime": st.st_atime + 5, "st_atime_ns": st.st_atime_ns + 5 * 10**9})

    monkeypatch.setattr(nvrtc, "_stat", stat_read_moved)
    first = _identity()
    assert _identity() == first and len(hashed) == 1
    moved = types.SimpleNamespace(**{k: getattr(os.stat(path), k) for k in dir(os.stat(path)) if k.startswith("st_")})
    assert nvrtc._file_key(moved) == nvrtc._file_key(os.stat(path))
    moved.st_ctime_ns += 1  # a write: another file as far as the memo is concerned
    assert nvrtc._file_key(moved) != nvrtc._file_key(os.stat(path))


def _later() -> None:
    time.sleep(0.05)  # past the file clock's tick, so a change shows in the file's times


CHANGES = {
    "appended": lambda p: p.write_bytes(p.read_bytes() + b"B"),
    "same size and mtime": lambda p: _same_size_same_mtime(p),
    "replaced by another file": lambda p: _replace(p, b"C" * 8192),
    "replaced by a copy of itself": lambda p: _replace(p, p.read_bytes()),
    "truncated": lambda p: p.write_bytes(b""),
}


def _same_size_same_mtime(p) -> None:
    st = p.stat()
    p.write_bytes(b"Z" * st.st_size)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_mtime_ns == st.st_mtime_ns and p.stat().st_size == st.st_size


def _replace(p, data: bytes) -> None:
    tmp = p.with_name("new.so")
    tmp.write_bytes(data)
    os.replace(tmp, p)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_to_the_file_hashes_it_again(lib, change):
    path, hashed, _ = lib
    _identity()
    _later()
    CHANGES[change](path)
    got = _identity()
    assert len(hashed) == 2 and got["libnvrtc_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_another_wheel_version_hashes_again(lib, monkeypatch):
    _, hashed, _ = lib
    _identity()
    real = nvrtc._dist_version
    monkeypatch.setattr(nvrtc, "_dist_version", lambda n: "13.0.99" if n == "nvidia-cuda-nvrtc" else real(n))
    assert _identity()["nvidia-cuda-nvrtc"] == "13.0.99" and len(hashed) == 2


def test_a_file_changed_just_before_it_was_hashed_is_not_remembered(lib, monkeypatch):
    """Two writes within one tick of the file clock can leave its times as they were: a file younger than
    SETTLE_NS is hashed every time until it settles."""
    path, hashed, _ = lib
    monkeypatch.setattr(nvrtc, "SETTLE_NS", 3_600 * 10**9)
    _identity()
    _identity()
    assert len(hashed) == 2
    monkeypatch.setattr(nvrtc, "SETTLE_NS", -10 * 10**9)  # settled (see the fixture)
    _identity()
    _identity()
    assert len(hashed) == 3


BAD = {
    "not JSON": b"{",
    "a list": b"[]",
    "a short digest": b'{"libnvrtc_sha256": "abc", "nvrtc_version": "13.0"}',
    "an upper-case digest": ('{"libnvrtc_sha256": "' + "A" * 64 + '", "nvrtc_version": "13.0"}').encode(),
    "a version that is no version": ('{"libnvrtc_sha256": "' + "a" * 64 + '", "nvrtc_version": "x"}').encode(),
    "an extra key": ('{"libnvrtc_sha256": "' + "a" * 64 + '", "nvrtc_version": "13.0", "x": "y"}').encode(),
    "a number for a version": ('{"libnvrtc_sha256": "' + "a" * 64 + '", "nvrtc_version": 13}').encode(),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_entry_is_refused(lib, case):
    path, hashed, cache = lib
    first = _identity()
    entries = [p for p in (cache / "v1").rglob("*") if p.is_file() and p.parent.name != "locks"]
    [entry] = entries
    assert Cache(cache).put(entry.name, {"identity": BAD[case]}) is None
    assert _identity() == first and len(hashed) == 2


@pytest.mark.parametrize("setting", ["0", "relative/path"])
def test_without_a_usable_cache_the_library_is_hashed_each_time(lib, monkeypatch, setting):
    _, hashed, _ = lib
    monkeypatch.setenv("MAMBA_FORGE_CACHE", setting)
    _identity()
    _identity()
    assert len(hashed) == 2


def test_no_library_found_has_no_digest_and_no_memo(lib, monkeypatch):
    _, hashed, cache = lib
    monkeypatch.setattr(nvrtc, "_loaded_library_path", lambda: None)
    ident = _identity()
    assert "libnvrtc_sha256" not in ident and hashed == [] and not (cache / "v1").exists()


def test_the_real_library_identity_is_the_same_from_the_memo(tmp_path, monkeypatch):
    if nvrtc._loaded_library_path() is None:
        pytest.skip("no libnvrtc here")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(cache))
    try:
        nvrtc.library_identity.cache_clear()
        first = nvrtc.library_identity()
        nvrtc.library_identity.cache_clear()
        monkeypatch.setattr(nvrtc, "_file_digest", lambda p: pytest.fail("hashed again"))
        assert nvrtc.library_identity() == first
    finally:
        nvrtc.library_identity.cache_clear()
