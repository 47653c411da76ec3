"""The GEMM route selector (mamba_forge/runtime/routes.py): the table built from the chain and the admitted
symbols, selection independent of M, fallback order when symbols are rejected, constraints, and refusal."""

from __future__ import annotations

import random

import pytest

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.manifest.schema import QRoute
from mamba_forge.runtime import routes as RT

PORTABLE_ALL = [
    "gemm_bi_bf16_bf16", "gemm_bi_bf16_f32", "gemm_bi_f16_f16", "gemm_bi_f16_f32",
    "gemm_bi_f32_f32", "gemm_bi_f32_f32_s2", "gemm_bi_f32_f32_n128_s2",
    "gemm_bi_nn_tf32_v1_m128n64_bk32_s2", "gemm_bi_nn_tf32_v1_m128n64_bk32_s3", "gemm_bi_nn_tf32_v1_m16n32_bk32_s4",
    "gemm_bi_nn_tf32_v1_m64n64_bk32_s2", "gemm_bi_nn_tf32_v1_m64n64_bk32_s3",
    "gemm_bi_nn_fixed_rna_wide_tf32_v1_m128n128_bk32_s3", "gemm_bi_nn_sm80_mma_tf32_v1_m128n128_bk32_s3",
    *[f"gemm_bi_nn_{t}_{d}" for t in ("tc16", "tc64", "tc128", "tcw64", "tcwn64") for d in ("bf16", "f16")],
    *[f"gemm_bi_nn_{t}_f32out_{d}" for t in ("tc16", "tc64", "tc128") for d in ("bf16", "f16")],
    *[f"triad_scalar_{lay}_f32" for lay in ("nn", "tn", "nt")],
    *[f"triad_sm80_{lay}_{dt}" for lay in ("nn", "tn", "nt") for dt in ("tf32", "bf16", "f16")],
]
WGMMA = ["gemm_bi_nn_sm90a_wgmma_wg1_bf16", "gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4_bf16"]
M_VALUES = [0, 1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 127, 128, 1000, 4096, 4097, 65536] + random.Random(5).sample(
    range(1, 10**6), 60
)


def table(admitted):
    return RT.build_route_table(admitted)


def row(tbl, layout, a, b, c):
    return next(r for r in tbl if (r.layout, r.a, r.b, r.c) == (layout, a, b, c))


def test_every_portable_gemm_symbol_is_routable_and_declared_in_the_catalog():
    cat = load_catalog(default_catalog_path())
    names = set(cat.symbols)
    assert set(PORTABLE_ALL) <= names
    routed = {s for r in table(PORTABLE_ALL) for s in r.symbols}
    assert set(PORTABLE_ALL) <= routed


def test_table_orders_fastest_first_and_ends_with_the_exact_family():
    tbl = table(PORTABLE_ALL + WGMMA)
    bf = row(tbl, "nn", "bf16", "bf16", "bf16").symbols
    assert bf[:3] == ["gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4_bf16", "gemm_bi_nn_sm90a_wgmma_wg1_bf16",
                      "gemm_bi_nn_tc128_bf16"]
    assert bf.index("gemm_bi_bf16_bf16") < bf.index("gemm_bi_f32_f32")
    assert bf[-1] == "gemm_bi_f32_f32"  # the oracle is the last resort
    assert len(bf) == len(set(bf))
    tf = row(tbl, "nn", "tf32", "tf32", "f32").symbols
    assert tf[0] == "gemm_bi_nn_fixed_rna_wide_tf32_v1_m128n128_bk32_s3" and tf[-1] == "gemm_bi_f32_f32"
    assert row(tbl, "tn", "bf16", "bf16", "f32").symbols == ["triad_sm80_tn_bf16", "triad_scalar_tn_f32"]
    # a rejected symbol is simply absent; its key keeps the rest
    assert "gemm_bi_f16_f16" not in table([n for n in PORTABLE_ALL if n != "gemm_bi_f16_f16"])[0].symbols


@pytest.mark.parametrize("key", [("nn", "bf16", "bf16", "bf16"), ("nn", "f16", "f16", "f32"), ("nn", "tf32", "tf32", "f32"),
                                 ("nn", "f32", "f32", "f32"), ("nt", "bf16", "bf16", "f32")])
def test_selection_never_depends_on_m(key):
    layout, a, b, c = key
    tbl = table(PORTABLE_ALL + WGMMA)
    for n, k in [(4096, 4096), (4095, 4096), (8, 3), (1, 1), (130, 8)]:
        picks = {RT.select(tbl, m, n, k, a, b, c, layout) for m in M_VALUES}
        assert len(picks) == 1, (key, n, k, picks)


