"""Faults around the build's outputs and inputs: a full disk, exhausted inodes, a read-only or failing disk
while artifacts are written, a file where a folder goes (or the reverse), a second build into the same `--out`,
sparse multi-GB sources and headers. Each ends in one line (exit 2 through the CLI), never a traceback; a failed
rebuild leaves the previous build byte for byte (nothing half-written, no temp file left), and an oversize input
is refused by its size before it is read."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harden_support import cli, one_line_error

from mamba_forge.build import outputs
from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.build.outputs import LOCK_NAME, hold_out
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.sources import MAX_SOURCE_BYTES
from mamba_forge.catalog.targets import get_target
from mamba_forge.core.errors import BuildError, CatalogError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "build_basic"


def _catalog(root: Path, *, variant: bool = False) -> Path:
    cat = root / ("cat2" if variant else "cat")
    if not cat.exists():
        shutil.copytree(FIXTURE, cat)
        if variant:  # different arithmetic, so different cubins: a rebuild that would change every artifact
            src = cat / "src" / "basic.cu"
            src.write_text(src.read_text().replace("a * fx::to_f32(x[i])", "a * fx::to_f32(x[i]) + 1.0f"))
    return cat / "catalog.toml"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def _artifacts(out: Path) -> tuple[dict, list]:
    """The artifacts and what the manifest says of them (its timings and cache flags differ run to run)."""
    import tomllib

    doc = tomllib.loads((out / "manifest.toml").read_text())
    files = {k: v for k, v in snapshot(out).items() if k != "manifest.toml"}
    return files, [[a["path"], a["sha256"]] for m in doc["modules"] for a in m["artifacts"]]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A private cache holding both catalogs' compiles (each compiled once for the module) and a finished
    build of the first catalog to copy as 'the previous build'."""
    root = tmp_path_factory.mktemp("faults")
    cache = root / "cache"
    cache.mkdir(mode=0o700)
    for variant in (False, True):
        out = root / ("prev2" if variant else "prev")
        req = BuildRequest(load_catalog(_catalog(root, variant=variant)), [get_target("sm_80"), get_target("sm_90a")],
                           out, jobs=1, cache_location=cache, write_manifest=True)
        build(req)
    assert snapshot(root / "prev") != snapshot(root / "prev2")
    return root


def _previous(shared: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(shared / "prev", out)
    return out


def _rebuild(shared: Path, out: Path, jobs: int = 1):
    req = BuildRequest(load_catalog(_catalog(shared, variant=True)), [get_target("sm_80"), get_target("sm_90a")],
                       out, jobs=jobs, cache_location=shared / "cache", write_manifest=True)
    return build(req)


def _fail_after(real, calls: int, code: int):
    count = [0]

    def fake(*args, **kwargs):
        count[0] += 1
        if count[0] > calls:
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    return fake


FAULTS = [(name, code, after) for name in ("write", "replace", "fsync", "mkstemp")
          for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO) for after in (0, 2)]


@pytest.mark.parametrize(("call", "code", "after"), FAULTS)
def test_a_disk_fault_mid_rebuild_keeps_the_previous_build(shared, tmp_path, monkeypatch, call, code, after):
    out = _previous(shared, tmp_path)
    before = snapshot(out)
    if call == "mkstemp":  # creating a file fails: a full disk, or no inode left (ENOSPC too)
        import tempfile

        monkeypatch.setattr(tempfile, "mkstemp", _fail_after(tempfile.mkstemp, after, code))
    else:
        monkeypatch.setattr(outputs.os, call, _fail_after(getattr(os, call), after, code))
    with pytest.raises(BuildError) as info:
        _rebuild(shared, out)
    monkeypatch.undo()
    msg = str(info.value)
    assert "\n" not in msg and os.strerror(code) in msg
    assert not [p for p in out.rglob("*") if p.name.endswith(".pending")]
    if "previous build there is unchanged" in msg:
        assert snapshot(out) == before  # nothing half-written, no artifact of the new build, no temp file
    else:  # a rename failed and so did every rename back (a disk gone read-only): no manifest that lies
        assert call == "replace" and "holds no manifest.toml" in msg
        assert not (out / "manifest.toml").exists()
        assert (out / ".manifest.toml.previous").read_bytes() == before["manifest.toml"]


