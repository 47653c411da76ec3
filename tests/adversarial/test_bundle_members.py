"""A .tar.gz bundle's members are checked against the verified manifest at their headers, before their data:
an unknown name, a size other than the manifest's, a duplicate, a link, device or FIFO, and a stream inflating
past what the manifest declares (a gzip bomb) are refused in one line, fast, and in memory bounded by the
manifest, wherever in the archive they sit: between the manifest and its runtime table (where the runtime table
belongs), after the table, or after the artifacts. Both load() and `mamba-forge verify`."""

from __future__ import annotations

import re
import tarfile
import time
import tracemalloc
import zlib

import pytest
from harden_support import cli, make_fixture, one_line_error
from runtime_support import FakeBackend

from mamba_forge.runtime import ArtifactRefused, load
from mamba_forge.runtime.trust import trusted_keys
from mamba_forge.runtime.verify import open_verified

GIB = 1 << 30
MB = 1 << 20


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("bundle-members"))


@pytest.fixture(scope="module")
def members(fx) -> list[tuple[str, bytes]]:
    with tarfile.open(fx.tar) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers()]


@pytest.fixture(autouse=True)
def _no_user_trust(tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))


# ---- archive pieces: each a list of ("bytes", b) or ("zeros", n) to compress in order ----------------------------


