"""`mamba-forge bundle`: exactly the manifest and its artifacts, reproducible bytes, accepted by verify and the
loader; refused when anything does not verify; unsafe archives refused on reading."""

from __future__ import annotations

import gzip
import io
import shutil
import tarfile

import pytest
from runtime_support import FakeBackend, signed_tiny

from mamba_forge.cli import main
from mamba_forge.runtime import ArtifactRefused, load
from mamba_forge.runtime.sources import read_tar_bundle

pytestmark = pytest.mark.usefixtures("isolated_trust")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    t = signed_tiny(tmp_path_factory.mktemp("bundle"), manifest="manifests/h200.toml", table=False)
    (t.build / "unrelated.txt").write_text("a build folder holds more than the bundle takes")
    return t


def bundle(capsys, tiny, out, build=None):
    rc = main(["bundle", str(tiny.manifest), "--build", str(build or tiny.build), "-o", str(out), "--key", str(tiny.pub)])
    return rc, capsys.readouterr()


def test_tar_bundle_is_exact_and_reproducible(tiny, tmp_path, capsys):
    a, b = tmp_path / "a" / "h200.tar.gz", tmp_path / "b" / "other-name.tar.gz"
    assert bundle(capsys, tiny, a)[0] == 0 and bundle(capsys, tiny, b)[0] == 0
    assert a.read_bytes() == b.read_bytes()
    raw = a.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[3] == 0 and raw[4:8] == b"\0\0\0\0"  # no file name, mtime 0
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(raw))) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == ["manifest.toml"] + sorted(x["path"] for x in tiny.body["artifacts"])
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.isreg()) == (0, 0, 0, "", "", 0o644, True)
        assert tar.extractfile("manifest.toml").read() == tiny.manifest.read_bytes()
        for x in tiny.body["artifacts"]:
            assert tar.extractfile(x["path"]).read() == (tiny.build / x["path"]).read_bytes()
    assert main(["verify", str(a), "--key", str(tiny.pub)]) == 0
    load(a, trusted_keys=[tiny.pub], backend=FakeBackend()).function("scale_f32")


def test_folder_bundle(tiny, tmp_path, capsys):
    out = tmp_path / "h200"
    assert bundle(capsys, tiny, out)[0] == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(["manifest.toml"] + [x["path"] for x in tiny.body["artifacts"]])
    assert main(["verify", str(out), "--key", str(tiny.pub)]) == 0
    rc, res = bundle(capsys, tiny, out)  # not into a non-empty folder
    assert rc == 1 and "not an empty folder" in res.err


def test_nothing_is_bundled_from_a_build_that_does_not_verify(tiny, tmp_path, capsys):
    build = tmp_path / "build"
    shutil.copytree(tiny.build, build)
    cubin = build / "sm_90a" / "Tiny.cubin"
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0x40
    cubin.write_bytes(bytes(data))
    out = tmp_path / "bad.tar.gz"
    rc, res = bundle(capsys, tiny, out, build=build)
    assert rc == 1 and "does not match its sha256" in res.err and not out.exists()
    rc = main(["bundle", str(tiny.manifest), "--build", str(tiny.build), "-o", str(out)])  # untrusted signer
    assert rc == 1 and not out.exists()


def _tar(entries) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def _info(name, size=0, kind=tarfile.REGTYPE, link=""):
    i = tarfile.TarInfo(name)
    i.size, i.type, i.linkname = size, kind, link
    return i


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([(_info("../evil", 1), b"x")], "unsafe member name"),
        ([(_info("/abs", 1), b"x")], "unsafe member name"),
        ([(_info("link", kind=tarfile.SYMTYPE, link="/etc/passwd"), None)], "not a regular file"),
        ([(_info("a", 1), b"x"), (_info("a", 1), b"y")], "holds a twice"),
    ],
)
def test_unsafe_archives_are_refused(tmp_path, entries, message):
    p = tmp_path / "b.tar.gz"
    p.write_bytes(_tar(entries))
    with pytest.raises(ArtifactRefused, match=message):
        read_tar_bundle(p)


def test_corrupt_archive_is_refused(tiny, tmp_path, capsys):
    out = tmp_path / "h200.tar.gz"
    assert bundle(capsys, tiny, out)[0] == 0
    raw = bytearray(out.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    out.write_bytes(bytes(raw))
    with pytest.raises(ArtifactRefused):
        load(out, trusted_keys=[tiny.pub], backend=FakeBackend())
    assert main(["verify", str(out), "--key", str(tiny.pub)]) == 1
