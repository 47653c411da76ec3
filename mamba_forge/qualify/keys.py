"""Signing keys and the signed files: which key signs (--sign-key, $MAMBA_FORGE_SIGNING_KEY or a local
development key, made once), and the signed manifest, its runtime table and public key written beside it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from mamba_forge.core.errors import ForgeError
from mamba_forge.core.fsio import write_atomic
from mamba_forge.core.schema import QualifiedManifest
from mamba_forge.manifest.qualified import signed_files
from mamba_forge.runtime import signing
from mamba_forge.runtime.sources import runtime_table_path


@dataclass
class SigningKey:
    private: object
    development: bool
    source: str


def dev_key_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mamba-forge" / "dev-key"


def resolve_key(path: Path | None) -> SigningKey:
    """--sign-key PATH, else $MAMBA_FORGE_SIGNING_KEY (PEM text), else a local development key (made once)."""
    if path is not None:
        try:
            return SigningKey(signing.parse_private(Path(path).read_bytes()), False, str(path))
        except FileNotFoundError:
            raise ForgeError(f"signing key not found: {path}", hint="run `mamba-forge keygen`") from None
        except signing.SignatureError as exc:
            raise ForgeError(f"{path}: {exc}") from None
    pem = os.environ.get(signing.KEY_ENV)
    if pem:
        try:
            return SigningKey(signing.parse_private(pem.encode()), False, f"${signing.KEY_ENV}")
        except signing.SignatureError as exc:
            raise ForgeError(f"${signing.KEY_ENV}: {exc}") from None
    folder = dev_key_dir()
    priv = folder / "mamba-forge-dev.key"
    if not priv.exists():
        signing.write_keypair(folder, "mamba-forge-dev")
        how = "generated"
    else:
        how = "reused"
    return SigningKey(signing.parse_private(priv.read_bytes()), True, f"{how} development key {priv}")


def write_signed(manifest: QualifiedManifest, key: SigningKey, out: Path) -> tuple[Path, Path]:
    """Write the signed manifest, its runtime table beside it (X.runtime.json) and the public key that
    verifies them (beside it, named by key id)."""
    manifest = dataclasses.replace(manifest, development_key=key.development)
    data, table = signed_files(manifest, key.private)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, payload in ((runtime_table_path(out), table), (out, data)):  # the table first: the manifest names it
        write_atomic(path, payload)
    pub = key.private.public_key()  # type: ignore[attr-defined]
    pub_path = out.parent / f"{signing.key_id(pub)[:16]}.pub"
    write_atomic(pub_path, signing.public_text(pub))
    return out, pub_path


__all__ = ["SigningKey", "dev_key_dir", "resolve_key", "write_signed"]
