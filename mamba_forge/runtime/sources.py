"""Where a signed document and its artifacts come from, with no GPU and no parsing:

* a manifest file: artifacts are read relative to ``build`` (default: the manifest's folder); other files may
  sit beside them (a build folder); its runtime table is X.runtime.json beside X.toml;
* a folder bundle (``manifest.toml``, ``runtime.json`` + exactly the artifacts it names) or a ``.tar.gz`` bundle
  (read in memory, never extracted);
* a release index's entry: a file beside the index, checked by the size and sha256 the index records.

Every artifact read is checked by size and sha256 against the record that names it. Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mamba_forge.manifest.schema import RESERVED_PATHS
from mamba_forge.runtime.errors import ArtifactRefused

BUNDLE_MANIFEST, RUNTIME_TABLE = RESERVED_PATHS  # a bundle's own files; beside a bare X.toml: X.runtime.json
MAX_BUNDLE_BYTES = 1 << 31  # a bundle larger than 2 GiB is refused before it is read into memory



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


def runtime_table_path(manifest: Path) -> Path:
    """Where a bare manifest's runtime table sits: X.toml -> X.runtime.json, beside it."""
    return manifest.with_name(manifest.name.removesuffix(".toml") + ".runtime.json")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_artifact_bytes(art, data: bytes | None, source: Source, by: str = "the manifest") -> bytes:
    """The bytes if they match the size and sha256 that `art` (a QArtifact or an IndexEntry) records; refuses
    otherwise."""
    if data is None:
        raise ArtifactRefused(f"artifact {art.path} is missing from {source.label}")
    if len(data) != art.size:
        raise ArtifactRefused(f"artifact {art.path} in {source.label} is {len(data)} bytes, {by} says {art.size}")
    if sha256(data) != art.sha256:
        raise ArtifactRefused(f"artifact {art.path} in {source.label} does not match its sha256 in {by}")
    return data


def read_indexed(index_path: Path, entry) -> Path:
    """The path of an index entry's file, after its bytes matched the entry's size and sha256."""
    base = index_path.parent
    folder = Source(label=f"index folder {base}", root=base)
    check_artifact_bytes(entry, folder.read(entry.path), folder, by="the index")
    return base / entry.path


__all__ = ["BUNDLE_MANIFEST", "MAX_BUNDLE_BYTES", "RUNTIME_TABLE", "Source", "check_artifact_bytes", "is_tar_path",
           "open_source", "read_indexed", "read_tar_bundle", "runtime_table_path", "sha256"]
