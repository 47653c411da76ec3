"""Where the build cache lives and the rule that it be private: the configured location (MAMBA_FORGE_CACHE, else
XDG_CACHE_HOME, else ~/.cache; 0 or off disables it) and `check_private`, which refuses a path with a symlinked
component, a foreign writable ancestor, or a final folder that is not yours with mode 0700 (CacheRefused)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from mamba_forge.core.safety import PathRefused, check_components

DISABLED_VALUES = {"0", "off"}


class CacheRefused(Exception):
    """The cache location is unsafe or unusable; the message says why and what to do."""


def default_location(env: Mapping[str, str] | None = None) -> Path | None:
    """The configured location, or None when the cache is disabled. Raises CacheRefused for a relative path."""
    env = os.environ if env is None else env
    explicit = env.get("MAMBA_FORGE_CACHE")
    if explicit is not None and explicit != "":
        if explicit.strip().lower() in DISABLED_VALUES:
            return None
        p = Path(explicit)
        if not p.is_absolute():
            raise CacheRefused(f"MAMBA_FORGE_CACHE={explicit!r} is not an absolute path; set an absolute path, or 0/off")
        return p
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "mamba-forge"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "mamba-forge"


def check_private(path: Path, *, uid: int | None = None) -> None:
    """Refuse an unsafe cache path (see module doc). Creates missing folders with mode 0700."""
    try:
        _check_private(path, uid=uid)
    except OSError as exc:  # an over-long name (ENAMETOOLONG), no permission, an I/O error: no cache, one warning
        raise CacheRefused(f"cache path {str(path)[:120]} cannot be used ({exc.strerror or exc})") from None


def _check_private(path: Path, *, uid: int | None) -> None:
    uid = os.getuid() if uid is None else uid
    try:  # the rule shared with the trust folders: no symlinked component, no foreign writable ancestor
        path = check_components(path, uid=uid, what="cache path")
    except PathRefused as exc:
        raise CacheRefused(f"{exc}; point MAMBA_FORGE_CACHE at a folder only you can write") from None
    if not path.exists():
        try:
            # parents too, each 0700 as it is made (umask cannot widen them)
            missing = [p for p in [path, *path.parents] if not p.exists()]
            for p in reversed(missing):
                os.mkdir(p, 0o700)
        except OSError as exc:
            raise CacheRefused(f"cannot create cache folder {path}: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise CacheRefused(f"cache path {path} is not a plain folder")
    if st.st_uid != uid:
        raise CacheRefused(f"cache folder {path} is owned by uid {st.st_uid}, not you ({uid}); use a folder of your own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        raise CacheRefused(
            f"cache folder {path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700; run `chmod 700 {path}` or choose another"
        )

