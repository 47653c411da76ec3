"""A rebuild that changes nothing leaves build/manifest.toml alone (issue #26): same bytes, same mtime, though its
programs now come from the cache; a changed source does rewrite it. And what the previous file may be (hostile or
just different) never makes the build keep a manifest that disagrees with this build."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from runtime_support import write_tiny_catalog

from mamba_forge import cli
from mamba_forge.build import builder, manifest_text
from mamba_forge.build.builder import manifest_bytes
from mamba_forge.cli import main
from mamba_forge.core.safety import MAX_MANIFEST_BYTES
from mamba_forge.core.schema import BuildManifest
from mamba_forge.manifest.toml_io import dumps, loads


@pytest.fixture(autouse=True)
def _quiet_consoles(tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))
    monkeypatch.setattr(cli, "out", Console(width=80))
    monkeypatch.setattr(cli, "err", Console(stderr=True, width=80))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny catalog built once for sm_90a through the CLI (its cache kept for the rebuilds)."""
    root = tmp_path_factory.mktemp("rebuild")
    cat = write_tiny_catalog(root / "cat")
    mp = pytest.MonkeyPatch()
    mp.setenv("MAMBA_FORGE_CACHE", str(root / "cache"))
    try:
        assert main(["build", "--catalog", str(cat), "--arch", "sm_90a", "--out", str(root / "b"), "-q"]) == 0
    finally:
        mp.undo()
    return root, cat


def _state(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".mamba-forge.lock"}


def _rebuild(root: Path, cat: Path, out: Path, *extra: str, monkeypatch) -> None:
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(root / "cache"))
    assert main(["build", "--catalog", str(cat), "--arch", "sm_90a", "--out", str(out), "-q", *extra]) == 0


def test_no_change_rebuild_leaves_every_file_alone(built, tmp_path, monkeypatch):
    root, cat = built
    out = tmp_path / "b"
    shutil.copytree(root / "b", out)
    before = _state(out)
    assert b"cached = false" in before["manifest.toml"][0]  # the first build compiled it
    _rebuild(root, cat, out, monkeypatch=monkeypatch)  # every program a cache hit now
    assert _state(out) == before  # bytes and mtime_ns of the manifest and every artifact
    _rebuild(root, cat, out, "--no-cache", monkeypatch=monkeypatch)  # compiled again: same bits, another time
    assert _state(out) == before


