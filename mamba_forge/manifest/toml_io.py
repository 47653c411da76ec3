"""TOML input and output of records: written with tomli-w, read with tomllib into the same pydantic models."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

import tomli_w
from pydantic import BaseModel, ValidationError

from mamba_forge.errors import ManifestError
from mamba_forge.fsio import write_atomic

M = TypeVar("M", bound=BaseModel)


def dumps(model: BaseModel) -> str:
    """TOML text of a record (TOML has no null: None fields are left out and read back as defaults)."""
    return tomli_w.dumps(model.model_dump(mode="json", exclude_none=True))


def write(path: Path, model: BaseModel) -> None:
    """Atomic write: a reader never sees half a manifest."""
    write_atomic(Path(path), dumps(model))


def loads(text: str, cls: type[M], *, source: str = "<text>") -> M:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from None
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ManifestError(f"{source}: {loc}: {err['msg']}") from None


def read(path: Path, cls: type[M]) -> M:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}", hint="run `mamba-forge build` first or pass its path") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: cannot read as a manifest ({type(exc).__name__})") from None
    return loads(text, cls, source=str(path))
