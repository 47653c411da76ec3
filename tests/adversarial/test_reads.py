"""Bounded reads before parsing: non-regular inputs (FIFOs, /dev/zero, folders), oversized files, nesting deep
enough to exhaust a recursive parser, and hostile .tar.gz bundles (bombs, unsafe names, links, devices,
duplicates, members the manifest does not name). Each is refused in one line, quickly, without a traceback."""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
import time
import tracemalloc
import zlib

import pytest
from harden_support import cli, make_fixture, one_line_error
from runtime_support import FakeBackend

from mamba_forge.core.safety import MAX_CATALOG_BYTES, MAX_MANIFEST_BYTES
from mamba_forge.runtime import ArtifactRefused, LoadError, load, signing


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("reads"))


@pytest.fixture(autouse=True)
def _no_user_trust(tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))


def _hostile(tmp_path, kind: str, limit: int):
    return _hostile_at(tmp_path / "in.toml", kind, limit)


def _hostile_at(p, kind: str, limit: int):
    """At path p: a FIFO, a link to /dev/zero or /dev/null, a folder, or (any other kind) a sparse file one byte
    above `limit` (no disk, no memory). Returns p."""
    if kind == "fifo":
        os.mkfifo(p)
    elif kind in ("dev-zero", "dev-null"):
        os.symlink("/" + kind.replace("-", "/"), p)
    elif kind == "folder":
        p.mkdir()
    else:
        with open(p, "wb") as f:
            f.truncate(limit + 1)
    return p


KINDS = ["fifo", "dev-zero", "folder", "oversize"]
COMMANDS = {
    "verify": (lambda p: ("verify", p), MAX_MANIFEST_BYTES, {1}),
    "report": (lambda p: ("report", p), MAX_MANIFEST_BYTES, {2}),  # report: an unreadable input is bad input
    "report-diff": (lambda p: ("report", p, "--diff", p), MAX_MANIFEST_BYTES, {2}),
    "build-catalog": (lambda p: ("build", "--catalog", p, "--out", p.parent / "out"), MAX_CATALOG_BYTES, {2}),
}


# /dev/null as a catalog is an empty file (a schema error, covered in test_catalog_input), not a read refusal
@pytest.mark.parametrize(("command", "kind"), [(c, k) for c in sorted(COMMANDS) for k in KINDS + ["dev-null"]
                                               if (c, k) != ("build-catalog", "dev-null")])
def test_non_regular_and_oversized_inputs(tmp_path, command, kind):
    argv, limit, codes = COMMANDS[command]
    p = _hostile(tmp_path, kind, limit)
    t0 = time.monotonic()
    rc, out, err = cli(*argv(p), timeout=20)
    assert rc in codes and one_line_error(err) and (str(p) in err or "/dev/zero" in err), (rc, err)
    assert time.monotonic() - t0 < 5
    assert not (p.parent / "out").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_load_refuses_non_regular_and_oversized(tmp_path, fx, kind):
    p = _hostile(tmp_path, kind, MAX_MANIFEST_BYTES)
    if kind == "folder":
        with pytest.raises(ArtifactRefused, match="holds no manifest.toml"):
            load(p, trusted_keys=[fx.pub], backend=FakeBackend())
        return
    with pytest.raises(ArtifactRefused, match="regular file|above the limit"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())


@pytest.mark.parametrize("kind", KINDS + ["dev-null"])
def test_read_verified_is_bounded(tmp_path, fx, kind):
    """manifest.qualified.read_verified (the qualifier's and tests' reader) refuses what read_bounded refuses."""
    from mamba_forge.core.errors import ManifestError
    from mamba_forge.manifest.qualified import read_verified

    p = _hostile(tmp_path, kind, MAX_MANIFEST_BYTES)
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as e:
            read_verified(p, signing.load_trusted([fx.pub]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(p) in str(e.value) and re.search("regular file|above the limit|folder", str(e.value)), str(e.value)
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 5 and peak < 4 << 20


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "oversize"])
def test_runtime_table_that_is_not_a_file(tmp_path, fx, kind):
    import shutil

    build = tmp_path / "build"
    shutil.copytree(fx.build, build)
    table = build / "h200.runtime.json"
    table.unlink()
    _hostile_at(table, kind, MAX_MANIFEST_BYTES)
    with pytest.raises(ArtifactRefused, match="runtime table"):
        load(build / "h200.toml", trusted_keys=[fx.pub], backend=FakeBackend())