def _counting(monkeypatch) -> dict[str, int]:
    """Counts of what a no-change rebuild should not do: write the TOML, load the catalog in full, hash libnvrtc."""
    import mamba_forge.catalog.model as catalog_model
    import mamba_forge.manifest.toml_io as toml_io
    from mamba_forge.build import nvrtc

    calls = {"dumps": 0, "catalog": 0, "libnvrtc": 0}

    def count(name, real):
        def counted(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return counted

    monkeypatch.setattr(toml_io, "dumps", count("dumps", toml_io.dumps))
    monkeypatch.setattr(catalog_model, "_load", count("catalog", catalog_model._load))
    monkeypatch.setattr(nvrtc, "_file_digest", count("libnvrtc", nvrtc._file_digest))
    nvrtc.library_identity.cache_clear()  # as in a new process
    monkeypatch.setattr(nvrtc, "SETTLE_NS", 0)  # a libnvrtc installed a moment ago is remembered too
    return calls


def test_a_no_change_rebuild_skips_the_writer_the_catalog_load_and_the_library_hash(built, tmp_path, monkeypatch):
    """Issue 26: the second no-change rebuild takes the catalog, the library identity and the manifest's text
    from their memos (each checked against the exact bytes it stands for) and leaves every file alone; a
    changed source is loaded, hashed and written again."""
    from mamba_forge.build import nvrtc

    root, cat = built
    out = tmp_path / "b"
    shutil.copytree(root / "b", out)
    calls = _counting(monkeypatch)
    _rebuild(root, cat, out, monkeypatch=monkeypatch)  # whatever memo this state lacked is written now
    before = _state(out)
    for name in calls:
        calls[name] = 0
    nvrtc.library_identity.cache_clear()
    _rebuild(root, cat, out, monkeypatch=monkeypatch)
    assert calls == {"dumps": 0, "catalog": 0, "libnvrtc": 0} and _state(out) == before
    src = cat.parent / "tiny.cu"
    copy = write_tiny_catalog(tmp_path / "cat")
    (copy.parent / "tiny.cu").write_text(src.read_text() + "\n// changed\n")
    _rebuild(root, copy, out, monkeypatch=monkeypatch)
    assert calls["dumps"] == 1 and calls["catalog"] == 1 and _state(out)["manifest.toml"] != before["manifest.toml"]
    nvrtc.library_identity.cache_clear()


def test_the_text_memo_stands_only_for_the_bytes_it_was_written_for(record, tmp_path, monkeypatch):
    """A memo says "these exact bytes are what the writer gives for a record of this plain-data digest": another
    record, other bytes, another writer version are each a miss, and the TOML is written as without a memo."""
    calls = _counting(monkeypatch)
    prev = tmp_path / "manifest.toml"
    hit = replace(record, modules=[replace(m, cached=True, compile_seconds=0.25) for m in record.modules])
    written = dumps(record).encode()
    prev.write_bytes(written)
    builder._text_memo(written, builder._plain_digest(record))
    calls["dumps"] = 0
    assert manifest_bytes(hit, prev) == written and calls["dumps"] == 0  # from the memo: only the cache fields differ
    def without_memo(m):
        with monkeypatch.context() as mp:
            mp.setenv("MAMBA_FORGE_CACHE", "0")
            return manifest_bytes(m, prev)

    for changed in (replace(hit, state_capacity=record.state_capacity + 16),
                    replace(hit, modules=[replace(m, cache_key="0" * 64) for m in hit.modules]),
                    replace(hit, modules=[replace(m, options=[*m.options, "-DX"]) for m in hit.modules])):
        assert manifest_bytes(changed, prev) == dumps(changed).encode() == without_memo(changed)
    # an int time writes "1", which the carve-out still takes for a time: kept as without the memo
    as_int = replace(hit, modules=[replace(m, compile_seconds=1) for m in hit.modules])
    assert manifest_bytes(as_int, prev) == without_memo(as_int) == written
    monkeypatch.setattr(manifest_text, "_text_code_digest", "0" * 64)  # the writer's code changed: no memo applies
    calls["dumps"] = 0
    assert manifest_bytes(hit, prev) == written and calls["dumps"] == 1
    monkeypatch.setattr(manifest_text, "_text_code_digest", None)
    for other in (written.replace(b'catalog = "tiny"', b'catalog = "tinx"'),  # the same length
                  written[:-1] + b" ", written + b"\n", written.replace(b"\n", b"\r\n")):
        prev.write_bytes(other)  # bytes no memo names: written as without a memo
        assert manifest_bytes(hit, prev) == without_memo(hit) == dumps(hit).encode()


def test_changed_source_rewrites_the_manifest(built, tmp_path, monkeypatch):
    root, _ = built
    cat = write_tiny_catalog(tmp_path / "cat")  # a copy to change
    out = tmp_path / "b"
    shutil.copytree(root / "b", out)
    _rebuild(root, cat, out, monkeypatch=monkeypatch)  # same sources in another folder: nothing to change
    before = _state(out)
    src = cat.parent / "tiny.cu"
    src.write_text(src.read_text() + "\n// a changed comment changes the program's digest\n")
    _rebuild(root, cat, out, monkeypatch=monkeypatch)
    after = _state(out)
    assert after["manifest.toml"][0] != before["manifest.toml"][0]
    assert after["manifest.toml"][1] != before["manifest.toml"][1]
    new = loads(after["manifest.toml"][0].decode(), BuildManifest)
    assert new.modules[0].source_sha256 not in before["manifest.toml"][0].decode()
    assert new.modules[0].cached is False  # this build compiled it, and says so


@pytest.fixture(scope="module")
def record(built) -> BuildManifest:
    root, _ = built
    return loads((root / "b" / "manifest.toml").read_text(), BuildManifest)


def test_only_the_cache_fields_are_carried(record, tmp_path):
    prev = tmp_path / "manifest.toml"
    prev.write_bytes(dumps(record).encode())
    hit = replace(record, modules=[replace(m, cached=True, compile_seconds=0.25) for m in record.modules])
    assert manifest_bytes(hit, prev) == prev.read_bytes()  # only how it was got differs: the file stays
    tiny = replace(record, modules=[replace(m, cached=False, compile_seconds=1e-07) for m in record.modules])
    prev.write_bytes(dumps(tiny).encode())
    assert manifest_bytes(hit, prev) == prev.read_bytes()  # any time tomli-w writes (here 1e-07) is carried
    for changed in (replace(record, state_capacity=record.state_capacity + 16),
                    replace(record, targets=["sm_80"]),
                    replace(hit, modules=[replace(m, cache_key="0" * 64) for m in hit.modules]),
                    replace(hit, modules=[replace(m, status="failed") for m in hit.modules])):
        assert manifest_bytes(changed, prev) == dumps(changed).encode()


def _hostile_previous(kind: str, good: bytes, folder: Path) -> Path:
    prev = folder / "manifest.toml"
    if kind == "missing":
        return prev
    if kind == "folder":
        prev.mkdir()
    elif kind == "symlink":
        (folder / "real.toml").write_bytes(good)
        prev.symlink_to(folder / "real.toml")
    elif kind == "fifo":
        os.mkfifo(prev)
    elif kind == "oversize":
        with open(prev, "wb") as f:  # sparse: past the manifest bound without writing 64 MiB
            f.write(good)
            f.truncate(MAX_MANIFEST_BYTES + 1)
    else:
        prev.write_bytes({
            "empty": b"",
            "garbage": b"\xff\xfe\x00 not toml",
            "truncated": good[: len(good) // 2],
            "extra_module_flag": good + b"\n[[modules]]\ncached = true\ncompile_seconds = 1.0\n",
            "no_flags": good.replace(b"cached = true\n", b""),
            "bad_seconds": good.replace(b"compile_seconds = 0.25", b"compile_seconds = 1e999999999"),
            "nan_seconds": good.replace(b"compile_seconds = 0.25", b"compile_seconds = 1..2.3"),
            "inf_seconds": good.replace(b"compile_seconds = 0.25", b"compile_seconds = 1e400"),
            "padded_seconds": good.replace(b"compile_seconds = 0.25", b"compile_seconds = 0.250"),
            "leading_zero": good.replace(b"compile_seconds = 0.25", b"compile_seconds = 00.25"),
            "negative_seconds": good.replace(b"compile_seconds = 0.25", b"compile_seconds = -0.25"),
            "flag_spelling": good.replace(b"cached = true", b"cached = True"),
            "fields_apart": good.replace(b"cached = true\n", b"cached = true\n\n"),
            "other_catalog": good.replace(b'catalog = "tiny"', b'catalog = "other"'),
            "crlf": good.replace(b"\n", b"\r\n"),
            "bom": b"\xef\xbb\xbf" + good,
        }[kind])
    return prev


@pytest.mark.parametrize("kind", ["missing", "folder", "symlink", "fifo", "oversize", "empty", "garbage",
                                  "truncated", "extra_module_flag", "no_flags", "bad_seconds", "nan_seconds",
                                  "inf_seconds", "padded_seconds", "leading_zero", "negative_seconds",
                                  "flag_spelling", "fields_apart",
                                  "other_catalog", "crlf", "bom"])
def test_a_previous_file_that_is_not_this_manifest_is_replaced(record, tmp_path, kind):
    hit = replace(record, modules=[replace(m, cached=True, compile_seconds=0.25) for m in record.modules])
    good = dumps(hit).encode()
    assert b"compile_seconds = 0.25" in good and b'catalog = "tiny"' in good
    builder._text_memo(good, builder._plain_digest(hit))  # a memo for the good bytes changes nothing here
    prev = _hostile_previous(kind, good, tmp_path)
    fresh = replace(record, modules=[replace(m, cached=False, compile_seconds=3.5) for m in record.modules])
    assert manifest_bytes(fresh, prev) == dumps(fresh).encode()


def test_no_cache_build_reads_and_writes_no_memo(built, tmp_path, monkeypatch):
    """--no-cache does what a machine without a cache does: no compile entry and no memo (catalog, compiler
    identity, manifest text, parsed TOML) is read or written; without the flag the same build writes them."""
    from mamba_forge.core import cache as core_cache

    _root, cat = built
    opened = []
    real_open = core_cache.Cache.open
    monkeypatch.setattr(core_cache.Cache, "open", classmethod(lambda cls, loc, *a, **k: opened.append(loc)
                                                              or real_open.__func__(cls, loc, *a, **k)))
    fresh = tmp_path / "fresh-cache"
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(fresh))
    assert main(["build", "--catalog", str(cat), "--arch", "sm_90a", "--out", str(tmp_path / "b1"), "-q",
                 "--no-cache"]) == 0
    opened_at = [loc for loc in opened if loc is not None]  # Cache.open(None) is the builder's "no cache"
    assert opened_at == [] and not fresh.exists(), (opened_at, sorted(p.name for p in fresh.rglob("*")) if fresh.exists() else [])
    assert main(["build", "--catalog", str(cat), "--arch", "sm_90a", "--out", str(tmp_path / "b2"), "-q"]) == 0
    assert [loc for loc in opened if loc is not None] and fresh.is_dir()  # the negative control: without the flag the cache and its memos are used


def test_the_fields_are_found_where_the_pattern_finds_them(record):
    """_fields_in (bytes.find, then the pattern at each line that starts with "cached = ") finds what
    _CACHE_FIELDS.finditer finds, in any text: the real manifest and random pieces of one."""
    import random

    text = dumps(record).encode()
    pieces = [b"cached = true\n", b"cached = false\n", b"compile_seconds = 1.25\n", b"compile_seconds = 1e-07",
              b"\n", b"x", b"cached = ", b"true\n", b" cached = true\n"]
    rng = random.Random(26)
    texts = [text, b"", b"cached = true\ncompile_seconds = 2.0" + text, text + b"\ncached = false\ncompile_seconds = 3.5"]
    texts += [b"".join(rng.choice(pieces) for _ in range(rng.randrange(14))) for _ in range(3000)]
    for t in texts:
        assert [m.group(0) for m in manifest_text._fields_in(t)] == [m.group(0) for m in manifest_text._CACHE_FIELDS.finditer(t)]
    assert len(manifest_text._fields_in(text)) == len(record.modules)  # the control: one per module


def test_the_plain_digest_tells_types_apart_and_not_object_sharing(record):
    one = replace(record, state_capacity=1)
    assert len({builder._plain_digest(replace(record, state_capacity=v)) for v in (1, 1.0, True)}) == 3
    shared = "sm_90a"
    a = replace(one, targets=[shared, shared])
    b = replace(one, targets=["sm_90" + "a"[: len(shared)], "".join(["sm_", "90a"])])  # equal, not the same objects
    assert builder._plain_digest(a) == builder._plain_digest(b) != builder._plain_digest(one)
