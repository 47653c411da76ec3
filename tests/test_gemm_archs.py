"""CPU checks of the architecture-specific GEMM families (TriadSm90a, TriadSm89*, Sm120, Sm100) and of
mamba_forge/tma.py: the reference names are declared where they belong, each module compiles for its target
(and sm_90a for check roles) with every symbol admitted, the wgmma rungs really use wgmma/TMA/setmaxnreg, and the
TMA host side refuses what the kernels cannot take. Builds go through the private cache into a tmp folder, one
module x one target per test.
"""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import Catalog, default_catalog_path, load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.gpu import tma
from mamba_forge.references import gemm as gemm_ref

# The reference library's names this work owns, by module kind.
REFERENCE_NAMES = {
    "TriadSm90a": ["gemm_bi_nn_sm90a_wgmma_wg1_bf16", "gemm_bi_nn_sm90a_wgmma_wg1_f16"],
    "TriadSm89Half": [
        "gemm_bi_nn_fixed_sm89_m128n64_bk64_s2_v1_f16", "gemm_bi_nn_fixed_sm89_m64n64_bk64_s3_v1_f16",
        "gemm_bi_nn_fixed_sm89_tc128_pipeline_v1_bf16", "gemm_bi_nn_fixed_sm89_tc128_pipeline_v1_f16",
        "gemm_bi_nn_fixed_sm89_tc128_s3_v1_bf16", "gemm_bi_nn_fixed_sm89_tc128_s3_v1_f16",
        "gemm_bi_nn_fixed_sm89_tc128_swizzle_v1_bf16", "gemm_bi_nn_fixed_sm89_tc128_swizzle_v1_f16",
    ],
    "TriadSm89ExactF32": ["gemm_bi_nn_fixed_sm89_f32_n64_copyplan_v1"],
    "TriadSm89Tf32Joint": ["gemm_bi_nn_fixed_sm89_rna_tf32_v1_m128n96_bk32_s3"],
    "Sm100": ["gemm_bi_nn_sm100_tcgen_c4_bf16", "gemm_bi_nn_sm100_tcgen_c4_f16"],
    "Sm120": [
        "gemm_bi_nn_fixed_sm120_f32_n64_copyplan_m128n64_t256_v1", "gemm_bi_nn_fixed_sm120_f32_n64_copyplan_t256_v1",
        "gemm_bi_nn_fixed_sm120_f32_n64_copyplan_v1", "gemm_bi_nn_fixed_sm120_f32_n64_sliced_v1",
        *[f"gemm_bi_nn_sm120_tma_{t}_{o}{d}" for t in ("128x128_bk32_s2", "128x128_bk32_s3", "128x64_bk32_s3",
                                                    "64x128_bk64_s2", "64x64_bk64_s2")
          for o in ("", "f32out_") for d in ("bf16", "f16")],
        "gemm_bi_nn_sm120_tma_fma_v1_fixed_nobias_m128n64_t256_bk16_s2",
        "gemm_bi_nn_sm120_tma_fma_v1_fixed_postbias_m128n64_bk16_s2",
        "gemm_bi_nn_sm120_tma_fma_v1_fixed_postbias_m128n64_bk16_s2_k4",
        "gemm_bi_nn_sm120_tma_fma_v1_fixed_postbias_m128n64_t256_bk16_s2",
        "gemm_bi_nn_sm120_tma_fma_v1_fixed_postbias_m128n96_bk16_s2",
        "gemm_bi_nn_sm120_tma_fma_v1_fixed_postbias_m64n128_bk16_s2",
        *[f"gemm_bi_nn_sm120_tma_tf32_v1_{t}" for t in ("m128n64_bk32_s2", "m128n64_bk32_s3", "m64n128_bk32_s2",
                                                        "m64n128_bk32_s3", "m64n64_bk32_s2",
                                                        "m64n64_bk32_s2_pair_store", "m64n64_bk32_s2_producer_warp")],
    ],
}
# The registry's named Ada Triad symbols (its constants, not its strings: reference-registry.rs ~1043-1121) under
# this catalog's names, and the two module kinds that hold only named symbols.
NAMED_ADA = {
    "TriadSm89Finalist": ["gemm_bi_nn_fixed_sm89_tf32_finalist_v1_m128n128_bk32_s2"],
    "TriadSm89ExactF32": ["gemm_bi_nn_fixed_sm89_f32_d768_in_fused_v1", "gemm_bi_nn_fixed_sm89_f32_d768_out_raw_v1",
                          "gemm_bi_nn_fixed_sm89_f32_prism_raw_v1"],
    "TriadSm89ExactF32D128": ["gemm_bi_nn_fixed_sm89_f32_d128_in_v1", "gemm_bi_nn_fixed_sm89_f32_d128_out_v1"],
}
ADA_KINDS = ("TriadSm89Finalist", "TriadSm89Half", "TriadSm89ExactF32", "TriadSm89ExactF32D128", "TriadSm89Tf32Joint")
MODULES = tuple(dict.fromkeys([*REFERENCE_NAMES, *NAMED_ADA]))


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(default_catalog_path())


