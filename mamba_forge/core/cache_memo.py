"""The memos kept in the build cache (parsed TOML, loaded catalog, compiler identity, manifest text): the switches
a command turns them off with (`memo_writes_off` for --dry-run, `memos_off` for --no-cache) and `memo_cache`, the
cache a memo reads and writes, or None. The store itself is core/cache.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mamba_forge.core.cache_location import CacheRefused, default_location

if TYPE_CHECKING:
    from mamba_forge.core.cache import Cache

_memo_writes = True
_memos_on = True  # memos_off


@contextlib.contextmanager
def memo_writes_off(active: bool = True) -> Iterator[None]:
    """While a command must write nothing (`--dry-run`): the memos kept in the cache (parsed TOML, loaded catalog,
    compiler identity, manifest text) are read where the cache folder exists, never written, and the folder is
    never created. `active` False: no change (a caller passes its dry-run flag)."""
    global _memo_writes
    before = _memo_writes
    _memo_writes = _memo_writes and not active
    try:
        yield
    finally:
        _memo_writes = before


@contextlib.contextmanager
def memos_off(active: bool = True) -> Iterator[None]:
    """While a command runs without the cache (`build --no-cache`): no memo is read or written either, so it does
    what a machine with no cache would do. `active` False: no change (a caller passes its --no-cache flag)."""
    global _memos_on
    before = _memos_on
    _memos_on = _memos_on and not active
    try:
        yield
    finally:
        _memos_on = before


def memo_writes() -> bool:
    """Whether a memo may be written now (see memo_writes_off)."""
    return _memo_writes


def memo_cache() -> Cache | None:
    """The cache at the default location for a memo to read (and, when memo_writes(), to write), or None: off,
    memos off (--no-cache), unsafe, or missing while memo writes are off (a dry run creates no folder). Never
    raises."""
    if not _memos_on:
        return None
    from mamba_forge.core.cache import Cache  # the store imports this module (it re-exports these names)

    try:
        location = default_location()
        if location is None or (not _memo_writes and not location.is_dir()):
            return None
        return Cache.open(location)
    except (CacheRefused, OSError):
        return None

