"""Loader/verify parity: over seeded mutations of a fixture manifest's signed head and of its runtime table
(re-signed with the trusted key or not), `load()` refuses exactly when full verification (`open_verified` with the
whole body, as `verify` runs it) refuses. Edits below the head (a trusted key signing tables that disagree with
the runtime table): test_verified_memo.py."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil

import pytest
from harden_support import make_fixture
from runtime_support import FakeBackend

from mamba_forge.core.schema import RUNTIME_KEYS
from mamba_forge.runtime import LoadError, load, signing
from mamba_forge.runtime.trust import trusted_keys
from mamba_forge.runtime.verify import open_verified

N = 300


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("parity"))


_VALUES = ['"x"', "0", "-1", "true", "false", "1.5", '""', "[]", "{}", '"2000-01-01T00:00:00Z"', "2", "3"]


def _mutate(rng: random.Random, body: bytes, table: bytes) -> tuple[bytes, bytes, bool]:
    """(body, table, re-sign?) after one seeded mutation of the head or the table."""
    head_end = re.search(rb"^\[", body, re.MULTILINE).start()
    head, rest = body[:head_end], body[head_end:]
    lines = head.decode().splitlines(keepends=True)
    op = rng.randrange(9)
    if op == 0:  # change one head value
        i = rng.randrange(len(lines))
        k = lines[i].split(" = ")[0]
        lines[i] = f"{k} = {rng.choice(_VALUES)}\n"
    elif op == 1:  # duplicate a head key
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(lines))
    elif op == 2:  # drop a head key
        lines.pop(rng.randrange(len(lines)))
    elif op == 3:  # an unknown head key
        lines.insert(rng.randrange(len(lines) + 1), f"extra_{rng.randrange(9)} = {rng.choice(_VALUES)}\n")
    elif op == 4:  # flip a byte of the table (its hash no longer matches the head)
        t = bytearray(table)
        t[rng.randrange(len(t))] ^= 1 << rng.randrange(8)
        return body, bytes(t), rng.random() < 0.5
    elif op == 5:  # change a top-level table value and rebind the head to the new table
        plain = json.loads(table)
        k = rng.choice([k for k, v in plain.items() if not isinstance(v, (dict, list))])
        plain[k] = json.loads(rng.choice(['"x"', "0", "true", "1.5", '"2099-01-01T00:00:00Z"']))
        table = json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()
        lines = _rebind(lines, table)
    elif op == 6:  # an unknown key in the table, rebound
        plain = json.loads(table)
        plain[f"extra_{rng.randrange(9)}"] = 1
        table = json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()
        lines = _rebind(lines, table)
    elif op == 7:  # a head key with TOML spelling variants of the same value
        i = rng.randrange(len(lines))
        lines[i] = lines[i].replace(" = ", "=", 1) if rng.random() < 0.5 else lines[i].replace("\n", " # c\n")
    else:  # garbage in the head
        i = rng.randrange(len(lines))
        lines[i] = rng.choice(["= 1\n", "a = \n", "[x\n", "a = 'unterminated\n", "a.b = 1\n", "\x00\n"])
    return "".join(lines).encode() + rest, table, rng.random() < 0.85


def _rebind(lines, table):
    out = []
    for ln in lines:
        k = ln.split(" = ")[0]
        if k == RUNTIME_KEYS[0]:
            ln = f'{k} = "{hashlib.sha256(table).hexdigest()}"\n'
        elif k == RUNTIME_KEYS[1]:
            ln = f"{k} = {len(table)}\n"
        out.append(ln)
    return out


@pytest.mark.parametrize("seed", range(N))
def test_load_refuses_exactly_when_verify_refuses(tmp_path, fx, seed):
    rng = random.Random(seed)
    body, _ = signing.split(fx.manifest.read_bytes())
    table = (fx.build / "h200.runtime.json").read_bytes()
    body, table, resign = _mutate(rng, body, table)
    folder = tmp_path / "b"
    shutil.copytree(fx.build, folder)
    manifest = folder / "h200.toml"
    if resign:
        doc = signing.sign(body, fx.priv)
    else:
        doc = body + signing.MARKER[1:] + signing.canonical_tail(signing.split(fx.manifest.read_bytes())[1])
    manifest.write_bytes(doc)
    (folder / "h200.runtime.json").write_bytes(table)
    keys = trusted_keys([fx.pub], defaults=False)
    try:
        open_verified(manifest, keys=keys)
        verify_error = None
    except LoadError as exc:
        verify_error = str(exc)
    try:
        load(manifest, trusted_keys=keys, default_keys=False, backend=FakeBackend())
        load_error = None
    except LoadError as exc:
        load_error = str(exc)
    assert (verify_error is None) == (load_error is None), (verify_error, load_error)


def test_the_fixture_itself_loads_and_verifies(fx):
    keys = trusted_keys([fx.pub], defaults=False)
    open_verified(fx.manifest, keys=keys)
    load(fx.manifest, trusted_keys=keys, default_keys=False, backend=FakeBackend()).function("scale_f32")


@pytest.mark.parametrize("value", _VALUES + ["1.0", "2.0", '"qualified"', '"index"', "{a = 1}"])
@pytest.mark.parametrize("key", ["schema_version", "kind", "manifest_version"])
def test_version_and_kind_values_are_type_strict(tmp_path, fx, key, value):
    """`kind = {}` once crashed both paths (unhashable); `schema_version = true` passed as 1."""
    body, _ = signing.split(fx.manifest.read_bytes())
    text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", body.decode(), count=1)
    folder = tmp_path / "b"
    shutil.copytree(fx.build, folder)
    (folder / "h200.toml").write_bytes(signing.sign(text.encode(), fx.priv))
    keys = trusted_keys([fx.pub], defaults=False)
    outcomes = []
    for call in (lambda: open_verified(folder / "h200.toml", keys=keys),
                 lambda: load(folder / "h200.toml", trusted_keys=keys, default_keys=False, backend=FakeBackend())):
        try:
            call()
            outcomes.append(None)
        except LoadError as exc:
            outcomes.append(str(exc).split(":")[0])
    assert outcomes[0] == outcomes[1]
    original = re.search(rf"(?m)^{key} = (.*)$", body.decode()).group(1)
    assert (outcomes[0] is None) == (value == original)
