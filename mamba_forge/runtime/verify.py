"""Verification with no GPU: a signed qualified manifest, release index or bundle becomes one verified record.

The body's layout is the schema's (mamba_forge/core/schema.py, read by the one codec, core/codec.py); on top of
it this module checks what the schema cannot say: the signature against trusted keys (canonical [signature] table
included), expiry, development_key agreement with the [signature] table, the runtime table's binding to the
signed body, and every artifact's size and sha256 (completeness of a bundle). An index is resolved here too: the
loader hands :func:`open_verified` the device at hand and gets the matching entry's manifest back, verified,
and never calls back. Where the bytes come from: sources.py; trusted keys: trust.py.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from mamba_forge.core.codec import from_dict, from_trusted_dict, gc_paused, runtime_table_bytes
from mamba_forge.core.safety import parse_json, parse_toml
from mamba_forge.core.schema import (
    MANIFEST_VERSION,
    QUALIFIED_SCHEMA,
    RUNTIME_KEYS,
    IndexEntry,
    QualifiedManifest,
    ReleaseIndex,
    RuntimeTable,
    SchemaError,
)
from mamba_forge.runtime import memo
from mamba_forge.runtime.errors import ArtifactRefused, DeviceMismatch, ManifestRefused, SignatureRefused
from mamba_forge.runtime.sources import (
    BUNDLE_MANIFEST,
    RUNTIME_TABLE,
    Source,
    check_artifact_bytes,
    open_source,
    sha256,
)

if TYPE_CHECKING:  # cryptography is imported when a signature is first checked (manifest.signing)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from mamba_forge.runtime import signing

_RECORDS = {"qualified": QualifiedManifest, "index": ReleaseIndex}
_VERSION = {"qualified": MANIFEST_VERSION, "index": ReleaseIndex.__dataclass_fields__["manifest_version"].default}
_ABSENT = object()
_HEAD_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory()
                  for f in fields(RuntimeTable) if f.default is not MISSING or f.default_factory is not MISSING}
DeviceKey = tuple[str, str, int]  # (name, cc, SM count): how an index entry names its device


# ---- signature and body -----------------------------------------------------------------------------------


def _signed_body(document: bytes, keys: Mapping[str, Ed25519PublicKey], what: str) -> tuple[bytes, signing.Signature]:
    from mamba_forge.runtime import signing

    try:
        return signing.verify(document, dict(keys))
    except signing.SignatureError as exc:
        if (reason := not_a_manifest(document)) is not None:
            raise SignatureRefused(f"{what} {reason}; pass a signed qualified manifest, a bundle (.tar.gz or folder) "
                                   "or a release index") from None
        raise SignatureRefused(f"{what} does not verify: {exc}") from None


def not_a_manifest(raw: bytes) -> str | None:
    """Why a document is no manifest at all (a README, a catalog, JSON, a build manifest, which is never signed),
    or None when it is one, however damaged: anything with a [signature] table, an unsigned qualified manifest or
    index. load() refuses such a file in these words; `mamba-forge verify` makes the same distinctions."""
    from mamba_forge.runtime import signing

    if signing.MARKER in raw:
        return None
    try:
        data = parse_toml(raw.decode("utf-8"), what="the document")
    except UnicodeDecodeError:
        return "is not a manifest: not UTF-8 text"
    except tomllib.TOMLDecodeError as exc:
        return f"is not a manifest: not TOML ({exc})"
    kind = data.get("kind")
    if kind == "build":
        return "is a build manifest, which is never signed (`mamba-forge qualify --build DIR` makes a signed one)"
    if kind not in ("qualified", "index"):
        got = "no kind key" if kind is None else f"kind {kind!r}"
        return f"is not a manifest: it has {got}, not kind = \"qualified\" or \"index\""
    return None


def _parse_body(body_bytes: bytes, what: str) -> dict:
    from mamba_forge.core.tomlmemo import parse_toml_bytes  # when a whole body is read: not at import

    try:
        return parse_toml_bytes(body_bytes, what=what)  # a large body's parse is memoised by its exact bytes
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ManifestRefused(f"{what} is signed but its body is not valid TOML ({exc})") from None


_FIRST_TABLE = re.compile(rb"^\[", re.MULTILINE)


def body_head(body_bytes: bytes) -> dict | None:
    """The body's top-level keys (everything before its first table header), or None when unreadable.
    The bytes were verified first, so reading a prefix of them reads what the signer wrote. The first header
    line is parsed with the prefix (its table, empty here, then dropped): a broken header that a full parse
    refuses (`[x`) is refused here too, rather than ending the head unnoticed."""
    m = _FIRST_TABLE.search(body_bytes)
    end = len(body_bytes) if m is None else body_bytes.find(b"\n", m.start()) + 1 or len(body_bytes)
    try:
        head = parse_toml(body_bytes[:end].decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    if m is not None and head:
        head.pop(next(reversed(head)))  # the header's table: tomllib keeps insertion order, it came last
    return head


def _kind(head: dict, what: str) -> str:
    """The document's kind, after its versions: said first, since they decide how the rest reads."""
    def get(k):
        return head[k] if k in head else None

    if not _same(get("schema_version"), QUALIFIED_SCHEMA):  # type-strict: `true` is not 1, 1.0 is not 1
        raise ManifestRefused(f"{what} has schema_version {get('schema_version')!r}; this loader reads {QUALIFIED_SCHEMA}")
    kind = get("kind")
    if type(kind) is not str or kind not in _RECORDS:
        raise ManifestRefused(f"{what} has kind {kind!r}; expected a qualified manifest or an index")
    if not _same(get("manifest_version"), _VERSION[kind]):
        raise ManifestRefused(f"{what} has manifest_version {get('manifest_version')!r}; this loader reads "
                              f"{_VERSION[kind]} (re-qualify with this tool version)")
    return kind


