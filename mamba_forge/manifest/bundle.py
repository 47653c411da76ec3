"""Release packaging: bundles (a signed manifest with exactly the artifacts it names) and the signed release
index over per-device manifests (``mamba-forge merge``).

Bundle bytes are reproducible: entries in a fixed order (manifest.toml, runtime.json, then artifact paths sorted), mtime 0,
uid/gid 0 with empty owner names, mode 0644, ustar headers, gzip with mtime 0 and no file name: the manifest and
its runtime table at level 9, the artifacts in a second gzip member stored uncompressed (see tar_bytes).
Nothing is packed before the manifest's signature and every artifact's size and sha256 verify.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

from mamba_forge import __version__
from mamba_forge.core import safety
from mamba_forge.core.errors import ForgeError, ManifestError
from mamba_forge.core.fsio import write_atomic
from mamba_forge.core.schema import RESERVED_PATHS, IndexEntry, ReleaseIndex
from mamba_forge.manifest import toml_io
from mamba_forge.runtime import signing
from mamba_forge.runtime.errors import LoadError
from mamba_forge.runtime.sources import BUNDLE_MANIFEST, RUNTIME_TABLE, is_tar_path, runtime_table_path, sha256
from mamba_forge.runtime.verify import Verified, open_verified

INDEX_VALIDITY_DAYS = 365
_TIME = "%Y-%m-%dT%H:%M:%SZ"


class BundleError(ForgeError):
    exit_code = 1


def _qualified(manifest: Path, error: type[ForgeError], otherwise: str, **kw) -> Verified:
    """The verified per-device (qualified) manifest at `manifest`, every artifact hashed; a failed check, or another
    kind of manifest (said as f"{manifest} is a {kind}{otherwise}"), raises `error`."""
    try:
        v = open_verified(manifest, hash_all=True, follow_index=False, **kw)
    except LoadError as exc:
        raise error(str(exc)) from None
    if v.kind != "qualified":
        raise error(f"{manifest} is a {v.kind}{otherwise}")
    return v


def _verified(manifest: Path, keys, build: Path | None) -> Verified:
    return _qualified(manifest, BundleError, ", not a qualified manifest; bundle a per-device manifest", keys=keys,
                      build=build)


def bundle_files(v: Verified) -> list[tuple[str, bytes]]:
    """(name, bytes) in bundle order: the signed manifest's exact bytes, its runtime table when it names one,
    then the artifacts by path."""
    files = [(BUNDLE_MANIFEST, v.document)]
    if v.runtime_table is not None:
        files.append((RUNTIME_TABLE, v.runtime_table))
    for a in sorted(v.manifest.artifacts, key=lambda a: a.path):
        data = v.source.read(a.path)
        if data is None or sha256(data) != a.sha256:  # re-read: it was verified a moment ago, check the bytes packed
            raise BundleError(f"artifact {a.path} changed while bundling")
        files.append((a.path, data))
    return files


def tar_bytes(files: list[tuple[str, bytes]]) -> bytes:
    """A reproducible .tar.gz of the files, in the given order (bundle_files'). The leading manifest and runtime
    table and their tar headers are one gzip member at level 9; the rest (the cubins) a second member stored
    without compression (level 0). Inflating the cubins cost the loader ~25-35 ms of its 100 ms
    cold start on the H200 host and the CPU machine (10 MB at level 9), stored they cost a copy and a CRC; the
    bundle grows from ~1.8 to ~8.7 MB. Both members are plain gzip (RFC 1952 allows several): tar, gzip and
    Python's tarfile read the file as one stream."""
    raw = io.BytesIO()
    split = None  # where the first artifact's header starts
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in files:
            if split is None and name not in RESERVED_PATHS:
                split = raw.tell()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    body = raw.getvalue()
    split = len(body) if split is None else split
    out = io.BytesIO()
    for part, level in ((body[:split], 9), (body[split:], 0)):
        if part:
            with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=level, mtime=0) as gz:
                gz.write(part)
    return out.getvalue()