def _header(name: str, size: int, kind=tarfile.REGTYPE, link: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = size, kind, link
    return info.tobuf(format=tarfile.GNU_FORMAT)


def reg(name: str, data: bytes):
    return [("bytes", _header(name, len(data)) + data + bytes(-len(data) % 512))]


def sparse(name: str, declared: int, payload: int = 1024):
    """A header claiming `declared` bytes followed by a short payload: the data the header promises is absent."""
    return [("bytes", _header(name, declared) + bytes(payload))]


def zeros(name: str, size: int):
    """A header and `size` real zero bytes (a few KB compressed per GiB)."""
    return [("bytes", _header(name, size)), ("zeros", size)]


def special(name: str, kind, link: str = ""):
    return [("bytes", _header(name, 0, kind, link))]


END = [("bytes", bytes(1024))]


def write_archive(path, pieces) -> None:
    """One gzip member; zero runs are one compressed MB written again and again (fully flushed deflate blocks
    stand alone), so the trailer's CRC does not cover them: the reader must refuse long before it."""
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    block = None
    with open(path, "wb") as f:
        for kind, value in pieces:
            if kind == "bytes":
                f.write(comp.compress(value) + comp.flush(zlib.Z_FULL_FLUSH))
                continue
            whole, rest = divmod(value, MB)
            for _ in range(whole):
                if block is None:
                    block = comp.compress(bytes(MB)) + comp.flush(zlib.Z_FULL_FLUSH)
                f.write(block)
            f.write(comp.compress(bytes(rest)) + comp.flush(zlib.Z_FULL_FLUSH))
        f.write(comp.flush())


# ---- the hostile members ----------------------------------------------------------------------------------------


def _artifact(m):
    return m[2]  # the first artifact (sm_90a/Tiny.cubin)


HOSTILE = {
    "unknown-small": lambda m: reg("extra.bin", b"x"),
    "unknown-1gib-sparse": lambda m: sparse("extra.bin", GIB),
    "unknown-1gib-real": lambda m: zeros("extra.bin", GIB),
    "unknown-under-folder": lambda m: reg("sm_90a/other.cubin", b"\0" * 64),
    "artifact-name-1gib-sparse": lambda m: sparse(_artifact(m)[0], GIB),
    "artifact-name-larger": lambda m: reg(_artifact(m)[0], _artifact(m)[1] + b"\0"),
    "artifact-name-smaller": lambda m: reg(_artifact(m)[0], _artifact(m)[1][:-1]),
    "artifact-name-empty": lambda m: reg(_artifact(m)[0], b""),
    "duplicate-manifest": lambda m: reg(*m[0]),
    "duplicate-runtime-table": lambda m: reg(*m[1]),
    "symlink": lambda m: special("link", tarfile.SYMTYPE, "/etc/passwd"),
    "hardlink": lambda m: special("hard", tarfile.LNKTYPE, "manifest.toml"),
    "symlink-as-artifact": lambda m: special(_artifact(m)[0], tarfile.SYMTYPE, "/dev/zero"),
    "hardlink-as-artifact": lambda m: special(_artifact(m)[0], tarfile.LNKTYPE, "manifest.toml"),
    "chardev": lambda m: special("zero", tarfile.CHRTYPE),
    "blockdev": lambda m: special("disk", tarfile.BLKTYPE),
    "fifo": lambda m: special("pipe", tarfile.FIFOTYPE),
    "fifo-as-artifact": lambda m: special(_artifact(m)[0], tarfile.FIFOTYPE),
    # the end of the archive, then ~100 MB of zeros (~100 KB compressed): inflated past the declared total
    "gzip-bomb-after-end": lambda m: END + [("zeros", 100 * MB)],
    "gzip-bomb-member": lambda m: zeros("bomb.bin", 100 * MB),
}

SAYS = {"unknown": "does not name|where the runtime table belongs", "gzip-bomb-member": "does not name|where the",
        "artifact-name": "the manifest says|twice|where the runtime table belongs", "duplicate": "twice",
        "gzip-bomb-after-end": "decompresses to more than"}


def says(case: str) -> str:
    return next((v for k, v in SAYS.items() if case.startswith(k)), "not a regular file")


# where the hostile piece goes: between manifest and runtime table, after the table, after the artifacts
WHERE = {"second": 1, "after-table": 2, "last": None}


def hostile_archive(path, members, case: str, where: str) -> None:
    bad = HOSTILE[case](members)
    at = WHERE[where]
    pieces = []
    for i, (name, data) in enumerate(members):
        if i == at:
            pieces += bad
        pieces += reg(name, data)
    if at is None:
        pieces += bad
    write_archive(path, pieces + END)


def _bounded(fn):
    """(exception, seconds, peak traced bytes) of fn(), which must raise."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned for the caller's assertions
        err = exc
    else:
        err = None
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, elapsed, peak


CASES = [(c, w) for c in sorted(HOSTILE) for w in WHERE]


@pytest.mark.parametrize(("case", "where"), CASES)
def test_load_refuses_before_reading_data(tmp_path, fx, members, case, where, monkeypatch):
    # memo off: a memo hit reads its cache entry with a 256 MiB read(n) (build/cache.py), not this path's cost
    monkeypatch.setenv("MAMBA_FORGE_CACHE", "0")
    p = tmp_path / "b.tar.gz"
    hostile_archive(p, members, case, where)
    assert p.stat().st_size < 4 * MB  # the 1 GiB and 100 MB members cost the file almost nothing
    backend = FakeBackend()  # made outside the measure: it holds a fake device memory of its own
    err, elapsed, peak = _bounded(lambda: load(p, trusted_keys=[fx.pub], backend=backend))
    assert isinstance(err, ArtifactRefused) and re.search(says(case), str(err)), repr(err)
    assert "\n" not in str(err) and str(p) in str(err), str(err)
    assert elapsed < 1.0 and peak < 50 * MB, (elapsed, peak)


@pytest.mark.parametrize(("case", "where"), CASES)
def test_verify_refuses_before_reading_data(tmp_path, fx, members, case, where):
    """The verify path (open_verified, hash_all, the full body): the same refusal, as bounded."""
    p = tmp_path / "b.tar.gz"
    hostile_archive(p, members, case, where)
    keys = trusted_keys([fx.pub], defaults=False)
    err, elapsed, peak = _bounded(lambda: open_verified(p, keys=keys))
    assert isinstance(err, ArtifactRefused) and re.search(says(case), str(err)) and "\n" not in str(err), repr(err)
    assert elapsed < 1.0 and peak < 50 * MB, (elapsed, peak)


@pytest.mark.parametrize("case", ["unknown-1gib-real", "unknown-1gib-sparse", "gzip-bomb-after-end", "symlink",
                                  "duplicate-runtime-table", "artifact-name-larger"])
def test_cli_verify_one_line(tmp_path, fx, members, case):
    p = tmp_path / "b.tar.gz"
    hostile_archive(p, members, case, "second" if case != "gzip-bomb-after-end" else "last")
    rc, out, err = cli("verify", p, "--key", fx.pub, timeout=30)
    assert rc == 1 and one_line_error(err) and not out and re.search(says(case), err), (rc, out, err)


def test_the_runtime_table_belongs_second(tmp_path, fx, members):
    p = tmp_path / "b.tar.gz"
    hostile_archive(p, members, "unknown-1gib-real", "second")
    with pytest.raises(ArtifactRefused, match="is missing: its second member is extra.bin"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())


@pytest.mark.parametrize("padding", [0, 512, 10240])
def test_good_bundle_with_record_padding_loads(tmp_path, fx, members, padding):
    """Positive: the same members with the end blocks and up to a record of padding load (the declared total
    allows for what tar writers put there)."""
    p = tmp_path / "g.tar.gz"
    pieces = [piece for name, data in members for piece in reg(name, data)]
    write_archive(p, pieces + END + [("bytes", bytes(padding))])
    load(p, trusted_keys=[fx.pub], backend=FakeBackend()).function("scale_f32")


def test_padding_past_a_record_is_refused(tmp_path, fx, members):
    p = tmp_path / "g.tar.gz"
    pieces = [piece for name, data in members for piece in reg(name, data)]
    write_archive(p, pieces + END + [("bytes", bytes(tarfile.RECORDSIZE + 1024))])
    with pytest.raises(ArtifactRefused, match="decompresses to more than"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())
