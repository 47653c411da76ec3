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
import os
import stat
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mamba_forge.core.safety import MAX_BUNDLE_BYTES, MAX_MANIFEST_BYTES, PathRefused, read_bounded
from mamba_forge.core.schema import RESERVED_PATHS
from mamba_forge.runtime.errors import ArtifactRefused

BUNDLE_MANIFEST, RUNTIME_TABLE = RESERVED_PATHS  # a bundle's own files; beside a bare X.toml: X.runtime.json
_BLOCK = 512
_TAR_END = 2 * _BLOCK + tarfile.RECORDSIZE  # end-of-archive blocks, then padding to a whole record (tarfile's)


def _read_regular(p: Path, limit: int = MAX_BUNDLE_BYTES) -> bytes | None:
    """The bytes of a regular file (not a symlink, not above `limit`), or None."""
    try:
        return read_bounded(p, limit, follow=False)
    except PathRefused:
        return None


def _read_input(p: Path, what: str, follow: bool = True) -> bytes:
    try:
        return read_bounded(p, MAX_MANIFEST_BYTES, what=what, follow=follow)
    except PathRefused as exc:
        raise ArtifactRefused(str(exc)) from None


@dataclass
class Source:
    """Where artifact bytes come from. `exact`: the source holds exactly the manifest and its artifacts.
    A .tar.gz bundle is read as it is needed: its manifest and runtime table first, then, once the verified
    record says what the rest must be, every other member (`expect`)."""

    label: str
    root: Path | None = None
    members: dict[str, bytes] | None = None
    exact: bool = False
    table_file: Path | None = None  # a bare manifest's runtime table (a bundle holds RUNTIME_TABLE)
    tar: TarReader | None = None  # the rest of a .tar.gz bundle, not yet read
    bare: bool = False  # a bare manifest's folder: a build there may since have written other programs
    missing_hint: str = ""  # what to do when an artifact is missing (the caller's words: load() or verify)

    def refused(self, rel: str, what: str = "", smaller: bool = False) -> ArtifactRefused:
        """An artifact missing (no `what`) or wrong (`what`: its size, its sha256), and what to do about it."""
        if not what:
            return ArtifactRefused(f"artifact {rel} is missing from {self.label}{'; ' * bool(self.missing_hint)}"
                                   f"{self.missing_hint}")
        why = (f" (a build with --kernels or --module writes {'a smaller' if smaller else 'another'} program under "
               "the same name: rebuild without them)") if self.bare else ""
        return ArtifactRefused(f"artifact {rel} in {self.label} {what}{why}")

    def expect(self, sizes: Mapping[str, int] | None) -> None:
        """Read the rest of a .tar.gz bundle; with `sizes`, each member's header must name one of them with
        that exact size before its data is read."""
        if self.tar is not None:
            tar, self.tar = self.tar, None
            _tar_errors(tar.path, lambda: tar.read_rest(self.members, sizes))  # type: ignore[arg-type]

    def read_runtime_table(self) -> bytes | None:
        if self.exact:
            if self.tar is not None and RUNTIME_TABLE not in self.members and self.tar.peeked is not None:  # type: ignore[operator]
                raise ArtifactRefused(f"{RUNTIME_TABLE} in {self.label} is missing: its second member is "
                                      f"{self.tar.peeked[0]}, where the runtime table belongs")
            return self.read(RUNTIME_TABLE)
        return None if self.table_file is None else _read_regular(self.table_file, MAX_MANIFEST_BYTES)

    def runtime_table_label(self) -> str:
        return f"{RUNTIME_TABLE} in {self.label}" if self.exact else str(self.table_file)

    def read(self, rel: str) -> bytes | None:
        if self.members is not None:
            if rel not in self.members and self.tar is not None:
                # the rest is read only against the verified record's names and sizes (expect): the runtime
                # table comes second or not at all, and nothing else is read unchecked
                if rel == RUNTIME_TABLE:
                    return None
                raise ArtifactRefused(f"{rel} in {self.label} was asked for before its manifest verified")
            return self.members.get(rel)
        assert self.root is not None
        if self.exact:  # a folder bundle: no component of the path may be a link (swapped after the walk)
            from mamba_forge.runtime.folders import read_beneath

            return read_beneath(self.root, rel)
        return _read_regular(self.root / rel)

    def size(self, rel: str) -> int | None:
        if self.members is not None:
            data = self.read(rel)
            return None if data is None else len(data)
        assert self.root is not None
        try:
            st = os.lstat(self.root / rel)
        except OSError:
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def names(self) -> set[str]:
        if self.members is not None:
            if self.tar is not None:
                raise ArtifactRefused(f"the members of {self.label} were asked for before its manifest verified")
            return set(self.members)
        assert self.root is not None
        if self.exact:
            from mamba_forge.runtime.folders import folder_names

            return folder_names(self.root, self.label)
        out = set()
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                out.add(Path(dirpath, f).relative_to(self.root).as_posix())
        return out