def write_bundle(manifest: Path, out: Path, *, keys, build: Path | None = None, inputs=()) -> Path:
    """Pack a verified manifest and exactly its artifacts into `out` (.tar.gz / .tgz, else a new folder). `inputs`:
    more files the command reads (its key files, trust_inputs), which `out` must not be either."""
    manifest, out = Path(manifest), Path(out)
    if is_tar_path(out) and out.name.endswith(".tar"):
        raise ForgeError(f"{out}: write a compressed bundle (.tar.gz or .tgz) or a folder")
    # input folders: a folder bundle must not gain a file (verify refuses one that holds more than it names); a
    # build folder may (a bare manifest's folder holds more than it names), but a folder bundle is not nested in it
    folders = [manifest] if manifest.is_dir() else []
    if not is_tar_path(out) and build is not None:
        folders.append(Path(build))
    _refuse_inside(out, folders, "bundle")
    inputs = [manifest, *map(Path, inputs)]
    _refuse_input(out, inputs, "bundle")  # before any work (nothing made yet); again below with what was read
    v = _verified(manifest, keys, build)
    files = bundle_files(v)
    inputs += _read_paths(v)
    if is_tar_path(out):
        _check_output(out, inputs, "bundle")
        return _write(out, tar_bytes(files))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an empty folder; a folder bundle holds exactly its files")
    _check_output_dir(out.parent, "the folder of bundle")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        for name, data in files:
            p = tmp / PurePosixPath(name)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            os.chmod(p, 0o644)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ForgeError(f"cannot write bundle {out}: {exc.strerror or exc}") from None
    return out


def _read_paths(v: Verified) -> list[Path]:
    """The files a verified manifest's check read besides the manifest itself: a bare manifest's runtime table and
    the artifacts of a folder source (a .tar.gz bundle's members are not files)."""
    table = [v.source.table_file] if v.source.table_file is not None else []
    if v.source.root is None or v.manifest is None:
        return table
    return table + [v.source.root / a.path for a in v.manifest.artifacts]


def _refuse_input(out: Path, inputs, what: str) -> None:
    if any(safety.same_file(out, Path(p)) for p in inputs):
        raise ForgeError(f"{what} {out} is also an input of this command; write it elsewhere")


def _refuse_inside(out: Path, folders, what: str) -> None:
    try:
        safety.check_not_inside(out, folders, what=what)
    except safety.PathRefused as exc:
        raise ForgeError(str(exc)) from None


def trust_inputs(out: Path, what: str, *, sign_key: Path | None = None, keys=(), defaults: bool = True) -> list[Path]:
    """The key files a command reads, which its output `out` must not be: the --sign-key file, each --key file, and
    every *.pub of a --key folder, of the shipped release keys and of the user's trust folder (`defaults`). An
    output named *.pub in one of those folders is refused here: the next command would read it as a key."""
    from mamba_forge.runtime.trust import release_keys_dir

    files = [] if sign_key is None else [Path(sign_key)]
    folders = [release_keys_dir(), signing.user_trust_dir()] if defaults else []
    for k in map(Path, keys or ()):
        (folders if k.is_dir() else files).append(k)
    for f in folders:
        if not f.is_dir():
            continue
        if out.name.endswith(".pub") and not out.exists() and safety.same_file(out.parent, f):  # an existing one
            raise ForgeError(f"{what} {out} would be read as a trusted key of {f}; write it elsewhere")  # is an input
        files += sorted(f.glob("*.pub"))
    return files


def _check_output(out: Path, inputs, what: str) -> None:
    """The output rule (safety.py): not one of the command's inputs, and a path that can take a file."""
    try:
        safety.check_output_file(out, inputs=inputs, what=what)
    except safety.PathRefused as exc:
        raise ForgeError(str(exc)) from None


def _check_output_dir(folder: Path, what: str) -> None:
    try:
        safety.prepare_output_dir(folder, what=what)
    except safety.PathRefused as exc:
        raise ForgeError(str(exc)) from None


def _write(out: Path, data: bytes) -> Path:
    try:
        return write_atomic(out, data)
    except OSError as exc:
        raise ForgeError(f"cannot write {out}: {exc.strerror or exc}") from None


# ---- signing keys ---------------------------------------------------------------------------------------


