"""Verification with no GPU: open a signed qualified manifest, release index or bundle; check the signature
against trusted keys (canonical [signature] table included), the body's layout and expiry, and every artifact's
size and sha256. Standard library + cryptography only (through :mod:`mamba_forge.manifest.signing`).

Sources:

* a manifest file: artifacts are read relative to ``build`` (default: the manifest's folder); other files may
  sit beside them (a build folder);
* a folder bundle (``manifest.toml`` + exactly the artifacts it names) or a ``.tar.gz`` bundle (read in memory,
  never extracted): a file the manifest does not name is refused;
* a release index (``kind = "index"``): its entries' files are checked by size and sha256 before being opened.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mamba_forge.manifest import signing
from mamba_forge.runtime.errors import ArtifactRefused, ManifestRefused, SignatureRefused

SCHEMA_VERSION = 1
BUNDLE_MANIFEST = "manifest.toml"
RUNTIME_TABLE = "runtime.json"  # a bundle's runtime table; beside a bare X.toml it is X.runtime.json
RUNTIME_KEYS = ("runtime_table_sha256", "runtime_table_size")  # the body's top-level keys that bind it
MAX_BUNDLE_BYTES = 1 << 31  # a bundle larger than 2 GiB is refused before it is read into memory
KINDS = ("qualified", "index")


# ---- trusted keys -----------------------------------------------------------------------------------------


def release_keys_dir() -> Path:
    """The shipped release keys: manifests/keys/ beside the package (a source checkout or editable install)."""
    return Path(__file__).resolve().parents[2] / "manifests" / "keys"


KeySpec = Path | str | bytes | Ed25519PublicKey


def trusted_keys(extra: Iterable[KeySpec] | Mapping[str, Ed25519PublicKey] | None = None, *,
                 defaults: bool = True) -> dict[str, Ed25519PublicKey]:
    """Key id -> public key: the shipped release keys and the user's trust folder (when `defaults`), plus
    `extra`: key objects, key files or folders of *.pub, or 'ed25519 <base64>' text."""
    out: dict[str, Ed25519PublicKey] = {}
    if defaults:
        for folder in (release_keys_dir(), signing.user_trust_dir()):
            if folder.is_dir():
                out.update(_load_key_paths([folder]))
    if extra is None:
        return out
    if isinstance(extra, Mapping):
        out.update(extra)
        return out
    if isinstance(extra, (str, bytes, Path, Ed25519PublicKey)):
        extra = [extra]
    for k in extra:
        if isinstance(k, Ed25519PublicKey):
            out[signing.key_id(k)] = k
        elif isinstance(k, bytes) or (isinstance(k, str) and k.strip().startswith("ed25519 ")):
            text = k.decode() if isinstance(k, bytes) else k
            key = _parse_key(text, "a key passed in")
            out[signing.key_id(key)] = key
        else:
            out.update(_load_key_paths([Path(k)]))
    return out


def _parse_key(text: str, where: str) -> Ed25519PublicKey:
    try:
        return signing.parse_public(text)
    except signing.SignatureError as exc:
        raise SignatureRefused(f"{where} is not a usable public key: {exc}") from None


def _load_key_paths(paths: list[Path]) -> dict[str, Ed25519PublicKey]:
    out: dict[str, Ed25519PublicKey] = {}
    for p in paths:
        if not p.exists():
            raise SignatureRefused(f"trusted key path {p} does not exist")
        for f in sorted(p.glob("*.pub")) if p.is_dir() else [p]:
            key = _parse_key(f.read_text(encoding="utf-8", errors="replace"), str(f))
            out[signing.key_id(key)] = key
    return out


# ---- signature, canonical form, body ----------------------------------------------------------------------


def _signed_body(document: bytes, keys: Mapping[str, Ed25519PublicKey], what: str) -> tuple[bytes, signing.Signature]:
    try:
        return signing.verify(document, dict(keys))
    except signing.SignatureError as exc:
        raise SignatureRefused(f"{what} does not verify: {exc}") from None


def _parse_body(body_bytes: bytes, what: str) -> dict:
    try:
        return tomllib.loads(body_bytes.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ManifestRefused(f"{what} is signed but its body is not valid TOML ({exc})") from None


def _check_dev_key(body: dict, sig: signing.Signature, what: str) -> None:
    if bool(body.get("development_key", False)) != sig.development_key:
        raise ManifestRefused(f"{what} says development_key={body.get('development_key')} in its body but "
                              f"{sig.development_key} in its [signature] table")


def verify_document(document: bytes, keys: Mapping[str, Ed25519PublicKey], *, what: str = "the manifest",
                    now: datetime | None = None) -> tuple[dict, signing.Signature]:
    """Check a signed document's signature and body; returns (body as plain dicts, signature).

    Beyond signing.verify (which also demands the canonical [signature] table): the body must be a schema-1
    qualified manifest or index that has not expired and agrees with the table's development_key.
    """
    body_bytes, sig = _signed_body(document, keys, what)
    body = _parse_body(body_bytes, what)
    check_body(body, what=what, now=now)
    _check_dev_key(body, sig, what)
    return body, sig


# ---- the runtime table: what loading reads, as JSON bound to the signed body ------------------------------
# Parsing a whole qualified manifest with tomllib costs ~100 ms (2,500 check tables); the loader needs none of
# the checks. The qualifier writes beside the manifest the body's projection without the toolchain and the
# per-symbol checks, as canonical JSON, and signs its size and sha256 as top-level keys of the body. The loader
# verifies the signature over the whole body, reads only the body's top-level keys, and takes the table whose
# hash those keys name (~2 ms). Full verification (`verify`, `bundle`, `merge`) also recomputes the projection
# from the parsed body and demands the same bytes.


def runtime_table_bytes(body: dict) -> bytes:
    """The canonical runtime table of a qualified body."""
    table = {k: v for k, v in body.items() if k not in ("toolchain", "signature", *RUNTIME_KEYS)}
    table["symbols"] = [{k: v for k, v in s.items() if k != "checks"} for s in body.get("symbols", [])]
    return json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


_FIRST_TABLE = re.compile(rb"^\[", re.MULTILINE)


def body_head(body_bytes: bytes) -> dict | None:
    """The body's top-level keys (everything before its first table header), or None when unreadable.
    The bytes were verified first, so reading a prefix of them reads what the signer wrote."""
    m = _FIRST_TABLE.search(body_bytes)
    try:
        return tomllib.loads(body_bytes[: m.start() if m else len(body_bytes)].decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def runtime_table_path(manifest: Path) -> Path:
    """Where a bare manifest's runtime table sits: X.toml -> X.runtime.json, beside it."""
    return manifest.with_name(manifest.name.removesuffix(".toml") + ".runtime.json")


