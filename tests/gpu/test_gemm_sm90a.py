"""GPU checks of the architecture-specific GEMM families on the H200 (sm_90a build):

* TriadSm90a (wgmma + TMA): every rung against a float64 product for bf16/f16, NN/NT/TN, aligned and ragged
  shapes; row i of C bit-identical for M in {1, 3, 17, 64, 1000, 4096} with the same A rows (batch invariance);
  five runs bitwise equal; the host refuses shapes the TMA path cannot describe.
* The Ada (TriadSm89*) and Sm120 modules' arithmetic through their sm_90a check builds: float64 agreement on a
  ragged shape, batch invariance, and the exact-f32 symbols bit-identical to one another.

Kernels are launched through mamba_forge.gpu (gpu_support.launch: PackedParams, tensor maps as 64-aligned bytes
parameters); memory and the float64 oracle are torch.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import admitted_function, torch_env  # noqa: E402
from gpu_support import launch as gpu_launch  # noqa: E402

from mamba_forge.catalog.model import default_catalog_path, load_catalog  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = "sm_90a"
WGMMA_NN = ["gemm_bi_nn_sm90a_wgmma_wg1", "gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4",
            "gemm_bi_nn_sm90a_wgmma_ws2_tmastore_m128n256_s3"]
WGMMA_ALL = [(n, "nn") for n in WGMMA_NN] + [
    (f"gemm_bi_{lay}_sm90a_wgmma_ws2{kind}", lay)
    for lay in ("nt", "tn") for kind in ("_m128n256_s4", "_tmastore_m128n256_s3")
]
SM_COUNT = 132


@pytest.fixture(scope="module")
def env():
    return torch_env(TARGET)


def _fn(env, name):
    return admitted_function(env, name)


def _tdtype(torch, token):
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[token]


def _ref(torch, layout, A, B):
    a, b = A.double(), B.double()
    if layout == "nt":
        b = b.t()
    if layout == "tn":
        a = a.t()
    return a @ b, a.abs() @ b.abs()


def run_wgmma(env, name, layout, A, B, M, N, K, C=None):
    """Launch one wgmma symbol on (A, B) of the layout; returns C (M x N, the inputs' dtype)."""
    from mamba_forge.gpu import tma

    torch = env[0]
    fn, sym = _fn(env, name)
    if C is None:
        C = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
    bm, bn = sym.params_env["BM"], sym.params_env["BN"]
    grid = min(math.ceil(M / bm) * math.ceil(N / bn), SM_COUNT)
    if sym.params_env["TMASTORE"]:
        maps = tma.gemm_tensor_maps_with_c(layout, A.data_ptr(), B.data_ptr(), C.data_ptr(), M, N, K)
        blobs = [maps["tmA"], maps["tmB"], maps["tmC"]]
    else:
        maps = tma.gemm_tensor_maps(layout, A.data_ptr(), B.data_ptr(), M, N, K)
        blobs = [maps["tmA"], maps["tmB"]]
    args = blobs + [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()), ("i32", M), ("i32", N),
                    ("i32", K)]
    gpu_launch(fn, (grid,), sym.block, args, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C


def _operands(torch, layout, M, N, K, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a_shape = (M, K) if layout in ("nn", "nt") else (K, M)
    b_shape = (K, N) if layout in ("nn", "tn") else (N, K)
    A = (torch.rand(a_shape, generator=g, device="cuda") * 2 - 1).to(dtype)
    B = (torch.rand(b_shape, generator=g, device="cuda") * 2 - 1).to(dtype)
    return A, B


def _assert_close(torch, C, ref, absprod, what):
    # bf16/f16 rounding of the output (<= 2^-8 relative) plus f32 accumulation error (<< 1e-4 of sum |a||b|).
    err = (C.double() - ref).abs()
    tol = 2.0**-7 * ref.abs() + 1e-4 * absprod + 1e-6
    bad = err > tol
    assert torch.isfinite(C.double()).all(), f"{what}: non-finite output (unwritten elements are NaN)"
    assert not bad.any(), f"{what}: {int(bad.sum())} elements off, worst {float((err - tol).max()):.3g} over tolerance"


SHAPES = [(256, 512, 256), (1000, 392, 328), (1, 8, 8), (129, 264, 72), (520, 1024, 4096)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("family,layout", WGMMA_ALL)
def test_wgmma_matches_float64(env, family, layout, dtype):
    torch = env[0]
    for M, N, K in SHAPES:
        if layout == "tn" and M % 8:
            M = (M + 7) // 8 * 8  # TN needs M % 8 == 0 (A's rows are M long)
        A, B = _operands(torch, layout, M, N, K, _tdtype(torch, dtype))
        C = run_wgmma(env, f"{family}_{dtype}", layout, A, B, M, N, K)
        ref, absprod = _ref(torch, layout, A, B)
        _assert_close(torch, C, ref, absprod, f"{family}_{dtype} {layout} M={M} N={N} K={K}")


@pytest.mark.parametrize("family", WGMMA_NN + ["gemm_bi_nt_sm90a_wgmma_ws2_m128n256_s4",
                                    "gemm_bi_nt_sm90a_wgmma_ws2_tmastore_m128n256_s3"])
def test_wgmma_batch_invariant(env, family):
    torch = env[0]
    layout = "nt" if "_nt_" in family else "nn"
    N, K = 1024, 520
    A, B = _operands(torch, layout, 4096, N, K, torch.bfloat16, seed=1)
    full = run_wgmma(env, f"{family}_bf16", layout, A, B, 4096, N, K)
    for M in (1, 3, 17, 64, 1000):
        part = run_wgmma(env, f"{family}_bf16", layout, A[:M].contiguous(), B, M, N, K)
        same = torch.equal(part.view(torch.int16), full[:M].view(torch.int16))
        assert same, f"{family}: rows of C differ between M={M} and M=4096"


@pytest.mark.parametrize("family,layout", WGMMA_ALL)
def test_wgmma_repeat_bitwise(env, family, layout):
    torch = env[0]
    M, N, K = 2048, 2048, 1032
    A, B = _operands(torch, layout, M, N, K, torch.bfloat16, seed=2)
    first = run_wgmma(env, f"{family}_bf16", layout, A, B, M, N, K).clone()
    for _ in range(4):
        again = run_wgmma(env, f"{family}_bf16", layout, A, B, M, N, K)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16)), f"{family}: run differs"


@pytest.mark.parametrize("family", WGMMA_NN)
def test_wgmma_writes_only_c(env, family):
    """Neighbours of C stay untouched on a ragged shape (guards the epilogue's bounds and the TMA store clipping)."""
    torch = env[0]
    M, N, K = 77, 136, 64
    A, B = _operands(torch, "nn", M, N, K, torch.bfloat16, seed=3)
    pad = 4096
    buf = torch.full((M * N + 2 * pad,), 7.0, dtype=torch.bfloat16, device="cuda")
    C = buf[pad : pad + M * N].view(M, N)
    run_wgmma(env, f"{family}_bf16", "nn", A, B, M, N, K, C=C)
    assert bool((buf[:pad] == 7.0).all()) and bool((buf[pad + M * N :] == 7.0).all()), "wrote outside C"
    ref, absprod = _ref(torch, "nn", A, B)
    _assert_close(torch, C, ref, absprod, "neighbour")


def test_wgmma_host_refuses_unaligned():
    from mamba_forge.gpu import tma

    with pytest.raises(tma.TmaError, match="K = 100"):
        tma.check_gemm("nn", 64, 64, 100)
    with pytest.raises(tma.TmaError, match="N = 60"):
        tma.check_gemm("nn", 64, 60, 64)
    tma.check_gemm("nn", 3, 64, 64)  # ragged M is fine in NN


# ---- Ada and Sm120 arithmetic through their sm_90a check builds ----
CHECK_MODULES = ("TriadSm89Half", "TriadSm89ExactF32", "TriadSm89Tf32Joint", "Sm120")


def _check_symbols():
    cat = load_catalog(default_catalog_path())
    # NN GEMMs (C, A, B, M, N, K); the Ada TF32-joint NT GEMM and pre-RNA transpose: tests/gpu/test_sm89_tf32_joint.py
    return [s.name for m in cat.modules if m.kind in CHECK_MODULES for s in m.symbols
            if s.name.startswith("gemm_bi_nn_")]


def run_tile(env, name, A, B, M, N, K, bias=None):
    torch = env[0]
    fn, sym = _fn(env, name)
    fam = next(f for m in env[2].modules for f in m.families if f.name == sym.family)
    out_token = next(p.dtype for p in fam.params if p.name == "C")
    out_token = sym.params_env.get(out_token, out_token)
    C = torch.full((M, N), float("nan"), dtype=_tdtype(torch, out_token), device="cuda")
    items = []
    if any(p.name == "tmA" for p in fam.params):  # the CC 12.x TMA tiles: padded boxes of the instance's tile
        from mamba_forge.gpu import tma

        e = sym.params_env
        maps = tma.padded_tile_maps(A.data_ptr(), B.data_ptr(), M, N, K, e["BM"], e["BN"], e["BK"], A.element_size())
        items = [("bytes", maps["tmA"]), ("bytes", maps["tmB"])]
    items += [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr())]
    if any(p.name == "bias" for p in fam.params):
        items.append(("ptr", bias.data_ptr()))
    items += [("i32", M), ("i32", N), ("i32", K)]
    grid = math.ceil(M / sym.params_env["BM"]) * math.ceil(N / sym.params_env["BN"])
    gpu_launch(fn, (grid,), sym.block, items, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C, any(p.name == "bias" for p in fam.params)


@pytest.mark.parametrize("name", _check_symbols())
def test_check_build_arithmetic(env, name):
    torch, _, catalog, _ = env
    sym = catalog.symbols[name]
    in_token = sym.dtype or "f32"
    M, N, K = 263, 200, 100  # K % 8 != 0: A takes the element path; N % 8 == 0: B takes the 16-byte path
    if _is_tma_tile(name) and in_token != "f32":
        K = 104  # TMA needs 16-byte row strides (K % 8 == 0 for 16-bit); 104 is still a ragged k-tile
    g = torch.Generator(device="cuda").manual_seed(4)
    A = (torch.rand((1000, K), generator=g, device="cuda") * 2 - 1).to(_tdtype(torch, in_token))
    B = (torch.rand((K, N), generator=g, device="cuda") * 2 - 1).to(_tdtype(torch, in_token))
    bias = torch.rand((N,), generator=g, device="cuda") * 2 - 1
    C, has_bias = run_tile(env, name, A[:M].contiguous(), B, M, N, K, bias)
    ref = A[:M].double() @ B.double()
    if has_bias:
        ref = ref + bias.double()[None, :]
    absprod = A[:M].double().abs() @ B.double().abs()
    tf32 = "tf32" in name
    err = (C.double() - ref).abs()
    rel = 2.0**-7 if C.dtype != torch.float32 else (2.0**-10 if tf32 else 1e-6)
    tol = rel * ref.abs() + (2e-3 if tf32 else 1e-5) * absprod + 1e-6
    assert torch.isfinite(C.double()).all(), f"{name}: unwritten or non-finite output"
    assert not (err > tol).any(), f"{name}: {int((err > tol).sum())} elements off"
    # batch invariance: the first rows are the same bits when 1000 rows are launched
    C_full, _ = run_tile(env, name, A, B, 1000, N, K, bias)
    assert torch.equal(C_full[:M].contiguous().view(torch.uint8), C.view(torch.uint8)), f"{name}: batch variant"


def _is_tma_tile(name: str) -> bool:
    return name.startswith("gemm_bi_nn_sm120_tma_")


def test_exact_f32_symbols_agree_bitwise(env):
    torch, _, catalog, _ = env
    names = [n for n in _check_symbols() if "f32_n64" in n and not _is_tma_tile(n)]
    assert len(names) >= 5
    M, N, K = 150, 131, 77  # everything ragged (the cp.async tiles; the TMA tiles need N, K % 4: below)
    g = torch.Generator(device="cuda").manual_seed(5)
    A = torch.rand((M, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
    outs = {n: run_tile(env, n, A, B, M, N, K)[0] for n in names}
    first = next(iter(outs.values()))
    for n, c in outs.items():
        assert torch.equal(c.view(torch.int32), first.view(torch.int32)), f"{n} differs from {names[0]}"


def test_postbias_symbols_equal_nobias_plus_bias(env):
    """c = acc + bias[n] in f32: the bias symbols equal the bias-free chain plus one f32 add, bit for bit."""
    torch = env[0]
    M, N, K = 150, 132, 76  # ragged tiles; N, K multiples of 4 (the TMA tiles' 16-byte row strides)
    g = torch.Generator(device="cuda").manual_seed(6)
    A = torch.rand((M, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
    bias = torch.rand((N,), generator=g, device="cuda") * 2 - 1
    plain, _ = run_tile(env, "gemm_bi_nn_sm120_tma_fma_v1_fixed_nobias_m128n64_t256_bk16_s2", A, B, M, N, K)
    want = plain + bias[None, :]
    names = [n for n in _check_symbols() if "_fixed_postbias_" in n]
    assert len(names) == 5
    for n in names:
        got, has_bias = run_tile(env, n, A, B, M, N, K, bias)
        assert has_bias
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), f"{n} != nobias + bias"


# ---- the CC 12.x TMA tiles (gemm_bi_nn_sm120_tma_*): the bits of their cp.async twins ----------------------------
# Each TMA tile runs the arithmetic of a portable cp.async template (mf/tile_tma.cuh): bf16/f16 -> MF_TILE_MMA_NN,
# TF32 -> MF_TILE_TF32_NN (RNA), exact f32 -> the FFMA chain. Per output element that arithmetic does not depend on
# the tile shape, so every TMA tile must give, bit for bit, what a cp.async symbol of the same template gives
# (the Ada check builds and the Sm120 copyplan tiles), on ragged tiles and on both corpora.
TMA_SHAPES = [(263, 200, 104), (1, 8, 8), (129, 264, 72), (77, 136, 1032), (300, 520, 4096)]
TWIN_HALF = "gemm_bi_nn_fixed_sm89_tc128_s3_v1_{dtype}"  # MF_TILE_MMA_NN 128x128x32, 3 stages, cp.async
TWIN_TF32 = "gemm_bi_nn_fixed_sm89_rna_tf32_v1_m128n96_bk32_s3"  # MF_TILE_TF32_NN, cp.async
TWIN_FMA = "gemm_bi_nn_fixed_sm120_f32_n64_copyplan_v1"  # MF_TILE_FMA_NN, cp.async


def _tma_tiles(kind: str) -> list[str]:
    names = [n for n in _check_symbols() if _is_tma_tile(n)]
    if kind == "half":
        return [n for n in names if "_tf32_" not in n and "_fma_" not in n and "f32out" not in n]
    if kind == "f32out":
        return [n for n in names if "f32out" in n]
    return [n for n in names if f"_{kind}_" in n]


def _corpus(torch, shape, dtype, corpus, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(shape, generator=g, device="cuda", dtype=torch.float64) * 2 - 1
    if corpus == "logu":
        x = x.sign() * 10.0 ** (torch.rand(shape, generator=g, device="cuda", dtype=torch.float64) * 4 - 2)
    return x.to(dtype)


def _same_bits(torch, a, b) -> bool:
    view = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def test_tma_tiles_cover_every_family():
    assert len(_tma_tiles("half")) == 10 and len(_tma_tiles("f32out")) == 10
    assert len(_tma_tiles("tf32")) == 7 and len(_tma_tiles("fma")) == 6


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("corpus", ["uniform", "logu"])
def test_tma_half_tiles_equal_their_cp_async_twin(env, dtype, corpus):
    """bf16/f16 out: bit-identical to the Ada cp.async tile; f32 out: rounded to T (RNE), bit-identical to it too."""
    torch = env[0]
    tdt = _tdtype(torch, dtype)
    for i, (M, N, K) in enumerate(TMA_SHAPES):
        A, B = _corpus(torch, (M, K), tdt, corpus, 10 + i), _corpus(torch, (K, N), tdt, corpus, 20 + i)
        want, _ = run_tile(env, TWIN_HALF.format(dtype=dtype), A, B, M, N, K)
        ref, absprod = _ref(torch, "nn", A, B)
        if corpus == "uniform":
            _assert_close(torch, want, ref, absprod, f"twin {dtype} M={M} N={N} K={K}")
        for name in [n for n in _tma_tiles("half") + _tma_tiles("f32out") if n.endswith(f"_{dtype}")]:
            got, _ = run_tile(env, name, A, B, M, N, K)
            if got.dtype == torch.float32:
                assert not got.isnan().any(), f"{name}: unwritten output at M={M} N={N} K={K}"
                got = got.to(tdt)  # round to nearest even, as the T-out epilogue's __float2*_rn
            assert _same_bits(torch, got, want), f"{name} differs from {TWIN_HALF.format(dtype=dtype)} at M={M} N={N} K={K}"


@pytest.mark.parametrize("corpus", ["uniform", "logu"])
def test_tma_tf32_tiles_equal_their_cp_async_twin(env, corpus):
    torch = env[0]
    for i, (M, N, K) in enumerate(TMA_SHAPES):
        A, B = _corpus(torch, (M, K), torch.float32, corpus, 30 + i), _corpus(torch, (K, N), torch.float32, corpus, 40 + i)
        want, _ = run_tile(env, TWIN_TF32, A, B, M, N, K)
        assert not want.isnan().any()
        for name in _tma_tiles("tf32"):
            got, _ = run_tile(env, name, A, B, M, N, K)
            assert _same_bits(torch, got, want), f"{name} differs from {TWIN_TF32} at M={M} N={N} K={K}"


@pytest.mark.parametrize("corpus", ["uniform", "logu"])
def test_tma_fma_tiles_equal_the_chain_bitwise(env, corpus):
    """The exact-f32 TMA tiles: the host FFMA chain (float64-free, references.gemm.chain_f32) and the cp.async
    copyplan tile, bit for bit; with bias, chain + bias[n] in f32."""
    import numpy as np

    from mamba_forge.references import gemm as R

    torch = env[0]
    for i, (M, N, K) in enumerate([(150, 132, 76), (1, 4, 4), (129, 264, 72), (77, 136, 300)]):
        A, B = _corpus(torch, (M, K), torch.float32, corpus, 50 + i), _corpus(torch, (K, N), torch.float32, corpus, 60 + i)
        bias = _corpus(torch, (N,), torch.float32, "uniform", 70 + i)
        chain = R.chain_f32(A.cpu().numpy().astype(np.float64), B.cpu().numpy().astype(np.float64), None)
        want = torch.from_numpy(np.ascontiguousarray(chain, dtype=np.float32)).cuda().view(M, N)
        twin, _ = run_tile(env, TWIN_FMA, A, B, M, N, K)
        assert _same_bits(torch, twin, want), f"{TWIN_FMA} differs from the host chain at M={M} N={N} K={K}"
        for name in _tma_tiles("fma"):
            got, has_bias = run_tile(env, name, A, B, M, N, K, bias)
            expect = want + bias[None, :] if has_bias else want
            assert _same_bits(torch, got, expect), f"{name} differs from the chain at M={M} N={N} K={K}"


@pytest.mark.parametrize("kind", ["half", "f32out", "tf32", "fma"])
def test_tma_tiles_batch_invariant_and_repeatable(env, kind):
    torch = env[0]
    dt = torch.float32 if kind in ("tf32", "fma") else torch.bfloat16
    N, K = 264, 520
    A, B = _corpus(torch, (1000, K), dt, "uniform", 80), _corpus(torch, (K, N), dt, "uniform", 81)
    bias = _corpus(torch, (N,), torch.float32, "uniform", 82)
    names = [n for n in _tma_tiles(kind) if dt == torch.float32 or n.endswith("_bf16")]
    for name in names:
        full, _ = run_tile(env, name, A, B, 1000, N, K, bias)
        for M in (1, 3, 17, 64, 263):
            part, _ = run_tile(env, name, A[:M].contiguous(), B, M, N, K, bias)
            assert _same_bits(torch, part, full[:M]), f"{name}: rows differ between M={M} and M=1000"
        for _ in range(3):
            assert _same_bits(torch, run_tile(env, name, A, B, 1000, N, K, bias)[0], full), f"{name}: run differs"


def test_tma_tiles_write_only_c(env):
    """Neighbours of C stay untouched on a ragged shape: the epilogue's bounds (the boxes only read)."""
    torch = env[0]
    M, N, K = 77, 136, 64
    for name in [n for n in _check_symbols() if _is_tma_tile(n) and not n.endswith("_f16")]:
        fn, sym = _fn(env, name)
        dt = torch.bfloat16 if name.endswith("_bf16") else torch.float32
        A, B = _corpus(torch, (M, K), dt, "uniform", 90), _corpus(torch, (K, N), dt, "uniform", 91)
        out_dt = torch.float32 if ("f32out" in name or dt == torch.float32) else dt
        pad = 4096
        buf = torch.full((M * N + 2 * pad,), 7.0, dtype=out_dt, device="cuda")
        C = buf[pad : pad + M * N].view(M, N)
        from mamba_forge.gpu import tma

        e = sym.params_env
        maps = tma.padded_tile_maps(A.data_ptr(), B.data_ptr(), M, N, K, e["BM"], e["BN"], e["BK"], A.element_size())
        items = [("bytes", maps["tmA"]), ("bytes", maps["tmB"]), ("ptr", C.data_ptr()), ("ptr", A.data_ptr()),
                 ("ptr", B.data_ptr())]
        bias = torch.zeros(N, device="cuda")
        if "_postbias" in name:
            items.append(("ptr", bias.data_ptr()))
        items += [("i32", M), ("i32", N), ("i32", K)]
        grid = math.ceil(M / e["BM"]) * math.ceil(N / e["BN"])
        gpu_launch(fn, (grid,), sym.block, items, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
        torch.cuda.synchronize()
        assert bool((buf[:pad] == 7.0).all()) and bool((buf[pad + M * N :] == 7.0).all()), f"{name}: wrote outside C"
        assert not (C == 7.0).all(), f"{name}: wrote nothing"


def test_tma_tile_host_refuses_unaligned():
    from mamba_forge.gpu import tma

    with pytest.raises(tma.TmaError, match="K = 100"):
        tma.padded_tile_maps(0x1000, 0x2000, 64, 64, 100, 128, 128, 32, 2)
    with pytest.raises(tma.TmaError, match="N = 6"):
        tma.padded_tile_maps(0x1000, 0x2000, 64, 6, 64, 128, 64, 16, 4)
