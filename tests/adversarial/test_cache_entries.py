"""Hostile build-cache entries and a cache that cannot be written: an entry copied over another key's name, a
symlink or a folder in an entry's place, an oversize entry, a full or read-only disk. The cache never serves what
it was not asked for, never follows a link, and a cache that fails to write only warns; the build goes on."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core import cache as cache_mod
from mamba_forge.core.cache import Cache

BASIC = Path(__file__).resolve().parent.parent / "fixtures" / "build_basic" / "catalog.toml"
RNG = random.Random(7)
KEYS = [f"{RNG.getrandbits(256):064x}" for _ in range(12)]


def private(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


@pytest.mark.parametrize("i", range(6))
def test_an_entry_copied_over_another_key_is_never_served(tmp_path, i):
    cache = Cache(private(tmp_path / "c"))
    a, b = KEYS[2 * i], KEYS[2 * i + 1]
    assert cache.put(a, {"cubin": b"sm_80 bytes " * 10, "meta": b"{}"}) is None
    src, dst = cache._path(a), cache._path(b)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())  # a valid entry, payload hash intact, under the wrong name
    assert cache.get(b) is None and cache.stats.corrupted == 1
    assert not dst.exists() and cache.get(a) is not None


@pytest.mark.parametrize("kind", ["symlink-to-entry", "symlink-to-secret", "dangling-symlink", "folder", "fifo"])
def test_a_non_regular_entry_is_refused_not_followed(tmp_path, kind):
    cache = Cache(private(tmp_path / "c"))
    key = KEYS[0]
    path = cache._path(key)
    path.parent.mkdir(parents=True)
    if kind == "symlink-to-entry":
        cache.put(KEYS[1], {"cubin": b"x", "meta": b"{}"})
        path.symlink_to(cache._path(KEYS[1]))
    elif kind == "symlink-to-secret":
        secret = tmp_path / "secret"
        secret.write_bytes(b"MFCACHE1" + b"\0" * 64)
        path.symlink_to(secret)
    elif kind == "dangling-symlink":
        path.symlink_to(tmp_path / "nothing")
    elif kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)  # would block a plain read forever
    t0 = time.monotonic()
    assert cache.get(key) is None
    assert time.monotonic() - t0 < 2
    assert cache.stats.corrupted == 1
    assert kind == "folder" or not path.is_symlink()


def test_an_oversize_entry_is_refused_without_reading_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "MAX_ENTRY_BYTES", 1024)
    cache = Cache(private(tmp_path / "c"))
    cache.put(KEYS[3], {"cubin": b"y" * 4096, "meta": b"{}"})
    assert cache.get(KEYS[3]) is None and cache.stats.corrupted == 1


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES])
def test_a_cache_that_cannot_be_written_warns_and_the_build_goes_on(tmp_path, monkeypatch, code):
    def fail(*_a, **_k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(cache_mod, "write_atomic_at", fail)
    req = BuildRequest(load_catalog(BASIC), [get_target("sm_90a")], tmp_path / "out", jobs=1,
                       cache_location=private(tmp_path / "cache"))
    bm = build(req)
    assert all(m.status == "compiled" for m in bm.modules)
    assert [w for w in req.warnings if "build cache not written" in w and os.strerror(code) in w]
    assert len([w for w in req.warnings if "build cache" in w]) == 1  # once, not per module
    assert (tmp_path / "out" / "sm_90a" / "Basic.cubin").is_file()


def test_an_unwritable_cache_folder_warns(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through 0500 folders")
    root = private(tmp_path / "cache")
    (root / "v1").mkdir(mode=0o500)
    req = BuildRequest(load_catalog(BASIC), [get_target("sm_90a")], tmp_path / "out", jobs=1, cache_location=root)
    bm = build(req)
    assert all(m.status == "compiled" for m in bm.modules) and req.warnings


@pytest.mark.parametrize("guarded", [True, False], ids=["die_with_parent", "negative-control"])
def test_build_workers_die_with_their_parent(tmp_path, guarded):
    """A build parent killed mid-compile leaves no worker behind (PR_SET_PDEATHSIG); without the initializer
    (the negative control) the workers outlive it, so the check can fail."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux")
    init = "die_with_parent" if guarded else "None"
    code = (
        "import os, sys, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "import multiprocessing as mp\n"
        "from mamba_forge.build.worker import die_with_parent\n"
        "def work(_):\n"
        "    os.write(1, f'{os.getpid()}\\n'.encode()); time.sleep(30)\n"  # one write: lines never interleave
        f"with ProcessPoolExecutor(2, mp_context=mp.get_context('fork'), initializer={init}) as p:\n"
        "    list(p.map(work, range(2)))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(proc.stdout.readline()) for _ in range(2)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + (10 if guarded else 1)
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    if guarded:
        assert not alive, f"workers {alive} outlived their parent"
    else:
        assert alive == pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _mutations(blob: bytes, rng: random.Random) -> list[bytes]:
    """Seeded edits of an encoded entry: a flipped byte anywhere (magic, header length, header, each part), cuts,
    growth, a header whose sizes no longer add up or that names another key."""
    import json
    import struct

    hlen = struct.unpack_from("<I", blob, 8)[0]
    header = json.loads(blob[12 : 12 + hlen])
    out = []
    for _ in range(40):
        i = rng.randrange(len(blob))
        out.append(blob[:i] + bytes([blob[i] ^ (1 << rng.randrange(8))]) + blob[i + 1 :])
    out += [blob[:n] for n in (0, 4, 8, 11, 12, 12 + hlen - 1, 12 + hlen, len(blob) - 1)]
    out += [blob + b"\0", blob + blob[-7:]]

    def with_header(h) -> bytes:
        raw = json.dumps(h, separators=(",", ":")).encode()
        return blob[:8] + struct.pack("<I", len(raw)) + raw + blob[12 + hlen :]

    first = header["parts"][0]
    out += [
        with_header({**header, "parts": [[first[0], first[1] + 1, first[2]], *header["parts"][1:]]}),
        with_header({**header, "parts": [[first[0], first[1] - 1, first[2]], *header["parts"][1:]]}),
        with_header({**header, "parts": header["parts"][1:]}),
        with_header({**header, "parts": [[first[0], -1, first[2]], *header["parts"][1:]]}),
        with_header({**header, "parts": [["sha256.x", first[1], first[2]], *header["parts"][1:]]}),
        with_header({**header, "parts": [[first[0], first[1]], *header["parts"][1:]]}),
        with_header({**header, "parts": [[first[0], str(first[1]), first[2]], *header["parts"][1:]]}),
        with_header({**header, "key": "0" * 64}),
        with_header([]),
        with_header({**header, "parts": {}}),
        blob[:8] + struct.pack("<I", len(blob)) + blob[12:],  # a header length past the end
    ]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_hit_reads_exactly_what_decoding_the_whole_entry_accepts(tmp_path, seed):
    """Cache.get reads each part straight from the file: whatever the whole-blob decoder (_decode) refuses, it
    refuses (and drops); whatever it accepts, it serves with the same parts and digests."""
    rng = random.Random(seed)
    cache = Cache(private(tmp_path / "c"))
    key = KEYS[seed]
    parts = {"cubin": bytes(rng.getrandbits(8) for _ in range(300)), "ptx": b"", "log": b"warning\n" * 5,
             "meta": b'{"ok": true}'}
    assert cache.put(key, parts) is None
    good = cache._path(key).read_bytes()
    assert cache.get(key) == cache_mod._decode(good, key) and cache.get(key)["cubin"] == parts["cubin"]
    for bad in _mutations(good, rng):
        cache._path(key).write_bytes(bad)
        os.chmod(cache._path(key), 0o600)
        expected = cache_mod._decode(bad, key)
        assert cache.get(key) == expected, (len(bad), bad[:64])
        if expected is None:
            assert not cache._path(key).exists()  # a refused entry is removed