@pytest.mark.parametrize("after", [0, 1, 2, 3, 4])
def test_a_rename_that_fails_once_is_rolled_back(shared, tmp_path, monkeypatch, after):
    out = _previous(shared, tmp_path)
    before = snapshot(out)
    real, count = os.replace, [0]

    def once(*args, **kwargs):
        count[0] += 1
        if count[0] == after + 1:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(*args, **kwargs)

    monkeypatch.setattr(outputs.os, "replace", once)
    with pytest.raises(BuildError, match="previous build there is unchanged"):
        _rebuild(shared, out)
    assert snapshot(out) == before and count[0] > after


def test_the_rebuild_without_a_fault_replaces_the_previous_build(shared, tmp_path):
    out = _previous(shared, tmp_path)
    _rebuild(shared, out)
    assert _artifacts(out) == _artifacts(shared / "prev2")  # the control for the test above


IN_THE_WAY = [
    ("sm_90a", "file"), ("sm_80", "file"), ("sm_90a/Basic.cubin", "folder"), ("sm_80/Basic.ptx", "folder"),
    ("manifest.toml", "folder"), ("sm_90a/Basic.cubin", "folder-with-files"),
]


@pytest.mark.parametrize(("rel", "kind"), IN_THE_WAY)
def test_something_in_an_outputs_way_is_one_line_and_changes_nothing(shared, tmp_path, rel, kind):
    out = tmp_path / "out"
    out.mkdir()
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        path.write_bytes(b"in the way")
    else:
        path.mkdir()
        if kind == "folder-with-files":
            (path / "keep.txt").write_text("keep")
    before = snapshot(out)
    rc, stdout, stderr = cli("build", "--catalog", _catalog(shared), "--arch", "sm_80,sm_90a", "--out", out, "-q",
                             env={"MAMBA_FORGE_CACHE": str(shared / "cache")})
    assert rc == 2 and one_line_error(stderr), stderr
    assert "cannot write" in stderr and snapshot(out) == before and not (out / "manifest.toml").is_file()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a tmpfs")
def test_a_tiny_filesystem_is_one_line(shared, tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    try:
        rc, _, stderr = cli("build", "--catalog", _catalog(shared), "--arch", "sm_80,sm_90a", "--out", mnt / "o", "-q",
                            env={"MAMBA_FORGE_CACHE": str(shared / "cache")})
        assert rc == 2 and one_line_error(stderr) and "No space left on device" in stderr, stderr
        assert snapshot(mnt / "o") == {}
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# ---- one build per --out ------------------------------------------------------------------------------------


def test_a_second_build_into_a_held_out_is_refused(shared, tmp_path):
    out = _previous(shared, tmp_path)
    before = snapshot(out)
    with hold_out(out):
        with pytest.raises(BuildError, match="being written by another build"):
            _rebuild(shared, out)
    assert snapshot(out) == before
    _rebuild(shared, out)  # released: the next build goes through
    assert _artifacts(out) == _artifacts(shared / "prev2")


HOLDER = "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT); fcntl.flock(fd,fcntl.LOCK_EX); " \
         "print('held',flush=True); time.sleep(30)"


def test_the_cli_refuses_an_out_another_process_holds(shared, tmp_path):
    out = _previous(shared, tmp_path)
    before = snapshot(out)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, _, stderr = cli("build", "--catalog", _catalog(shared, variant=True), "--arch", "sm_80,sm_90a", "--out",
                            out, "-q", env={"MAMBA_FORGE_CACHE": str(shared / "cache")})
    finally:
        holder.kill()
        holder.wait()
    assert rc == 2 and one_line_error(stderr) and "another build" in stderr, stderr
    assert snapshot(out) == before


def test_two_builds_of_different_catalogs_into_one_out_leave_a_consistent_manifest(shared, tmp_path):
    import hashlib
    import tomllib

    out = tmp_path / "out"
    env = dict(os.environ, MAMBA_FORGE_CACHE=str(shared / "cache"), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-m", "mamba_forge.cli", "build", "--catalog",
                               str(_catalog(shared, variant=v)), "--arch", "sm_80,sm_90a", "--out", str(out), "-q"],
                              env=env, stderr=subprocess.PIPE, text=True) for v in (False, True)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert any(rc == 0 for rc, _ in results)
    assert all(rc == 0 or ("another build" in err and one_line_error(err)) for rc, err in results), results
    doc = tomllib.loads((out / "manifest.toml").read_text())
    for mod in doc["modules"]:
        for art in mod["artifacts"]:
            assert hashlib.sha256((out / art["path"]).read_bytes()).hexdigest() == art["sha256"]


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_refused(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("victim")
    if kind == "symlink":
        (out / LOCK_NAME).symlink_to(victim)
    elif kind == "folder":
        (out / LOCK_NAME).mkdir()
    else:
        os.mkfifo(out / LOCK_NAME)
    t0 = time.monotonic()
    with pytest.raises(BuildError):
        with hold_out(out):
            pass
    assert time.monotonic() - t0 < 2 and victim.read_text() == "victim"


# ---- sources and headers: bounded before they are read ----------------------------------------------------


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)


