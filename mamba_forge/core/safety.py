"""The safety rules at the trust, read and output boundaries, each in one place. Standard library only: the cache,
the runtime's trust folder and every reader of untrusted files share it.

* Private paths (`check_components`, `check_owner_mode`, `check_trusted_dir`, `check_trusted_file`): no symlinked
  component, no group- or world-writable ancestor that neither root nor you own, and the folder or key itself
  owned by you or root and writable by nobody else.
* Bounded reads (`read_bounded`): only a regular file, no larger than its cap, checked on the open descriptor
  before a byte is read (a FIFO, /dev/zero or a folder is refused, never read); parsers (`parse_toml`,
  `parse_json`) refuse nesting deeper than the interpreter allows as one line instead of a RecursionError.
* Outputs (`check_output_file`, `prepare_output_dir`, `check_not_inside`, `check_inputs_apart`): an output never
  names one of the command's inputs nor lies in an input folder, and a path that cannot be written is one line,
  before any work.

Each refusal is a `PathRefused` naming the path and the rule; callers re-raise it as their own error class.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tomllib
from collections.abc import Iterable
from pathlib import Path

MAX_MANIFEST_BYTES = 64 << 20  # a qualified manifest of 266 symbols is 0.7 MB; its runtime table 0.12 MB
MAX_CATALOG_BYTES = 8 << 20  # a catalog or family file
MAX_BUNDLE_BYTES = 1 << 31  # a .tar.gz bundle, compressed and decompressed alike; also one artifact file
MAX_KEY_BYTES = 16 << 10  # a public key is one 53-byte line; a PEM private key ~120 bytes
MAX_SIGNATURE_TAIL = 1024  # the canonical [signature] table is ~190 bytes


class PathRefused(Exception):
    """A path breaks one of the rules above; the message names the path and the rule."""


# ---- private paths ------------------------------------------------------------------------------------------


def check_components(path: Path, *, uid: int | None = None, what: str = "path") -> Path:
    """The absolute path, after every existing component passed: none is a symlink, and a group- or
    world-writable folder above the last component is owned by root or `uid` (a sticky /tmp is root's)."""
    uid = os.getuid() if uid is None else uid
    path = Path(os.path.abspath(path))
    current = Path(path.anchor)
    for part in path.parts[1:]:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise PathRefused(f"{what} {path} has a symlinked component {current}")
        if current != path and not stat.S_ISDIR(st.st_mode):
            raise PathRefused(f"{what} component {current} is not a folder")
        if current != path and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and st.st_uid not in (0, uid):
            raise PathRefused(f"{what} ancestor {current} is group- or world-writable and owned by uid {st.st_uid}")
    return path


def check_owner_mode(path: Path, st: os.stat_result, *, uid: int | None = None, what: str = "path") -> None:
    """Owned by you or root, and writable by nobody else."""
    uid = os.getuid() if uid is None else uid
    if st.st_uid not in (0, uid):
        raise PathRefused(f"{what} {path} is owned by uid {st.st_uid}, not by you ({uid}) or root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PathRefused(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: group- or world-writable")


def _check_trusted(path: Path, uid: int | None, what: str, is_kind, kind: str) -> Path:
    """check_components, then `path` itself (not followed) is of the kind (`is_kind` of its mode; else refused as
    not `kind`) and passes check_owner_mode."""
    path = check_components(path, uid=uid, what=what)
    st = os.lstat(path)
    if not is_kind(st.st_mode):
        raise PathRefused(f"{what} {path} is not {kind}")
    check_owner_mode(path, st, uid=uid, what=what)
    return path


def check_trusted_dir(path: Path, *, uid: int | None = None, what: str = "trust folder") -> Path:
    return _check_trusted(path, uid, what, stat.S_ISDIR, "a folder")


def check_trusted_file(path: Path, *, uid: int | None = None, what: str = "trusted key") -> Path:
    path = _check_trusted(path, uid, what, stat.S_ISREG, "a regular file")
    check_owner_mode(path.parent, os.lstat(path.parent), uid=uid, what=f"the folder of {what}")
    return path


# ---- bounded reads ------------------------------------------------------------------------------------------


def read_bounded(path: Path, limit: int, *, what: str = "input", follow: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. The type and size are checked on the opened
    descriptor (O_NONBLOCK: opening a FIFO does not wait for a writer), so a file swapped after a check cannot
    slip through; a file that grows past `limit` while it is read is refused too. `follow=False`: a symlink
    is refused (O_NOFOLLOW)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise PathRefused(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise PathRefused(f"{what} {path} is a folder, not a file") from None
    except OSError as exc:
        raise PathRefused(f"{what} {path} cannot be opened ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PathRefused(f"{what} {path} is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"{what} {path} is not a regular file (a FIFO, device or socket is never read)")
        if st.st_size > limit:
            raise PathRefused(f"{what} {path} is {st.st_size} bytes, above the limit of {limit}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise PathRefused(f"{what} {path} grew above the limit of {limit} bytes while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise PathRefused(f"{what} {path} cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def parse_toml(text: str, *, what: str = "input") -> dict:
    """tomllib's parse; nesting deeper than the interpreter's recursion limit is a TOMLDecodeError, not a crash.
    (tomllib is pure Python and keeps no state across calls, so unwinding a RecursionError leaves nothing
    half-done.)"""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError(f"{what} nests arrays or tables too deeply") from None


def parse_json(data: bytes | str, *, what: str = "input"):
    """json's parse; ValueError (not RecursionError) for nesting too deep."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{what} nests arrays or objects too deeply") from None


# ---- outputs -------------------------------------------------------------------------------------------------


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (after symlinks and hard links); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(os.path.abspath(a)) == Path(os.path.abspath(b))


def check_output_file(path: Path, *, inputs: Iterable[Path] = (), what: str = "output") -> Path:
    """An output file's path: not one of `inputs`, not a folder, and its folder exists or can be made."""
    path = Path(path)
    for p in inputs:
        if same_file(path, Path(p)):
            raise PathRefused(f"{what} {path} is also an input of this command; write it elsewhere")
    if path.is_dir():
        raise PathRefused(f"{what} {path} is a folder; name a file")
    prepare_output_dir(path.parent, what=f"the folder of {what}")
    return path


def prepare_output_dir(path: Path, *, what: str = "output folder") -> Path:
    """Make the folder (with parents) and prove it takes a file, so a bad path is refused before any work."""
    path = Path(path)
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise PathRefused(f"{what} {path}: {p} exists and is not a folder")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        import tempfile  # only when probing (the runtime loader imports this module)

        fd, probe = tempfile.mkstemp(prefix=".mf-probe.", dir=path)
    except OSError as exc:
        raise PathRefused(f"{what} {path} cannot be written ({exc.strerror or exc})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return path


def inside(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or lies beneath it, both after symlinks (a missing tail is taken as written)."""
    return _beneath(os.path.realpath(path), os.path.realpath(folder))


def _beneath(real: str, folder: str) -> bool:
    """Whether the resolved path `real` is the resolved `folder` or lies beneath it."""
    return real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)


def check_not_inside(path: Path, folders: Iterable[Path], *, what: str = "output") -> Path:
    """An output that is neither one of the input `folders` nor inside one (writing there would change the input)."""
    path = Path(path)
    for f in folders:
        if inside(path, Path(f)):
            where = "is" if same_file(path, Path(f)) else "is inside"
            raise PathRefused(f"{what} {path} {where} {f}, an input folder of this command; write it elsewhere")
    return path


def check_inputs_apart(outputs: Iterable[Path], inputs: Iterable[Path], *, folders: Iterable[Path] = (),
                       what: str = "output") -> None:
    """No existing one of `outputs` is one of `inputs` (the same file after symlinks and hard links), and no input
    lies inside one of `folders` (the folders the command writes into): nothing the command writes replaces an input.
    Inputs are statted once each: a build checks hundreds of outputs against hundreds of catalog files."""
    inputs = [Path(p) for p in inputs]
    seen: dict[tuple[int, int], Path] = {}
    for p in inputs:
        try:
            st = os.stat(p)
        except OSError:
            continue
        seen.setdefault((st.st_dev, st.st_ino), p)
    for out in outputs:
        try:
            st = os.stat(out)
        except OSError:
            continue
        hit = seen.get((st.st_dev, st.st_ino))
        if hit is not None:
            also = "" if Path(os.path.abspath(hit)) == Path(os.path.abspath(out)) else f" ({hit})"
            raise PathRefused(f"{what} {out} is also an input of this command{also}; write it elsewhere")
    folders = [(Path(f), os.path.realpath(f)) for f in folders]
    for p in inputs if folders else ():
        real = os.path.realpath(p)
        for folder, f in folders:
            if _beneath(real, f):
                raise PathRefused(f"{what} {folder} holds {p}, an input of this command; write it elsewhere")


__all__ = ["MAX_BUNDLE_BYTES", "MAX_CATALOG_BYTES", "MAX_KEY_BYTES", "MAX_MANIFEST_BYTES", "MAX_SIGNATURE_TAIL", "PathRefused",
           "check_components", "check_inputs_apart", "check_not_inside", "check_output_file", "check_owner_mode",
           "check_trusted_dir", "check_trusted_file", "inside", "parse_json", "parse_toml", "prepare_output_dir",
           "read_bounded", "same_file"]