# ---- deep nesting: the [signature] tail, the head, a table, the runtime table ---------------------------------

DEPTHS = [10, 500, 2000, 100_000]


def _deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_signature_tail(tmp_path, fx, depth):
    doc = fx.manifest.read_bytes()
    body, _ = signing.split(doc)
    p = tmp_path / "deep.toml"
    p.write_bytes(body + b"[signature]\nvalue = " + _deep_array(depth).encode() + b"\n")
    with pytest.raises(LoadError, match="malformed"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())
    rc, _, err = cli("verify", p, "--key", fx.pub)
    assert rc == 1 and one_line_error(err) and "malformed" in err
    rc, _, err = cli("report", p)
    assert "Traceback" not in err


@pytest.mark.parametrize("where", ["head", "table-no-runtime", "inline"])
@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_signed_body(tmp_path, fx, depth, where):
    import tomli_w

    body = dict(fx.body)
    text = tomli_w.dumps(body)
    if where == "head":
        text = f"deep = {_deep_array(depth)}\n" + text
    elif where == "inline":
        text = "deep = " + "{a = " * depth + "1" + "}" * depth + "\n" + text
    else:
        text += f"\n[extra]\ndeep = {_deep_array(depth)}\n"
    p = tmp_path / "deep.toml"
    p.write_bytes(signing.sign(text.encode(), fx.priv))
    with pytest.raises(LoadError):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend(), build=fx.build)
    rc, _, err = cli("verify", p, "--key", fx.pub, "--build", fx.build)
    assert rc == 1 and one_line_error(err)
    rc, _, err = cli("report", p)
    assert rc == 2 and one_line_error(err)


@pytest.mark.parametrize("depth", DEPTHS)
def test_deep_runtime_table(tmp_path, fx, depth):
    import hashlib

    import tomli_w

    table = _deep_array(depth).encode()
    from mamba_forge.core.schema import RUNTIME_KEYS

    keys = list(RUNTIME_KEYS)
    body = {**fx.body, keys[0]: hashlib.sha256(table).hexdigest(), keys[1]: len(table)}
    ordered = {k: body[k] for k in keys} | {k: v for k, v in body.items() if k not in keys}
    p = tmp_path / "deep.toml"
    p.write_bytes(signing.sign(tomli_w.dumps(ordered).encode(), fx.priv))
    (tmp_path / "deep.runtime.json").write_bytes(table)
    with pytest.raises(LoadError, match="runtime table"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend(), build=fx.build)
    rc, _, err = cli("verify", p, "--key", fx.pub, "--build", fx.build)
    assert rc == 1 and one_line_error(err)


# ---- tar bundles --------------------------------------------------------------------------------------------


def _members(fx) -> list[tuple[str, bytes]]:
    with tarfile.open(fx.tar) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers()]


def _tar(entries) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def _reg(name, data: bytes):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name, kind, link=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def test_tar_fixture_loads(fx):
    load(fx.tar, trusted_keys=[fx.pub], backend=FakeBackend()).function("scale_f32")


