"""The parsed-TOML memo: a large document's tomllib parse is done once per machine, not once per process.

tomllib is pure Python, ~2 MB/s: a build manifest of 20,000 symbols (8.7 MB) takes 4 s to parse on an idle CPU
machine and 10+ s on a loaded one, while json reads the same tree in a tenth of a second. So the first parse of a
document of at least MIN_BYTES stores tomllib's result as JSON in the private build cache (mamba_forge/core/cache.py:
its location and privacy rules, atomic 0600 writes, the full key recorded in the entry and a sha256 of each part,
both checked on every read), and later parses of the same bytes read that JSON instead.

The memo never stands in for other bytes: its key is the sha256 and size of the exact bytes (with this memo's
format and the Python version, whose tomllib made the tree), and the entry names them again, checked on read.
What is read back is validated: a JSON object of TOML's value types only (no null), else the entry is dropped and
the bytes are parsed again. Only a successful parse is stored (a document tomllib refuses is refused every time,
with its own error), and only a tree JSON keeps exactly (str, int, float, bool, lists, tables: a TOML date or time
is not stored). Callers validate the tree as they would tomllib's (the codec's from_dict), so a memo cannot make
them accept anything the bytes would not give.

No cache (MAMBA_FORGE_CACHE=0), an unsafe cache folder or one that cannot be written: every parse is tomllib's
(correct, slower), silently.
"""

from __future__ import annotations

import hashlib
import json
import sys

from mamba_forge.core.codec import gc_paused
from mamba_forge.core.safety import parse_json, parse_toml

MIN_BYTES = 128 << 10  # below this, tomllib (~60 ms) is about what a cache lookup costs: nothing is stored
FORMAT = 1
JSON_PART = "tree.json"
SOURCE_PART = "source"  # "<sha256 hex>:<size>" of the TOML bytes the tree was parsed from
PYTHON = ".".join(map(str, sys.version_info[:3]))  # whose tomllib made the tree


def _key(digest: str, size: int) -> str:
    from mamba_forge.core.cache import cache_key

    return cache_key({"kind": "toml-parse", "format": FORMAT, "toml_sha256": digest, "toml_size": size,
                      "python": PYTHON})


def _cache():
    from mamba_forge.core.cache import memo_cache

    return memo_cache()


def _tree_problem(tree, blob: bytes) -> str | None:
    """Why a tree read back from a memo is not one tomllib could have made, or None."""
    if type(tree) is not dict:
        return "not a table"
    if b"null" not in blob:  # json's only value outside TOML's types is null; without the word there is none
        return None
    stack = [tree]
    while stack:
        v = stack.pop()
        if type(v) is dict:
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
        elif v is None:
            return "a null value"
    return None


def _read(cache, key: str, source: bytes) -> dict | None:
    found: list[dict] = []

    def accept(parts: dict[str, bytes]) -> str | None:
        if parts.get(SOURCE_PART) != source or JSON_PART not in parts:
            return "names other bytes"
        blob = parts[JSON_PART]
        try:
            tree = parse_json(blob)
        except (UnicodeDecodeError, ValueError):
            return "not JSON"
        problem = _tree_problem(tree, blob)
        if problem is None:
            found.append(tree)
        return problem

    cache.get(key, accept)  # a refused entry is removed and counted as a miss
    return found[0] if found else None


def _storable(tree: dict) -> bytes | None:
    """JSON of the tree when json keeps it exactly (TOML's dates and times have no JSON form), else None."""
    try:
        return json.dumps(tree, ensure_ascii=False, check_circular=False, separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError):
        return None


def parse_toml_bytes(raw: bytes, *, what: str = "input") -> dict:
    """tomllib's tree of UTF-8 TOML bytes, as safety.parse_toml gives it (UnicodeDecodeError and TOMLDecodeError
    as there), read from the memo when these exact bytes were parsed before on this machine."""
    with gc_paused():  # a tree of fresh acyclic containers (codec.gc_paused)
        return _parse(bytes(raw), what)


def _parse(raw: bytes, what: str) -> dict:
    if len(raw) < MIN_BYTES:
        return parse_toml(raw.decode("utf-8"), what=what)
    cache = _cache()
    if cache is None:
        return parse_toml(raw.decode("utf-8"), what=what)
    digest = hashlib.sha256(raw).hexdigest()
    key, source = _key(digest, len(raw)), f"{digest}:{len(raw)}".encode()
    tree = _read(cache, key, source)
    if tree is not None:
        return tree
    tree = parse_toml(raw.decode("utf-8"), what=what)
    from mamba_forge.core.cache import memo_writes

    blob = _storable(tree) if memo_writes() else None
    if blob is not None:
        cache.put(key, {JSON_PART: blob, SOURCE_PART: source})  # a cache that cannot be written: no memo, no error
    return tree


__all__ = ["MIN_BYTES", "parse_toml_bytes"]
