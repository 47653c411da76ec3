"""An output is never one of the command's inputs: `merge` and `bundle` refuse an -o that is their signing key, a
trusted key (or a new *.pub in a key folder), a manifest's runtime table or an artifact; `bundle` refuses an -o
inside (or equal to) a folder bundle it reads or, for a folder bundle, inside its --build folder; `build` refuses an
--out whose manifest.toml or artifact paths are catalog files, or whose per-target folders hold one. Each refusal is
exit 2 in one line and leaves the input byte-identical; `--build FILE` is "not a folder" (exit 2). The ordinary
paths keep working."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from adversarial.harden_support import make_fixture, one_line_error
from runtime_support import write_tiny_catalog

from mamba_forge.cli import main

pytestmark = pytest.mark.usefixtures("isolated_trust")  # tests/conftest.py
ART = "sm_90a/Tiny.cubin"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime.trust import trusted_keys

    fx = make_fixture(tmp_path_factory.mktemp("outputs-not-inputs"))
    fx.folder = write_bundle(fx.manifest, fx.root / "folder-bundle", keys=trusted_keys([fx.pub], defaults=False),
                             build=fx.build)
    return fx


@pytest.fixture
def w(tmp_path, fx):
    """A private copy of the fixture's build folder (manifest, runtime table, artifacts), key pair and folder bundle."""
    shutil.copytree(fx.build, tmp_path / "b")
    shutil.copytree(fx.keys, tmp_path / "keys")
    shutil.copytree(fx.folder, tmp_path / "fb")
    for p in (tmp_path / "keys", *(tmp_path / "keys").iterdir()):
        p.chmod(0o700 if p.is_dir() else 0o600 if p.suffix == ".key" else 0o644)
    return tmp_path


def run(capsys, *args) -> tuple[int, str]:
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def snapshot(*roots: Path) -> dict[Path, bytes]:
    out = {}
    for r in roots:
        out.update({r: r.read_bytes()} if r.is_file() else {p: p.read_bytes() for p in r.rglob("*") if p.is_file()})
    return out


def refused(capsys, args, keep, *, says="input"):
    before = snapshot(*keep)
    rc, err = run(capsys, *args)
    assert rc == 2 and one_line_error(err) and says in err, (rc, err)
    assert snapshot(*keep) == before


# ---- merge ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["sign-key", "key-file", "key-folder-pub", "runtime-table"])
def test_merge_never_over_a_key_or_runtime_table(capsys, w, target):
    keys, b = w / "keys", w / "b"
    out = {"sign-key": keys / "release.key", "key-file": keys / "release.pub", "key-folder-pub": keys / "release.pub",
           "runtime-table": b / "h200.runtime.json"}[target]
    key = keys if target == "key-folder-pub" else keys / "release.pub"
    refused(capsys, ["merge", b / "h200.toml", "-o", out, "--sign-key", keys / "release.key", "--key", key],
            [keys, b])


def test_merge_never_writes_a_new_key_into_a_key_folder(capsys, w):
    out = w / "keys" / "index.pub"  # the next command would read it as a key
    refused(capsys, ["merge", w / "b" / "h200.toml", "-o", out, "--sign-key", w / "keys" / "release.key",
                     "--key", w / "keys"], [w / "keys"], says="trusted key")
    assert not out.exists()


def test_merge_never_over_an_artifact(capsys, w):
    b = w / "b"
    os.link(b / ART, b / "index.toml")  # the index's name beside the manifest is the artifact
    refused(capsys, ["merge", b / "h200.toml", "-o", b / "index.toml", "--sign-key", w / "keys" / "release.key",
                     "--key", w / "keys" / "release.pub"], [b / ART])


def test_merge_still_writes_an_index(capsys, w):
    b = w / "b"
    rc, err = run(capsys, "merge", b / "h200.toml", "-o", b / "index.toml", "--sign-key", w / "keys" / "release.key",
                  "--key", w / "keys")
    assert rc == 0, err
    assert run(capsys, "verify", b / "index.toml", "--key", w / "keys" / "release.pub")[0] == 0


# ---- bundle --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["key-file", "key-folder-pub"])
def test_bundle_never_over_a_key(capsys, w, target):
    keys, b = w / "keys", w / "b"
    link = w / "out.tar.gz"
    os.symlink(keys / "release.pub", link)  # the same file under a bundle's name
    key = keys if target == "key-folder-pub" else keys / "release.pub"
    refused(capsys, ["bundle", b / "h200.toml", "--build", b, "-o", link, "--key", key], [keys, b])


def test_bundle_never_writes_a_new_key_into_a_key_folder(capsys, w):
    out = w / "keys" / "bundle.pub"  # a folder bundle named like a key, where every *.pub is read as one
    refused(capsys, ["bundle", w / "b" / "h200.toml", "--build", w / "b", "-o", out, "--key", w / "keys"],
            [w / "keys"], says="trusted key")
    assert not out.exists()