def test_alignment_constraints_skip_to_the_next_rung():
    tbl = table(PORTABLE_ALL + WGMMA)
    assert RT.select(tbl, 64, 4096, 4096, "bf16", "bf16", "bf16").symbol.startswith("gemm_bi_nn_sm90a_wgmma_ws2")
    assert RT.select(tbl, 64, 4100, 4096, "bf16", "bf16", "bf16").symbol == "gemm_bi_nn_tc128_bf16"  # N % 8
    assert RT.select(tbl, 64, 4096, 4095, "bf16", "bf16", "bf16").symbol == "gemm_bi_nn_tc128_bf16"  # K % 8
    # a bias request skips rungs without a bias pointer
    r = RT.select(tbl, 64, 4096, 4096, "bf16", "bf16", "bf16", bias=True)
    assert r.symbol == "gemm_bi_nn_tc128_bf16" and r.bias and not r.cast


def test_fallback_order_as_symbols_are_rejected():
    order = ["gemm_bi_nn_tc128_bf16", "gemm_bi_nn_tcwn64_bf16", "gemm_bi_nn_tcw64_bf16", "gemm_bi_nn_tc64_bf16",
             "gemm_bi_bf16_bf16", "gemm_bi_nn_tc16_bf16", "gemm_bi_f32_f32_n128_s2", "gemm_bi_f32_f32_s2",
             "triad_scalar_nn_f32", "gemm_bi_f32_f32"]
    admitted = set(PORTABLE_ALL)
    for expected in order:
        r = RT.select(table(admitted), 5, 100, 100, "bf16", "bf16", "bf16")
        assert r.symbol == expected
        assert r.cast == (r.a == "f32")  # the exact family serves bf16 through casts
        admitted.discard(expected)
    with pytest.raises(RT.NoRoute, match="nn bf16xbf16->bf16"):
        RT.select(table(admitted), 5, 100, 100, "bf16", "bf16", "bf16")


def test_tf32_request_falls_back_to_exact_f32_without_casts():
    admitted = [n for n in PORTABLE_ALL if "tf32" not in n]
    r = RT.select(table(admitted), 1, 64, 64, "tf32", "tf32", "f32")
    assert r.symbol == "gemm_bi_f32_f32_n128_s2" and not r.cast
    # but an exact f32 request never gets TF32 math
    r = RT.select(table(PORTABLE_ALL), 1, 64, 64, "f32", "f32", "f32")
    assert "tf32" not in r.symbol and r.a == "f32"


def test_a_key_missing_from_the_table_uses_the_layouts_exact_list():
    tbl = [r for r in table(PORTABLE_ALL) if r.a != "f16"]
    r = RT.select(tbl, 3, 32, 32, "f16", "f16", "f16")
    assert r.symbol == "gemm_bi_f32_f32_n128_s2" and r.cast
    r = RT.select(tbl, 3, 32, 32, "f16", "f16", "f32", "nt")
    assert r.symbol == "triad_scalar_nt_f32" and r.cast


def test_refusals():
    with pytest.raises(RT.NoRoute, match="no symbol"):
        RT.select([], 1, 8, 8, "bf16", "bf16", "bf16")
    # only a constrained symbol, constraint not met: refused, naming what was tried
    tbl = table(["gemm_bi_nn_sm90a_wgmma_wg1_bf16"])
    with pytest.raises(RT.NoRoute, match="tried gemm_bi_nn_sm90a_wgmma_wg1_bf16"):
        RT.select(tbl, 1, 9, 8, "bf16", "bf16", "bf16")
    assert RT.select(tbl, 1, 8, 8, "bf16", "bf16", "bf16").symbol == "gemm_bi_nn_sm90a_wgmma_wg1_bf16"
    # symbols the chain does not describe are never picked
    with pytest.raises(RT.NoRoute):
        RT.select([QRoute(layout="nn", a="bf16", b="bf16", c="bf16", symbols=["mystery"])],
                  1, 8, 8, "bf16", "bf16", "bf16")
    for bad in [dict(layout="tt"), dict(a="i8"), dict(c="tf32")]:
        kw = dict(layout="nn", a="bf16", b="bf16", c="bf16") | bad
        with pytest.raises(ValueError):
            RT.select(table(PORTABLE_ALL), 1, 8, 8, kw["a"], kw["b"], kw["c"], kw["layout"])
    with pytest.raises(ValueError):
        RT.select(table(PORTABLE_ALL), -1, 8, 8, "bf16", "bf16", "bf16")


def test_rungs_may_not_constrain_m_outside_tn():
    with pytest.raises(ValueError, match="batch invariance"):
        RT.Rung("x", "nn", "bf16", "bf16", "bf16", (("m", 8),))
    RT.Rung("x", "tn", "bf16", "bf16", "bf16", (("m", 8),))  # M is a feature dimension in dW = X^T dY
    for r in RT.DEFAULT_CHAIN:
        assert all(d != "m" for d, _ in r.align) or r.layout == "tn"


def test_tn_may_depend_on_m_alignment_only_through_its_rungs():
    tn = ["gemm_bi_tn_sm90a_wgmma_ws2_m128n256_s4_bf16", "triad_scalar_tn_f32"]
    tbl = table(tn)
    assert RT.select(tbl, 64, 64, 64, "bf16", "bf16", "bf16", "tn").symbol == tn[0]
    r = RT.select(tbl, 65, 64, 64, "bf16", "bf16", "bf16", "tn")
    assert r.symbol == "triad_scalar_tn_f32" and r.cast
