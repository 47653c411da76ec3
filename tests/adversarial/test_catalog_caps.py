"""Catalog size caps: too many modules, family files, sources, families, variants, instances, params, fallbacks or
symbols (counted as a product before anything is expanded) are refused fast with the cap in the one-line message;
the built-in catalog sits well under every cap."""

from __future__ import annotations

import time

import pytest
from catalog_gen import FAMILY, MODULE, refused, table, write_catalog

from mamba_forge.catalog import limits
from mamba_forge.catalog.model import default_catalog_path, load_catalog


def _families(n: int, **over: str) -> str:
    return "".join("[[family]]\n" + table({**FAMILY, "name": f'"k{i}"', **over}) for i in range(n))


def _list(item: str, n: int) -> str:
    return "[" + ", ".join([item] * n) + "]"


FAMILY_CAPS = [  # (family field overrides, expected words)
    ({"variants": _list('"f32"', limits.MAX_VARIANTS + 1)}, f"the limit is {limits.MAX_VARIANTS}"),
    ({"variants": _list('"f32"', 200_000)}, f"the limit is {limits.MAX_VARIANTS}"),
    ({"instances": _list("{ B = 1 }", limits.MAX_INSTANCES + 1), "symbol": '"{name}_{B}"'},
     f"the limit is {limits.MAX_INSTANCES}"),
    ({"instances": _list("{}", 100_000), "symbol": '"{name}"'}, f"the limit is {limits.MAX_INSTANCES}"),
    ({"variants": _list('"f32"', 16), "instances": _list("{ B = 1 }", 65), "symbol": '"x"'},
     f"1040 symbols from (variants + bare) x instances; the limit is {limits.MAX_FAMILY_SYMBOLS}"),
    ({"variants": _list('"f32"', 15), "bare": '"f32"', "instances": _list("{ B = 1 }", 65), "symbol": '"x"'},
     "1040 symbols"),
    ({"params": _list('{ name = "a", type = "i32" }', limits.MAX_PARAMS + 1)}, f"the limit is {limits.MAX_PARAMS}"),
    ({"fallback": _list('"{name}"', limits.MAX_FALLBACKS + 1)}, f"the limit is {limits.MAX_FALLBACKS}"),
]


@pytest.mark.parametrize(("fam", "needle"), FAMILY_CAPS, ids=[n[:30] for _, n in FAMILY_CAPS])
def test_family_over_a_cap_refused_before_expanding(tmp_path, fam, needle):
    path = write_catalog(tmp_path, fam)
    t0 = time.perf_counter()
    refused(path, "fam.toml", "family[0] (name=k)", needle)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("n", [limits.MAX_FAMILIES + 1, 8_000])
def test_too_many_families_refused_fast(tmp_path, n):
    path = write_catalog(tmp_path, family_text=_families(n))
    t0 = time.perf_counter()
    refused(path, f"{n} families", f"the limit is {limits.MAX_FAMILIES}")
    assert time.perf_counter() - t0 < 8


def test_symbols_across_families_refused_before_expanding(tmp_path):
    # 17 families of 1000 symbols each: every family under its own cap, the catalog over MAX_SYMBOLS
    over = {"variants": _list('"f32"', 10), "instances": _list("{ B = 1 }", 100), "symbol": '"x"'}
    path = write_catalog(tmp_path, family_text=_families(17, **over))
    t0 = time.perf_counter()
    refused(path, "family[16]", f"17000 symbols in the catalog so far; the limit is {limits.MAX_SYMBOLS}")
    assert time.perf_counter() - t0 < 3  # refused before any of the 17000 symbols is built


def _root(tmp_path, n_modules=1, **module_over: str):
    write_catalog(tmp_path)
    mods = "".join("[[module]]\n" + table({**MODULE, "kind": f'"K{i}"', **module_over}) for i in range(n_modules))
    (tmp_path / "catalog.toml").write_text("[catalog]\nschema = 1\n\n" + mods)
    return tmp_path / "catalog.toml"


ROOT_CAPS = [
    ({"n_modules": limits.MAX_MODULES + 1}, f"the limit is {limits.MAX_MODULES}"),
    ({"n_modules": 5_000}, f"the limit is {limits.MAX_MODULES}"),
    ({"families": _list('"fam.toml"', limits.MAX_FAMILY_FILES + 1)}, f"the limit is {limits.MAX_FAMILY_FILES}"),
    ({"sources": _list('"src/k.cu"', limits.MAX_SOURCES + 1)}, f"the limit is {limits.MAX_SOURCES}"),
]


@pytest.mark.parametrize(("over", "needle"), ROOT_CAPS, ids=[n for _, n in ROOT_CAPS])
def test_root_over_a_cap_refused_before_validation(tmp_path, over, needle):
    path = _root(tmp_path, **over)
    t0 = time.perf_counter()
    refused(path, "catalog.toml", needle)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize(("fam", "count"), [
    ({"variants": _list('"f32"', 1), "instances": _list("{ B = 1 }", 1), "symbol": '"{name}_{B}"'}, 1),
    ({"variants": '["f32", "f16", "bf16"]', "instances": "[" + ", ".join(f"{{ B = {i} }}" for i in range(40)) + "]",
      "symbol": '"{name}_{B}_{dtype}"'}, 120),
])
def test_family_under_the_caps_loads(tmp_path, fam, count):
    assert len(load_catalog(write_catalog(tmp_path, fam)).symbols) == count


def test_builtin_catalog_well_under_every_cap():
    cat = load_catalog(default_catalog_path())
    fams = [f for m in cat.modules for f in m.families]
    assert len(cat.modules) * 8 <= limits.MAX_MODULES and len(fams) * 8 <= limits.MAX_FAMILIES
    assert len(cat.symbols) * 8 <= limits.MAX_SYMBOLS
    assert max(len(f.variants) for f in fams) * 4 <= limits.MAX_VARIANTS
    assert max(len(f.instances) for f in fams) * 8 <= limits.MAX_INSTANCES
    assert max(len(f.params) for f in fams) * 2 <= limits.MAX_PARAMS
    assert all(s.threads <= limits.BLOCK_THREADS_MAX and s.dynamic_smem <= limits.SMEM_OPTIN_MAX
               for s in cat.symbols.values())
