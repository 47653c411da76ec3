"""TOML input and output of manifest records (mamba_forge/core/schema.py): written with tomli-w, read with
tomllib, converted both ways by the one codec (codec.py). A document that does not fit its record is refused with
one ManifestError line naming the file and the path."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

import tomli_w

from mamba_forge.core.codec import from_dict, gc_paused, to_dict
from mamba_forge.core.errors import ForgeError, ManifestError
from mamba_forge.core.fsio import write_atomic
from mamba_forge.core.safety import MAX_MANIFEST_BYTES, PathRefused, parse_toml, read_bounded
from mamba_forge.core.schema import SchemaError
from mamba_forge.core.tomlmemo import parse_toml_bytes

R = TypeVar("R")


def dumps(record) -> str:
    """TOML text of a record (TOML has no null: None fields are left out and read back as defaults)."""
    with gc_paused():
        return tomli_w.dumps(to_dict(record))


def write(path: Path, record) -> None:
    """Atomic write: a reader never sees half a manifest; a path that cannot take it is one line."""
    try:
        write_atomic(Path(path), dumps(record))
    except OSError as exc:
        raise ForgeError(f"cannot write {path}: {exc.strerror or exc}") from None


def parse(data, cls: type[R], *, source: str) -> R:
    """The record `cls` of plain data read from `source`; ManifestError (one line) when it does not fit."""
    try:
        return from_dict(cls, data, where=source)
    except SchemaError as exc:
        raise ManifestError(str(exc)) from None


def loads(text: str, cls: type[R], *, source: str = "<text>") -> R:
    try:
        data = parse_toml(text, what=source)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    return parse(data, cls, source=source)


def read_input(path: Path) -> bytes:
    """A manifest's bytes through the one bounded reader: a regular file of at most MAX_MANIFEST_BYTES."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        raise ManifestError(f"manifest not found: {path}", hint="run `mamba-forge build` first or pass its path")
    try:
        return read_bounded(path, MAX_MANIFEST_BYTES, what="manifest")
    except PathRefused as exc:
        raise ManifestError(str(exc)) from None


def read(path: Path, cls: type[R]) -> R:
    """The record of a manifest file; a large one's parse comes from the parsed-TOML memo when these exact bytes
    were parsed before (core/tomlmemo.py), and is validated by the codec either way."""
    path = Path(path)
    raw = read_input(path)
    try:
        data = parse_toml_bytes(raw, what=str(path))
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: cannot read as a manifest ({type(exc).__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML: {exc}") from None
    return parse(data, cls, source=str(path))