@pytest.mark.parametrize("out", ["fb/sub", "fb/sm_90a/new", "fb", "fb/x.tar.gz", "fb/sm_90a/x.tgz", "b/sub", "b"])
def test_bundle_never_writes_into_its_input_folders(capsys, w, out):
    """A folder bundle must not gain a file (verify refuses one that holds files its manifest does not name); a
    folder bundle is not written inside (or over) the --build folder either."""
    refused(capsys, ["bundle", w / "fb", "--build", w / "b", "-o", w / out, "--key", w / "keys" / "release.pub"],
            [w / "fb", w / "b"])
    assert sorted(p.name for p in (w / "fb").iterdir()) == ["manifest.toml", "runtime.json", "sm_90a"]
    assert run(capsys, "verify", w / "fb", "--key", w / "keys" / "release.pub")[0] == 0


def test_bundle_of_a_bare_manifest_refuses_a_folder_inside_its_build(capsys, w):
    b = w / "b"
    refused(capsys, ["bundle", b / "h200.toml", "--build", b, "-o", b / "bundle", "--key", w / "keys" / "release.pub"],
            [b])
    assert not (b / "bundle").exists()


def test_bundles_still_written(capsys, w):
    """A folder bundle re-bundled elsewhere, and an archive inside the build folder (which may hold more files than
    a manifest names: the manifest still verifies against it)."""
    pub = w / "keys" / "release.pub"
    for args in (["bundle", w / "fb", "--build", w / "b", "-o", w / "again"],
                 ["bundle", w / "fb", "--build", w / "b", "-o", w / "again.tar.gz"],
                 ["bundle", w / "b" / "h200.toml", "--build", w / "b", "-o", w / "b" / "h200.tar.gz"],
                 ["bundle", w / "b" / "h200.toml", "--build", w / "b", "-o", w / "out" / "fresh"]):
        rc, err = run(capsys, *args, "--key", pub)
        assert rc == 0, err
        assert run(capsys, "verify", args[-1], "--key", pub)[0] == 0
    assert run(capsys, "verify", w / "b" / "h200.toml", "--key", pub)[0] == 0


# ---- --build FILE --------------------------------------------------------------------------------------------


def test_build_option_naming_a_file_is_bad_input(capsys, w):
    f = w / "b" / ART
    refused(capsys, ["verify", w / "b" / "h200.toml", "--build", f, "--key", w / "keys" / "release.pub"], [w / "b"],
            says=f"--build {f} is not a folder")
    refused(capsys, ["bundle", w / "b" / "h200.toml", "--build", f, "-o", w / "x.tar.gz", "--key",
                     w / "keys" / "release.pub"], [w / "b"], says=f"--build {f} is not a folder")
    assert not (w / "x.tar.gz").exists()


# ---- build ---------------------------------------------------------------------------------------------------


def _build(*args):
    return ["build", "--arch", "sm_90a", "-q", *args]


def test_build_never_over_its_catalog_file(capsys, tmp_path):
    out = tmp_path / "o"
    write_tiny_catalog(out)
    os.replace(out / "catalog.toml", out / "manifest.toml")  # the catalog is what the build names O/manifest.toml
    refused(capsys, _build("--catalog", out / "manifest.toml", "--out", out), [out])


def test_build_never_over_a_hard_linked_catalog_file(capsys, tmp_path):
    cat = write_tiny_catalog(tmp_path / "cat")
    (tmp_path / "o").mkdir()
    os.link(cat.parent / "tiny.toml", tmp_path / "o" / "manifest.toml")
    refused(capsys, _build("--catalog", cat, "--out", tmp_path / "o"), [cat.parent])


@pytest.mark.parametrize("moved", ["tiny.cu", "tiny.toml"])
def test_build_never_over_a_catalog_file_at_an_artifact_path(capsys, tmp_path, moved):
    """A source at O/sm_90a/Tiny.cubin, or any catalog file in a folder the build writes artifacts into."""
    cat = write_tiny_catalog(tmp_path / "o")
    name = "sm_90a/Tiny.cubin" if moved == "tiny.cu" else "sm_90a/families.toml"
    (cat.parent / "sm_90a").mkdir()
    os.replace(cat.parent / moved, cat.parent / name)
    cat.write_text(cat.read_text().replace(f'"{moved}"', f'"{name}"'))
    refused(capsys, _build("--catalog", cat, "--out", cat.parent), [cat.parent], says="--out")


def test_build_beside_or_around_its_catalog_still_works(capsys, tmp_path):
    """The catalog's folder may be --out, or lie inside it (`--out .` from a checkout): no name collides."""
    cat = write_tiny_catalog(tmp_path / "cat")
    before = snapshot(cat.parent)
    for out in (cat.parent, tmp_path):
        rc, err = run(capsys, *_build("--catalog", cat, "--out", out))
        assert rc == 0 and (out / "manifest.toml").is_file() and (out / ART).is_file(), err
    assert {p: d for p, d in snapshot(cat.parent).items() if p in before} == before


@pytest.mark.parametrize("out", [None, "."])
def test_the_default_catalog_builds_into_build_or_the_checkout(capsys, monkeypatch, out):
    monkeypatch.chdir(ROOT)
    rc, err = run(capsys, *_build("--kernels", "softplus*", "--dry-run", *(["--out", out] if out else [])))
    assert rc == 0, err
