"""Reading a module's program text: its sources and the headers of its include folders, each read bounded (a
sparse 3 GB file is refused by its size before a byte is read) and each checked by the include rule
(:mod:`mamba_forge.catalog.compile_rules`). Used by the catalog at load and by the build before it compiles."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mamba_forge.catalog.compile_rules import IncludeRefused, include_names
from mamba_forge.core.errors import CatalogError
from mamba_forge.core.safety import PathRefused, read_bounded

MAX_SOURCE_BYTES = 8 << 20  # one source or header: the largest built-in one is ~60 KB
MAX_PROGRAM_BYTES = 64 << 20  # every header of a module's include folders together
MAX_HEADERS = 4096  # files with a header suffix under one include folder
HEADER_SUFFIXES = {".h", ".cuh", ".hpp", ".inl"}


def read_source(path: Path, what: str) -> str:
    """A source or header as text: a regular file of at most MAX_SOURCE_BYTES, UTF-8, whose includes are plain."""
    try:
        text = read_bounded(path, MAX_SOURCE_BYTES, what=what).decode("utf-8")
    except PathRefused as exc:
        raise CatalogError(str(exc), hint=f"a catalog source or header may be at most {MAX_SOURCE_BYTES} bytes") from None
    except UnicodeDecodeError:
        raise CatalogError(f"{what} {path} is not UTF-8 text") from None
    try:
        include_names(text)
    except IncludeRefused as exc:
        raise CatalogError(f"{what} {path}: {exc}",
                           hint="include only the catalog's own headers (by their name under an include folder) "
                                "and CUDA headers such as <cuda_bf16.h>") from None
    return text


def read_headers(base: Path) -> dict[str, bytes]:
    """Every header under an include folder by its relative name, each read bounded and include-checked; a header
    that is a link out of the folder is refused (the catalog's path rule, applied to what the folder holds)."""
    root = base.resolve()
    out: dict[str, bytes] = {}
    total = 0
    for p in sorted(base.rglob("*")):
        if p.suffix not in HEADER_SUFFIXES or p.is_dir():  # a FIFO or device named like a header is refused below
            continue
        if not p.resolve().is_relative_to(root):
            raise CatalogError(f"header {p} leads out of its include folder {root} (to {p.resolve()})",
                               hint="keep headers inside the catalog's folder")
        if len(out) >= MAX_HEADERS:
            raise CatalogError(f"include folder {base} holds more than {MAX_HEADERS} headers")
        data = read_source(p, "header").encode("utf-8")
        total += len(data)
        if total > MAX_PROGRAM_BYTES:
            raise CatalogError(f"the headers under {base} add up to more than {MAX_PROGRAM_BYTES} bytes")
        out[p.relative_to(base).as_posix()] = data
    return out


def check_resolved(texts: dict[str, str | bytes], known: Callable[[str], bool], where: str) -> None:
    """Every name the texts include is `known` (an in-memory header, or a CUDA header): NVRTC would otherwise go
    looking for it on disk."""
    for name, text in texts.items():
        body = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        try:
            names = include_names(body)
        except IncludeRefused as exc:
            raise CatalogError(f"{where}: {name}: {exc}") from None
        missing = sorted({n for n in names if not known(n)})
        if missing:
            raise CatalogError(f"{where}: {name} includes {missing[0]!r}, which is neither a header of the module's "
                               "include folders nor a CUDA header",
                               hint="put the header under an include folder of the catalog")