def test_reference_names_declared_in_their_modules(catalog):
    assert sum(len(v) for v in REFERENCE_NAMES.values()) == 51
    for kind, names in REFERENCE_NAMES.items():
        declared = {s.name for s in catalog.module(kind).symbols}
        missing = sorted(set(names) - declared)
        assert not missing, f"{kind} lacks {missing}"


def test_named_ada_symbols_declared_and_routed(catalog):
    """The eleven module kinds of the reference library, each named Ada symbol in its module and a force rung of
    its route (d768/d128 at their widths), and the exact-f32 ones on the FFMA chain oracle bit for bit."""
    assert len(catalog.modules) == 11
    assert [m.kind for m in catalog.modules if m.kind.startswith("TriadSm89")] == list(ADA_KINDS)
    rungs = {r.symbol: r for route in catalog.routes for r in route.rungs()}
    widths = {"d768_in": ("k", 768), "d768_out": ("n", 768), "d128_in": ("k", 128), "d128_out": ("n", 128)}
    for kind, names in NAMED_ADA.items():
        declared = {s.name for s in catalog.module(kind).symbols}
        assert set(names) <= declared, f"{kind} lacks {sorted(set(names) - declared)}"
        for name in names:
            rung = rungs[name]
            assert rung.mode == "force", name
            want = tuple(w for key, w in widths.items() if f"_{key}_" in name)
            assert rung.needs == want, (name, rung.needs)
            fam = catalog.module(kind).family(catalog.symbols[name].family)
            assert "registry" in fam.contract, name
            if "_f32_" in name:
                assert fam.qualify.exact and fam.qualify.reference.endswith(":gemm_nn_f32_chain"), name
    assert rungs["gemm_bi_nn_fixed_sm89_f32_d768_in_fused_v1"].bias
    assert not rungs["gemm_bi_nn_fixed_sm89_f32_d768_out_raw_v1"].bias


@pytest.mark.parametrize("name,fits,off", [
    ("gemm_bi_nn_fixed_sm89_f32_d768_in_fused_v1", (5, 3072, 768), (5, 3072, 100)),
    ("gemm_bi_nn_fixed_sm89_f32_d768_out_raw_v1", (5, 768, 1536), (5, 200, 1536)),
    ("gemm_bi_nn_fixed_sm89_f32_d128_in_v1", (5, 512, 128), (5, 512, 96)),
    ("gemm_bi_nn_fixed_sm89_f32_d128_out_v1", (5, 128, 256), (5, 192, 256)),
])
def test_named_width_rungs_serve_their_width_only(catalog, name, fits, off):
    """Asked for by name, a d768/d128 rung serves at its model width and is refused elsewhere; never by shape."""
    from mamba_forge.core.schema import QSymbol
    from mamba_forge.qualify.assemble import route_table
    from mamba_forge.runtime import routes as RT

    tbl = route_table(catalog.routes, [QSymbol(name=n, module="M", target="sm_89", family="f", status="admitted")
                                       for n in catalog.symbols])
    bias = "_fused_" in name
    assert RT.select(tbl, *fits, "f32", "f32", "f32", "nn", bias=bias, symbol=name).symbol == name
    with pytest.raises(RT.NoRoute, match="needs"):
        RT.select(tbl, *off, "f32", "f32", "f32", "nn", bias=bias, symbol=name)
    assert RT.select(tbl, *fits, "f32", "f32", "f32", "nn", bias=bias).symbol != name


