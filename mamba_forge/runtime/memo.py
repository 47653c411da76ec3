"""The verified-body memo: the loader checks a manifest's whole body once per machine, not once per process.

Parsing a qualified manifest's whole TOML body (to prove its runtime table is the body's projection, as `verify`
does) costs several times the cold-start budget. So the first full check of a signed document on a machine
stores a memo, and later loads of the same bytes take the runtime table without parsing the body again.

A memo is an entry of the private build cache (mamba_forge/core/cache.py: its location rule, its privacy rule,
atomic 0600 writes, the full key recorded in the entry and checked on read, a payload sha256), keyed by
sha256(the whole signed document) with the tool version, holding the sha256 of the runtime table that matched.
Any change to either file misses the memo, so the loader refuses exactly what full verification refuses. A memo
can only say "these exact bytes passed"; writing one needs the cache folder, which only you can write.

No cache (MAMBA_FORGE_CACHE=0), an unsafe cache folder, or one that cannot be written: every load checks the whole
body (correct, slower), and the loader logs one warning per process saying why.
"""

from __future__ import annotations

import hashlib
import logging

log = logging.getLogger("mamba_forge.runtime")
_warned: set[str] = set()
TABLE_PART = "runtime_table_sha256"


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _key(document: bytes) -> str:
    from mamba_forge import __version__
    from mamba_forge.core.cache import cache_key

    return cache_key({"kind": "verified-body", "document_sha256": hashlib.sha256(document).hexdigest(),
                      "tool_version": __version__})


def _cache():
    from mamba_forge.core.cache import Cache, CacheRefused, default_location

    try:
        return Cache.open(default_location())
    except CacheRefused as exc:
        _warn_once(f"verified-body memo off ({exc}); every load checks the whole manifest body")
        return None


def seen(document: bytes, table_digest: str) -> bool:
    """Whether these exact document bytes passed the whole-body check with a runtime table of this sha256."""
    cache = _cache()
    if cache is None:
        return False
    parts = cache.get(_key(document))
    return parts is not None and parts.get(TABLE_PART) == table_digest.encode()


def remember(document: bytes, table_digest: str) -> None:
    """Record that the document's whole body verified against this runtime table; a failed write only warns."""
    cache = _cache()
    if cache is None:
        return
    problem = cache.put(_key(document), {TABLE_PART: table_digest.encode()})
    if problem is not None:
        _warn_once(f"verified-body memo not written: {problem.split(': ', 1)[0]}; the next load checks the "
                   "whole manifest body again")
