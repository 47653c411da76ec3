"""The qualified manifest (docs/architecture.md, "Qualified manifest"): the records of
:mod:`mamba_forge.core.schema`, TOML with tomli-w, signed with :mod:`mamba_forge.runtime.signing`. The runtime
loader reads the same bytes with ``tomllib`` and the same codec (no pydantic, no tomli-w at load time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

from mamba_forge.core import safety
from mamba_forge.core.codec import from_dict, runtime_table_bytes, to_dict
from mamba_forge.core.errors import ManifestError
from mamba_forge.core.schema import QualifiedManifest, SchemaError
from mamba_forge.core.tomlmemo import parse_toml_bytes
from mamba_forge.manifest import toml_io
from mamba_forge.runtime import signing

VALIDITY_DAYS = 365


def timestamps(now: datetime | None = None, days: int = VALIDITY_DAYS) -> tuple[str, str]:
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return now.strftime(fmt), (now + timedelta(days=days)).strftime(fmt)


def body_bytes(m: QualifiedManifest) -> bytes:
    """The exact TOML body (TOML has no null: None fields are left out)."""
    return toml_io.dumps(m).encode()


def signed_bytes(m: QualifiedManifest, private) -> bytes:
    """The signed manifest alone (no runtime table: the loader parses the whole body)."""
    return signing.sign(body_bytes(m), private, development_key=m.development_key)


def sign_with_runtime_table(m: QualifiedManifest, private) -> tuple[bytes, bytes]:
    """(signed document, runtime table): the table is the projection of the record as the loader will read it
    back, and its size and sha256 become top-level keys of the body. The record first goes through the codec, so
    the signer never signs what the loader would refuse (and an int given for a float reads back as the float)."""
    try:
        m = from_dict(QualifiedManifest, to_dict(m), where="the qualified manifest to sign")
    except SchemaError as exc:
        raise ManifestError(str(exc)) from None
    table = runtime_table_bytes(m)
    bound = dataclasses.replace(m, runtime_table_sha256=hashlib.sha256(table).hexdigest(), runtime_table_size=len(table))
    return signing.sign(body_bytes(bound), private, development_key=m.development_key), table


def signed_files(m: QualifiedManifest, private) -> tuple[bytes, bytes]:
    """(signed manifest, runtime table): what the qualifier writes at X.toml and X.runtime.json."""
    return sign_with_runtime_table(m, private)


def parse_body(body: bytes, *, source: str = "<manifest>") -> QualifiedManifest:
    try:
        data = parse_toml_bytes(body, what=source)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    data.pop("signature", None)
    return toml_io.parse(data, QualifiedManifest, source=source)


def read_verified(path: Path, trusted: dict) -> QualifiedManifest:
    """Verify the signature against trusted keys (key id -> public key), then parse the body. The read is
    bounded (safety.read_bounded): a FIFO, a device or a file above MAX_MANIFEST_BYTES is refused unread."""
    try:
        doc = safety.read_bounded(Path(path), safety.MAX_MANIFEST_BYTES, what="manifest")
    except safety.PathRefused as exc:
        raise ManifestError(str(exc)) from None
    try:
        body, sig = signing.verify(doc, trusted)
    except signing.SignatureError as exc:
        raise ManifestError(f"{path}: {exc}") from None
    m = parse_body(body, source=str(path))
    if m.development_key != sig.development_key:
        raise ManifestError(f"{path}: development_key in the body disagrees with the [signature] table")
    return m


__all__ = ["body_bytes", "parse_body", "read_verified", "sign_with_runtime_table", "signed_bytes", "signed_files",
           "timestamps"]