def signing_key(path: Path | None):
    """The private key from a PEM file, else from $MAMBA_FORGE_SIGNING_KEY (CI secrets)."""
    if path is not None:
        try:
            pem = safety.read_bounded(Path(path), safety.MAX_KEY_BYTES, what="signing key")
        except safety.PathRefused as exc:
            raise ForgeError(str(exc)) from None
    else:
        text = os.environ.get(signing.KEY_ENV, "")
        if not text.strip():
            raise ForgeError("no signing key", hint=f"pass --sign-key PATH or set {signing.KEY_ENV} to the PEM text")
        pem = text.encode()
    try:
        return signing.parse_private(pem)
    except signing.SignatureError as exc:
        raise ForgeError(f"signing key: {exc}") from None


# ---- release index ------------------------------------------------------------------------------------------


def index_record(manifests: list[Path], out: Path, *, keys, now: datetime | None = None,
                 development_key: bool = False, read: list | None = None) -> ReleaseIndex:
    """The index over verified per-device manifests (or bundles); paths are relative to the index's folder.
    `read`: gets the files the checks read besides the manifests (runtime tables, artifacts)."""
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    entries, seen = [], {}
    expires = now + timedelta(days=INDEX_VALIDITY_DAYS)
    dev_key = development_key
    for m in manifests:
        m = Path(m)
        v = _qualified(m, ManifestError, "; merge takes per-device qualified manifests or bundles", keys=keys, now=now)
        if read is not None:
            read += _read_paths(v)
        dev = v.manifest.device
        ident = (dev.name, dev.cc, dev.sm_count)
        if ident in seen:
            raise ManifestError(f"{m} and {seen[ident]} were both qualified on {dev.name} ({dev.sm_count} SMs); "
                                "an index holds one manifest per device")
        seen[ident] = m
        rel = os.path.relpath(m.resolve(), out.resolve().parent)
        if rel.startswith(".."):
            raise ManifestError(f"{m} is not under the index's folder {out.parent}; write the index beside the manifests")
        data = v.document if m.is_file() and not is_tar_path(m) else (_read_bundle_bytes(m) if m.is_file() else None)
        if data is None:
            raise ManifestError(f"{m} is a folder; merge manifest files or .tar.gz bundles")
        entries.append(IndexEntry(
            path=Path(rel).as_posix(), sha256=sha256(data), size=len(data), device_name=dev.name, cc=dev.cc,
            sm_count=dev.sm_count, driver_version=dev.driver_version, level=v.manifest.level,
            key_id=v.signature.key_id,
        ))
        exp = datetime.fromisoformat(v.manifest.expires.replace("Z", "+00:00"))
        expires = min(expires, exp if exp.tzinfo else exp.replace(tzinfo=UTC))
        dev_key = dev_key or v.signature.development_key
    if not entries:
        raise ManifestError("merge needs at least one manifest")
    entries.sort(key=lambda e: (e.device_name, e.cc, e.sm_count))
    return ReleaseIndex(created=now.strftime(_TIME), expires=expires.strftime(_TIME), tool_version=__version__,
                        development_key=dev_key, entries=entries)


def write_index(manifests: list[Path], out: Path, private, *, keys, now: datetime | None = None,
                development_key: bool = False, inputs=()) -> Path:
    """`inputs`: more files the command reads (its key files, trust_inputs), which `out` must not be either."""
    out = Path(out)
    tables = [runtime_table_path(Path(m)) for m in manifests if not is_tar_path(Path(m)) and not Path(m).is_dir()]
    inputs = [*map(Path, manifests), *tables, *map(Path, inputs)]
    _check_output(out, inputs, "index")  # before any work; again below with the artifacts the checks read
    read: list[Path] = []
    index = index_record(manifests, out, keys=keys, now=now, development_key=development_key, read=read)
    _check_output(out, inputs + read, "index")
    doc = signing.sign(toml_io.dumps(index).encode(), private, development_key=index.development_key)
    return _write(out, doc)


def _read_bundle_bytes(path: Path) -> bytes:
    try:
        return safety.read_bounded(path, safety.MAX_BUNDLE_BYTES, what="bundle")
    except safety.PathRefused as exc:
        raise ManifestError(str(exc)) from None