class _Inflater:
    """The bytes of a (gzip-compressed or plain) tar file, decompressed as they are asked for, never more than
    `cap` in all: a small archive of a huge zero stream costs the bytes asked for, not the stream.

    A read of n bytes decompresses n more (zlib's max_length), from compressed input read 1 MB at a time (zlib
    copies the unconsumed input per call: small reads of headers want it short, big members long), and joins the
    pieces once: never a bytearray grown, sliced and copied again."""

    _IN = 1 << 20  # compressed bytes read per call

    def __init__(self, f, cap: int, label: str):
        self.f, self.cap, self.label, self.total = f, cap, label, 0
        self.raw = f.read(2)
        self.zlib = zlib.decompressobj(wbits=31) if self.raw == b"\x1f\x8b" else None
        self.buf, self.pos = b"", 0  # decompressed, not yet read: buf[pos:]

    def _more(self, want: int) -> bytes:
        """The next decompressed bytes (at most `want`; a plain tar reads at least 64 KB); b"" at the end."""
        if self.zlib is None:
            want = max(want, 1 << 16)
            data = self.raw + self.f.read(want - len(self.raw)) if self.raw else self.f.read(want)
            self.raw = b""
        else:
            data = b""
            while not data:
                if self.zlib.eof:  # a gzip file may hold several members, one after the other (RFC 1952)
                    rest = self.zlib.unused_data + self.raw or self.f.read(self._IN)
                    if not rest:
                        return b""
                    self.zlib, self.raw = zlib.decompressobj(wbits=31), rest
                src = self.zlib.unconsumed_tail or self.raw or self.f.read(self._IN)
                self.raw = b""
                data = self.zlib.decompress(src, want)  # b"" in: what zlib still holds of the input it took
                if not src and not data and not self.zlib.eof:
                    return b""  # the file ended inside a member
        self.total += len(data)
        if self.total > self.cap:
            raise ArtifactRefused(f"{self.label} decompresses to more than {self.cap} bytes, what its manifest "
                                  "declares or the bundle limit")
        return data

    def read(self, n: int) -> bytes:
        buf, pos = self.buf, self.pos
        have = len(buf) - pos
        if have >= n:
            self.pos = pos + n
            return buf[pos:pos + n]
        parts = [buf[pos:]] if have else []
        need = n - have
        while need > 0:
            data = self._more(need)
            if not data:
                self.buf, self.pos = b"", 0
                raise ArtifactRefused(f"{self.label} is truncated")
            if len(data) > need:
                parts.append(data[:need])
                self.buf, self.pos = data, need
                return b"".join(parts)
            parts.append(data)
            need -= len(data)
        self.buf, self.pos = b"", 0
        return b"".join(parts)

    def finish(self) -> None:
        """Read to the end of the file (the tar's padding, at most the cap): a gzip stream must end with its
        last member complete, so a cut or trailing junk is refused even where it holds only padding."""
        self.buf, self.pos = b"", 0
        while self._more(1 << 16):
            pass
        if self.zlib is not None and not self.zlib.eof:
            raise ArtifactRefused(f"{self.label} is truncated")

    def consumed(self) -> int:
        """Decompressed bytes handed out so far."""
        return self.total - (len(self.buf) - self.pos)

    def remaining(self) -> int:
        return self.cap - self.total + len(self.buf) - self.pos


