"""The parsed-TOML memo (mamba_forge/core/tomlmemo.py) never stands in for other bytes and never serves what it
cannot prove it stored: a changed byte misses, a corrupted, foreign, null-bearing or non-table entry is refused and
the bytes are parsed again, a document tomllib refuses is refused every time, and a tree JSON cannot keep (TOML
dates) is never stored. What a hit returns is exactly, type for type, what tomllib returns. The codec's faster
to_dict and the collector pause are checked here too."""

from __future__ import annotations

import gc
import math
import threading
import tomllib
from pathlib import Path

import pytest
import tomli_w

from mamba_forge.core import tomlmemo
from mamba_forge.core.cache import Cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(d))
    monkeypatch.setattr(tomlmemo, "MIN_BYTES", 1)  # memoise small documents too
    return d


def _entries(cache_dir: Path) -> list[Path]:
    v1 = cache_dir / "v1"
    return [p for p in v1.rglob("*") if p.is_file() and p.parent.name != "locks"] if v1.exists() else []


def _same(a, b) -> bool:
    """Equal and of equal types all the way down (1 is not 1.0 is not True; nan is nan; key order counts)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float and math.isnan(a):
        return math.isnan(b) and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is float:
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


DOC = """
title = "m\\u00e9lange \\"quoted\\" \\\\ null"
count = 3
big = 9223372036854775807
neg = -17
ratio = 1.0
tiny = 5e-324
huge = 1.7976931348623157e308
nz = -0.0
pinf = inf
ninf = -inf
nan = nan
flag = true
off = false
empty_list = []
nested = [[1, 2], ["a"], [[]], [1.5, 2.5]]
inline = { a = 1, "b c" = { d = [true] } }
"dotted.key" = "x"
a.b.c = 1
z = 0

[table]
k = "v"
z = 1
a = 2

[table.sub]

[[arr]]
x = 1

