"""`build --kernels GLOB`: keep only the symbols whose name matches a glob, and the modules left with any."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from mamba_forge.catalog.model import Catalog
from mamba_forge.core.errors import ForgeError

MAX_GLOB = 200  # characters: a symbol name is far shorter; longer is a mistake or an attack on fnmatch


def select_symbols(catalog: Catalog, globs: Sequence[str]) -> Catalog:
    """The catalog narrowed to symbols matching any glob (fnmatch, case-sensitive). A glob that matches no
    symbol, an empty one or an overlong one is bad input."""
    for g in globs:
        if not g or len(g) > MAX_GLOB:
            raise ForgeError(f"--kernels {g[:40]!r} is {'empty' if not g else 'too long'}",
                             hint="pass a glob over symbol names, e.g. --kernels 'softplus*'")
    matched: set[str] = set()
    modules = []
    for m in catalog.modules:
        keep = tuple(s for s in m.symbols if any(fnmatchcase(s.name, g) for g in globs))
        matched.update(g for g in globs for s in keep if fnmatchcase(s.name, g))
        if keep:
            modules.append(m.model_copy(update={"symbols": keep}))
    unmatched = [g for g in globs if g not in matched]
    if unmatched:
        raise ForgeError(f"--kernels {unmatched[0]!r} matches no symbol of {catalog.path}",
                         hint="`mamba-forge report build/manifest.toml` lists symbol names")
    return catalog.narrowed(tuple(modules))