def _bound_table(head: dict, source: Source, what: str) -> bytes:
    """The runtime table the signed head names, checked by size and sha256; refuses when absent or changed."""
    size, digest = head.get("runtime_table_size"), head.get("runtime_table_sha256")
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(digest, str):
        raise ManifestRefused(f"{what} names a runtime table without a valid size and sha256")
    data = source.read_runtime_table()
    where = source.runtime_table_label()
    if data is None:
        raise ArtifactRefused(f"{what} names a runtime table, but {where} is missing; copy it with the manifest "
                              "or use the bundle")
    if len(data) != size or sha256(data) != digest:
        raise ArtifactRefused(f"runtime table {where} does not match the size and sha256 signed in {what}")
    return data


def _table_body(head: dict, data: bytes, what: str) -> dict:
    try:
        table = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        table = None
    if not isinstance(table, dict):
        raise ManifestRefused(f"the runtime table of {what} is not a JSON object")
    for k, v in head.items():
        if k not in RUNTIME_KEYS and table.get(k) != v:
            raise ManifestRefused(f"the runtime table of {what} disagrees with its signed body on {k!r}")
    return table


def _parse_time(value, field_name: str, what: str) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return t if t.tzinfo else t.replace(tzinfo=UTC)
    raise ManifestRefused(f"{what} has no valid '{field_name}' time (got {value!r})")


