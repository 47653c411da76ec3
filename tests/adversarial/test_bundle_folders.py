"""Folder bundles hold regular files only: a symbolic link anywhere in one (an artifact, its folder, the manifest,
the runtime table, an extra entry; pointing inside or outside, at the very bytes the manifest names or nowhere)
and a FIFO are refused as a tar bundle's link members are, by load() and by `mamba-forge verify`. A signed release
index with two entries for one device is refused at verify and at load, naming the device."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from harden_support import cli, make_fixture, one_line_error
from runtime_support import H200, FakeBackend

from mamba_forge.manifest import toml_io
from mamba_forge.manifest.bundle import index_record, write_bundle
from mamba_forge.runtime import ArtifactRefused, ManifestRefused, load, signing
from mamba_forge.runtime.trust import trusted_keys
from mamba_forge.runtime.verify import open_verified

ART = "sm_90a/Tiny.cubin"


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    fx = make_fixture(tmp_path_factory.mktemp("bundle-folders"))
    keys = trusted_keys([fx.pub], defaults=False)
    fx.folder = write_bundle(fx.manifest, fx.root / "folder-bundle", keys=keys, build=fx.build)
    fx.trusted = keys
    return fx


@pytest.fixture(autouse=True)
def _no_user_trust(tmp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))


def _outside_copy(b: Path, rel: str) -> Path:
    """The same bytes (or folder) outside the bundle: a link to it would verify by content alone."""
    src = b / rel
    dst = b.parent / "outside" / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)
    return dst


def _swap_for_link(b: Path, rel: str, target) -> None:
    p = b / rel
    if p.is_dir():
        shutil.rmtree(p)
    else:
        p.unlink()
    os.symlink(target, p)


def _link_out(rel):
    def mutate(b: Path):
        _swap_for_link(b, rel, _outside_copy(b, rel))
    return mutate


def _link_out_relative(rel):
    def mutate(b: Path):
        target = _outside_copy(b, rel)
        _swap_for_link(b, rel, os.path.relpath(target, (b / rel).parent))
    return mutate


def _extra_link(name, target):
    def mutate(b: Path):
        (b / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, b / name)
    return mutate


def _artifact_to_inside_copy(b: Path):
    os.rename(b / ART, b / "sm_90a" / "real.cubin")
    os.symlink("real.cubin", b / ART)


def _fifo(rel):
    def mutate(b: Path):
        if (b / rel).exists():
            (b / rel).unlink()
        os.mkfifo(b / rel)
    return mutate


MUTATIONS = {
    "artifact-link-out-absolute": _link_out(ART),
    "artifact-link-out-relative": _link_out_relative(ART),
    "artifact-folder-link-out": _link_out("sm_90a"),
    "artifact-folder-link-out-relative": _link_out_relative("sm_90a"),
    "manifest-link-out": _link_out("manifest.toml"),
    "manifest-link-out-relative": _link_out_relative("manifest.toml"),
    "runtime-table-link-out": _link_out("runtime.json"),
    "ptx-link-out": _link_out("sm_90a/Tiny.ptx"),
    "artifact-link-inside": _artifact_to_inside_copy,
    "extra-link-passwd": _extra_link("extra", "/etc/passwd"),
    "extra-link-root-folder": _extra_link("root", "/"),
    "extra-link-dangling": _extra_link("gone", "/nonexistent/file"),
    "extra-link-loop": _extra_link("loop", "loop"),
    "extra-link-to-manifest": _extra_link("again.toml", "manifest.toml"),
    "nested-link-parent": _extra_link("sm_90a/up", ".."),
    "nested-link-dev-zero": _extra_link("sm_90a/zero", "/dev/zero"),
    "artifact-fifo": _fifo(ART),
    "extra-fifo": _fifo("pipe"),
    "manifest-fifo": _fifo("manifest.toml"),
}
SAYS = "symbolic link|not a regular file"


@pytest.fixture
def hostile_folder(tmp_path, fx):
    def make(case: str) -> Path:
        b = tmp_path / "b"
        shutil.copytree(fx.folder, b)
        MUTATIONS[case](b)
        return b
    return make


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_load_refuses_links_in_a_folder_bundle(fx, hostile_folder, case):
    b = hostile_folder(case)
    with pytest.raises(ArtifactRefused) as exc:
        load(b, trusted_keys=[fx.pub], backend=FakeBackend())
    assert re.search(SAYS, str(exc.value)) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_verify_refuses_links_in_a_folder_bundle(fx, hostile_folder, case):
    b = hostile_folder(case)
    with pytest.raises(ArtifactRefused, match=SAYS):
        open_verified(b, keys=fx.trusted)


@pytest.mark.parametrize("case", ["artifact-link-out-absolute", "artifact-folder-link-out", "manifest-link-out",
                                  "runtime-table-link-out", "extra-link-dangling"])
def test_cli_verify_refuses_links_in_a_folder_bundle(fx, hostile_folder, case):
    b = hostile_folder(case)
    rc, out, err = cli("verify", b, "--key", fx.pub, timeout=30)
    assert rc == 1 and one_line_error(err) and re.search(SAYS, err) and not out, (rc, out, err)


def test_the_folder_bundle_itself_loads_and_verifies(fx, tmp_path):
    """Positive: the untouched folder loads and verifies, also through a link to the folder itself (the path the
    user passes is theirs to choose; links inside the bundle are not)."""
    load(fx.folder, trusted_keys=[fx.pub], backend=FakeBackend()).function("scale_f32")
    os.symlink(fx.folder, tmp_path / "via-link")
    assert open_verified(tmp_path / "via-link", keys=fx.trusted).kind == "qualified"
    rc, out, err = cli("verify", fx.folder, "--key", fx.pub, timeout=30)
    assert rc == 0 and out.startswith("ok: "), (rc, out, err)


def test_a_link_swapped_in_after_the_listing_reads_as_absent(fx, tmp_path):
    """read_beneath opens each component without following: the folder check cannot be raced past."""
    from mamba_forge.runtime.folders import read_beneath

    b = tmp_path / "b"
    shutil.copytree(fx.folder, b)
    assert read_beneath(b, ART) == (fx.folder / ART).read_bytes()
    _link_out("sm_90a")(b)
    assert (b / ART).read_bytes() and read_beneath(b, ART) is None


# ---- a release index with two entries for one device ----------------------------------------------------------


def _index(tmp_path, fx, entries_of):
    """A signed index over copies of the fixture's bundle, its entries rewritten by entries_of(entries)."""
    a = tmp_path / "a.tar.gz"
    shutil.copyfile(fx.tar, a)
    out = tmp_path / "index.toml"
    rec = index_record([a], out, keys=fx.trusted)
    for extra in ("b.tar.gz", "c.tar.gz"):
        shutil.copyfile(fx.tar, tmp_path / extra)
    rec = replace(rec, entries=entries_of(rec.entries))
    out.write_bytes(signing.sign(toml_io.dumps(rec).encode(), fx.priv))
    return out