BIG = [("source", 3 << 30), ("header", 3 << 30), ("source", MAX_SOURCE_BYTES + 1), ("header", MAX_SOURCE_BYTES + 1),
       ("source", 1 << 40), ("new-header", 3 << 30)]


@pytest.mark.parametrize(("which", "size"), BIG)
def test_an_oversize_source_or_header_is_refused_by_its_size(tmp_path, which, size):
    cat = _catalog(tmp_path)
    path = {"source": cat.parent / "src" / "basic.cu", "header": cat.parent / "include" / "fx" / "scale.cuh",
            "new-header": cat.parent / "include" / "fx" / "huge.cuh"}[which]
    try:
        _sparse(path, size)
    except OSError:
        pytest.skip("this filesystem holds no sparse file that large")
    t0 = time.monotonic()
    with pytest.raises(CatalogError) as info:
        load_catalog(cat)
    assert time.monotonic() - t0 < 2
    assert f"limit of {MAX_SOURCE_BYTES}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "fifo-header", "dev-zero", "folder-named-like-a-header"])
def test_a_source_or_header_that_is_not_a_file_is_refused_without_blocking(tmp_path, kind):
    cat = _catalog(tmp_path)
    src = cat.parent / "src" / "basic.cu"
    header = cat.parent / "include" / "fx" / "odd.cuh"
    if kind == "fifo":
        src.unlink()
        os.mkfifo(src)
    elif kind == "fifo-header":
        os.mkfifo(header)
    elif kind == "dev-zero":
        header.symlink_to("/dev/zero")
    else:
        header.mkdir()
        (header / "x.cuh").write_text("#pragma once\n")
    t0 = time.monotonic()
    if kind == "folder-named-like-a-header":
        load_catalog(cat)  # a folder is walked into, never read as a header: its headers count, it does not
    else:
        with pytest.raises(CatalogError):
            load_catalog(cat)
    assert time.monotonic() - t0 < 2


def test_the_cli_refuses_a_sparse_source_in_one_line(tmp_path):
    cat = _catalog(tmp_path)
    _sparse(cat.parent / "src" / "basic.cu", 3 << 30)
    rc, _, stderr = cli("build", "--catalog", cat, "--arch", "sm_80", "--out", tmp_path / "out", "--no-cache")
    assert rc == 2 and one_line_error(stderr) and str(MAX_SOURCE_BYTES) in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_a_lock_is_released_when_its_process_dies(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with hold_out(out):
        fd = os.open(out / LOCK_NAME, os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held by this build now
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