def _require(table: dict, key: str, typ, what: str):
    v = table.get(key)
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        raise ManifestRefused(f"{what} lacks a valid '{key}' field")
    return v


def _safe_relpath(path: str, what: str) -> str:
    p = PurePosixPath(path)
    if (not path or "\\" in path or p.is_absolute() or ".." in p.parts or str(p) != path
            or path in (BUNDLE_MANIFEST, RUNTIME_TABLE)):
        raise ManifestRefused(f"{what} names an unsafe artifact path {path!r} (must be relative, normalised, no '..')")
    return path


def check_body(body: dict, *, what: str = "the manifest", now: datetime | None = None) -> None:
    """Layout checks on a verified body (plain dicts from tomllib)."""
    if body.get("schema_version") != SCHEMA_VERSION:
        raise ManifestRefused(f"{what} has schema_version {body.get('schema_version')!r}; this loader reads {SCHEMA_VERSION}")
    kind = body.get("kind")
    if kind not in KINDS:
        raise ManifestRefused(f"{what} has kind {kind!r}; expected a qualified manifest or an index")
    now = now or datetime.now(UTC)
    expires = _parse_time(body.get("expires"), "expires", what)
    if now > expires:
        raise ManifestRefused(f"{what} expired at {body.get('expires')}; re-qualify or use a newer release")
    if kind == "index":
        entries = _require(body, "entries", list, what)
        for i, e in enumerate(entries):
            w = f"{what} entry {i}"
            if not isinstance(e, dict):
                raise ManifestRefused(f"{w} is not a table")
            for k, t in (("path", str), ("sha256", str), ("size", int), ("device_name", str), ("cc", str), ("sm_count", int)):
                _require(e, k, t, w)
            _safe_relpath(e["path"], w)
        return
    device = _require(body, "device", dict, what)
    for k, t in (("name", str), ("cc", str), ("sm_count", int), ("driver_version", int)):
        _require(device, k, t, f"{what}'s [device]")
    seen = set()
    for i, a in enumerate(_require(body, "artifacts", list, what)):
        w = f"{what} artifact {i}"
        if not isinstance(a, dict):
            raise ManifestRefused(f"{w} is not a table")
        for k, t in (("module", str), ("target", str), ("role", str), ("path", str), ("code", str), ("size", int), ("sha256", str)):
            _require(a, k, t, w)
        _safe_relpath(a["path"], w)
        if a["path"] in seen:
            raise ManifestRefused(f"{what} names artifact {a['path']} twice")
        seen.add(a["path"])
    for i, s in enumerate(body.get("symbols", [])):
        w = f"{what} symbol {i}"
        if not isinstance(s, dict):
            raise ManifestRefused(f"{w} is not a table")
        for k in ("name", "module", "target", "status"):
            _require(s, k, str, w)


# ---- sources: a folder, a build folder, or an in-memory tar -----------------------------------------------


def _read_regular(p: Path) -> bytes | None:
    """The bytes of a regular file (not a symlink), or None."""
    try:
        if p.is_symlink() or not p.is_file():
            return None
        return p.read_bytes()
    except OSError:
        return None


@dataclass
class Source:
    """Where artifact bytes come from. `exact`: the source holds exactly the manifest and its artifacts."""

    label: str
    root: Path | None = None
    members: dict[str, bytes] | None = None
    exact: bool = False
    table_file: Path | None = None  # a bare manifest's runtime table (a bundle holds RUNTIME_TABLE)

    def read_runtime_table(self) -> bytes | None:
        if self.exact:
            return self.read(RUNTIME_TABLE)
        return None if self.table_file is None else _read_regular(self.table_file)

    def runtime_table_label(self) -> str:
        return f"{RUNTIME_TABLE} in {self.label}" if self.exact else str(self.table_file)

    def read(self, rel: str) -> bytes | None:
        if self.members is not None:
            return self.members.get(rel)
        assert self.root is not None
        return _read_regular(self.root / rel)

    def size(self, rel: str) -> int | None:
        if self.members is not None:
            data = self.members.get(rel)
            return None if data is None else len(data)
        assert self.root is not None
        p = self.root / rel
        try:
            if p.is_symlink() or not p.is_file():
                return None
            return p.stat().st_size
        except OSError:
            return None

    def names(self) -> set[str]:
        if self.members is not None:
            return set(self.members)
        assert self.root is not None
        out = set()
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                out.add(Path(dirpath, f).relative_to(self.root).as_posix())
        return out