[[arr]]
y = "two"
[arr.t]
q = [1, 2]
"""


def test_a_hit_is_exactly_tomllibs_tree(cache_dir):
    raw = DOC.encode()
    expect = tomllib.loads(DOC)
    first = tomlmemo.parse_toml_bytes(raw)
    assert _same(first, expect) and len(_entries(cache_dir)) == 1
    second = tomlmemo.parse_toml_bytes(raw)
    assert _same(second, expect), (second, expect)
    assert second is not first and second["table"] is not first["table"]  # a fresh tree: callers may change it
    second["table"]["k"] = "changed"
    assert tomlmemo.parse_toml_bytes(raw)["table"]["k"] == "v"


def test_the_memo_is_read_on_a_hit(cache_dir, monkeypatch):
    raw = DOC.encode()
    tomlmemo.parse_toml_bytes(raw)
    calls = []
    monkeypatch.setattr(tomlmemo, "parse_toml", lambda *a, **k: calls.append(1) or tomllib.loads(a[0]))
    assert _same(tomlmemo.parse_toml_bytes(raw), tomllib.loads(DOC)) and calls == []
    tomlmemo.parse_toml_bytes(raw + b"\n")  # other bytes: parsed
    assert calls == [1]


@pytest.mark.parametrize("at", [0.1, 0.5, 0.9])
def test_a_changed_byte_misses(cache_dir, at):
    """Same size, one value changed: the memo of the old bytes is not used."""
    doc = "".join(f'k{i} = "{i:05d}"\n' for i in range(1, 400))
    tomlmemo.parse_toml_bytes(doc.encode())
    i = doc.index(' = "', int(len(doc) * at)) + len(' = "')
    changed = doc[:i] + ("7" if doc[i] != "7" else "8") + doc[i + 1:]
    assert len(changed) == len(doc) and changed != doc
    assert _same(tomlmemo.parse_toml_bytes(changed.encode()), tomllib.loads(changed))
    assert _same(tomlmemo.parse_toml_bytes(doc.encode()), tomllib.loads(doc))
    assert len(_entries(cache_dir)) == 2


def _forge(cache_dir: Path, raw: bytes, parts: dict[str, bytes]) -> None:
    """Replace the memo entry of `raw` with other parts, under its own key (as a bug or a bad disk might)."""
    [entry] = _entries(cache_dir)
    entry.unlink()
    import hashlib

    key = tomlmemo._key(hashlib.sha256(raw).hexdigest(), len(raw))
    assert Cache(cache_dir).put(key, parts) is None


def _source(raw: bytes) -> bytes:
    import hashlib

    return f"{hashlib.sha256(raw).hexdigest()}:{len(raw)}".encode()


BAD_ENTRIES = {
    "null value": lambda raw: {"tree.json": b'{"title": null}', "source": _source(raw)},
    "null in a list": lambda raw: {"tree.json": b'{"title": [1, null]}', "source": _source(raw)},
    "not a table": lambda raw: {"tree.json": b'[1, 2]', "source": _source(raw)},
    "a string": lambda raw: {"tree.json": b'"x"', "source": _source(raw)},
    "not JSON": lambda raw: {"tree.json": b'{"title": ', "source": _source(raw)},
    "not UTF-8": lambda raw: {"tree.json": b'{"t": "\xff"}', "source": _source(raw)},
    "other bytes named": lambda raw: {"tree.json": b'{"title": "forged"}', "source": _source(raw + b" ")},
    "no source": lambda raw: {"tree.json": b'{"title": "forged"}'},
    "no tree": lambda raw: {"source": _source(raw)},
    "too deep": lambda raw: {"tree.json": b"[" * 100_000 + b"]" * 100_000, "source": _source(raw)},
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_a_bad_entry_is_refused_and_the_bytes_parsed(cache_dir, case):
    raw = DOC.encode()
    tomlmemo.parse_toml_bytes(raw)
    _forge(cache_dir, raw, BAD_ENTRIES[case](raw))
    assert _same(tomlmemo.parse_toml_bytes(raw), tomllib.loads(DOC))
    # the bad entry was dropped and a good one written in its place: the next read is a hit of tomllib's tree
    [entry] = _entries(cache_dir)
    assert b'"forged"' not in entry.read_bytes() and b"null}" not in entry.read_bytes()
    assert _same(tomlmemo.parse_toml_bytes(raw), tomllib.loads(DOC))


@pytest.mark.parametrize("where", ["header", "payload", "truncated"])
def test_a_corrupted_entry_is_refused(cache_dir, where):
    raw = DOC.encode()
    tomlmemo.parse_toml_bytes(raw)
    [entry] = _entries(cache_dir)
    blob = bytearray(entry.read_bytes())
    if where == "truncated":
        blob = blob[:-5]
    else:
        i = 20 if where == "header" else len(blob) - 30
        blob[i] ^= 0x01
    entry.write_bytes(bytes(blob))
    assert _same(tomlmemo.parse_toml_bytes(raw), tomllib.loads(DOC))


def test_a_memo_never_answers_for_a_document_tomllib_refuses(cache_dir):
    good = tomli_w.dumps({"a": 1, "b": "x" * 100})
    tomlmemo.parse_toml_bytes(good.encode())
    bad = good.replace("a = 1", "a = = 1")
    for _ in range(2):
        with pytest.raises(tomllib.TOMLDecodeError):
            tomlmemo.parse_toml_bytes(bad.encode())
        with pytest.raises(UnicodeDecodeError):
            tomlmemo.parse_toml_bytes(b"a = '\xff'")
    assert len(_entries(cache_dir)) == 1  # only the good document's


def test_dates_are_not_stored(cache_dir):
    """TOML dates and times have no JSON form: such a tree is parsed every time, never stored approximately."""
    doc = b"when = 2026-01-02T03:04:05Z\nday = 2026-01-02\nat = 03:04:05\nlocal = 2026-01-02T03:04:05\n"
    for _ in range(2):
        assert _same(tomlmemo.parse_toml_bytes(doc), tomllib.loads(doc.decode()))
    assert _entries(cache_dir) == []


def test_small_documents_are_not_memoised(cache_dir, monkeypatch):
    monkeypatch.setattr(tomlmemo, "MIN_BYTES", len(DOC) + 1)
    assert _same(tomlmemo.parse_toml_bytes(DOC.encode()), tomllib.loads(DOC))
    assert _entries(cache_dir) == []


@pytest.mark.parametrize("setting", ["off", "unsafe", "unwritable"])
def test_without_a_usable_cache_every_parse_is_tomllibs(tmp_path, monkeypatch, setting):
    monkeypatch.setattr(tomlmemo, "MIN_BYTES", 1)
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    if setting == "off":
        monkeypatch.setenv("MAMBA_FORGE_CACHE", "0")
    elif setting == "unsafe":
        d.chmod(0o777)
        monkeypatch.setenv("MAMBA_FORGE_CACHE", str(d))
    else:
        (d / "v1").write_text("a file where the entries folder goes")
        monkeypatch.setenv("MAMBA_FORGE_CACHE", str(d))
    for _ in range(2):
        assert _same(tomlmemo.parse_toml_bytes(DOC.encode()), tomllib.loads(DOC))
    assert not (d / "v1").is_dir()


def test_the_key_names_the_python_and_the_format(cache_dir, monkeypatch):
    raw = DOC.encode()
    tomlmemo.parse_toml_bytes(raw)
    monkeypatch.setattr(tomlmemo, "FORMAT", tomlmemo.FORMAT + 1)
    tomlmemo.parse_toml_bytes(raw)
    monkeypatch.setattr(tomlmemo, "PYTHON", "3.99.0")
    tomlmemo.parse_toml_bytes(raw)
    assert len(_entries(cache_dir)) == 3


# ---- the signed path: the memo is read only after the signature verified the exact bytes --------------------


def test_signed_manifest_records_agree_with_and_without_the_memo(tmp_path, monkeypatch, cache_dir):
    from runtime_support import signed_tiny

    from mamba_forge.runtime import signing
    from mamba_forge.runtime.trust import trusted_keys
    from mamba_forge.runtime.verify import open_verified

    t = signed_tiny(tmp_path / "fx")
    keys = trusted_keys([t.pub], defaults=False)
    first = open_verified(t.manifest, keys=keys).manifest
    assert _entries(cache_dir)  # the body's parse was memoised
    second = open_verified(t.manifest, keys=keys).manifest
    monkeypatch.setenv("MAMBA_FORGE_CACHE", "0")
    plain = open_verified(t.manifest, keys=keys).manifest
    assert first == second == plain
    # a body changed by one byte after signing fails its signature before any parse, memo or not
    doc = t.manifest.read_bytes()
    body, _ = signing.split(doc)
    i = body.index(b'level = "quick"')
    t.manifest.write_bytes(doc[:i] + b'level = "fully"' + doc[i + len(b'level = "quick"'):])
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(cache_dir))
    from mamba_forge.runtime import LoadError

    with pytest.raises(LoadError, match="does not verify"):
        open_verified(t.manifest, keys=keys)


# ---- the codec's to_dict and the collector pause --------------------------------------------------------------


def test_to_dict_is_the_plain_data_of_any_record(tmp_path):
    """The fast to_dict agrees with the declared-order, None-dropping conversion for records built every way:
    through the codec, through __init__ with tuples and None inside lists, and with dict fields."""
    import dataclasses

    from mamba_forge.core.codec import from_dict, to_dict
    from mamba_forge.core.schema import QualifiedManifest, Resources, SymbolBuild, Verdict

    def reference(v):
        if dataclasses.is_dataclass(v):
            return {f.name: reference(getattr(v, f.name)) for f in dataclasses.fields(v)
                    if getattr(v, f.name) is not None}
        if type(v) in (list, tuple):
            return [reference(x) for x in v]
        if type(v) is dict:
            return {k: reference(x) for k, x in v.items() if x is not None}
        return v

    res = Resources(registers=32, static_smem=0, stack_frame=0, spill_stores=0, spill_loads=0, max_threads=0,
                    barriers=0, param_bytes=16, param_layout=[(0, 8), [8, None]])
    sym = SymbolBuild(name="k", family="k", dtype="f32", block=(128, 1, 1), dynamic_smem=0, deterministic=True,
                      resources=res, verdict=Verdict(status="admitted"))
    got = to_dict(sym)
    assert _same(got, reference(sym)) and type(got["block"]) is list and type(got["resources"]["param_layout"][0]) is list
    assert got["resources"]["param_layout"][1] == [8, None]
    body = Path(__file__).resolve().parents[2] / "manifests" / "h200.toml"
    from mamba_forge.runtime import signing

    data = tomllib.loads(signing.split(body.read_bytes())[0].decode())
    data.pop("signature", None)
    m = from_dict(QualifiedManifest, data)
    assert _same(to_dict(m), reference(m))


def test_gc_pause_is_reentrant_and_restores_the_collector():
    from mamba_forge.core.codec import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a collector its owner turned off stays off
    finally:
        gc.enable()
    # two threads overlapping: on again only when both are done
    inside, release = threading.Event(), threading.Event()

    def hold():
        with gc_paused():
            inside.set()
            release.wait(5)

    th = threading.Thread(target=hold)
    th.start()
    inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()
    release.set()
    th.join(5)
    assert gc.isenabled()
