"""Fuzz: a signed manifest mutated at random bytes (flips, insertions, deletions, anywhere: body, marker,
[signature] table), or its runtime table mutated, is refused by load() every time, quickly, and nothing reaches
the driver."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest
from runtime_support import FakeBackend, signed_tiny

from mamba_forge.runtime import LoadError, load
from mamba_forge.runtime.sources import runtime_table_path

MUTATIONS = 600
SEED = 20261129


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    t = signed_tiny(tmp_path_factory.mktemp("fuzz"), manifest="build/signed.toml")
    root, pub, doc = t.root, t.pub, t.doc
    table = runtime_table_path(t.manifest).read_bytes()
    for name in ("fuzzed", "tail", "table"):  # the runtime table beside each manifest name the tests write
        runtime_table_path(root / "build" / f"{name}.toml").write_bytes(table)
    return SimpleNamespace(build=root / "build", pub=pub, doc=doc, table=table)


def _mutate(doc: bytes, rng: random.Random) -> tuple[bytes, int]:
    b = bytearray(doc)
    op = rng.random()
    at = rng.randrange(len(b))
    if op < 0.7:  # change one byte to a different value
        b[at] = (b[at] + rng.randrange(1, 256)) % 256
    elif op < 0.85:  # insert a byte
        b.insert(at, rng.randrange(256))
    else:  # delete a byte
        del b[at]
    return bytes(b), at


def test_every_mutation_is_refused(signed, monkeypatch, tmp_path):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))
    fake = FakeBackend()
    path = signed.build / "fuzzed.toml"
    # the unmutated document loads: the refusals below are the mutations' doing
    path.write_bytes(signed.doc)
    load(path, trusted_keys=[signed.pub], backend=FakeBackend()).function("scale_f32")

    rng = random.Random(SEED)
    accepted, reasons, in_tail = [], {}, 0
    tail_start = signed.doc.rfind(b"\n[signature]\n")
    t0 = time.perf_counter()
    for i in range(MUTATIONS):
        m, at = _mutate(signed.doc, rng)
        assert m != signed.doc
        in_tail += at >= tail_start
        path.write_bytes(m)
        try:
            load(path, trusted_keys=[signed.pub], backend=fake)
        except LoadError as exc:
            key = type(exc).__name__
            reasons[key] = reasons.get(key, 0) + 1
        else:
            accepted.append(i)
    seconds = time.perf_counter() - t0
    assert not accepted, f"mutations {accepted[:10]} were loaded"
    assert fake.loaded == [] and fake.activated == []
    assert sum(reasons.values()) == MUTATIONS
    assert seconds < 15, f"{MUTATIONS} refusals took {seconds:.1f}s"
    # positions are drawn over the whole document, signature table included: about its share of the mutations (a
    # fixed count broke when the records grew a field: 6 of 600 for a table of 1.3% of the bytes)
    expected = MUTATIONS * (len(signed.doc) - tail_start) / len(signed.doc)
    assert in_tail > 0.4 * expected, (in_tail, expected)


def _tail_mutations(doc: bytes, rng: random.Random) -> list[bytes]:
    """Every byte of the [signature] table changed at random, plus the changes TOML and base64 would read as the
    same table: a tab for each space, an extra space, and every other last character of the base64 value
    (its low bits are padding that b64decode ignores)."""
    start = doc.rfind(b"\n[signature]\n")
    out = []
    for at in range(start, len(doc)):
        b = bytearray(doc)
        b[at] = (b[at] + rng.randrange(1, 256)) % 256
        out.append(bytes(b))
    for at in range(start, len(doc)):
        if doc[at:at + 1] == b" ":
            out.append(doc[:at] + b"\t" + doc[at + 1:])
            out.append(doc[:at] + b"  " + doc[at + 1:])
    last = doc.rindex(b'=="') - 1  # the value's last data character
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out += [doc[:last] + bytes([c]) + doc[last + 1:] for c in alphabet if c != doc[last]]
    return out


def _loaded(signed, backend, manifest, written, mutations) -> list[int]:
    """The indices of the mutations (each written to `written` in turn) with which load(manifest) succeeded."""
    accepted = []
    for i, m in enumerate(mutations):
        written.write_bytes(m)
        try:
            load(manifest, trusted_keys=[signed.pub], backend=backend)
        except LoadError:
            continue
        accepted.append(i)
    return accepted


def test_mutations_of_the_signature_table_are_refused(signed, monkeypatch, tmp_path):
    """The canonical-form check leaves no slack in the [signature] table."""
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))
    fake = FakeBackend()
    path = signed.build / "tail.toml"
    mutations = _tail_mutations(signed.doc, random.Random(SEED + 1))
    accepted = _loaded(signed, fake, path, path, mutations)
    assert not accepted, f"{len(accepted)} of {len(mutations)} signature-table mutations were loaded"
    assert len(mutations) > 200 and fake.loaded == []


def test_mutations_of_the_runtime_table_are_refused(signed, monkeypatch, tmp_path):
    """The table the loader reads instead of the TOML is bound by size and sha256 in the signed body."""
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))
    fake = FakeBackend()
    path = signed.build / "table.toml"
    path.write_bytes(signed.doc)
    table = runtime_table_path(path)
    load(path, trusted_keys=[signed.pub], backend=FakeBackend()).function("scale_f32")
    rng = random.Random(SEED + 2)
    try:
        accepted = _loaded(signed, fake, path, table, (_mutate(signed.table, rng)[0] for _ in range(300)))
    finally:
        table.write_bytes(signed.table)
    assert not accepted, f"runtime-table mutations {accepted[:10]} were loaded"
    assert fake.loaded == [] and fake.activated == []
