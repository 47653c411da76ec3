"""The qualified manifest (docs/architecture.md, "Qualified manifest"): pydantic models, TOML with tomli-w,
signed with :mod:`mamba_forge.manifest.signing`. The runtime loader reads the same bytes with ``tomllib`` alone.
"""

from __future__ import annotations

import hashlib
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mamba_forge.errors import ManifestError
from mamba_forge.manifest import signing
from mamba_forge.runtime.verify import RUNTIME_KEYS, runtime_table_bytes

QUALIFIED_SCHEMA = 1
MANIFEST_VERSION = 1
VALIDITY_DAYS = 365


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QToolchain(_Rec):
    nvrtc_version: str
    library: dict[str, str] = Field(default_factory=dict)
    header_sha256: dict[str, str] = Field(default_factory=dict)
    base_options: list[str] = Field(default_factory=list)
    source_sha256: dict[str, str] = Field(default_factory=dict)  # "Module/target" -> composed program digest


class QDevice(_Rec):
    name: str
    cc: str
    sm_count: int
    driver_version: int
    count: int = 1  # GPUs of this model compared (--device all)


class QArtifact(_Rec):
    module: str
    target: str
    role: Literal["qualify", "check"]
    path: str  # relative to the build folder (a bundle's root)
    code: Literal["cubin", "ptx"]
    size: int
    sha256: str


class QResources(_Rec):
    registers: int
    static_smem: int
    local_bytes: int
    max_threads: int
    blocks_per_sm: int


class QCheck(_Rec):
    name: str  # correctness/repeat/batch/stream/neighbour/address/graph/sanitize/...
    passed: bool
    digest: str = ""
    detail: str = ""


class QSymbol(_Rec):
    name: str
    module: str
    target: str
    family: str
    dtype: str = ""
    status: Literal["admitted", "rejected", "checked", "built-only"]
    reason: str = ""
    check: str = ""
    fallback: list[str] = Field(default_factory=list)
    block: list[int] = Field(default_factory=lambda: [1, 1, 1])
    dynamic_smem: int = 0
    params: list[list[int]] = Field(default_factory=list)  # [offset, size] per parameter (the ABI census)
    deterministic: bool = True
    seed: int | None = None  # the random seed of the inputs
    resources: QResources | None = None
    checks: list[QCheck] = Field(default_factory=list)


class QRoute(_Rec):
    layout: str
    a: str
    b: str
    c: str
    symbols: list[str]


class QualifiedManifest(_Rec):
    schema_version: int = QUALIFIED_SCHEMA
    kind: Literal["qualified"] = "qualified"
    manifest_version: int = MANIFEST_VERSION
    created: str
    expires: str
    tool_version: str
    level: Literal["quick", "full"]
    qualification_seconds: float
    development_key: bool = False
    catalog: str = ""
    catalog_sha256: str = ""
    state_capacity: int = 64
    # bind the runtime table (runtime.verify.runtime_table_bytes) to the signed body; set by signed_files()
    runtime_table_sha256: str | None = None
    runtime_table_size: int | None = None
    toolchain: QToolchain
    device: QDevice
    artifacts: list[QArtifact] = Field(default_factory=list)
    symbols: list[QSymbol] = Field(default_factory=list)
    routes: list[QRoute] = Field(default_factory=list)

    def symbol(self, name: str, target: str | None = None) -> QSymbol:
        for s in self.symbols:
            if s.name == name and (target is None or s.target == target):
                return s
        raise KeyError(name)


def timestamps(now: datetime | None = None, days: int = VALIDITY_DAYS) -> tuple[str, str]:
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return now.strftime(fmt), (now + timedelta(days=days)).strftime(fmt)


def body_bytes(m: QualifiedManifest) -> bytes:
    """The exact TOML body (TOML has no null: None fields are left out)."""
    return tomli_w.dumps(m.model_dump(mode="json", exclude_none=True)).encode()


def signed_bytes(m: QualifiedManifest, private) -> bytes:
    """The signed manifest alone (no runtime table: the loader parses the whole body)."""
    return signing.sign(body_bytes(m), private, development_key=m.development_key)


def sign_with_runtime_table(body: dict, private, *, development_key: bool) -> tuple[bytes, bytes]:
    """(signed document, runtime table) for a qualified body of plain values: the table is the projection of
    the body as the loader will read it back, and its size and sha256 become top-level keys of the body."""
    body = {k: v for k, v in body.items() if k not in RUNTIME_KEYS}
    table = runtime_table_bytes(tomllib.loads(tomli_w.dumps(body)))
    bound = {**body, "runtime_table_sha256": hashlib.sha256(table).hexdigest(), "runtime_table_size": len(table)}
    return signing.sign(tomli_w.dumps(bound).encode(), private, development_key=development_key), table


def signed_files(m: QualifiedManifest, private) -> tuple[bytes, bytes]:
    """(signed manifest, runtime table): what write_signed puts at X.toml and X.runtime.json."""
    return sign_with_runtime_table(m.model_dump(mode="json", exclude_none=True), private,
                                   development_key=m.development_key)


def parse_body(body: bytes, *, source: str = "<manifest>") -> QualifiedManifest:
    try:
        data = tomllib.loads(body.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    data.pop("signature", None)
    try:
        return QualifiedManifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ManifestError(f"{source}: {loc}: {err['msg']}") from None


def read_verified(path: Path, trusted: dict) -> QualifiedManifest:
    """Verify the signature against trusted keys (key id -> public key), then parse the body."""
    doc = Path(path).read_bytes()
    try:
        body, sig = signing.verify(doc, trusted)
    except signing.SignatureError as exc:
        raise ManifestError(f"{path}: {exc}") from None
    m = parse_body(body, source=str(path))
    if m.development_key != sig.development_key:
        raise ManifestError(f"{path}: development_key in the body disagrees with the [signature] table")
    return m


__all__ = [
    "QArtifact", "QCheck", "QDevice", "QResources", "QRoute", "QSymbol", "QToolchain", "QualifiedManifest",
    "body_bytes", "parse_body", "read_verified", "sign_with_runtime_table", "signed_bytes", "signed_files",
    "timestamps",
]