def _record(cls: type, data, what: str):
    try:
        return from_dict(cls, data, where=what)
    except SchemaError as exc:
        raise ManifestRefused(str(exc)) from None


def _check_dates_and_key(record, sig: signing.Signature, what: str, now: datetime | None) -> None:
    try:
        expires = datetime.fromisoformat(record.expires.replace("Z", "+00:00"))
    except ValueError:
        raise ManifestRefused(f"{what} has no valid 'expires' time (got {record.expires!r})") from None
    if (now or datetime.now(UTC)) > (expires if expires.tzinfo else expires.replace(tzinfo=UTC)):
        raise ManifestRefused(f"{what} expired at {record.expires}; re-qualify or use a newer release")
    if record.development_key != sig.development_key:
        raise ManifestRefused(f"{what} says development_key={record.development_key} in its body but "
                              f"{sig.development_key} in its [signature] table")


def verify_document(document: bytes, keys: Mapping[str, Ed25519PublicKey], *, what: str = "the manifest",
                    now: datetime | None = None) -> tuple[QualifiedManifest | ReleaseIndex, signing.Signature]:
    """A signed document's record after its signature, layout, expiry and development_key agreement hold."""
    body_bytes, sig = _signed_body(document, keys, what)
    data = _parse_body(body_bytes, what)
    record = _record(_RECORDS[_kind(data, what)], data, what)
    _check_dates_and_key(record, sig, what, now)
    return record, sig


# ---- the runtime table: what loading reads, as JSON bound to the signed body ------------------------------
# Parsing a whole qualified manifest with tomllib costs several times the 100 ms cold start (0.6 s on the CPU
# machine for the committed one), and the loader needs none of its checks. The qualifier writes beside the
# manifest the body's projection without the toolchain and the per-symbol checks, as canonical JSON, and signs
# its size and sha256 as top-level keys of the body. The loader verifies the signature over the whole body and
# takes the table whose hash those keys name, its top-level values type-strictly equal to the head's.
# Parity with full verification (tests/adversarial/test_loader_parity.py, test_verified_memo.py): the loader
# refuses whatever `verify` refuses. The first load of a document on a machine parses the whole body and demands
# that its projection be the table's exact bytes, as `verify`, `bundle` and `merge` do; a pass is remembered in
# the private cache (runtime/memo.py: keyed by the document's sha256, holding the table's), so later loads of the
# same bytes skip the parse. Any other bytes miss the memo and are checked whole again.


def _bound_table(head: dict, source: Source, what: str) -> bytes:
    """The runtime table the signed head names, checked by size and sha256; refuses when absent or changed."""
    size = head[RUNTIME_KEYS[1]] if RUNTIME_KEYS[1] in head else None
    digest = head[RUNTIME_KEYS[0]] if RUNTIME_KEYS[0] in head else None
    if type(size) is not int or type(digest) is not str:
        raise ManifestRefused(f"{what} names a runtime table without a valid size and sha256")
    data = source.read_runtime_table()
    where = source.runtime_table_label()
    if data is None:
        raise ArtifactRefused(f"{what} names a runtime table, but {where} is missing; copy it with the manifest "
                              "or use the bundle")
    if len(data) != size or sha256(data) != digest:
        raise ArtifactRefused(f"runtime table {where} does not match the size and sha256 signed in {what}")
    return data


def _is_table(v) -> bool:
    """A value TOML writes as a table or an array of tables: below the head, not in it."""
    return type(v) is dict or (type(v) is list and bool(v) and all(type(x) is dict for x in v))


