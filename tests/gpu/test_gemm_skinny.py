"""GPU checks of the skinny-M (decode) GEMM rungs on the H200 (sm_90a build):

* gemm_bi_nn_sm90a_wgmma_skinny_* (bf16/f16, TriadSm90a): against a float64 product on aligned and ragged shapes;
  and the route-equivalence property they exist for: rows of a skinny rung at M in {1, 3, 17, 64, 256} are
  bit-identical to the same rows of the route's reference rung gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4 run at
  M = 1000 on the same A rows and B. This is what proves that wgmma m64nNk16 for N in {32, 64, 128} gives per
  element the bits of m64n256k16 (an assumption of the kernels' equivalence argument, not something the code
  can show by itself).
* gemm_bi_f32_f32_skinny_* and gemm_bi_f32_f32_decode_* (exact f32, Fixed): against float64, and bit for bit
  equal to gemm_bi_f32_f32_s2 at M = 1000 (with and without bias) row by row, and to the host FFMA-chain
  reference on a small shape; the decode rungs also bit for bit equal to gemm_bi_f32_f32_n128_s2 at their own
  M (1, 2, 3, 5, 8, and past MC) on odd N and K (the 4-byte copy path, N and K tails), bias and no bias.

Every launch uses the catalog's block, dynamic shared memory and grid expressions; outputs are poisoned (NaN)
first and inputs are fresh random tensors. Memory and the float64 oracle are torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import admitted_function, torch_env  # noqa: E402
from gpu_support import launch as gpu_launch  # noqa: E402

from mamba_forge.core import expr  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = "sm_90a"
WG_SKINNY = [f"gemm_bi_nn_sm90a_wgmma_skinny_{t}" for t in ("m64n64_s12", "m64n32_s18", "m64n128_s8", "m128n64_s8",
                                                             "m64n64_s6", "lsu1_m64n128_s8", "lsu2_m64n128_s8",
                                                             "lsu1_m64n64_s12", "tail_m64n80_s8")]  # lsu, tail: B on the LSU too
WG_REF = "gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4"
F32_SKINNY = ["gemm_bi_f32_f32_skinny_n64", "gemm_bi_f32_f32_skinny_n32"]
F32_DECODE = ["gemm_bi_f32_f32_decode_n64", "gemm_bi_f32_f32_decode_n32"]
F32_REF = "gemm_bi_f32_f32_s2"
F32_TILE = "gemm_bi_f32_f32_n128_s2"  # the fma-chain route class's reference rung
DECODE_MS = (1, 2, 3, 5, 8, 9, 17)  # the route's M range (1..8), then more row chunks than one
# (N, K): the headline decode shape, aligned, ragged K (tail k-tile), odd N and K (4-byte copies), N < BN
DECODE_NK = [(8192, 8192), (4096, 4096), (1032, 1000), (263, 201), (37, 29), (1, 3), (8193, 517)]
SKINNY_MS = (1, 3, 17, 41, 64, 256)  # the SHORT_A rungs' A box: 8, 8, 24, 48 rows, then whole 64-row boxes
REF_M = 1000
# (N, K): ragged (the qualifier's N and K), and a decode projection
EQUIV_NK = [(392, 328), (4096, 4096)]
SHAPES = [(1, 392, 328), (3, 8, 8), (17, 264, 72), (64, 1024, 1000), (129, 520, 64), (256, 4096, 1024),
          (523, 392, 328)]


@pytest.fixture(scope="module")
def env():
    return torch_env(TARGET)


def _fn(env, name):
    return admitted_function(env, name)


def _grid(catalog, sym, M, N, K):
    fam = catalog.module(sym.module).family(sym.family)
    e = {k_: v for k_, v in sym.params_env.items() if isinstance(v, int)}
    e.update({"M": M, "N": N, "K": K})
    return tuple(int(expr.evaluate(g, e)) for g in fam.launch.grid)


def run_wgmma(env, name, A, B, C=None):
    """One NN wgmma launch (A: M x K, B: K x N, 16-bit); returns C (M x N), poisoned with NaN first (C: a caller's
    buffer of at least M rows, C's first M rows the product)."""
    from mamba_forge.gpu import tma

    torch, _, catalog, _ = env
    fn, sym = _fn(env, name)
    M, K = A.shape
    N = B.shape[1]
    if C is None:
        C = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
    ptrs = {"A": A.data_ptr(), "B": B.data_ptr(), "C": C.data_ptr()}
    if "_skinny_" in name:  # the family's hook, as qualified: B's box as wide as BN, A's short box where SHORT_A
        dims = {k_: v for k_, v in sym.params_env.items() if isinstance(v, int)}
        maps = tma.prepare_gemm_nn_skinny(ptrs, {}, {**dims, "M": M, "N": N, "K": K})
    else:
        maps = tma.gemm_tensor_maps("nn", A.data_ptr(), B.data_ptr(), M, N, K)
    args = [maps["tmA"], maps["tmB"], ("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()),
            ("i32", M), ("i32", N), ("i32", K)]
    gpu_launch(fn, _grid(catalog, sym, M, N, K), sym.block, args, smem=sym.dynamic_smem,
               stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C


def run_f32(env, name, A, B, bias=None):
    torch, _, catalog, _ = env
    fn, sym = _fn(env, name)
    M, K = A.shape
    N = B.shape[1]
    C = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    args = [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()),
            ("ptr", bias.data_ptr() if bias is not None else 0), ("i32", M), ("i32", N), ("i32", K)]
    gpu_launch(fn, _grid(catalog, sym, M, N, K), sym.block, args, smem=sym.dynamic_smem,
               stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C


def _rand(torch, shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, generator=g, device="cuda") * 2 - 1).to(dtype)


def _assert_close(torch, C, ref, absprod, eps_out, what):
    err = (C.double() - ref).abs()
    tol = 2 * eps_out * ref.abs() + 1e-5 * absprod + 1e-6
    assert torch.isfinite(C.double()).all(), f"{what}: non-finite output (unwritten elements are NaN)"
    bad = err > tol
    assert not bad.any(), f"{what}: {int(bad.sum())} elements off, worst {float((err - tol).max()):.3g} over tolerance"


def _same_bits(torch, x, y) -> bool:
    view = torch.int16 if x.element_size() == 2 else torch.int32
    return torch.equal(x.contiguous().view(view), y.contiguous().view(view))


# ---- bf16 / f16 wgmma skinny rungs ----


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("family", WG_SKINNY)
def test_wgmma_skinny_matches_float64(env, family, dtype):
    torch = env[0]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    for i, (M, N, K) in enumerate(SHAPES):
        A, B = _rand(torch, (M, K), tdt, 10 + i), _rand(torch, (K, N), tdt, 100 + i)
        C = run_wgmma(env, f"{family}_{dtype}", A, B)
        a, b = A.double(), B.double()
        _assert_close(torch, C, a @ b, a.abs() @ b.abs(), 2.0**-8, f"{family}_{dtype} M={M} N={N} K={K}")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("N,K", EQUIV_NK)
def test_wgmma_skinny_rows_equal_the_reference_rung(env, N, K, dtype):
    """Route equivalence: every skinny rung's rows at small M == the m64n256k16 rung's rows at M = 1000."""
    torch = env[0]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    A, B = _rand(torch, (REF_M, K), tdt, 7), _rand(torch, (K, N), tdt, 8)
    full = run_wgmma(env, f"{WG_REF}_{dtype}", A, B)
    assert torch.isfinite(full.double()).all()
    bad = []
    for family in WG_SKINNY:
        name = f"{family}_{dtype}"
        for M in SKINNY_MS + (REF_M,):
            part = run_wgmma(env, name, A[:M].contiguous(), B)
            if not _same_bits(torch, part, full[:M]):
                diff = int((part.view(torch.int16) != full[:M].view(torch.int16)).sum())
                bad.append(f"{name} M={M}: {diff} elements differ")
    assert not bad, f"N={N} K={K}: rows differ from {WG_REF}_{dtype} at M={REF_M}: {bad}"


@pytest.mark.parametrize("family", WG_SKINNY)
def test_wgmma_skinny_repeat_bitwise(env, family):
    torch = env[0]
    A, B = _rand(torch, (33, 2048), torch.bfloat16, 3), _rand(torch, (2048, 1032), torch.bfloat16, 4)
    first = run_wgmma(env, f"{family}_bf16", A, B).clone()
    for _ in range(3):
        assert _same_bits(torch, run_wgmma(env, f"{family}_bf16", A, B), first), f"{family}: a run differs"


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("family", [f for f in WG_SKINNY if "_m64" in f])
def test_wgmma_skinny_short_a_box_keeps_stale_rows_out_of_c(env, family, dtype):
    """The SHORT_A rungs read A at M < 64 through a box of M rounded up to 8 rows; the tile's other rows hold what
    shared memory held. Fill every SM's tiles with NaN rows first (a launch at M = 64 on an all-NaN A), then at
    M = 1, 5, 13, 41: C's M rows are bitwise those of the reference rung and the buffer's rows past M keep their
    poison bits (a stale row never reaches C, and nothing is stored past M)."""
    torch = env[0]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    name = f"{family}_{dtype}"
    assert _fn(env, name)[1].params_env.get("SHORT_A") == 1, f"{name}: not built with the short A box"
    N, K = 1032, 1000
    B = _rand(torch, (K, N), tdt, 41)
    nan_a = torch.full((64, K), float("nan"), dtype=tdt, device="cuda")
    A = _rand(torch, (64, K), tdt, 42)
    want = run_wgmma(env, f"{WG_REF}_{dtype}", A, B)
    for M in (1, 5, 13, 41):
        run_wgmma(env, name, nan_a, B)  # every CTA's ring: NaN rows left behind in shared memory
        C = torch.full((64, N), -7.0, dtype=tdt, device="cuda")
        run_wgmma(env, name, A[:M].contiguous(), B, C=C)
        assert _same_bits(torch, C[:M], want[:M]), f"{name} M={M}: rows differ from {WG_REF}_{dtype}"
        assert bool((C[M:] == -7.0).all()), f"{name} M={M}: a row past M was written"


# ---- exact f32 skinny rungs ----


@pytest.mark.parametrize("family", F32_SKINNY + F32_DECODE)
def test_f32_skinny_matches_float64(env, family):
    torch = env[0]
    for i, (M, N, K) in enumerate(SHAPES + [(5, 37, 29), (2, 1, 3)]):  # + N, K not multiples of 4: scalar copies
        A, B = _rand(torch, (M, K), torch.float32, 20 + i), _rand(torch, (K, N), torch.float32, 200 + i)
        bias = _rand(torch, (N,), torch.float32, 300 + i)
        C = run_f32(env, family, A, B, bias)
        a, b = A.double(), B.double()
        ref = a @ b + bias.double()
        _assert_close(torch, C, ref, a.abs() @ b.abs() + bias.double().abs(), 2.0**-23, f"{family} M={M} N={N} K={K}")


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("N,K", EQUIV_NK + [(264, 203)])
def test_f32_skinny_rows_equal_the_reference_rung(env, N, K, with_bias):
    """Every skinny f32 rung's rows at small M == gemm_bi_f32_f32_s2's rows at M = 1000, bit for bit."""
    torch = env[0]
    A, B = _rand(torch, (REF_M, K), torch.float32, 17), _rand(torch, (K, N), torch.float32, 18)
    bias = _rand(torch, (N,), torch.float32, 19) if with_bias else None
    full = run_f32(env, F32_REF, A, B, bias)
    assert torch.isfinite(full).all()
    bad = []
    for name in F32_SKINNY + F32_DECODE:
        for M in SKINNY_MS + (REF_M,):
            part = run_f32(env, name, A[:M].contiguous(), B, bias)
            if not _same_bits(torch, part, full[:M]):
                bad.append(f"{name} M={M}: {int((part.view(torch.int32) != full[:M].view(torch.int32)).sum())} differ")
    assert not bad, f"N={N} K={K} bias={with_bias}: rows differ from {F32_REF} at M={REF_M}: {bad}"


def test_f32_skinny_equals_the_host_chain(env):
    from mamba_forge.references import gemm as R

    torch = env[0]
    M, N, K = 3, 40, 45
    A, B = _rand(torch, (M, K), torch.float32, 31), _rand(torch, (K, N), torch.float32, 32)
    bias = _rand(torch, (N,), torch.float32, 33)
    a, b, c = A.cpu().numpy(), B.cpu().numpy(), bias.cpu().numpy()
    want = R.chain_f32(a, b, c)
    for name in F32_SKINNY + F32_DECODE:
        got = run_f32(env, name, A, B, bias).cpu().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{name}: not the chain"


# ---- exact f32 decode rungs (M <= 8) ----


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("N,K", DECODE_NK)
def test_f32_decode_equals_the_tile_rung_at_its_own_m(env, N, K, with_bias):
    """Every decode rung == gemm_bi_f32_f32_n128_s2 bit for bit at the same M, on fresh inputs per M (outputs
    poisoned with NaN first: an unwritten element fails), and close to float64."""
    torch = env[0]
    bad = []
    for i, M in enumerate(DECODE_MS):
        seed = 1000 * i + 7 * (N % 97) + (K % 89) + (500 if with_bias else 0)
        A, B = _rand(torch, (M, K), torch.float32, seed), _rand(torch, (K, N), torch.float32, seed + 1)
        bias = _rand(torch, (N,), torch.float32, seed + 2) if with_bias else None
        want = run_f32(env, F32_TILE, A, B, bias)
        assert torch.isfinite(want).all()
        a, b = A.double(), B.double()
        ref = a @ b + (bias.double() if with_bias else 0)
        absprod = a.abs() @ b.abs() + (bias.double().abs() if with_bias else 0)
        for name in F32_DECODE:
            got = run_f32(env, name, A, B, bias)
            _assert_close(torch, got, ref, absprod, 2.0**-23, f"{name} M={M} N={N} K={K} bias={with_bias}")
            if not _same_bits(torch, got, want):
                bad.append(f"{name} M={M}: {int((got.view(torch.int32) != want.view(torch.int32)).sum())} differ")
    assert not bad, f"N={N} K={K} bias={with_bias}: differ from {F32_TILE}: {bad}"


def test_f32_decode_keeps_a_negative_zero_chain_through_the_k_tail(env):
    """Every product underflows to -0, so every chain is -0; a step over a zero-filled slot past K would make it
    +0 (fma(+0, +0, -0) = +0). The decode rungs and the tile rung (whose padding steps are fma(-0, +0, acc))
    all keep -0."""
    torch = env[0]
    for M, N, K in [(1, 8192, 8192 + 3), (3, 263, 70), (8, 40, 1)]:
        A = torch.full((M, K), -1e-30, dtype=torch.float32, device="cuda")
        B = torch.full((K, N), 1e-30, dtype=torch.float32, device="cuda")
        for name in F32_DECODE + [F32_TILE]:
            C = run_f32(env, name, A, B)
            assert bool((C.view(torch.int32) == -(2**31)).all()), f"{name} M={M} N={N} K={K}: not all -0"
