"""Signing and verification of qualified manifests: every refusal (wrong key, flipped byte, truncated file,
reordered tables, unknown key id, malformed signature, development-key mismatch) says why; keys are 0600."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from mamba_forge.cli import main as cli_main
from mamba_forge.core.errors import ForgeError, ManifestError
from mamba_forge.core.schema import (
    Param,
    QArtifact,
    QCheck,
    QDevice,
    QResources,
    QSymbol,
    QToolchain,
    QualifiedManifest,
)
from mamba_forge.manifest.qualified import body_bytes, read_verified, signed_bytes, timestamps
from mamba_forge.qualify.keys import resolve_key, write_signed
from mamba_forge.runtime import signing


def _manifest(dev: bool = False) -> QualifiedManifest:
    created, expires = timestamps()
    return QualifiedManifest(
        created=created, expires=expires, tool_version="0.1.0", level="quick", qualification_seconds=1.5,
        development_key=dev,
        toolchain=QToolchain(nvrtc_version="13.0", source_sha256={"Fixed/sm_90a": "ab" * 32}),
        device=QDevice(name="NVIDIA H200", cc="9.0", sm_count=132, driver_version=13000),
        artifacts=[QArtifact(module="Fixed", target="sm_90a", role="qualify", path="sm_90a/Fixed.cubin", code="cubin",
                             size=10, sha256="cd" * 32)],
        symbols=[
            QSymbol(name="a", module="Fixed", target="sm_90a", family="a", status="admitted",
                    params=[Param(name="x", kind="pointer", type="ptr", dtype="f32", role="in", shape=["n"], offset=0,
                                  size=8)],
                    resources=QResources(registers=16, static_smem=0, local_bytes=0, max_threads=256, blocks_per_sm=8),
                    checks=[QCheck(name="repeat", passed=True, digest="ee" * 32, detail="5 runs")]),
            QSymbol(name="b", module="Fixed", target="sm_90a", family="b", status="rejected", check="fault",
                    reason="b: cuStreamSynchronize failed with CUDA_ERROR_ILLEGAL_ADDRESS"),
        ],
    )


@pytest.fixture(scope="module")
def keys():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    a, b = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    return a, b


def _trust(*privs):
    return {signing.key_id(p.public_key()): p.public_key() for p in privs}


def _write(tmp_path: Path, data: bytes, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_signed_manifest_verifies_and_round_trips(tmp_path, keys):
    a, _ = keys
    m = _manifest()
    got = read_verified(_write(tmp_path, signed_bytes(m, a)), _trust(a))
    assert got == m


def test_wrong_key_refused(tmp_path, keys):
    a, b = keys
    doc = signed_bytes(_manifest(), a)
    # the signature table claims key b (trusted) but the signature was made by a
    forged = doc.replace(signing.key_id(a.public_key()).encode(), signing.key_id(b.public_key()).encode())
    with pytest.raises(ManifestError, match="does not match the manifest's bytes"):
        read_verified(_write(tmp_path, forged), _trust(b))


def test_unknown_key_id_refused(tmp_path, keys):
    a, b = keys
    with pytest.raises(ManifestError, match="not trusted"):
        read_verified(_write(tmp_path, signed_bytes(_manifest(), a)), _trust(b))


def test_flipped_byte_refused(tmp_path, keys):
    a, _ = keys
    doc = bytearray(signed_bytes(_manifest(), a))
    at = doc.index(b"registers = 16") + len("registers = 1")
    doc[at] ^= 0x01  # 16 -> 17
    with pytest.raises(ManifestError, match="does not match"):
        read_verified(_write(tmp_path, bytes(doc)), _trust(a))


def test_truncated_file_refused(tmp_path, keys):
    a, _ = keys
    doc = signed_bytes(_manifest(), a)
    with pytest.raises(ManifestError, match="not signed"):
        read_verified(_write(tmp_path, doc[: len(doc) // 2]), _trust(a))
    # cut inside the signature table: malformed
    with pytest.raises(ManifestError, match="malformed"):
        read_verified(_write(tmp_path, doc[: doc.rindex(b"value = ") + 12], "t2.toml"), _trust(a))


def test_reordered_tables_refused(tmp_path, keys):
    a, _ = keys
    doc = signed_bytes(_manifest(), a)
    body, sep, tail = doc.partition(b"\n[signature]\n")
    blocks = re.split(rb"(?=^\[\[symbols\]\]$)", body, flags=re.M)
    assert len(blocks) >= 3
    head, *syms = blocks
    reordered = head + b"".join(reversed(syms))
    assert reordered != body and sorted(reordered) == sorted(body)
    with pytest.raises(ManifestError, match="does not match"):
        read_verified(_write(tmp_path, reordered + sep + tail), _trust(a))


def test_unsigned_and_development_mismatch_refused(tmp_path, keys):
    a, _ = keys
    m = _manifest(dev=False)
    with pytest.raises(ManifestError, match="not signed"):
        read_verified(_write(tmp_path, body_bytes(m)), _trust(a))
    # body says development_key = false, the signature table says true (signed so: the bytes verify)
    doc = signing.sign(body_bytes(m), a, development_key=True)
    with pytest.raises(ManifestError, match="development_key"):
        read_verified(_write(tmp_path, doc, "dev.toml"), _trust(a))


def test_keygen_writes_private_key_0600(tmp_path):
    assert cli_main(["keygen", "--out", str(tmp_path), "--name", "ci"]) == 0
    priv, pub = tmp_path / "ci.key", tmp_path / "ci.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    key = signing.parse_private(priv.read_bytes())
    assert signing.parse_public(pub.read_text()).public_bytes_raw() == key.public_key().public_bytes_raw()
    # never overwrites an existing key
    assert cli_main(["keygen", "--out", str(tmp_path), "--name", "ci"]) == 2


def test_key_resolution_file_env_and_development(tmp_path, monkeypatch, keys):
    a, _ = keys
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    dev1 = resolve_key(None)
    assert dev1.development and "generated" in dev1.source
    dev2 = resolve_key(None)
    assert "reused" in dev2.source
    assert signing.key_id(dev1.private.public_key()) == signing.key_id(dev2.private.public_key())
    monkeypatch.setenv(signing.KEY_ENV, signing.private_pem(a).decode())
    env = resolve_key(None)
    assert not env.development and signing.key_id(env.private.public_key()) == signing.key_id(a.public_key())
    path = tmp_path / "k.pem"
    path.write_bytes(signing.private_pem(a))
    assert not resolve_key(path).development
    path.write_text("not a key")
    with pytest.raises(ForgeError, match="not a PEM"):
        resolve_key(path)
    with pytest.raises(ForgeError, match="not found"):
        resolve_key(tmp_path / "missing.pem")
    monkeypatch.setenv(signing.KEY_ENV, "garbage")
    with pytest.raises(ForgeError, match="MAMBA_FORGE_SIGNING_KEY"):
        resolve_key(None)


def test_write_signed_marks_development_key_and_writes_public_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    key = resolve_key(None)
    path, pub = write_signed(_manifest(dev=False), key, tmp_path / "manifests" / "h200.toml")
    trusted = signing.load_trusted([pub])
    m = read_verified(path, trusted)
    assert m.development_key is True
    assert b"development_key = true" in path.read_bytes().split(b"[signature]")[1]