class TarReader:
    """A tar bundle's members, one header at a time: each header is checked (a regular file with a safe, new
    name, no larger than what is left of the cap) before a byte of its data is decompressed."""

    def __init__(self, path: Path):
        self.path, self.label = path, f"bundle {path}"
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise ArtifactRefused(f"bundle {path} cannot be opened ({exc.strerror or exc})") from None
        self.f = os.fdopen(fd, "rb")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            self.f.close()
            raise ArtifactRefused(f"bundle {path} is not a regular file")
        if st.st_size > MAX_BUNDLE_BYTES:
            self.f.close()
            raise ArtifactRefused(f"bundle {path} is larger than {MAX_BUNDLE_BYTES} bytes")
        self.stream = _Inflater(self.f, MAX_BUNDLE_BYTES, self.label)
        self.seen: set[str] = set()
        self.peeked: tuple[str, int] | None = None

    def close(self) -> None:
        self.f.close()

    def next(self, sizes: Mapping[str, int] | None = None) -> tuple[str, int] | None:
        """(name, size) of the next regular member, or None at the end; folders are skipped. With `sizes`, the
        member must be one of them at that size."""
        if self.peeked is not None:
            out, self.peeked = self.peeked, None
            return out
        while True:
            block = self.stream.read(_BLOCK)
            if block == bytes(_BLOCK):  # the end: what follows is at most the second end block and a record's padding
                self.stream.cap = min(self.stream.cap, self.stream.consumed() + _TAR_END)
                self.stream.finish()
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
            except tarfile.HeaderError as exc:
                raise ArtifactRefused(f"{self.label} is not a readable .tar.gz (a bad header: {exc})") from None
            if info.isdir() and info.size == 0:
                continue
            if not info.isreg():
                raise ArtifactRefused(f"{self.label} holds {info.name!r}, which is not a regular file")
            name = info.name.removeprefix("./")
            p = PurePosixPath(name)
            if not name or p.is_absolute() or ".." in p.parts or str(p) != name:
                raise ArtifactRefused(f"{self.label} holds an unsafe member name {info.name!r}")
            if name in self.seen:
                raise ArtifactRefused(f"{self.label} holds {name} twice")
            if sizes is not None:
                self.check_named(name, info.size, sizes)
            if info.size > self.stream.remaining():
                raise ArtifactRefused(f"{self.label} member {name} is {info.size} bytes, above the limit of "
                                      f"{self.stream.cap} bytes for the whole bundle")
            self.seen.add(name)
            return name, info.size

    def check_named(self, name: str, size: int, sizes: Mapping[str, int]) -> None:
        """A member must be one the verified record names, at the size it records."""
        if name not in sizes:
            raise ArtifactRefused(f"{self.label} holds files its manifest does not name: {name}")
        if size != sizes[name]:
            raise ArtifactRefused(f"artifact {name} in {self.label} is {size} bytes, the manifest says {sizes[name]}")

    def data(self, size: int) -> bytes:
        out = self.stream.read(size)
        self.stream.read(-size % _BLOCK)
        return out

    def read_first(self, name: str, limit: int, *, required: bool) -> bytes | None:
        """The next member's bytes when it is `name` (at most `limit` bytes); else it stays for the next call."""
        head = self.next()
        if head is None or head[0] != name:
            if required:
                raise ArtifactRefused(f"bundle {self.path} holds no {name} as its first member")
            self.peeked = head
            return None
        if head[1] > limit:
            raise ArtifactRefused(f"{self.label} member {name} is {head[1]} bytes, above the limit of {limit}")
        return self.data(head[1])

    def read_rest(self, members: dict[str, bytes], sizes: Mapping[str, int] | None) -> None:
        """Every remaining member; with `sizes`, each must be one of them at that size (checked at its header),
        and the stream may inflate no further than their headers, data, and the tar's end and record padding."""
        if sizes is not None:
            declared = sum(_BLOCK + size + -size % _BLOCK for size in sizes.values()) + _TAR_END
            self.stream.cap = min(self.stream.cap, self.stream.consumed() + declared)
        try:
            if self.peeked is not None and sizes is not None:  # a member read_first looked at and left
                self.check_named(*self.peeked, sizes)
            while (head := self.next(sizes)) is not None:
                name, size = head
                members[name] = self.data(size)
        finally:
            self.close()