def read_tar_bundle(path: Path) -> dict[str, bytes]:
    """Members of a .tar.gz bundle, in memory; refuses links, devices, unsafe or duplicate names."""
    try:
        if path.stat().st_size > MAX_BUNDLE_BYTES:
            raise ArtifactRefused(f"bundle {path} is larger than {MAX_BUNDLE_BYTES} bytes")
        raw = path.read_bytes()
        members: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            for m in tar:
                if m.isdir():
                    continue
                if not m.isreg():
                    raise ArtifactRefused(f"bundle {path} holds {m.name!r}, which is not a regular file")
                name = m.name.removeprefix("./")
                p = PurePosixPath(name)
                if p.is_absolute() or ".." in p.parts or str(p) != name:
                    raise ArtifactRefused(f"bundle {path} holds an unsafe member name {m.name!r}")
                if name in members:
                    raise ArtifactRefused(f"bundle {path} holds {name} twice")
                f = tar.extractfile(m)
                members[name] = f.read() if f else b""
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:  # zlib.error is an Exception subclass below
        raise ArtifactRefused(f"bundle {path} is not a readable .tar.gz ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # noqa: BLE001 - zlib.error and friends from a corrupted stream
        if isinstance(exc, ArtifactRefused):
            raise
        raise ArtifactRefused(f"bundle {path} is not a readable .tar.gz ({type(exc).__name__}: {exc})") from None
    return members


def is_tar_path(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz", ".tar"))


def open_source(path: str | Path, build: str | Path | None = None) -> tuple[bytes, Source]:
    """(signed document bytes, artifact source) for a manifest file, a folder bundle or a .tar.gz bundle."""
    path = Path(path)
    if not path.exists():
        raise ArtifactRefused(f"{path} does not exist")
    if path.is_dir():
        src = Source(label=f"bundle {path}", root=path, exact=True)  # a folder bundle: exactly its files
        doc = path / BUNDLE_MANIFEST
        if not doc.is_file():
            raise ArtifactRefused(f"folder {path} holds no {BUNDLE_MANIFEST}")
        return doc.read_bytes(), src
    if is_tar_path(path):
        members = read_tar_bundle(path)
        doc = members.get(BUNDLE_MANIFEST)
        if doc is None:
            raise ArtifactRefused(f"bundle {path} holds no {BUNDLE_MANIFEST}")
        return doc, Source(label=f"bundle {path}", members=members, exact=True)
    root = Path(build) if build is not None else path.parent
    return path.read_bytes(), Source(label=f"folder {root}", root=root, table_file=runtime_table_path(path))


# ---- artifacts --------------------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_artifact_bytes(art: dict, data: bytes | None, source: Source, by: str = "the manifest") -> bytes:
    """The artifact's bytes if they match the size and sha256 recorded `by` the manifest; refuses otherwise."""
    if data is None:
        raise ArtifactRefused(f"artifact {art['path']} is missing from {source.label}")
    if len(data) != art["size"]:
        raise ArtifactRefused(f"artifact {art['path']} in {source.label} is {len(data)} bytes, {by} says {art['size']}")
    if sha256(data) != art["sha256"]:
        raise ArtifactRefused(f"artifact {art['path']} in {source.label} does not match its sha256 in {by}")
    return data


def check_complete(body: dict, source: Source, *, hash_all: bool = True, runtime_table: bool = False) -> None:
    """Every admitted symbol lives in a listed cubin; every artifact is present (and hashes, when `hash_all`);
    an exact source (bundle) holds nothing else."""
    cubins = {(a["module"], a["target"]) for a in body["artifacts"] if a["code"] == "cubin"}
    for s in body.get("symbols", []):
        if s["status"] == "admitted" and (s["module"], s["target"]) not in cubins:
            raise ArtifactRefused(
                f"symbol {s['name']} is admitted but the manifest lists no cubin for module {s['module']} on {s['target']}"
            )
    for a in body["artifacts"]:
        if hash_all:
            check_artifact_bytes(a, source.read(a["path"]), source)
        else:
            size = source.size(a["path"])
            if size is None:
                raise ArtifactRefused(f"artifact {a['path']} is missing from {source.label}")
            if size != a["size"]:
                raise ArtifactRefused(f"artifact {a['path']} in {source.label} is {size} bytes, the manifest says {a['size']}")
    if source.exact:
        named = {BUNDLE_MANIFEST, *([RUNTIME_TABLE] if runtime_table else []), *(a["path"] for a in body["artifacts"])}
        extra = sorted(source.names() - named)
        if extra:
            more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
            raise ArtifactRefused(f"{source.label} holds files its manifest does not name: {', '.join(extra[:3])}{more}")


# ---- one call ---------------------------------------------------------------------------------------------


@dataclass
class Verified:
    """A document whose signature and layout verified, with where its artifacts come from."""

    path: Path
    body: dict
    signature: signing.Signature
    source: Source
    document: bytes = b""  # the exact signed bytes that verified
    runtime_table: bytes | None = None  # the runtime table bound to the body, when it names one
    entries: list[Verified] = field(default_factory=list)  # an index's verified manifests

    @property
    def kind(self) -> str:
        return self.body["kind"]


def open_verified(path: str | Path, *, keys: Mapping[str, Ed25519PublicKey], build: str | Path | None = None,
                  hash_all: bool = True, follow_index: bool = True, now: datetime | None = None,
                  full_body: bool = True) -> Verified:
    """Open and verify a manifest, bundle or index. For an index, every entry is checked and verified too.

    full_body=False (the loader): when the signed body names a runtime table, its body is that table (no
    toolchain, no checks), and the manifest's TOML is never parsed past its top-level keys.
    """
    path = Path(path)
    what = str(path)
    doc, source = open_source(path, build)
    body_bytes, sig = _signed_body(doc, keys, what)
    head = body_head(body_bytes)
    table = _bound_table(head, source, what) if head and head.get("kind") == "qualified" and any(
        k in head for k in RUNTIME_KEYS) else None
    if table is not None and not full_body:
        body = _table_body(head, table, what)
    else:
        body = _parse_body(body_bytes, what)
        if table is not None and runtime_table_bytes(body) != table:
            raise ManifestRefused(f"the runtime table of {what} is not the projection of its signed body; "
                                  "re-sign the manifest")
    check_body(body, what=what, now=now)
    _check_dev_key(body, sig, what)
    v = Verified(path=path, body=body, signature=sig, source=source, document=doc, runtime_table=table)
    if body["kind"] == "qualified":
        check_complete(body, source, hash_all=hash_all, runtime_table=table is not None)
    elif follow_index:
        v.entries = [open_entry(v, e, keys=keys, build=build, hash_all=hash_all, now=now) for e in body["entries"]]
    return v


def open_entry(index: Verified, entry: dict, *, keys, build=None, hash_all=True, now=None,
               full_body: bool = True) -> Verified:
    """One index entry: its file is checked against the index's size and sha256, then verified itself."""
    base = index.path.parent
    p = base / entry["path"]
    folder = Source(label=f"index folder {base}", root=base)
    check_artifact_bytes(entry, folder.read(entry["path"]), folder, by="the index")
    v = open_verified(p, keys=keys, build=build, hash_all=hash_all, follow_index=False, now=now, full_body=full_body)
    if v.kind != "qualified":
        raise ManifestRefused(f"index entry {entry['path']} is not a qualified manifest")
    dev = v.body["device"]
    if (dev["name"], dev["cc"], dev["sm_count"]) != (entry["device_name"], entry["cc"], entry["sm_count"]):
        raise ManifestRefused(f"index entry {entry['path']} names device {entry['device_name']} but its manifest was "
                              f"qualified on {dev['name']}")
    return v
