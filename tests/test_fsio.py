"""The one atomic-write helper: temp file in the same folder, mode before bytes, exclusive create for keys."""

from __future__ import annotations

import os
import stat

import pytest

from mamba_forge.core.fsio import write_atomic, write_if_changed


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "m.toml"
    write_atomic(p, "a = 1\n")
    write_atomic(p, b"a = 2\n")
    assert p.read_text() == "a = 2\n"
    assert sorted(x.name for x in p.parent.iterdir()) == ["m.toml"]


def test_mode_is_applied(tmp_path):
    p = write_atomic(tmp_path / "k.key", b"secret", mode=0o600)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["file", "symlink", "dangling-symlink"])
def test_exclusive_refuses_an_existing_name_and_keeps_it(tmp_path, kind):
    p = tmp_path / "x.pub"
    target = tmp_path / "elsewhere"
    if kind == "file":
        p.write_text("old")
    else:
        if kind == "symlink":
            target.write_text("old")
        p.symlink_to(target)
    with pytest.raises(FileExistsError):
        write_atomic(p, "new", exclusive=True)
    if kind != "dangling-symlink":
        assert p.read_text() == "old"
    else:
        assert not target.exists()
    assert [x.name for x in tmp_path.iterdir() if x.name.endswith(".tmp")] == []


def test_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "m"
    p.write_text("old")

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(p, "new")
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m"]


def test_write_if_changed_keeps_unchanged_files(tmp_path):
    p = tmp_path / "a.cubin"
    assert write_if_changed(p, b"x")
    ino = p.stat().st_ino
    assert not write_if_changed(p, b"x")
    assert p.stat().st_ino == ino
    assert write_if_changed(p, b"y") and p.read_bytes() == b"y"