DUPLICATES = {
    "same-path-twice": lambda es: [es[0], es[0]],
    "two-copies": lambda es: [es[0], replace(es[0], path="b.tar.gz")],
    "three-copies": lambda es: [es[0], replace(es[0], path="b.tar.gz"), replace(es[0], path="c.tar.gz")],
    "other-device-between": lambda es: [es[0], replace(es[0], device_name="NVIDIA H100", path="b.tar.gz"),
                                        replace(es[0], path="c.tar.gz")],
    "second-differs-only-in-level": lambda es: [es[0], replace(es[0], path="b.tar.gz", level="full")],
}


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_index_with_two_entries_for_one_device(tmp_path, fx, case):
    idx = _index(tmp_path, fx, DUPLICATES[case])
    with pytest.raises(ManifestRefused, match="two entries for NVIDIA H200") as exc:
        load(idx, trusted_keys=[fx.pub], backend=FakeBackend())
    assert "\n" not in str(exc.value)
    with pytest.raises(ManifestRefused, match="two entries for NVIDIA H200"):  # also for a device it does not list twice
        load(idx, trusted_keys=[fx.pub], backend=FakeBackend(info=replace(H200, name="NVIDIA H100")))
    with pytest.raises(ManifestRefused, match="two entries for NVIDIA H200"):
        open_verified(idx, keys=fx.trusted)


@pytest.mark.parametrize("case", ["same-path-twice", "two-copies"])
def test_cli_verify_index_with_two_entries_for_one_device(tmp_path, fx, case):
    idx = _index(tmp_path, fx, DUPLICATES[case])
    rc, out, err = cli("verify", idx, "--key", fx.pub, timeout=30)
    assert rc == 1 and one_line_error(err) and "two entries for NVIDIA H200" in err and not out, (rc, out, err)


def test_index_with_one_entry_per_device_loads(tmp_path, fx):
    """Positive: the same construction with one entry loads and verifies."""
    idx = _index(tmp_path, fx, lambda es: es)
    assert load(idx, trusted_keys=[fx.pub], backend=FakeBackend()).manifest.device.name == "NVIDIA H200"
    assert len(open_verified(idx, keys=fx.trusted).entries) == 1
