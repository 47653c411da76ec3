"""The loaded-catalog memo: a catalog that loaded and passed every check is remembered, with every input it read,
so a later load of the same files skips the parse, the validation and the expansion (0.25 s of a no-change
rebuild of the built-in catalog, about a third of it).

What a load reads is recorded as it happens (:class:`Inputs`): the bytes of every TOML file (root, family and
route files), where every path the catalog names resolves (symlinks included), the bytes of every source, and
every include folder's headers (names and bytes). A memo is used only when each of those reads gives the same
result again, in the same order, done by the same functions (a source is read with its include check, an include
folder listed and read with its link rule): any difference, and any error while checking, is a miss and the
catalog is loaded in full, which then raises its own error or stores a new memo. The entry's key names the
catalog's path, the root file's sha256, this package's own code (the sha256 of the catalog package's modules and
the core modules its checks use: an edited check never meets an old memo), the Python and pydantic versions.

The entry lives in the private cache (mamba_forge/core/cache.py: private folder, atomic 0600 writes, the key and a
sha256 of each part checked on every read). The catalog is stored pickled and read back by an unpickler that
builds only the catalog's own record classes and paths (no other callable can be named, so nothing runs), then
checked to be a Catalog of this path. No cache (MAMBA_FORGE_CACHE=0) or an unusable one: every load is a full
load, silently.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mamba_forge.catalog.expanded import Catalog

FORMAT = 1
FACTS_PART, CATALOG_PART = "inputs.json", "catalog.pickle"
_KINDS = {"file", "path", "source", "headers"}
# the modules whose code decides what a load accepts and builds: the catalog package and the core rules it uses
_CODE = ("catalog", "core/expr.py", "core/vocab.py", "core/safety.py", "core/errors.py")
_code_digest: str | None = None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def headers_digest(headers: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(headers):
        h.update(name.encode() + b"\0" + hashlib.sha256(headers[name]).digest())
    return h.hexdigest()


class Inputs:
    """The reads of one load, in order: (kind, subject, detail, result) rows of text."""

    def __init__(self) -> None:
        self.facts: list[list[str]] = []

    def file(self, path: Path, data: bytes) -> None:
        self.facts.append(["file", str(path), "", _sha(data)])

    def path(self, base: Path, rel: str, resolved: Path) -> None:
        self.facts.append(["path", str(base), rel, str(resolved)])

    def source(self, path: Path, text: str) -> None:
        self.facts.append(["source", str(path), "", _sha(text.encode("utf-8"))])

    def headers(self, folder: Path, headers: dict[str, bytes]) -> None:
        self.facts.append(["headers", str(folder), "", headers_digest(headers)])


def _replay(facts: list) -> bool:
    """Whether every recorded read gives its recorded result again (any error: no)."""
    from mamba_forge.catalog.model import inside_catalog
    from mamba_forge.catalog.sources import read_headers, read_source
    from mamba_forge.core.safety import MAX_CATALOG_BYTES, read_bounded

    try:
        for kind, subject, detail, result in facts:
            if kind == "file":
                got = _sha(read_bounded(Path(subject), MAX_CATALOG_BYTES, what="catalog file"))
            elif kind == "path":
                got = str(inside_catalog(Path(subject), detail, "catalog path"))
            elif kind == "source":
                got = _sha(read_source(Path(subject), "source").encode("utf-8"))
            else:  # an include folder: the load checks it is one before it reads it
                got = headers_digest(read_headers(Path(subject))) if Path(subject).is_dir() else ""
            if got != result:
                return False
    except Exception:  # noqa: BLE001 - whatever the check meets (a CatalogError, an OSError): a full load says it
        return False
    return True


def code_digest() -> str:
    """sha256 of the code that loads and checks a catalog (computed once per process)."""
    global _code_digest
    if _code_digest is None:
        pkg = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for part in _CODE:
            p = pkg / part
            for f in sorted(p.glob("*.py")) if p.is_dir() else [p]:
                h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
        _code_digest = h.hexdigest()
    return _code_digest


def _key(path: Path, root: bytes) -> str:
    import pydantic

    from mamba_forge import __version__
    from mamba_forge.core.cache import cache_key

    return cache_key({"kind": "catalog", "format": FORMAT, "path": str(path), "root_sha256": _sha(root),
                      "tool": __version__, "code": code_digest(), "python": ".".join(map(str, sys.version_info[:3])),
                      "pydantic": pydantic.VERSION})


def _cache():
    from mamba_forge.core.cache import memo_cache

    return memo_cache()


class _CatalogUnpickler(pickle.Unpickler):
    """Builds the catalog's record classes (pydantic models and dataclasses of a mamba_forge.catalog module) and
    paths, nothing else: no other callable can be named. (The module list was once fixed: a record added in a new
    catalog module, split_rules.Split, made every memo unreadable, a silent full load each time.)"""

    def find_class(self, module: str, name: str):
        if module == "pathlib" and name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
            return super().find_class(module, name)
        if module.startswith("mamba_forge.catalog.") and module.count(".") == 2:  # entries, routes, split_rules...
            import dataclasses

            from pydantic import BaseModel

            cls = getattr(sys.modules.get(module) or __import__(module, fromlist=[name]), name, None)
            if isinstance(cls, type) and (issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls)):
                return cls
        raise pickle.UnpicklingError(f"the catalog memo names {module}.{name}, which is not a catalog record")


def _facts_ok(facts) -> bool:
    return type(facts) is list and all(
        type(f) is list and len(f) == 4 and all(type(x) is str for x in f) and f[0] in _KINDS for f in facts)


def lookup(path: Path, root: bytes) -> Catalog | None:
    """The remembered catalog of `path` (whose root file holds `root`), when every recorded read holds again."""
    from mamba_forge.catalog.expanded import Catalog

    cache = _cache()
    if cache is None:
        return None
    found: list = []

    def accept(parts: dict[str, bytes]) -> str | None:
        try:
            facts = json.loads(parts[FACTS_PART])
            if not _facts_ok(facts):
                return "its inputs are not a list of reads"
            if not _replay(facts):
                found.append(None)  # a changed catalog: a miss, not a bad entry (the full load writes a new one)
                return None
            catalog = _CatalogUnpickler(io.BytesIO(parts[CATALOG_PART])).load()
        except Exception as exc:  # noqa: BLE001 - an entry that does not read back is dropped, never served
            return f"unreadable ({type(exc).__name__})"
        if type(catalog) is not Catalog or catalog.path != path:
            return "not a catalog of this path"
        found.append(catalog)
        return None

    cache.get(_key(path, root), accept)
    return found[0] if found else None


def store(path: Path, root: bytes, inputs: Inputs, catalog: Catalog) -> None:
    """Remember a catalog that loaded and passed every check; a cache that cannot take it: nothing, no error."""
    from mamba_forge.core.cache import memo_writes

    cache = _cache() if memo_writes() else None
    if cache is None:
        return
    try:
        data = pickle.dumps(catalog, protocol=5)
    except Exception:  # noqa: BLE001 - a catalog that does not pickle is simply not remembered
        return
    cache.put(_key(path, root), {FACTS_PART: json.dumps(inputs.facts).encode(), CATALOG_PART: data})


__all__ = ["Inputs", "code_digest", "headers_digest", "lookup", "store"]