def _tar_errors(path: Path, fn):
    try:
        return fn()
    except ArtifactRefused:
        raise
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise ArtifactRefused(f"bundle {path} is not a readable .tar.gz ({type(exc).__name__}: {exc})") from None


def read_tar_bundle(path: Path) -> dict[str, bytes]:
    """Members of a .tar.gz bundle, in memory; refuses links, devices, unsafe or duplicate names, and more
    than MAX_BUNDLE_BYTES decompressed."""
    def read() -> dict[str, bytes]:
        members: dict[str, bytes] = {}
        TarReader(Path(path)).read_rest(members, None)
        return members

    return _tar_errors(Path(path), read)


def _open_tar(path: Path) -> tuple[bytes, Source]:
    """The manifest (first member) and runtime table (second, when there is one) of a .tar.gz bundle; the rest
    is read when the verified record says what it must be (Source.expect)."""
    def start() -> tuple[bytes, Source]:
        tar = TarReader(path)
        try:
            doc = tar.read_first(BUNDLE_MANIFEST, MAX_MANIFEST_BYTES, required=True)
            members = {BUNDLE_MANIFEST: doc}
            table = tar.read_first(RUNTIME_TABLE, MAX_MANIFEST_BYTES, required=False)
            if table is not None:
                members[RUNTIME_TABLE] = table
        except BaseException:
            tar.close()
            raise
        return doc, Source(label=f"bundle {path}", members=members, exact=True, tar=tar)  # type: ignore[arg-type]

    return _tar_errors(path, start)


def is_tar_path(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz", ".tar"))


def open_source(path: str | Path, build: str | Path | None = None) -> tuple[bytes, Source]:
    """(signed document bytes, artifact source) for a manifest file, a folder bundle or a .tar.gz bundle. Every
    read is bounded (safety.read_bounded): a FIFO, a device or an oversized file is refused before it is read."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        make = f"make one with `mamba-forge bundle MANIFEST --build BUILD -o {path}`" if is_tar_path(path) else \
            "pass a signed qualified manifest, a bundle (.tar.gz or folder) or a release index"
        raise ArtifactRefused(f"{path} does not exist; {make}")
    if path.is_dir():
        from mamba_forge.runtime.folders import folder_names

        src = Source(label=f"bundle {path}", root=path, exact=True)  # a folder bundle: exactly its files
        if BUNDLE_MANIFEST not in folder_names(path, src.label):  # links refused before anything is read
            raise ArtifactRefused(f"folder {path} holds no {BUNDLE_MANIFEST}")
        return _read_input(path / BUNDLE_MANIFEST, "bundle manifest", follow=False), src
    if is_tar_path(path):
        return _open_tar(path)
    root = Path(build) if build is not None else path.parent
    return _read_input(path, "manifest"), Source(f"folder {root}", root, table_file=runtime_table_path(path), bare=True)


def runtime_table_path(manifest: Path) -> Path:
    """Where a bare manifest's runtime table sits: X.toml -> X.runtime.json, beside it."""
    return manifest.with_name(manifest.name.removesuffix(".toml") + ".runtime.json")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_artifact_bytes(art, data: bytes | None, source: Source, by: str = "the manifest") -> bytes:
    """The bytes if they match the size and sha256 that `art` (a QArtifact or an IndexEntry) records; refuses
    otherwise."""
    if data is None:
        raise source.refused(art.path)
    if len(data) != art.size:
        raise source.refused(art.path, f"is {len(data)} bytes, {by} says {art.size}", len(data) < art.size)
    if sha256(data) != art.sha256:
        raise source.refused(art.path, f"does not match its sha256 in {by}")
    return data


__all__ = ["BUNDLE_MANIFEST", "MAX_BUNDLE_BYTES", "RUNTIME_TABLE", "Source", "TarReader", "check_artifact_bytes", "is_tar_path",
           "open_source", "read_tar_bundle", "runtime_table_path", "sha256"]