HOSTILE = {
    "dotdot": lambda m: m + [_reg("../evil", b"x")],
    "dotdot-inner": lambda m: m + [_reg("sm_90a/../../evil", b"x")],
    "absolute": lambda m: m + [_reg("/etc/evil", b"x")],
    "dot-slash-dotdot": lambda m: m + [_reg("./../evil", b"x")],
    "empty-name-dot": lambda m: m + [_reg(".", b"x")],
    "symlink": lambda m: m + [_special("link", tarfile.SYMTYPE, "/etc/passwd")],
    "hardlink": lambda m: m + [_special("hard", tarfile.LNKTYPE, "manifest.toml")],
    "chardev": lambda m: m + [_special("zero", tarfile.CHRTYPE)],
    "blockdev": lambda m: m + [_special("disk", tarfile.BLKTYPE)],
    "fifo": lambda m: m + [_special("pipe", tarfile.FIFOTYPE)],
    "duplicate-artifact": lambda m: m + [m[-1]],
    "duplicate-manifest": lambda m: m[:1] + m,
    "unnamed-extra": lambda m: m + [_reg("extra.bin", b"x")],
    "wrong-size": lambda m: m[:-1] + [_reg(m[-1][0].name, m[-1][1] + b"\0")],
    "manifest-not-first": lambda m: m[1:] + m[:1],
    "no-manifest": lambda m: m[1:],
    "symlink-as-artifact": lambda m: m[:-1] + [_special(m[-1][0].name, tarfile.SYMTYPE, "/dev/zero")],
    "hardlink-as-artifact": lambda m: m[:-1] + [_special(m[-1][0].name, tarfile.LNKTYPE, "manifest.toml")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_tar_members(tmp_path, fx, case):
    members = [_reg(n, d) for n, d in _members(fx)]
    p = tmp_path / "b.tar.gz"
    p.write_bytes(_tar(HOSTILE[case](members)))
    with pytest.raises(ArtifactRefused) as exc:
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())
    assert "\n" not in str(exc.value)
    rc, _, err = cli("verify", p, "--key", fx.pub)
    assert rc == 1 and one_line_error(err)


def _bomb(path, member_size: int, *, first: str = "manifest.toml") -> None:
    """A .tar.gz whose one member is `member_size` zero bytes, written in fully flushed deflate blocks: the same
    compressed block repeated, so a 4 GiB member costs a few MB and no 4 GiB buffer (the gzip trailer is not
    meaningful; the reader must stop long before it)."""
    info = tarfile.TarInfo(first)
    info.size = member_size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = 1 << 20
    with open(path, "wb") as f:
        f.write(comp.compress(header) + comp.flush(zlib.Z_FULL_FLUSH))
        block = comp.compress(bytes(chunk)) + comp.flush(zlib.Z_FULL_FLUSH)
        for _ in range(member_size // chunk):
            f.write(block)
        f.write(comp.flush())


@pytest.mark.parametrize(("first", "size"), [("manifest.toml", 4 << 30), ("manifest.toml", MAX_MANIFEST_BYTES + 512),
                                             ("runtime.json", 4 << 30), ("anything", 4 << 30)])
def test_tar_bomb_is_refused_fast_and_small(tmp_path, fx, first, size):
    p = tmp_path / "bomb.tar.gz"
    _bomb(p, size, first=first)
    assert p.stat().st_size < 8 << 20
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(ArtifactRefused, match="above the limit|first member"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 0.5 and peak < 100 << 20, (elapsed, peak)


@pytest.mark.parametrize(("size", "words"), [(4 << 30, "the manifest says"), (1 << 30, "the manifest says"),
                                             (1 << 20, "the manifest says")])
def test_artifact_bomb_behind_a_valid_manifest(tmp_path, fx, size, words):
    """A real manifest and runtime table, then a member the manifest names with a 4 GiB header: refused by the
    size the manifest records, before its data."""
    members = _members(fx)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members[:2]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    prefix = raw.getvalue()
    while prefix.endswith(bytes(512)):
        prefix = prefix[:-512]
    info = tarfile.TarInfo(members[2][0])
    info.size = size
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    p = tmp_path / "b.tar.gz"
    with open(p, "wb") as f:
        f.write(comp.compress(prefix + info.tobuf(format=tarfile.GNU_FORMAT)) + comp.flush(zlib.Z_FULL_FLUSH))
        block = comp.compress(bytes(1 << 20)) + comp.flush(zlib.Z_FULL_FLUSH)
        for _ in range(size >> 20):
            f.write(block)
        f.write(comp.flush())
    t0 = time.perf_counter()
    with pytest.raises(ArtifactRefused, match=words):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("cut", [10, 100, 1000, 3000, -100])
def test_truncated_tar(tmp_path, fx, cut):
    raw = fx.tar.read_bytes()
    p = tmp_path / "t.tar.gz"
    p.write_bytes(raw[:cut])
    with pytest.raises(ArtifactRefused):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "oversize-sparse"])
def test_tar_path_that_is_not_a_file(tmp_path, fx, kind):
    p = _hostile_at(tmp_path / "b.tar.gz", kind, 1 << 31)
    with pytest.raises(ArtifactRefused, match="regular file|larger than"):
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())