def test_every_symbol_has_contract_params_and_reference(catalog):
    for kind in MODULES:
        mod = catalog.module(kind)
        for fam in mod.families:
            assert fam.contract and len(fam.contract) > 40, fam.name
            outs = [p.name for p in fam.params if p.role == "out"]
            assert outs == (["C"] if fam.name.startswith("gemm_") else ["At"]), fam.name  # At: the pre-RNA pass
            ref = fam.qualify.reference
            assert ref and ref.startswith("mamba_forge.references.gemm:"), fam.name
            mod_name, fn = ref.split(":")
            assert callable(getattr(importlib.import_module(mod_name), fn))
            if fam.qualify.prepare:
                pm, pf = fam.qualify.prepare.split(":")
                assert callable(getattr(importlib.import_module(pm), pf))


def test_module_gates_and_roles(catalog):
    t = {n: get_target(n) for n in ("sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a")}
    roles = lambda kind: {tt.name: r for tt, r in catalog.module(kind).targets(list(t.values()))}  # noqa: E731
    assert roles("TriadSm90a") == {"sm_90a": "qualify"}
    for kind in ADA_KINDS:
        assert roles(kind) == {"sm_89": "qualify", "sm_90a": "check"}
    assert roles("Sm120") == {"sm_120a": "qualify", "sm_90a": "check"}
    assert roles("Sm100") == {"sm_100a": "qualify"}
    assert catalog.module("Sm100").built_only(t["sm_100a"])


