"""Outputs: never over an input of the same command, keys created exclusively and never left half-written, and a
bad output path (a file where a folder goes, a folder where a file goes, /proc) is one line with exit 2."""

from __future__ import annotations

import errno
import os
import shutil

import pytest
from harden_support import cli, make_fixture, one_line_error

from mamba_forge.core import fsio
from mamba_forge.core.errors import ForgeError
from mamba_forge.runtime import signing


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("outputs"))


@pytest.fixture
def env(tmp_path, fx):
    return {"MAMBA_FORGE_TRUST": str(tmp_path / "none"), "MAMBA_FORGE_SIGNING_KEY": (fx.keys / "release.key").read_text()}


def _snapshot(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "", "/abs", "a\\b", "x" * 200, "a b", "..x", "k\n"])
def test_keygen_name_is_a_plain_stem(tmp_path, name):
    rc, _, err = cli("keygen", "--out", tmp_path / "keys", "--name", name)
    assert rc == 2 and one_line_error(err) and not (tmp_path / "x.key").exists()
    assert not any(tmp_path.rglob("*.key"))


@pytest.mark.parametrize("which", [0, 1])
def test_keygen_full_disk_leaves_nothing(tmp_path, monkeypatch, which):
    real = fsio.os.fsync
    calls = []

    def fsync(fd):  # the disk fills up while the `which`-th key file is written
        calls.append(fd)
        if len(calls) == 2 * which + 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(fsio.os, "fsync", fsync)
    with pytest.raises(ForgeError, match="No space left"):
        signing.write_keypair(tmp_path, "k")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(fsio.os, "fsync", real)
    priv, pub, _ = signing.write_keypair(tmp_path, "k")
    assert priv.stat().st_size > 0 and pub.stat().st_size > 0 and oct(priv.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("existing", ["k.key", "k.pub"])
def test_keygen_never_over_an_existing_key(tmp_path, existing):
    (tmp_path / existing).write_text("keep")
    rc, _, err = cli("keygen", "--out", tmp_path, "--name", "k")
    assert rc == 2 and one_line_error(err) and (tmp_path / existing).read_text() == "keep"
    assert len(list(tmp_path.iterdir())) == 1


def _bad_paths(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    d = tmp_path / "adir"
    d.mkdir()
    return {"file-as-folder": f / "sub", "under-a-file": f / "a" / "b", "proc": "/proc/self/nope/x",
            "proc-root": "/proc/x", "sys": "/sys/nope/x"}, {"folder-as-file": d}


@pytest.mark.parametrize("case", ["file-as-folder", "under-a-file", "proc", "proc-root", "sys", "existing-file"])
def test_keygen_bad_out(tmp_path, case):
    bad, _ = _bad_paths(tmp_path)
    out = tmp_path / "afile" if case == "existing-file" else bad[case]
    rc, _, err = cli("keygen", "--out", out, "--name", "k")
    assert rc == 2 and one_line_error(err) and (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("case", ["file-as-folder", "under-a-file", "proc", "proc-root", "sys", "folder-as-file"])
def test_merge_bad_output(tmp_path, fx, env, case):
    bad, folders = _bad_paths(tmp_path)
    out = folders[case] if case in folders else bad[case]
    rc, _, err = cli("merge", fx.manifest, "-o", out, "--key", fx.pub, env=env)
    assert rc == 2 and one_line_error(err) and (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("case", ["file-as-folder", "under-a-file", "proc", "proc-root", "sys", "folder-as-file"])
@pytest.mark.parametrize("suffix", [".tar.gz", ""])
def test_bundle_bad_output(tmp_path, fx, env, case, suffix):
    bad, folders = _bad_paths(tmp_path)
    if case in folders:
        out = folders[case]
        (out / "x").write_text("keep")  # a folder bundle needs an empty or new folder; a tar a file name
        out = out if suffix == "" else out
    else:
        out = f"{bad[case]}{suffix}"
    rc, _, err = cli("bundle", fx.manifest, "--build", fx.build, "-o", out, "--key", fx.pub, env=env)
    assert rc in (1, 2) and one_line_error(err) and (tmp_path / "afile").read_text() == "keep"
    if case in folders:
        assert (folders[case] / "x").read_text() == "keep"
    else:
        assert rc == 2


def test_merge_never_over_its_input(tmp_path, fx, env):
    build = tmp_path / "b"
    shutil.copytree(fx.build, build)
    before = (build / "h200.toml").read_bytes()
    for out in (build / "h200.toml", build / "." / "h200.toml"):
        rc, _, err = cli("merge", build / "h200.toml", "-o", out, "--key", fx.pub, env=env)
        assert rc == 2 and one_line_error(err) and "input" in err
    os.link(build / "h200.toml", build / "alias.toml")
    rc, _, err = cli("merge", build / "h200.toml", "-o", build / "alias.toml", "--key", fx.pub, env=env)
    assert rc == 2 and "input" in err and (build / "h200.toml").read_bytes() == before


@pytest.mark.parametrize("target", ["manifest", "table", "artifact"])
def test_bundle_never_over_its_inputs(tmp_path, fx, env, target):
    build = tmp_path / "b"
    shutil.copytree(fx.build, build)
    before = _snapshot(build)
    named = {"manifest": build / "h200.toml", "table": build / "h200.runtime.json",
             "artifact": build / "sm_90a" / "Tiny.cubin"}[target]
    link = tmp_path / "out.tar.gz"
    os.symlink(named, link)  # the same file under a .tar.gz name
    rc, _, err = cli("bundle", build / "h200.toml", "--build", build, "-o", link, "--key", fx.pub, env=env)
    assert rc == 2 and one_line_error(err) and "input" in err and _snapshot(build) == before


def test_build_bad_out_is_one_line(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    for out in (f, f / "sub", "/proc/self/nope"):
        rc, _, err = cli("build", "--out", out, "--arch", "sm_90a")
        assert rc == 2 and one_line_error(err) and f.read_text() == "keep"


def test_good_outputs_still_work(tmp_path, fx, env):
    rc, out, err = cli("bundle", fx.manifest, "--build", fx.build, "-o", tmp_path / "x" / "b.tar.gz", "--key", fx.pub,
                       env=env)
    assert rc == 0 and (tmp_path / "x" / "b.tar.gz").is_file()
    rc, _, _ = cli("keygen", "--out", tmp_path / "k", "--name", "ci.v1")
    assert rc == 0 and (tmp_path / "k" / "ci.v1.key").is_file()
