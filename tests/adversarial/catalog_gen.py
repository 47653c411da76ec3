"""Writes small catalogs from text, for the catalog hardening tests: one module with one source and one family file
(or many), whose fields a test replaces. Loading goes through `load_catalog`, the CLI through harden_support.cli."""

from __future__ import annotations

from pathlib import Path

import pytest

from mamba_forge.catalog.model import load_catalog
from mamba_forge.core.errors import CatalogError

SOURCE = "#define FX_K(name, T) extern \"C\" __global__ void name(T* y) { y[0] = T(0); }\n"
FAMILY = {
    "name": '"k"',
    "instantiate": '"FX_K"',
    "variants": '["f32"]',
    "launch": '{ block = 128, grid = ["ceil_div(n, 128)"] }',
    "params": '[{ name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"] }]',
    "qualify": "{ dims = { n = 1000 } }",
}
MODULE = {"kind": '"K"', "mandatory": "true", "arch": '["sm_80+"]', "sources": '["src/k.cu"]',
          "families": '["fam.toml"]'}


def table(fields: dict[str, str]) -> str:
    return "".join(f"{k} = {v}\n" for k, v in fields.items() if v is not None)


def write_catalog(root: Path, family: dict | None = None, module: dict | None = None, *, header: str = "schema = 1",
                  family_text: str | None = None, source: bytes | None = None) -> Path:
    """A catalog at root/catalog.toml; `family`/`module` override FAMILY/MODULE fields (value None drops one)."""
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "include").mkdir(exist_ok=True)
    (root / "src" / "k.cu").write_bytes(SOURCE.encode() if source is None else source)
    fam = family_text if family_text is not None else "[[family]]\n" + table({**FAMILY, **(family or {})})
    (root / "fam.toml").write_text(fam)
    text = f"[catalog]\n{header}\n\n[[module]]\n" + table({**MODULE, **(module or {})})
    (root / "catalog.toml").write_text(text)
    return root / "catalog.toml"


def refused(path: Path, *needles: str) -> str:
    """load_catalog(path) raises one single-line CatalogError holding every needle; returns the message."""
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    msg = str(info.value)
    assert "\n" not in msg and "\r" not in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg
