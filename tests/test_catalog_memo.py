"""The loaded-catalog memo (mamba_forge/catalog/memo.py) never hides a change: editing any catalog file (every
family file, the root, the route file, a source, a header), adding or removing a header, a path that now leads
out of the catalog, a folder swapped for a file, or the loader's own code is a full load, which reports its own
error or the new catalog. A hit is the catalog a full load gives; an entry that does not read back, or whose
pickle names anything but a catalog record, is refused (and runs nothing)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from mamba_forge.catalog import memo
from mamba_forge.catalog import model as M
from mamba_forge.core.cache import Cache
from mamba_forge.core.errors import CatalogError

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
FAMILY_FILES = sorted(str(p.relative_to(KERNELS)) for p in KERNELS.rglob("*.toml")
                      if p.name not in ("catalog.toml", "routes.toml", "route_tuning.toml"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A copy of the built-in catalog, and the catalog a full load of it gives (no memo)."""
    root = tmp_path_factory.mktemp("kernels") / "kernels"
    shutil.copytree(KERNELS, root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MAMBA_FORGE_CACHE", "0")
        full = M.load_catalog(root / "catalog.toml")
    return root, full


@pytest.fixture
def cat(pristine, tmp_path, monkeypatch):
    """A fresh copy of the catalog, a private cache of its own and a count of full loads."""
    root = tmp_path / "kernels"
    shutil.copytree(pristine[0], root)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(cache))
    loads: list[Path] = []
    real = M._load
    monkeypatch.setattr(M, "_load", lambda path, *a: loads.append(path) or real(path, *a))
    return root / "catalog.toml", loads, cache


def _same_catalog(a, b) -> bool:
    return (a == b and a.model_dump() == b.model_dump() and a.routes == b.routes and a.digest() == b.digest()
            and [[(s.name, s.block, s.macro_args) for s in m.symbols] for m in a.modules]
            == [[(s.name, s.block, s.macro_args) for s in m.symbols] for m in b.modules])


def _full(path: Path):
    """What the loader gives without any memo."""
    saved = os.environ.get("MAMBA_FORGE_CACHE")
    os.environ["MAMBA_FORGE_CACHE"] = "0"
    try:
        return M.load_catalog(path)
    finally:
        os.environ["MAMBA_FORGE_CACHE"] = saved  # type: ignore[assignment]


def test_a_second_load_is_the_memo_and_the_same_catalog(cat, pristine):
    path, loads, _ = cat
    first = M.load_catalog(path)
    second = M.load_catalog(path)
    assert len(loads) == 1  # the second came from the memo
    assert first is not second and _same_catalog(second, first)
    relocated = pristine[1]  # the same files elsewhere: equal but for the path
    assert second.path == path and len(second.symbols) == len(relocated.symbols) > 300
    assert second.routes == relocated.routes and second.digest() == relocated.digest()
    assert M.load_catalog(path.parent) == second and len(loads) == 1  # a folder names its catalog.toml


@pytest.mark.parametrize("family_file", FAMILY_FILES)
def test_editing_any_family_file_is_a_full_load(cat, family_file):
    path, loads, _ = cat
    before = M.load_catalog(path)
    target = path.parent / family_file
    target.write_text(target.read_text() + "\n# a comment: the same catalog, other bytes\n")
    after = M.load_catalog(path)
    assert len(loads) == 2 and _same_catalog(after, before)
    # a real change: a family's contract line (a value no other rule depends on) reads through
    text = target.read_text()
    assert 'contract = "' in text, family_file
    target.write_text(text.replace('contract = "', 'contract = "edited: ', 1))
    changed = M.load_catalog(path)
    assert len(loads) == 3 and changed != after
    assert any(f.contract and f.contract.startswith("edited: ") for m in changed.modules for f in m.families)
    assert _same_catalog(changed, _full(path))


EDITS = {
    "root": lambda root: (root / "catalog.toml").write_text((root / "catalog.toml").read_text() + "\n"),
    "routes": lambda root: (root / "routes.toml").write_text((root / "routes.toml").read_text() + "\n#\n"),
    "route tuning": lambda root: (root / "route_tuning.toml").write_text(
        (root / "route_tuning.toml").read_text() + "\n#\n"),
    "source": lambda root: (root / "fixed" / "activation.cu").write_text(
        (root / "fixed" / "activation.cu").read_text() + "\n// edited\n"),
    "header": lambda root: (root / "include" / "mf" / "common.cuh").write_text(
        (root / "include" / "mf" / "common.cuh").read_text() + "\n// edited\n"),
    "same-size header": lambda root: _same_size_edit(root / "include" / "mf" / "common.cuh"),
    "new header": lambda root: (root / "include" / "mf" / "new.cuh").write_text("#pragma once\n"),
    "removed header": lambda root: (root / "include" / "mf" / "layout.cuh").rename(root / "layout.cuh.bak"),
    "header in a new subfolder": lambda root: _write(root / "include" / "mf" / "sub" / "x.h", "#pragma once\n"),
}


