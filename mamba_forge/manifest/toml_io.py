"""TOML input and output of manifest records (mamba_forge/manifest/schema.py): written with tomli-w, read with
tomllib, converted both ways by the one codec (codec.py). A document that does not fit its record is refused with
one ManifestError line naming the file and the path."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

import tomli_w

from mamba_forge.errors import ManifestError
from mamba_forge.fsio import write_atomic
from mamba_forge.manifest.codec import from_dict, to_dict
from mamba_forge.manifest.schema import SchemaError

R = TypeVar("R")


def dumps(record) -> str:
    """TOML text of a record (TOML has no null: None fields are left out and read back as defaults)."""
    return tomli_w.dumps(to_dict(record))


def write(path: Path, record) -> None:
    """Atomic write: a reader never sees half a manifest."""
    write_atomic(Path(path), dumps(record))


def parse(data, cls: type[R], *, source: str) -> R:
    """The record `cls` of plain data read from `source`; ManifestError (one line) when it does not fit."""
    try:
        return from_dict(cls, data, where=source)
    except SchemaError as exc:
        raise ManifestError(str(exc)) from None


def loads(text: str, cls: type[R], *, source: str = "<text>") -> R:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    return parse(data, cls, source=source)


def read(path: Path, cls: type[R]) -> R:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}", hint="run `mamba-forge build` first or pass its path") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read as a manifest ({type(exc).__name__})") from None
    return loads(text, cls, source=str(path))
