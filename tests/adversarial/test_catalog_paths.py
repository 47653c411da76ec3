"""Paths a catalog names are hostile: absolute paths, '..', links out of the catalog's folder, an include folder
of '/' are refused when the catalog loads, with one line and exit 2 through the CLI; nothing outside the folder is
read (no file's first lines land in a build manifest)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mamba_forge.catalog.model import load_catalog
from mamba_forge.core.errors import CatalogError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "build_basic"


def _catalog(tmp_path: Path) -> Path:
    cat = tmp_path / "cat"
    shutil.copytree(FIXTURE, cat)
    return cat


def _with(cat: Path, key: str, value: str) -> Path:
    root = cat / "catalog.toml"
    text = root.read_text()
    old = {"sources": 'sources = ["src/basic.cu"]', "families": 'families = ["basic.toml"]'}
    if key == "include":
        text = text.replace(old["sources"], old["sources"] + f"\ninclude = [{value!r}]".replace("'", '"'))
    else:
        text = text.replace(old[key], f"{key} = [{value!r}]".replace("'", '"'))
    root.write_text(text)
    return root


HOSTILE = [
    ("sources", "/etc/passwd", "relative"),
    ("sources", "../../../../etc/passwd", "relative"),
    ("sources", "src/../../outside.cu", "relative"),
    ("sources", "", "relative"),
    ("sources", "link_out.cu", "leads out"),
    ("sources", "linkdir/basic.cu", "leads out"),
    ("families", "/etc/hostname", "relative"),
    ("families", "../x.toml", "relative"),
    ("families", "link_out.toml", "leads out"),
    ("include", "/", "relative"),
    ("include", "..", "relative"),
    ("include", "linkdir", "leads out"),
]


def _plant_links(cat: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "basic.cu").write_text("secret line one\n")
    (outside / "x.toml").write_text("[[family]]\nname = 'x'\n")
    (cat / "link_out.cu").symlink_to(outside / "basic.cu")
    (cat / "link_out.toml").symlink_to(outside / "x.toml")
    (cat / "linkdir").symlink_to(outside)


@pytest.mark.parametrize(("key", "value", "needle"), HOSTILE, ids=[f"{k}={v}" for k, v, _ in HOSTILE])
def test_hostile_catalog_path_is_refused_at_load(tmp_path, key, value, needle):
    cat = _catalog(tmp_path)
    _plant_links(cat, tmp_path)
    root = _with(cat, key, value)
    with pytest.raises(CatalogError) as info:
        load_catalog(root)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("key", "value", "needle"), HOSTILE[:3] + HOSTILE[4:5] + HOSTILE[9:10],
                         ids=["abs", "dotdot", "inner-dotdot", "link", "include-root"])
def test_hostile_catalog_path_through_the_cli(tmp_path, key, value, needle):
    cat = _catalog(tmp_path)
    _plant_links(cat, tmp_path)
    root = _with(cat, key, value)
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", "from mamba_forge.cli import entry; entry()", "build", "--catalog",
                          str(root), "--out", str(out), "--arch", "sm_90a", "-q"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and needle in res.stderr and "secret" not in res.stderr + res.stdout
    assert not out.exists()


def test_a_link_that_stays_inside_is_fine(tmp_path):
    cat = _catalog(tmp_path)
    (cat / "alias.cu").symlink_to(cat / "src" / "basic.cu")
    root = _with(cat, "sources", "alias.cu")
    assert load_catalog(root).modules[0].module.sources == ["alias.cu"]


def test_a_header_linked_out_of_its_include_folder_is_refused(tmp_path):
    from mamba_forge.build.builder import collect_headers_at

    cat = _catalog(tmp_path)
    secret = tmp_path / "secret.cuh"
    secret.write_text("// secret\n")
    (cat / "include" / "fx" / "evil.cuh").symlink_to(secret)
    with pytest.raises(CatalogError, match="leads out"):
        collect_headers_at(cat / "include")
