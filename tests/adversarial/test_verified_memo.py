"""The loader refuses a signed body whose tables disagree with its runtime table, as `verify` does, and checks
the whole body once per machine (the verified-body memo, runtime/memo.py), never trusting a memo that does not
name these exact bytes.

Generated cases: seeded edits of one value below the head (the symbols, artifacts, toolchain and check tables),
re-signed with the trusted key while the runtime table stays as it was; load() and full verification must agree
on every one, with a fresh memo folder and after the other path filled it."""

from __future__ import annotations

import logging
import random
import re
import shutil

import pytest
from harden_support import make_fixture
from runtime_support import FakeBackend

from mamba_forge.core.cache import Cache
from mamba_forge.runtime import LoadError, load, memo, signing
from mamba_forge.runtime import verify as verify_mod
from mamba_forge.runtime.trust import trusted_keys
from mamba_forge.runtime.verify import open_verified

N = 60


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("memo"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(d))
    memo._warned.clear()
    return d


def _copy(fx, tmp_path, body: bytes):
    folder = tmp_path / "b"
    shutil.copytree(fx.build, folder)
    (folder / "h200.toml").write_bytes(signing.sign(body, fx.priv))
    return folder / "h200.toml"


def _keys(fx):
    return trusted_keys([fx.pub], defaults=False)


def _load(fx, manifest):
    return load(manifest, trusted_keys=_keys(fx), default_keys=False, backend=FakeBackend())


def _count_parses(monkeypatch) -> list:
    """From now on, one entry per whole-body TOML parse (verify's _parse_body)."""
    calls: list = []
    real = verify_mod._parse_body
    monkeypatch.setattr(verify_mod, "_parse_body", lambda *a: calls.append(1) or real(*a))
    return calls


def _outcome(call) -> str | None:
    try:
        call()
    except LoadError as exc:
        return str(exc)
    return None


def _edit_below_head(rng: random.Random, body: bytes) -> bytes:
    text = body.decode()
    head_end = re.search(r"(?m)^\[", text).start()
    lines = text[head_end:].splitlines(keepends=True)
    candidates = [i for i, ln in enumerate(lines) if re.match(r"^[a-z_]+ = (\d+|true|false|\"[^\"]*\")\n$", ln)]
    i = rng.choice(candidates)
    key, value = lines[i].rstrip("\n").split(" = ", 1)
    if value in ("true", "false"):
        value = "false" if value == "true" else "true"
    elif value.startswith('"'):
        value = value[:-1] + rng.choice(["x", "0", " "]) + '"'
    else:
        value = str(int(value) + rng.choice([1, 16, 4096]))
    lines[i] = f"{key} = {value}\n"
    return (text[:head_end] + "".join(lines)).encode()


@pytest.mark.parametrize("seed", range(N))
def test_a_signed_body_edit_below_the_head_is_refused_by_load_exactly_when_verify_refuses(tmp_path, fx, cache_dir,
                                                                                       seed):
    body, _ = signing.split(fx.manifest.read_bytes())
    manifest = _copy(fx, tmp_path, _edit_below_head(random.Random(seed), body))
    first = _outcome(lambda: _load(fx, manifest))  # no memo yet: the loader checks the whole body
    full = _outcome(lambda: open_verified(manifest, keys=_keys(fx)))
    again = _outcome(lambda: _load(fx, manifest))  # after verify ran (and remembered, when it passed)
    assert (first is None) == (full is None) == (again is None), (first, full, again)


def test_the_projection_mismatch_is_named(tmp_path, fx, cache_dir):
    body, _ = signing.split(fx.manifest.read_bytes())
    edited = re.sub(rb"(?m)^dynamic_smem = 0$", b"dynamic_smem = 64", body, count=1)
    assert edited != body
    manifest = _copy(fx, tmp_path, edited)
    with pytest.raises(LoadError, match="not the projection of its signed body"):
        _load(fx, manifest)


def test_a_memo_skips_the_body_parse_and_only_for_these_bytes(tmp_path, fx, cache_dir, monkeypatch):
    _load(fx, fx.manifest)  # checks the whole body, remembers
    calls = _count_parses(monkeypatch)
    _load(fx, fx.manifest)
    assert calls == []  # the memo served
    body, _ = signing.split(fx.manifest.read_bytes())
    edited = re.sub(rb"(?m)^dynamic_smem = 0$", b"dynamic_smem = 64", body, count=1)
    other = _copy(fx, tmp_path, edited)  # other bytes, the same runtime table: no memo names them
    with pytest.raises(LoadError, match="not the projection"):
        _load(fx, other)
    assert calls == [1]


def test_a_memo_naming_another_table_or_a_broken_entry_is_not_trusted(tmp_path, fx, cache_dir, monkeypatch):
    doc = fx.manifest.read_bytes()
    key = memo._key(doc)
    cache = Cache(cache_dir)
    calls = _count_parses(monkeypatch)
    cache.put(key, {memo.TABLE_PART: b"0" * 64})  # a memo for another runtime table
    _load(fx, fx.manifest)
    assert calls == [1]
    entry = cache._path(key)
    for broken in (b"garbage", entry.read_bytes()[:-1] + b"!"):  # not an entry; a payload that fails its sha256
        entry.write_bytes(broken)
        _load(fx, fx.manifest)
    assert calls == [1, 1, 1]
    entry.unlink()
    entry.symlink_to(tmp_path / "elsewhere")  # a symlink in the entry's place is refused, never followed
    _load(fx, fx.manifest)
    assert len(calls) == 4
    _load(fx, fx.manifest)  # the last full check rewrote a good memo
    assert len(calls) == 4


def test_without_a_usable_cache_every_load_checks_the_whole_body(tmp_path, fx, monkeypatch, caplog):
    calls = _count_parses(monkeypatch)
    unsafe = tmp_path / "open"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    for value in ("0", "off", "relative/path", str(unsafe), str(not_a_folder / "cache")):
        monkeypatch.setenv("MAMBA_FORGE_CACHE", value)
        memo._warned.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mamba_forge.runtime"):
            for _ in range(2):
                _load(fx, fx.manifest)
        notes = [r.getMessage() for r in caplog.records if "verified-body memo" in r.getMessage()]
        assert len(notes) == (0 if value in ("0", "off") else 1), (value, notes)
    assert len(calls) == 10


def test_a_memo_that_cannot_be_written_warns_and_loads(tmp_path, fx, cache_dir, monkeypatch, caplog):
    (cache_dir / "v1").write_text("a file where the entries folder goes")
    with caplog.at_level(logging.WARNING, logger="mamba_forge.runtime"):
        _load(fx, fx.manifest)
        _load(fx, fx.manifest)
    notes = [r.getMessage() for r in caplog.records if "memo not written" in r.getMessage()]
    assert len(notes) == 1


def test_verify_writes_the_memo_the_loader_takes(fx, cache_dir, monkeypatch):
    """`mamba-forge verify` (the full path) pays the whole-body check once; the next load does not parse."""
    open_verified(fx.tar, keys=_keys(fx))
    calls = _count_parses(monkeypatch)
    load(fx.tar, trusted_keys=_keys(fx), default_keys=False, backend=FakeBackend())
    assert calls == []
