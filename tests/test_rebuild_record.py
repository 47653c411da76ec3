"""The stored stat record (core/cache_stat.py) may be anything: corrupt, truncated, oversized, of another shape,
nested to blow the parser's stack, or lying about what a file holds. Each is treated as absent (every artifact
read and compared, as with no record) and replaced by a good one; the build never fails for it and its outputs
are right. The control: the good record a build stored is trusted (nothing read)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import test_rebuild_stat
from test_rebuild_stat import Reads, artifacts, run, settle, stored

from mamba_forge.core import cache_stat
from mamba_forge.core.cache import cache_key
from mamba_forge.core.cache_stat import MAX_RECORD_BYTES, decode

built, fresh = test_rebuild_stat.built, test_rebuild_stat.fresh  # the same fixtures: a tiny build, copied per test


def _doc(out, cache) -> dict:
    """The stored record as its JSON document."""
    rec = stored(out, cache)
    return {"format": 1, "outputs": _plain(rec.outputs.known), "entries": _plain(rec.entries.known)}


def _plain(known: dict) -> dict:
    return {name: [*key, digest] for name, (key, digest) in known.items()}


def _first(section: dict) -> str:
    return sorted(section)[0]


def _hostile(kind: str, doc: dict) -> bytes:
    """A record's bytes: the good `doc` damaged as `kind` says."""
    out = json.loads(json.dumps(doc))
    name = _first(out["outputs"])
    if kind == "garbage":
        return b"\xff\xfe not json"
    if kind == "empty":
        return b""
    if kind == "truncated":
        text = json.dumps(doc).encode()
        return text[: len(text) // 2]
    if kind == "nested":
        return b"[" * 200_000 + b"]" * 200_000  # past the parser's recursion limit, under the size bound
    if kind == "oversize":
        out["outputs"]["pad"] = ["x" * (MAX_RECORD_BYTES + 1)]
    elif kind == "not_a_dict":
        return json.dumps([doc]).encode()
    elif kind == "other_format":
        out["format"] = 2
    elif kind == "extra_key":
        out["more"] = {}
    elif kind == "missing_section":
        del out["entries"]
    elif kind == "bool_for_int":
        out["outputs"][name][0] = True
    elif kind == "float_for_int":
        out["outputs"][name][1] = float(out["outputs"][name][1])
    elif kind == "huge_int":
        out["outputs"][name][2] = 1 << 80
    elif kind == "short_row":
        out["outputs"][name] = out["outputs"][name][:5]
    elif kind == "upper_digest":
        out["outputs"][name][5] = out["outputs"][name][5].upper()
    elif kind == "short_digest":
        out["outputs"][name][5] = out["outputs"][name][5][:63]
    elif kind == "long_name":
        out["outputs"]["x" * (cache_stat.MAX_NAME + 1)] = out["outputs"][name]
    elif kind == "section_a_list":
        out["entries"] = list(out["entries"].items())
    elif kind == "stale_digest":  # well formed, every stat right, each digest another file's: nothing matches
        for section in ("outputs", "entries"):
            for row in out[section].values():
                row[5] = "0" * 64
        return json.dumps(out).encode()
    return json.dumps(out).encode()


KINDS = [
    "garbage",
    "empty",
    "truncated",
    "nested",
    "oversize",
    "not_a_dict",
    "other_format",
    "extra_key",
    "missing_section",
    "bool_for_int",
    "float_for_int",
    "huge_int",
    "short_row",
    "upper_digest",
    "short_digest",
    "long_name",
    "section_a_list",
]


@pytest.mark.parametrize("kind", KINDS)
def test_decode_refuses_a_record_of_any_other_shape(kind, tmp_path):
    good = {"format": 1, "outputs": {"sm_80/A.cubin": [1, 2, 3, 4, 5, "a" * 64]}, "entries": {}}
    assert decode(json.dumps(good).encode()) == {
        "outputs": {"sm_80/A.cubin": ((1, 2, 3, 4, 5), "a" * 64)},
        "entries": {},
    }  # the control
    assert decode(_hostile(kind, good)) is None


def _record_file(cache, out) -> Path:
    return cache / cache_stat.RECORDS / stored(out, cache).key


def _plant(cache, out, data: bytes, *, how: str = "framed") -> None:
    """Put `data` where `out`'s record is kept: framed as the build frames it (so only its JSON is wrong), or the
    stored file damaged, or something that is not a file."""
    path = _record_file(cache, out)
    blob = path.read_bytes()
    path.unlink()
    if how == "framed":
        path.write_bytes(cache_stat._framed(data))
    elif how in ("truncated_file", "corrupt_file"):
        path.write_bytes(blob[: len(blob) // 2] if how == "truncated_file" else blob[:-3] + b"xyz")
    elif how == "symlink":  # to a good record elsewhere: never followed
        (cache.parent / "elsewhere").write_bytes(blob)
        path.symlink_to(cache.parent / "elsewhere")
    elif how == "fifo":  # never read (a read would block)
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()


def _assert_read_in_full_then_recorded(cat, out, cache, monkeypatch, good: dict[str, bytes]) -> None:
    with monkeypatch.context() as mp:
        reads = Reads(mp, good)
        manifest = run(cat, out, cache)  # never fails for the record
        assert sorted(reads.compared) == sorted(["manifest.toml", *(r.split("/")[1] for r in good)])
    assert artifacts(out) == good and all(m.status == "compiled" for m in manifest.modules)
    assert set(stored(out, cache).outputs.known) == set(good)  # replaced by a good record


@pytest.mark.parametrize("kind", [*KINDS, "stale_digest"])
def test_a_hostile_record_is_ignored_and_replaced(fresh, monkeypatch, kind):
    cat, out, cache = fresh
    settle(cat, out, cache)
    good = artifacts(out)
    doc = _doc(out, cache)
    with monkeypatch.context() as mp:  # the control: the record as stored is trusted, nothing is read
        reads = Reads(mp, good)
        run(cat, out, cache)
        assert reads.compared == ["manifest.toml"]
    _plant(cache, out, _hostile(kind, doc))
    assert (stored(out, cache).outputs.known == {}) == (kind != "stale_digest")  # that one loads, matches nothing
    _assert_read_in_full_then_recorded(cat, out, cache, monkeypatch, good)


@pytest.mark.parametrize("how", ["truncated_file", "corrupt_file", "symlink", "fifo"])
def test_a_damaged_record_file_or_not_a_file_is_absent(fresh, monkeypatch, how):
    cat, out, cache = fresh
    settle(cat, out, cache)
    _plant(cache, out, b"", how=how)
    assert stored(out, cache).outputs.known == {}
    _assert_read_in_full_then_recorded(cat, out, cache, monkeypatch, artifacts(out))
    assert _record_file(cache, out).is_file() and not _record_file(cache, out).is_symlink()


def test_a_folder_in_the_records_place_only_costs_the_record(fresh, monkeypatch):
    cat, out, cache = fresh
    settle(cat, out, cache)
    good = artifacts(out)
    _plant(cache, out, b"", how="folder")
    for _ in range(2):  # it cannot be replaced: each build reads in full, and succeeds
        with monkeypatch.context() as mp:
            reads = Reads(mp, good)
            run(cat, out, cache)
            assert len(reads.compared) == 1 + len(good)
    assert artifacts(out) == good and _record_file(cache, out).is_dir()


def test_an_oversized_record_is_refused_before_it_is_read(fresh, monkeypatch):
    cat, out, cache = fresh
    settle(cat, out, cache)
    path = _record_file(cache, out)
    payload = path.read_bytes()[cache_stat._HEAD :]
    parsed = []
    real = cache_stat.decode
    monkeypatch.setattr(cache_stat, "decode", lambda data: parsed.append(len(data)) or real(data))
    path.write_bytes(cache_stat._framed(payload + b" " * (MAX_RECORD_BYTES - len(payload))))  # JSON takes the spaces
    assert stored(out, cache).outputs.known and parsed == [MAX_RECORD_BYTES]  # the control: at the bound, read
    path.write_bytes(cache_stat._framed(payload + b" " * (MAX_RECORD_BYTES + 1 - len(payload))))
    assert stored(out, cache).outputs.known == {} and parsed == [MAX_RECORD_BYTES]  # a byte over: never parsed
    monkeypatch.undo()
    _assert_read_in_full_then_recorded(cat, out, cache, monkeypatch, artifacts(out))


def test_a_record_names_a_file_only_with_its_exact_stat(fresh):
    """A record for another folder (a copy, or a new folder where the old one was) is not this folder's."""
    cat, out, cache = fresh
    settle(cat, out, cache)
    key = stored(out, cache).key
    moved = out.parent / "moved"
    out.rename(moved)
    assert stored(moved, cache).key != key and stored(moved, cache).outputs.known == {}
    out.mkdir()  # a new folder at the old path: another inode, so another record
    assert stored(out, cache).key != key
    assert key == cache_key(
        {
            "kind": "build-stat-record",
            "format": 1,
            "out": str(out.resolve()),
            "device": moved.stat().st_dev,
            "inode": moved.stat().st_ino,
        }
    )  # the control


def test_cache_clean_removes_the_records_and_follows_no_link(fresh):
    from mamba_forge.build import cache_admin

    cat, out, cache = fresh
    settle(cat, out, cache)
    path = _record_file(cache, out)
    victim = cache.parent / "victim"
    victim.write_bytes(b"not ours")
    (cache / cache_stat.RECORDS / ("f" * 64)).symlink_to(victim)
    assert path.is_file()  # the control
    cache_admin.clean(cache)
    assert not path.exists() and victim.read_bytes() == b"not ours"
    assert (cache / cache_stat.RECORDS / ("f" * 64)).is_symlink()  # a link is neither followed nor removed