def test_wgmma_tensor_map_params(catalog):
    for fam in catalog.module("TriadSm90a").families:
        blobs = [(p.name, p.size, p.align) for p in fam.params if p.type == "bytes"]
        maps = [("tmA", 128, 64), ("tmB", 128, 64)]
        if "tmastore" in fam.name:
            assert blobs == maps + [("tmC", 128, 64)] and fam.qualify.prepare.endswith("_tmastore")
        else:
            assert blobs == maps and not fam.qualify.prepare.endswith("_tmastore")
        assert fam.qualify.prepare.startswith("mamba_forge.gpu.tma:prepare_gemm_")
    for s in catalog.module("TriadSm90a").symbols:
        e = s.params_env
        if "RS" in e:  # a pair rung: two rings of RS stages, the BM x BN f32 total, 2 x 2 x RS ring barriers + 2 hand-offs
            assert s.dynamic_smem == (2 * e["RS"] * (e["BM"] + e["BN"]) * 128 + e["BM"] * e["BN"] * 4 + 32 * e["RS"] + 16
                                      + 1024)
            assert s.dynamic_smem <= 227 * 1024 - 1024 and s.threads == 384
            continue
        # B's part of a stage: whole 64-column boxes from BN = 64 on (the 80-column rung holds two, the second a
        # quarter used: kernels/sm90a/wgmma.cu gemm_wgmma_skinny80), BN itself below
        b_cols = -(-e["BN"] // 64) * 64 if e["BN"] >= 64 else e["BN"]
        ring = e["STAGES"] * (e["BM"] + b_cols) * 128
        if "TS" in e:  # the in-CTA smt rung: TS of each consumer thread's running totals in shared memory (2 x 128)
            staging = 2 * 128 * e["TS"] * 4
        elif "SPLIT" in e:  # split-K: a cluster rung's f32 partial tile (rows padded by 8 floats), in-CTA none
            staging = e["CLUSTER"] * e["BM"] * (e["BN"] + 8) * 4
        else:  # TMASTORE: the C tile staged as 16-bit boxes (the 80-column rung: none, one consumer warpgroup)
            staging = e.get("TMASTORE", 0) * e["BM"] * e["BN"] * 2
        assert s.dynamic_smem == ring + staging + 16 * e["STAGES"] + 1024
        assert s.dynamic_smem <= 227 * 1024 - 1024  # the system reserves 1 KB per block on sm_90
        assert s.threads == 128 * (e.get("NC", 2 if "TS" in e else 1) + 1)  # smt: 2 consumers (its macro's)


def test_sm120_tma_tiles_take_tensor_maps(catalog):
    """The gemm_bi_nn_sm120_tma_* families load through TMA: tmA, tmB first (128 bytes, 64-aligned), built by the
    padded-box prepare hook of their element size; the copyplan / sliced families stay on cp.async (no maps)."""
    for fam in catalog.module("Sm120").families:
        blobs = [(p.name, p.size, p.align) for p in fam.params if p.type == "bytes"]
        if fam.name.startswith("gemm_bi_nn_sm120_tma"):
            assert [p.name for p in fam.params[:2]] == ["tmA", "tmB"] and blobs == [("tmA", 128, 64), ("tmB", 128, 64)]
            assert fam.instantiate.endswith("_TMA") and "TMA" in fam.contract, fam.name
            bits = "f32" if fam.params[3].dtype == "f32" else "16bit"
            assert fam.qualify.prepare == f"mamba_forge.gpu.tma:prepare_padded_tiles_{bits}", fam.name
        else:
            assert not blobs and not fam.qualify.prepare and fam.instantiate == "MF_TILE_FMA_NN", fam.name
    for s in catalog.module("Sm120").symbols:
        assert s.dynamic_smem <= 99 * 1024, s.name  # CC 12.x: 99 KB of shared memory per block
        if not s.name.startswith("gemm_bi_nn_sm120_tma"):
            continue
        e, eb = s.params_env, 2 if s.dtype in ("bf16", "f16") else 4
        a_box, b_box = (e["BK"] + 16 // eb, e["BM"]), (e["BN"] + 16 // eb, e["BK"])  # (columns, rows), padded
        for cols, rows in (a_box, b_box):
            assert cols <= 256 and rows <= 256 and cols * eb % 16 == 0, s.name  # cuTensorMapEncodeTiled's rules
        a_bytes, stage = a_box[0] * a_box[1] * eb, (a_box[0] * a_box[1] + b_box[0] * b_box[1]) * eb
        assert a_bytes % 128 == 0 and stage % 128 == 0, s.name  # every box lands 128-byte aligned
        assert s.dynamic_smem == e["STAGES"] * stage + 8 * e["STAGES"] + 128, s.name  # mf::tile::TmaRing::TOTAL


def test_padded_tile_maps_refuse_before_the_driver():
    with pytest.raises(tma.TmaError, match="K = 100"):
        tma.padded_tile_maps(0x1000, 0x2000, 64, 64, 100, 128, 128, 32, 2)
    with pytest.raises(tma.TmaError, match="N = 6 "):
        tma.padded_tile_maps(0x1000, 0x2000, 64, 6, 64, 128, 64, 16, 4)
    with pytest.raises(tma.TmaError, match="M = 0"):
        tma.padded_tile_maps(0x1000, 0x2000, 0, 8, 8, 128, 64, 16, 4)
    with pytest.raises(tma.TmaError, match="8-byte elements"):
        tma.padded_tile_maps(0x1000, 0x2000, 8, 8, 8, 128, 64, 16, 8)
    with pytest.raises(tma.TmaError, match="16-byte aligned"):
        tma.padded_tile_maps(0x1008, 0x2000, 8, 8, 8, 128, 64, 16, 4)
    with pytest.raises(tma.TmaError, match="box rows = 300"):
        tma.encode_2d_box(0x1000, 64, 64, 8, 300, 2)
    with pytest.raises(tma.TmaError, match="box row of 6 x 2 bytes"):
        tma.encode_2d_box(0x1000, 64, 64, 6, 8, 2)
    with pytest.raises(tma.TmaError, match="lack"):
        tma.padded_tile_maps_for({"BM": 64, "BN": 64}, 0x1000, 0x2000, 8, 8, 8)
    with pytest.raises(tma.TmaError, match="K = 4 is not a multiple of 8"):  # sizeof_T = 2: a 16-bit tile
        tma.padded_tile_maps_for({"BM": 64, "BN": 64, "BK": 64, "sizeof_T": 2}, 0x1000, 0x2000, 8, 8, 4)
    with pytest.raises(tma.TmaError, match="K = 12"):  # the prepare hooks read the tile from dims
        tma.prepare_padded_tiles_16bit({"A": 0x1000, "B": 0x2000}, {}, {"M": 8, "N": 8, "K": 12, "BM": 64,
                                                                        "BN": 64, "BK": 64})


def _build_one(catalog: Catalog, kind: str, target: str, tmp_path):
    sub = Catalog(path=catalog.path, name=catalog.name, modules=(catalog.module(kind),))
    man = build(BuildRequest(sub, [get_target(target)], tmp_path, jobs=1))
    (mod,) = [m for m in man.modules if m.kind == kind and m.target == target]
    return mod


BUILDS = [("TriadSm90a", "sm_90a"), ("TriadSm89Half", "sm_89"), ("TriadSm89Half", "sm_90a"),
          ("TriadSm89ExactF32", "sm_89"), ("TriadSm89ExactF32", "sm_90a"), ("TriadSm89Tf32Joint", "sm_89"),
          ("TriadSm89Tf32Joint", "sm_90a"), ("TriadSm89Finalist", "sm_89"), ("TriadSm89Finalist", "sm_90a"),
          ("TriadSm89ExactF32D128", "sm_89"), ("TriadSm89ExactF32D128", "sm_90a"), ("Sm100", "sm_100a"),
          ("Sm120", "sm_120a"),
          pytest.param("Sm120", "sm_90a", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind,target", BUILDS)
def test_module_compiles_and_every_symbol_admitted(catalog, kind, target, tmp_path):
    mod = _build_one(catalog, kind, target, tmp_path)
    assert mod.status == "compiled", mod.log_head
    rejected = [(s.name, s.verdict.reason) for s in mod.symbols if s.verdict.status != "admitted"]
    assert not rejected, rejected
    declared = {s.name for s in catalog.module(kind).symbols}
    assert {s.name for s in mod.symbols} == declared
    for s in mod.symbols:
        assert s.resources.spill_stores == 0 and s.resources.stack_frame == 0, s.name


def test_wgmma_module_uses_hopper_instructions(catalog, tmp_path):
    mod = _build_one(catalog, "TriadSm90a", "sm_90a", tmp_path)
    ptx = next(a for a in mod.artifacts if a.code == "ptx")
    text = (tmp_path / ptx.path).read_text()
    for token in ("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16",
                  "cp.async.bulk.tensor.2d.shared::cluster.global", "cp.async.bulk.tensor.2d.global.shared::cta",
                  "setmaxnreg.inc.sync.aligned.u32", "mbarrier.try_wait.parity", "fence.proxy.async.shared::cta"):
        assert token in text, token
    # deterministic: no atomics or reductions to memory, no local memory (instruction mnemonics at line starts)
    for pattern in (r"^\s*(@!?%p\d+\s+)?(atom|red)\.", r"\.local\b"):
        assert not re.search(pattern, text, re.M), pattern
    assert re.search(r"^\s*atom\.", "  atom.global.add.f32 [x], 1.0;", re.M)  # the pattern does find one


def test_sm100_module_uses_tcgen05(catalog, tmp_path):
    mod = _build_one(catalog, "Sm100", "sm_100a", tmp_path)
    text = (tmp_path / next(a for a in mod.artifacts if a.code == "ptx").path).read_text()
    for token in ("tcgen05.mma.cta_group::1.kind::f16", "tcgen05.alloc", "tcgen05.ld.sync.aligned.32x32b.x32",
                  "tcgen05.commit", "tcgen05.dealloc", "cp.async.bulk.tensor.2d"):
        assert token in text, token
    assert not re.search(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", text, re.M)


# ---- mamba_forge/tma.py: what is checked before the driver is asked ----
def test_check_gemm_accepts_supported_shapes():
    tma.check_gemm("nn", 1, 8, 8)
    tma.check_gemm("nn", 1003, 4096, 2048)
    tma.check_gemm("nt", 17, 392, 328)
    tma.check_gemm("tn", 520, 392, 331)  # TN: K is a row count, any value


# (layout, M, N, K, what the refusal names): check_gemm's, and the TF32 wgmma rungs' check_gemm_tf32 (NT only,
# K % 4, any M and N; tests/test_gemm_tf32_wgmma_cpu.py)
GEMM_REFUSALS = (("nn", 64, 64, 100, "K = 100"), ("nt", 64, 64, 12, "K = 12"), ("nn", 64, 60, 64, "N = 60"),
                 ("tn", 63, 64, 64, "M = 63"), ("nn", 0, 64, 64, "M = 0"), ("nn", 64, 64, 0, "K = 0"),
                 ("nn", 2**31, 64, 64, "out of range"), ("xx", 64, 64, 64, "unknown GEMM layout"))
TF32_REFUSALS = (("nn", 64, 64, 64, "NT only"), ("tn", 64, 64, 64, "NT only"), ("nt", 64, 64, 6, "K = 6"),
                 ("nt", 0, 64, 64, "M = 0"), ("nt", 64, 0, 64, "N = 0"), ("nt", 2**31, 64, 64, "out of range"))


@pytest.mark.parametrize("check,layout,M,N,K,match", [("check_gemm", *c) for c in GEMM_REFUSALS]
                         + [("check_gemm_tf32", *c) for c in TF32_REFUSALS])
def test_check_gemm_refuses(check, layout, M, N, K, match):
    with pytest.raises(tma.TmaError, match=match):
        getattr(tma, check)(layout, M, N, K)


def test_check_gemm_refuses_non_integers():
    with pytest.raises(tma.TmaError, match="integer"):
        tma.check_gemm("nn", 64.0, 64, 64)
    with pytest.raises(tma.TmaError, match="integer"):
        tma.check_gemm("nn", True, 64, 64)


def test_operand_shapes():
    assert tma.operand_shapes("nn", 3, 5, 7) == ((3, 7), (7, 5))
    assert tma.operand_shapes("nt", 3, 5, 7) == ((3, 7), (5, 7))
    assert tma.operand_shapes("tn", 3, 5, 7) == ((7, 3), (7, 5))


@pytest.mark.parametrize("ptr,rows,cols,match", [
    (0x1008, 64, 64, "16-byte aligned"),
    (0, 64, 64, "16-byte aligned"),
    (0x1000, 0, 64, "out of range"),
    (0x1000, 64, 12, "multiple of 16 bytes"),
])
def test_encode_refuses_before_the_driver(ptr, rows, cols, match):
    with pytest.raises(tma.TmaError, match=match):
        tma.encode_2d(ptr, rows, cols)


def test_prepare_hooks_refuse_bad_shapes_first():
    with pytest.raises(tma.TmaError, match="N = 12"):
        tma.prepare_gemm_nt_tmastore({"A": 0x1000, "B": 0x2000, "C": 0x3000}, {}, {"M": 8, "N": 12, "K": 8})
    with pytest.raises(tma.TmaError, match="K = 100"):
        tma.prepare_gemm_nn({"A": 0x1000, "B": 0x2000, "C": 0x3000}, {}, {"M": 8, "N": 8, "K": 100})
    with pytest.raises(tma.TmaError, match="M = 9"):
        tma.prepare_gemm_tn({"A": 0x1000, "B": 0x2000, "C": 0x3000}, {}, {"M": 9, "N": 8, "K": 8})


def test_tensor_map_blob_packs_by_value_64_aligned():
    """A tensor map travels as a ("bytes", map) parameter of the one launch path, aligned TMA_DESC_ALIGN."""
    import ctypes

    from mamba_forge.gpu import driver as cu

    blob = bytes(range(128))
    args = cu.PackedParams([("bytes", blob), ("ptr", 0xDEADBEEF000), ("i32", -3), ("f32", 1.5)],
                           [tma.TMA_DESC_ALIGN, 0, 0, 0])
    ptrs = (ctypes.c_void_p * 4).from_address(args.address)
    assert ctypes.string_at(ptrs[0], 128) == blob and ptrs[0] % 64 == 0
    assert ctypes.c_uint64.from_address(ptrs[1]).value == 0xDEADBEEF000
    assert ctypes.c_int32.from_address(ptrs[2]).value == -3
    assert ctypes.c_float.from_address(ptrs[3]).value == 1.5
    with pytest.raises(ValueError, match="unknown type 'i128'"):
        cu.PackedParams([("i128", 1)])


# ---- the float64 references ----
def test_references_match_explicit_sums():
    rng = np.random.default_rng(0)
    M, N, K = 3, 4, 5
    a, b, bias = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal(N)
    want = np.array([[sum(a[i, k] * b[k, j] for k in range(K)) for j in range(N)] for i in range(M)])
    dims = {"M": M, "N": N, "K": K}
    np.testing.assert_allclose(gemm_ref.gemm_nn({"A": a.ravel(), "B": b.ravel()}, dims)["C"], want.ravel(), rtol=1e-13)
    np.testing.assert_allclose(gemm_ref.gemm_nt({"A": a.ravel(), "B": b.T.ravel()}, dims)["C"], want.ravel(), rtol=1e-13)
    np.testing.assert_allclose(gemm_ref.gemm_tn({"A": a.T.ravel(), "B": b.ravel()}, dims)["C"], want.ravel(), rtol=1e-13)
    with_bias = gemm_ref.gemm_nn({"A": a.ravel(), "B": b.ravel(), "bias": bias}, dims)["C"]
    np.testing.assert_allclose(with_bias, (want + bias[None, :]).ravel(), rtol=1e-13)
    # a wrong layout gives a different answer (the references are not layout-blind)
    wrong = gemm_ref.gemm_nt({"A": a.ravel(), "B": b.ravel()}, dims)["C"]
    assert not np.allclose(wrong, want.ravel())


# ---- the Ada TF32-joint named symbols (reference-registry.rs 1130-1145) ----
TF32_JOINT_NAMED = [
    "tn_pre_rna_transpose_fixed_sm89_tf32_v1",
    "gemm_bi_nn_fixed_sm89_tn_pre_rna_tf32_v1_m128n96_bk32_s3",
    "gemm_bi_nn_fixed_sm89_tn_pre_rna_tf32_v1_m64n64_bk32_s3",
    "gemm_bi_nn_fixed_sm89_tn_pre_rna_tf32_v1_m64n96_bk32_s2",
    "gemm_bi_nn_fixed_sm89_add_half_direct_tf32_v1_m128n96_bk32_s3",
    "gemm_bi_nn_fixed_sm89_add_half_tf32_v1_m128n96_bk32_s3",
    "gemm_bi_nt_fixed_sm89_a_ldmatrix_tf32_v1_m128n96_bk32_s3",
]


def test_tf32_joint_named_symbols_declared_within_ada_shared_memory(catalog):
    syms = {s.name: s for s in catalog.module("TriadSm89Tf32Joint").symbols}
    missing = [n for n in TF32_JOINT_NAMED if n not in syms]
    assert not missing, missing
    for n in TF32_JOINT_NAMED:
        assert syms[n].dynamic_smem <= 99 * 1024, n  # the Ada per-block opt-in limit


def _entry_bodies(ptx: str) -> dict[str, str]:
    parts = re.split(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_tf32_joint_ptx_does_what_the_names_say(catalog, tmp_path):
    mod = _build_one(catalog, "TriadSm89Tf32Joint", "sm_89", tmp_path)
    body = _entry_bodies((tmp_path / next(a for a in mod.artifacts if a.code == "ptx").path).read_text())
    count = lambda n, tok: body[n].count(tok)  # noqa: E731
    mma, cvt = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cvt.rna.tf32.f32"
    rna, pre = "gemm_bi_nn_fixed_sm89_rna_tf32_v1_m128n96_bk32_s3", TF32_JOINT_NAMED[1]
    # pre-RNA: A is not converted, B still is (the incumbent converts both: 80 per 48 mma, the variant 48)
    assert count(pre, mma) == count(rna, mma) and count(pre, cvt) < count(rna, cvt)
    for n in TF32_JOINT_NAMED[4:6]:  # 3xTF32: three mma per product tile, hi and lo of every operand
        assert count(n, mma) == 3 * count(rna, mma) and count(n, cvt) == 2 * count(rna, cvt), n
    nt = TF32_JOINT_NAMED[6]
    assert count(nt, "ldmatrix.sync.aligned.m8n8.x4.shared.b16") > 0 and count(rna, "ldmatrix") == 0
    assert count(TF32_JOINT_NAMED[0], cvt) > 0 and count(TF32_JOINT_NAMED[0], "mma") == 0


def test_tf32_rna_reference_rounds_ties_away_and_carries():
    u = 2.0**-10  # one TF32 ulp at 1
    x = np.array([1.0, 1 + u / 2, 1 + u / 2 - 2.0**-23, -(1 + u / 2), 1 + 3 * u / 4, 2 - u / 2, 3.4028234e38,
                  np.inf, np.nan, 0.0, -0.0])
    got = gemm_ref.tf32_rna(x)
    want = np.array([1.0, 1 + u, 1.0, -(1 + u), 1 + u, 2.0, np.inf, np.inf, np.nan, 0.0, -0.0])
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got[-1]) and not np.signbit(got[-2])
    # the low 13 bits are zero on random values, and the rounding is the nearest TF32 value (not truncation)
    r = np.random.default_rng(0).uniform(-1, 1, 4096).astype(np.float32)
    g = gemm_ref.tf32_rna(r).astype(np.float32)
    assert not (g.view(np.uint32) & 0x1FFF).any()
    trunc = (r.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    assert (np.abs(g - r) <= np.abs(trunc - r)).all() and (g != trunc).any()
    a = np.arange(6, dtype=np.float64).reshape(2, 3)  # A [K=2, M=3]
    assert gemm_ref.tf32_rna_transpose({"A": a.ravel()}, {"M": 3, "K": 2})["At"].tolist() == a.T.ravel().tolist()