def _same(a, b) -> bool:
    """Equal values of equal types: Python's == takes 0 for false and 1 for 1.0, which the full verification's
    schema tells apart (a head saying `development_key = 0` is refused there, so here too)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _table_record(head: dict, data: bytes, what: str, *, proven: bool = False) -> RuntimeTable:  # type: ignore[valid-type]
    """The runtime table's record; its top-level values must be exactly the signed head's. `proven`: these exact
    bytes passed full verification on this machine (the memo), so the schema check is not run again."""
    try:
        with gc_paused():  # a tree of fresh acyclic containers
            plain = parse_json(data)
    except (UnicodeDecodeError, ValueError):
        plain = None
    if type(plain) is not dict:
        raise ManifestRefused(f"the runtime table of {what} is not a JSON object")
    table = (from_trusted_dict(RuntimeTable, plain) if proven
             else _record(RuntimeTable, plain, f"the runtime table of {what}"))
    for k, v in head.items():
        if k not in RUNTIME_KEYS and (k not in plain or not _same(plain[k], v)):
            raise ManifestRefused(f"the runtime table of {what} disagrees with its signed body on {k!r}")
    for k, v in plain.items():  # a key the head leaves out reads as its default: the table must say the same
        if k not in head and not _is_table(v) and not _same(v, _HEAD_DEFAULTS.get(k, _ABSENT)):
            raise ManifestRefused(f"the runtime table of {what} disagrees with its signed body on {k!r}")
    return table


def _check_projection(record: QualifiedManifest, table: bytes, document: bytes, what: str) -> None:  # type: ignore[valid-type]
    """The runtime table must be exactly the projection of the parsed body; a pass is remembered (memo.py)
    under the table's sha256, which _bound_table checked against the signed head."""
    if runtime_table_bytes(record) != table:
        raise ManifestRefused(f"the runtime table of {what} is not the projection of its signed body; "
                              "re-sign the manifest")
    memo.remember(document, record.runtime_table_sha256)


# ---- completeness -----------------------------------------------------------------------------------------


def check_complete(m: QualifiedManifest | RuntimeTable, source: Source, *, hash_all: bool = True,  # type: ignore[valid-type]
                   runtime_table: bool = False) -> None:
    """Every admitted symbol lives in a listed cubin; every artifact is present (and hashes, when `hash_all`);
    an exact source (bundle) holds nothing else."""
    # a .tar.gz bundle's remaining members must be exactly these, at these sizes, before their data is read
    source.expect({a.path: a.size for a in m.artifacts})
    cubins = {(a.module, a.target) for a in m.artifacts if a.code == "cubin"}
    for s in m.symbols:
        if s.status == "admitted" and (s.module, s.target) not in cubins:
            raise ArtifactRefused(
                f"symbol {s.name} is admitted but the manifest lists no cubin for module {s.module} on {s.target}"
            )
    for a in m.artifacts:
        if hash_all:
            check_artifact_bytes(a, source.read(a.path), source)
        else:
            size = source.size(a.path)
            if size is None:
                raise source.refused(a.path)
            if size != a.size:
                raise source.refused(a.path, f"is {size} bytes, the manifest says {a.size}", size < a.size)
    if source.exact:
        named = {BUNDLE_MANIFEST, *([RUNTIME_TABLE] if runtime_table else []), *(a.path for a in m.artifacts)}
        extra = sorted(source.names() - named)
        if extra:
            more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
            raise ArtifactRefused(f"{source.label} holds files its manifest does not name: {', '.join(extra[:3])}{more}")


# ---- one call ---------------------------------------------------------------------------------------------


@dataclass
class Verified:
    """A document whose signature, layout and artifacts verified: one typed record and where its bytes come from.

    `manifest` is the qualified record (a RuntimeTable when the loader read the runtime table, else the whole
    QualifiedManifest); `index` is the release index it was picked through (with that `entry`), or the index
    itself when an index was verified without a device (then `entries` holds its verified manifests)."""

    path: Path
    signature: signing.Signature
    source: Source
    document: bytes = b""  # the exact signed bytes that verified
    manifest: QualifiedManifest | RuntimeTable | None = None  # type: ignore[valid-type]
    index: ReleaseIndex | None = None
    entry: IndexEntry | None = None
    runtime_table: bytes | None = None  # the runtime table bound to the body, when it names one
    entries: list[Verified] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "qualified" if self.manifest is not None else "index"


