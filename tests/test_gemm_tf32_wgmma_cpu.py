"""The TF32 wgmma rungs on CPU (kernels/sm90a/wgmma_tf32.cu): the catalog declares them in TriadSm90a with the
tensor-map ABI and the ring's shared memory, they compile for sm_90a and are admitted with no spills, their PTX
holds the .tf32 wgmma and nothing the static token policy forbids; the host checks of mamba_forge/gpu/tma.py
refuse what the f32 TMA path cannot describe (each with a negative case); the NT tf32 route leads with them."""

from __future__ import annotations

import re

import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import Catalog, default_catalog_path, load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core.schema import QSymbol
from mamba_forge.gpu import tma
from mamba_forge.qualify.assemble import route_table
from mamba_forge.runtime import routes as RT

RUNGS = ["gemm_bi_nt_sm90a_wgmma_tf32_m128n256_s4", "gemm_bi_nt_sm90a_wgmma_tf32_m128n128_s6"]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(default_catalog_path())


def test_declared_in_triad_sm90a(catalog):
    declared = {s.name: s for s in catalog.module("TriadSm90a").symbols}
    for name in RUNGS:
        s = declared[name]
        e = s.params_env
        assert s.dynamic_smem == e["STAGES"] * (e["BM"] + e["BN"]) * 32 * 4 + 16 * e["STAGES"] + 1024
        assert s.dynamic_smem <= 227 * 1024 - 1024
        assert s.threads == 128 * (e["NC"] + 1)
        fam = catalog.module("TriadSm90a").family(s.family)
        assert [p.name for p in fam.params] == ["tmA", "tmB", "C", "A", "B", "M", "N", "K"]
        assert {p.name: p.dtype for p in fam.params if p.type == "ptr"} == {"C": "f32", "A": "f32", "B": "f32"}
        assert fam.qualify.prepare == "mamba_forge.gpu.tma:prepare_gemm_nt_tf32"


def test_builds_admitted_without_spills(catalog, tmp_path):
    sub = Catalog(path=catalog.path, name=catalog.name, modules=(catalog.module("TriadSm90a"),))
    man = build(BuildRequest(sub, [get_target("sm_90a")], tmp_path, jobs=1))
    (mod,) = [m for m in man.modules if m.kind == "TriadSm90a"]
    assert mod.status == "compiled", mod.log_head
    got = {s.name: s for s in mod.symbols}
    for name in RUNGS:
        s = got[name]
        assert s.verdict.status == "admitted", s.verdict.reason
        assert s.resources.spill_stores == 0 and s.resources.stack_frame == 0
    text = (tmp_path / next(a for a in mod.artifacts if a.code == "ptx").path).read_text()
    for token in ("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"):
        assert token in text, token
    assert not re.search(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", text, re.M) and not re.search(r"\.local\b", text)


def test_host_checks_accept_supported_shapes():
    tma.check_gemm_tf32("nt", 1, 1, 4)
    tma.check_gemm_tf32("nt", 1000, 391, 332)  # any M and N, K % 4 == 0
    tma.check_matrix(256, 3, 4, "A", element_bytes=4)


# check_gemm_tf32's refusals: tests/test_gemm_archs.py test_check_gemm_refuses (with check_gemm's)


@pytest.mark.parametrize("ptr,rows,cols,match", [(260, 4, 4, "16-byte aligned"), (0, 4, 4, "16-byte aligned"),
                                                  (256, 4, 6, "multiple of 4"), (256, 0, 4, "out of range")])
def test_matrix_checks_refuse(ptr, rows, cols, match):
    with pytest.raises(tma.TmaError, match=match):
        tma.check_matrix(ptr, rows, cols, "A", element_bytes=4)


def test_nt_tf32_route_leads_with_wgmma(catalog):
    tbl = route_table(catalog.routes, [QSymbol(name=n, module="M", target="sm_90a", family="f", status="admitted")
                                       for n in catalog.symbols])
    for m in (1, 17, 4096):
        r = RT.select(tbl, m, 4096, 4096, "tf32", "tf32", "f32", "nt")
        assert (r.symbol, r.eq_class) == (RUNGS[0], "wgmma-tf32-k8")
    assert RT.select(tbl, 8, 64, 66, "tf32", "tf32", "f32", "nt").symbol == "triad_sm80_nt_tf32"  # K % 4 != 0
    gone = RT.select(tbl, 8, 64, 64, "tf32", "tf32", "f32", "nt", serves=lambda s: s != RUNGS[0])
    assert (gone.symbol, gone.eq_class) == (RUNGS[1], "wgmma-tf32-k8")  # the 128x128 rung of the same class
    both = RT.select(tbl, 8, 64, 64, "tf32", "tf32", "f32", "nt", serves=lambda s: s not in RUNGS)
    assert both.symbol == "triad_sm80_nt_tf32"  # both wgmma rungs rejected: the portable class serves
    assert RT.select(tbl, 8, 64, 64, "tf32", "tf32", "f32", "nt", symbol=RUNGS[1]).symbol == RUNGS[1]  # by name
    assert RT.select(tbl, 8, 64, 64, "tf32", "tf32", "f32", "tn").symbol == "triad_sm80_tn_tf32"


def test_exact_async_rung_joins_the_fma_chain_class(catalog):
    (route,) = [r for r in catalog.routes if (r.layout, r.a, r.b, r.c) == ("nn", "f32", "f32", "f32")]
    (cls,) = [c for c in route.classes if c.name == "fma-chain"]
    names = [r.symbol for r in cls.rungs]
    assert "gemm_bi_f32_f32_async_m128n128_bk16_s3" in names
    # measured faster than n128_s2 at every large shape (benchmarks/results/gemm_f32.md): it leads the large-M rungs
    assert names.index("gemm_bi_f32_f32_async_m128n128_bk16_s3") < names.index("gemm_bi_f32_f32_n128_s2")
    sym = catalog.symbols["gemm_bi_f32_f32_async_m128n128_bk16_s3"]
    assert sym.module == "Fixed" and sym.threads == 256 and sym.dynamic_smem == 0