# ---- multi-member gzip (the bundle writer's text member + stored artifact member) ---------------------------


def test_bundle_is_a_compressed_text_member_then_a_stored_artifact_member(fx):
    """What mamba-forge bundle writes: manifest and runtime table deflated, artifacts stored (the loader's cold
    start), read back by tarfile and by the loader as one tar stream."""
    raw = fx.tar.read_bytes()
    d = zlib.decompressobj(wbits=31)
    first = d.decompress(raw)
    assert d.eof and d.unused_data[:2] == b"\x1f\x8b"  # a second gzip member follows
    with tarfile.open(fileobj=io.BytesIO(first + bytes(1024))) as t:
        assert [m.name for m in t.getmembers()] == ["manifest.toml", "runtime.json"]
    second = d.unused_data
    assert second[10] & 0x06 == 0  # its first deflate block is stored (BTYPE 00)
    assert [n for n, _ in _members(fx)][:2] == ["manifest.toml", "runtime.json"] and len(_members(fx)) > 2


def _split_members(raw: bytes, pieces: int) -> bytes:
    """The same tar stream re-written as `pieces` gzip members of about equal size."""
    body = gzip.decompress(raw)  # every member (zlib.decompress stops after the first)
    step = -(-len(body) // pieces)
    return b"".join(gzip.compress(body[i:i + step], mtime=0) for i in range(0, len(body), step))


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 64])
def test_any_split_into_gzip_members_loads(tmp_path, fx, pieces):
    p = tmp_path / "m.tar.gz"
    p.write_bytes(_split_members(fx.tar.read_bytes(), pieces))
    load(p, trusted_keys=[fx.pub], backend=FakeBackend()).function("scale_f32")


@pytest.mark.parametrize("tail", [b"\0" * 16, b"garbage!", b"\x1f\x8b\x08\0\0\0\0\0\0\xff", b"\x1f\x8b"])
def test_junk_where_a_next_member_would_be_is_refused(tmp_path, fx, tail):
    """A member boundary inside the tar stream followed by bytes that are not a gzip member: one line, exit 1."""
    body = gzip.decompress(fx.tar.read_bytes())
    p = tmp_path / "j.tar.gz"
    p.write_bytes(gzip.compress(body[:1536], mtime=0) + tail)
    with pytest.raises(ArtifactRefused) as exc:
        load(p, trusted_keys=[fx.pub], backend=FakeBackend())
    assert "\n" not in str(exc.value)
    rc, _, err = cli("verify", p, "--key", fx.pub)
    assert rc == 1 and one_line_error(err)


def test_a_bomb_spread_over_many_members_is_capped(monkeypatch):
    """The decompressed-size cap counts every member, not each one."""
    from mamba_forge.runtime import sources

    member = gzip.compress(bytes(1 << 20), mtime=0)
    stream = io.BytesIO(member * 40)  # 40 MB of zeros in 40 members, ~40 KB compressed
    inflater = sources._Inflater(stream, 8 << 20, "bundle test")
    with pytest.raises(ArtifactRefused, match="decompresses to more than"):
        while inflater.read(1 << 20):
            pass