def open_verified(path: str | Path, *, keys: Mapping[str, Ed25519PublicKey], build: str | Path | None = None,
                  hash_all: bool = True, follow_index: bool = True, now: datetime | None = None,
                  full_body: bool = True, device: Callable[[], DeviceKey] | None = None,
                  missing_hint: str = "") -> Verified:
    """Open and verify a manifest, bundle or index.

    An index: with `device` (called only for an index, after the index verified), the entry for that device is
    checked against the index and verified, and its Verified returned (DeviceMismatch when none matches);
    without, every entry is verified when `follow_index`. full_body=False (the loader): when the signed body names
    a runtime table, the record is that table and the manifest's TOML is never parsed past its top-level keys.
    missing_hint: what a refusal of a bare manifest's missing artifact adds when `build` is not given (the
    caller's words: load() names build=, `verify` its --build option).
    """
    path = Path(path)
    what = str(path)
    doc, source = open_source(path, build)
    if source.bare and build is None:
        source.missing_hint = missing_hint
    body_bytes, sig = _signed_body(doc, keys, what)
    head = body_head(body_bytes)
    if head is None:
        head = _parse_body(body_bytes, what)  # refuses with the TOML error
    kind = _kind(head, what)
    table = _bound_table(head, source, what) if kind == "qualified" and any(k in head for k in RUNTIME_KEYS) else None
    if table is not None and not full_body:
        proven = memo.seen(doc, head[RUNTIME_KEYS[0]])  # the table's sha256, checked by _bound_table
        record = _table_record(head, table, what, proven=proven)
        if not proven:  # once per machine: the whole body, as `verify` checks it
            _check_projection(_record(_RECORDS[kind], _parse_body(body_bytes, what), what), table, doc, what)
    else:
        record = _record(_RECORDS[kind], _parse_body(body_bytes, what), what)
        if table is not None:
            _check_projection(record, table, doc, what)
    _check_dates_and_key(record, sig, what, now)
    if kind == "qualified":
        check_complete(record, source, hash_all=hash_all, runtime_table=table is not None)
        return Verified(path=path, signature=sig, source=source, document=doc, manifest=record, runtime_table=table)
    _one_entry_per_device(record, what)
    v = Verified(path=path, signature=sig, source=source, document=doc, index=record)
    opts = {"keys": keys, "build": build, "hash_all": hash_all, "now": now, "full_body": full_body,
            "missing_hint": missing_hint}
    if device is not None:
        return _pick_entry(v, device(), opts)
    if follow_index:
        v.entries = [open_entry(v, e, **opts) for e in record.entries]
    return v


def _one_entry_per_device(index: ReleaseIndex, what: str) -> None:  # type: ignore[valid-type]
    """merge writes one entry per device; an index with two would hand the loader whichever came first."""
    seen: dict[DeviceKey, str] = {}
    for e in index.entries:
        key = (e.device_name, e.cc, e.sm_count)
        if key in seen:
            raise ManifestRefused(f"{what} has two entries for {_device_text(e)}: {seen[key]} and {e.path}; an "
                                  "index holds one manifest per device (merge again)")
        seen[key] = e.path


def _device_text(e: IndexEntry) -> str:
    return f"{e.device_name} (cc {e.cc}, {e.sm_count} SMs)"


def _pick_entry(index: Verified, dev: DeviceKey, opts: dict) -> Verified:
    for e in index.index.entries:  # type: ignore[union-attr]
        if (e.device_name, e.cc, e.sm_count) == dev:
            return open_entry(index, e, **opts)
    have = "; ".join(_device_text(e) for e in index.index.entries) or "none"  # type: ignore[union-attr]
    raise DeviceMismatch(f"{index.path} has no manifest for {dev[0]} (cc {dev[1]}, {dev[2]} SMs); it has: {have}")


def read_indexed(index_path: Path, entry: IndexEntry) -> Path:
    """The path of an index entry's file, after its bytes matched the entry's size and sha256."""
    folder = Source(label=f"index folder {index_path.parent}", root=index_path.parent)
    check_artifact_bytes(entry, folder.read(entry.path), folder, by="the index")
    return index_path.parent / entry.path


def open_entry(index: Verified, entry: IndexEntry, *, keys, build=None, hash_all=True, now=None,
               full_body: bool = True, missing_hint: str = "") -> Verified:
    """One index entry: its file is checked against the index's size and sha256, then verified itself."""
    p = read_indexed(index.path, entry)
    v = open_verified(p, keys=keys, build=build, hash_all=hash_all, follow_index=False, now=now, full_body=full_body,
                      missing_hint=missing_hint)
    if v.manifest is None:
        raise ManifestRefused(f"index entry {entry.path} is not a qualified manifest")
    dev = v.manifest.device
    if (dev.name, dev.cc, dev.sm_count) != (entry.device_name, entry.cc, entry.sm_count):
        raise ManifestRefused(f"index entry {entry.path} names device {entry.device_name} but its manifest was "
                              f"qualified on {dev.name}")
    v.index, v.entry = index.index, entry
    return v


__all__ = ["DeviceKey", "Verified", "body_head", "check_complete", "not_a_manifest", "open_entry", "open_verified",
           "read_indexed", "verify_document"]
