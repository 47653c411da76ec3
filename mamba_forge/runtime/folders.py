"""A folder bundle read without following links: its listing (lstat only) and its files opened one path
component at a time. Standard library only; imported when a folder bundle is opened."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from mamba_forge.core.safety import MAX_BUNDLE_BYTES
from mamba_forge.runtime.errors import ArtifactRefused

MAX_FOLDER_ENTRIES = 1 << 16  # a folder bundle holds its manifest, table and cubins: a few hundred files


def folder_names(root: Path, label: str) -> set[str]:
    """The regular files of a folder bundle, relative to it; refuses a symbolic link (to a file or a folder,
    inside or outside), a FIFO, device or socket anywhere in it, as a tar bundle's link members are refused.
    Nothing is followed: entries are lstat'ed (os.scandir) and folders descended only when they are real."""
    out: set[str] = set()
    todo, count = [(Path(root), "")], 0
    while todo:
        folder, prefix = todo.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as exc:
            raise ArtifactRefused(f"{label} cannot be listed ({exc.strerror or exc})") from None
        for e in entries:
            count += 1
            if count > MAX_FOLDER_ENTRIES:
                raise ArtifactRefused(f"{label} holds more than {MAX_FOLDER_ENTRIES} entries")
            rel = prefix + e.name
            if e.is_symlink():
                raise ArtifactRefused(f"{label} holds {rel!r}, a symbolic link; a bundle folder holds regular "
                                      "files only (copy what it points to)")
            if e.is_dir(follow_symlinks=False):
                todo.append((Path(e.path), rel + "/"))
            elif e.is_file(follow_symlinks=False):
                out.add(rel)
            else:
                raise ArtifactRefused(f"{label} holds {rel!r}, which is not a regular file")
    return out


def read_beneath(root: Path, rel: str, limit: int = MAX_BUNDLE_BYTES) -> bytes | None:
    """A regular file at `rel` under `root`, opened one component at a time with O_NOFOLLOW: a link anywhere on
    the way (not only the last component, as O_NOFOLLOW alone checks) reads as absent. None when absent."""
    parts = PurePosixPath(rel).parts
    if not parts or ".." in parts or PurePosixPath(rel).is_absolute():
        return None
    nofollow, cloexec = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | cloexec)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            sub = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow | cloexec, dir_fd=fd)
            os.close(fd)
            fd = sub
        leaf = os.open(parts[-1], os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0) | cloexec, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    with os.fdopen(leaf, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        data = f.read(st.st_size + 1)
    return data if len(data) <= limit else None