def _write(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _same_size_edit(p: Path) -> None:
    """One byte changed, size and mtime kept: only the content tells."""
    st = p.stat()
    data = bytearray(p.read_bytes())
    i = data.rindex(b"\n", 0, len(data) - 1)
    data[i - 1 : i] = b" " if data[i - 1 : i] != b" " else b"\t"
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_any_other_input_change_is_a_full_load(cat, edit):
    path, loads, _ = cat
    M.load_catalog(path)
    EDITS[edit](path.parent)
    got = M.load_catalog(path)
    assert len(loads) == 2
    assert M.load_catalog(path) == got and len(loads) == 2  # and that state is remembered in its turn
    assert _same_catalog(got, _full(path))


BREAKS = {
    "bad TOML in a family file": lambda root: (root / "fixed" / "norm.toml").write_text("[[family]\n"),
    "a source leads out": lambda root: _relink(root / "fixed" / "activation.cu", root.parent / "outside.cu"),
    "a header leads out": lambda root: _relink(root / "include" / "mf" / "common.cuh", root.parent / "outside.cuh"),
    "include folder is a file": lambda root: (shutil.rmtree(root / "include"), (root / "include").write_text("x")),
    "a source is gone": lambda root: (root / "fixed" / "activation.cu").unlink(),
    "a source includes a path": lambda root: (root / "fixed" / "activation.cu").write_text(
        '#include "/etc/passwd"\n'),
    "a family file is a folder": lambda root: ((root / "triad" / "scalar.toml").unlink(),
                                               (root / "triad" / "scalar.toml").mkdir()),
}


def _relink(p: Path, outside: Path) -> None:
    outside.write_bytes(p.read_bytes())
    p.unlink()
    p.symlink_to(outside)


@pytest.mark.parametrize("brk", sorted(BREAKS))
def test_a_broken_catalog_is_refused_as_without_a_memo(cat, brk):
    path, loads, _ = cat
    M.load_catalog(path)
    BREAKS[brk](path.parent)
    errors = []
    for _ in range(2):  # and no memo is stored for a failure
        with pytest.raises(CatalogError) as info:
            M.load_catalog(path)
        errors.append(str(info.value))
    assert len(loads) == 3
    with pytest.raises(CatalogError) as plain:
        _full(path)
    assert errors == [str(plain.value)] * 2


def test_the_loaders_code_is_part_of_the_key(cat, monkeypatch):
    path, loads, _ = cat
    M.load_catalog(path)
    monkeypatch.setattr(memo, "_code_digest", "0" * 64)  # as if a check were edited
    M.load_catalog(path)
    assert len(loads) == 2
    assert memo.code_digest() == "0" * 64
    monkeypatch.setattr(memo, "_code_digest", None)
    assert len(memo.code_digest()) == 64 and memo.code_digest() != "0" * 64


def _entry(cache: Path) -> tuple[str, dict[str, bytes]]:
    entries = [p for p in (cache / "v1").rglob("*") if p.is_file() and p.parent.name != "locks"]
    found = [(p.name, Cache(cache).get(p.name)) for p in entries]
    [(key, parts)] = [(k, p) for k, p in found if p and memo.CATALOG_PART in p]
    return key, {k: v for k, v in parts.items() if not k.startswith("sha256.")}


class _Planted:
    def __reduce__(self):
        return (os.system, ("touch planted-by-memo",))


BAD_PARTS = {
    "a pickle naming os.system": lambda parts: {**parts, memo.CATALOG_PART: pickle.dumps(_Planted())},
    "a pickle of another type": lambda parts: {**parts, memo.CATALOG_PART: pickle.dumps({"path": "x"})},
    "a truncated pickle": lambda parts: {**parts, memo.CATALOG_PART: parts[memo.CATALOG_PART][:-100]},
    "inputs not JSON": lambda parts: {**parts, memo.FACTS_PART: b"[1,"},
    "inputs of another shape": lambda parts: {**parts, memo.FACTS_PART: b'[["file", 1, "", ""]]'},
    "an unknown kind of input": lambda parts: {**parts, memo.FACTS_PART: b'[["exec", "x", "", ""]]'},
    "no inputs": lambda parts: {memo.CATALOG_PART: parts[memo.CATALOG_PART]},
    "no catalog": lambda parts: {memo.FACTS_PART: parts[memo.FACTS_PART]},
}


@pytest.mark.parametrize("case", sorted(BAD_PARTS))
def test_a_bad_entry_is_refused_and_nothing_runs(cat, tmp_path, monkeypatch, case):
    path, loads, cache = cat
    first = M.load_catalog(path)
    key, parts = _entry(cache)
    assert Cache(cache).put(key, BAD_PARTS[case](parts)) is None
    monkeypatch.chdir(tmp_path)
    got = M.load_catalog(path)
    assert len(loads) == 2 and _same_catalog(got, first)
    assert not (tmp_path / "planted-by-memo").exists()


def test_a_catalog_of_another_path_is_refused(cat, tmp_path):
    """An entry holding another catalog (a copy elsewhere) under this key is not served."""
    path, loads, cache = cat
    M.load_catalog(path)
    key, parts = _entry(cache)
    other = tmp_path / "other"
    shutil.copytree(path.parent, other)
    foreign = pickle.dumps(_full(other / "catalog.toml"), protocol=5)
    assert Cache(cache).put(key, {**parts, memo.CATALOG_PART: foreign}) is None
    got = M.load_catalog(path)
    assert [p for p in loads if p == path] == [path, path] and got.path == path  # refused: loaded in full


def test_without_a_cache_every_load_is_full(cat, monkeypatch):
    path, loads, cache = cat
    monkeypatch.setenv("MAMBA_FORGE_CACHE", "0")
    M.load_catalog(path)
    M.load_catalog(path)
    assert len(loads) == 2 and not (cache / "v1").exists()
