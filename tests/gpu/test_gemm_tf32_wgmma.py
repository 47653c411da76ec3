"""GPU checks of the TF32 wgmma GEMM rungs (kernels/sm90a/wgmma_tf32.cu, TriadSm90a, sm_90a build) on the H200:

* against a float64 product of the f32 inputs at the TF32 tolerance, aligned and ragged shapes (M, N, K not
  multiples of the tile, N odd, K below one k-tile);
* the rounding contract: inputs are truncated to TF32 by wgmma (low 13 mantissa bits ignored), pinned with
  inputs whose truncation and round-to-nearest differ (a single nonzero product per output is exact in f32);
* batch invariance: rows of C bit-identical for M in {1, 3, 17, 64, 256} against M = 1000 with the same A rows;
* five runs bitwise equal; C's neighbours untouched; the host refuses what the TMA path cannot describe.

Launched through mamba_forge.gpu (gpu_support.launch: PackedParams, tensor maps as 64-aligned bytes parameters);
memory and the float64 oracle are torch.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import admitted_function, torch_env  # noqa: E402
from gpu_support import launch as gpu_launch  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = "sm_90a"
RUNGS = ["gemm_bi_nt_sm90a_wgmma_tf32_m128n256_s4", "gemm_bi_nt_sm90a_wgmma_tf32_m128n128_s6"]
SM_COUNT = 132
TRUNC_MASK = -0x2000  # 0xFFFFE000 as int32: sign, exponent and the top 10 mantissa bits, the TF32 part of an f32


@pytest.fixture(scope="module")
def env():
    return torch_env(TARGET)


def _fn(env, name):
    return admitted_function(env, name)


def run_tf32(env, name, A, B, M, N, K, C=None):
    """Launch one TF32 wgmma rung on A [M, K], B [N, K] (f32); returns C [M, N] f32 (NaN-filled first)."""
    from mamba_forge.gpu import tma

    torch = env[0]
    fn, sym = _fn(env, name)
    if C is None:
        C = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    bm, bn = sym.params_env["BM"], sym.params_env["BN"]
    grid = min(math.ceil(M / bm) * math.ceil(N / bn), SM_COUNT)
    maps = tma.gemm_tensor_maps_tf32("nt", A.data_ptr(), B.data_ptr(), M, N, K)
    args = [maps["tmA"], maps["tmB"], ("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()),
            ("i32", M), ("i32", N), ("i32", K)]
    gpu_launch(fn, (grid,), sym.block, args, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C


def _operands(torch, M, N, K, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.rand((M, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((N, K), generator=g, device="cuda") * 2 - 1
    return A, B


def _truncated(torch, x):
    return (x.contiguous().view(torch.int32) & TRUNC_MASK).view(torch.float32)


def _assert_tf32_close(torch, C, A, B, what):
    # Each input truncated to TF32 is off by < 2^-10 relative, so each product by < 2^-9 (+ 2^-20): the sum by
    # < 2^-9 sum|a||b|; f32 accumulation adds at most ~2^-11 sum|a||b| at K = 4096. Holds for cvt.rna inputs too,
    # so the rounding mode is pinned separately (test_tf32_inputs_truncated).
    ref = A.double() @ B.double().t()
    absprod = A.double().abs() @ B.double().abs().t()
    err = (C.double() - ref).abs()
    tol = (2.0**-9 + 2.0**-11) * absprod + 1e-6
    assert torch.isfinite(C.double()).all(), f"{what}: non-finite output (unwritten elements are NaN)"
    bad = err > tol
    assert not bad.any(), f"{what}: {int(bad.sum())} elements off, worst {float((err - tol).max()):.3g} over tolerance"
    # and against the truncated inputs in float64: only the accumulation differs (tensor-core f32 sums)
    At, Bt = _truncated(torch, A), _truncated(torch, B)
    ref_t = At.double() @ Bt.double().t()
    abs_t = At.double().abs() @ Bt.double().abs().t()
    err_t = (C.double() - ref_t).abs()
    bad_t = err_t > 2.0**-11 * abs_t + 1e-6
    assert not bad_t.any(), f"{what}: {int(bad_t.sum())} elements off the truncated-input float64 product"


SHAPES = [(256, 512, 256), (1000, 391, 332), (1, 8, 8), (129, 264, 72), (520, 1024, 4096), (77, 135, 36),
          (300, 40, 4), (4096, 300, 1028)]


@pytest.mark.parametrize("name", RUNGS)
def test_tf32_matches_float64(env, name):
    torch = env[0]
    for M, N, K in SHAPES:
        A, B = _operands(torch, M, N, K)
        C = run_tf32(env, name, A, B, M, N, K)
        _assert_tf32_close(torch, C, A, B, f"{name} M={M} N={N} K={K}")


@pytest.mark.parametrize("name", RUNGS)
def test_tf32_inputs_truncated(env, name):
    """One nonzero product per output, exact in f32: C holds exactly tf32(a) * tf32(b). The low 13 bits of each
    input are 0x1801 (above half an ulp of TF32): truncation keeps the TF32 part, round-to-nearest would add one
    TF32 ulp. Both operands, both signs."""
    torch = env[0]
    M, N, K = 128, 256, 8
    j = torch.arange(M, device="cuda", dtype=torch.int64)
    x_bits = (0x3F800000 + (j % 1024) * 0x2000 + 0x1801).to(torch.int32)  # 1 + j/1024 + low bits
    x = x_bits.view(torch.float32) * torch.where(j % 2 == 0, 1.0, -1.0)
    n = torch.arange(N, device="cuda", dtype=torch.int64)
    y = (0x40000000 + (n % 1024) * 0x2000 + 0x1801).to(torch.int32).view(torch.float32)  # 2 + ...
    A = torch.zeros((M, K), device="cuda")
    B = torch.zeros((N, K), device="cuda")
    A[:, 3] = x  # the product sits in k slot 3 of the one k8 slice
    B[:, 3] = y
    C = run_tf32(env, name, A, B, M, N, K)
    tx, ty = _truncated(torch, x), _truncated(torch, y)
    want = tx[:, None].double() * ty[None, :].double()  # 11 x 11 significant bits: exact in f32
    assert torch.equal(C.double(), want), (
        f"{name}: C is not tf32_trunc(a) * tf32_trunc(b); the truncation contract (mf/wgmma_tf32.cuh) does not hold: "
        f"{int((C.double() != want).sum())} of {M * N} differ, e.g. got {float(C[0, 0])!r} want {float(want[0, 0])!r}")


@pytest.mark.parametrize("name", RUNGS)
def test_tf32_batch_invariant(env, name):
    torch = env[0]
    N, K = 1024, 520  # K not a multiple of 32: the zero-filled tail is in every run
    A, B = _operands(torch, 1000, N, K, seed=1)
    full = run_tf32(env, name, A, B, 1000, N, K)
    for M in (1, 3, 17, 64, 256):
        part = run_tf32(env, name, A[:M].contiguous(), B, M, N, K)
        assert torch.equal(part.view(torch.int32), full[:M].view(torch.int32)), (
            f"{name}: rows of C differ between M={M} and M=1000")


@pytest.mark.parametrize("name", RUNGS)
def test_tf32_repeat_bitwise(env, name):
    torch = env[0]
    M, N, K = 2048, 2048, 1032
    A, B = _operands(torch, M, N, K, seed=2)
    first = run_tf32(env, name, A, B, M, N, K).clone()
    for _ in range(4):
        again = run_tf32(env, name, A, B, M, N, K)
        assert torch.equal(again.view(torch.int32), first.view(torch.int32)), f"{name}: run differs"


def test_tf32_rungs_agree_bitwise(env):
    """The 128x128 force rung computes the same per-element sequence as the 128x256 route rung (only the
    instruction's N differs); recorded here, not claimed by the route (it is a force rung)."""
    torch = env[0]
    M, N, K = 1000, 392, 332
    A, B = _operands(torch, M, N, K, seed=7)
    outs = [run_tf32(env, n, A, B, M, N, K) for n in RUNGS]
    same = torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))
    if not same:
        pytest.xfail("m64n128k8 and m64n256k8 differ in bits: the 128x128 rung stays force-only")


@pytest.mark.parametrize("name", RUNGS)
def test_tf32_writes_only_c(env, name):
    """Neighbours of C stay untouched on a ragged shape with N odd (the scalar store path)."""
    torch = env[0]
    M, N, K = 77, 135, 36
    A, B = _operands(torch, M, N, K, seed=3)
    pad = 4096
    buf = torch.full((M * N + 2 * pad,), 7.0, dtype=torch.float32, device="cuda")
    C = buf[pad : pad + M * N].view(M, N)
    run_tf32(env, name, A, B, M, N, K, C=C)
    assert bool((buf[:pad] == 7.0).all()) and bool((buf[pad + M * N :] == 7.0).all()), "wrote outside C"
    _assert_tf32_close(torch, C, A, B, f"{name} neighbour")


def test_tf32_host_refuses(env):
    from mamba_forge.gpu import tma

    torch = env[0]
    A = torch.zeros((64, 64), device="cuda")
    with pytest.raises(tma.TmaError, match="NT only"):
        tma.gemm_tensor_maps_tf32("nn", A.data_ptr(), A.data_ptr(), 64, 64, 64)
    with pytest.raises(tma.TmaError, match="K = 6"):
        tma.gemm_tensor_maps_tf32("nt", A.data_ptr(), A.data_ptr(), 64, 64, 6)
    with pytest.raises(tma.TmaError, match="16-byte aligned"):
        tma.gemm_tensor_maps_tf32("nt", A.data_ptr() + 4, A.data_ptr(), 16, 16, 64)
    maps = tma.gemm_tensor_maps_tf32("nt", A.data_ptr(), A.data_ptr(), 64, 64, 64)  # the control is accepted
    assert sorted(maps) == ["tmA", "tmB"] and all(len(v) == tma.TMA_DESC_BYTES for v in maps.values())


# ---- exact f32 with B in a cp.async ring (kernels/fixed/gemm_f32_async.cu): the fma-chain class, bit for bit ----
EXACT_ASYNC = "gemm_bi_f32_f32_async_m128n128_bk16_s3"
CLASS_REFERENCE = "gemm_bi_f32_f32_n128_s2"  # the fma-chain route class's reference rung (kernels/routes.toml)
ORACLE = "gemm_bi_f32_f32"  # the qualification oracle (same chain)


def run_exact(env, name, A, B, M, N, K, bias=None):
    """Launch one Fixed exact-f32 NN symbol (C, A, B, bias, M, N, K; grid over N then M tiles)."""
    torch = env[0]
    fn, sym = _fn(env, name)
    e = sym.params_env
    C = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    args = [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()),
            ("ptr", 0 if bias is None else bias.data_ptr()), ("i32", M), ("i32", N), ("i32", K)]
    grid = (math.ceil(N / e["BN"]), math.ceil(M / e["BM"]))
    gpu_launch(fn, grid, sym.block, args, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C


# (M, N, K): aligned; ragged everywhere with N % 4 != 0 (4-byte cp.async path) and K % 16 != 0; K below one tile;
# the route class's check shape; a large one
EXACT_SHAPES = [(256, 256, 256), (150, 131, 77), (1, 8, 3), (301, 264, 200), (129, 1030, 1000), (1000, 392, 328),
                (2048, 2048, 1032)]


@pytest.mark.parametrize("with_bias", [False, True])
def test_exact_async_bitwise_equal_to_class_reference(env, with_bias):
    torch = env[0]
    for i, (M, N, K) in enumerate(EXACT_SHAPES):
        g = torch.Generator(device="cuda").manual_seed(10 + i)
        A = torch.rand((M, K), generator=g, device="cuda") * 2 - 1
        B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
        bias = (torch.rand((N,), generator=g, device="cuda") * 2 - 1) if with_bias else None
        got = run_exact(env, EXACT_ASYNC, A, B, M, N, K, bias)
        assert torch.isfinite(got).all(), f"M={M} N={N} K={K}: unwritten or non-finite output"
        for ref_name in (CLASS_REFERENCE, ORACLE):
            want = run_exact(env, ref_name, A, B, M, N, K, bias)
            diff = got.view(torch.int32) != want.view(torch.int32)
            assert not diff.any(), (f"{EXACT_ASYNC} differs from {ref_name} at M={M} N={N} K={K} bias={with_bias}: "
                                    f"{int(diff.sum())} elements")
        ref = A.double() @ B.double() + (bias.double()[None, :] if with_bias else 0.0)
        err = (got.double() - ref).abs().max()
        assert float(err) <= 1e-5 * float(K) ** 0.5 * 4 + 1e-6, f"M={M} N={N} K={K}: error {float(err):.3g}"


def test_exact_async_special_values_match_reference(env):
    """Inf, NaN, -0 and denormals in A and B: the same bits as the class reference (the chain propagates them the
    same way; the -0 / +0 padding past K leaves them unchanged)."""
    torch = env[0]
    M, N, K = 133, 140, 45
    g = torch.Generator(device="cuda").manual_seed(20)
    A = torch.rand((M, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
    A[0, 0], A[1, 5], A[2, 44], A[3, :] = float("inf"), float("nan"), -0.0, -0.0
    B[7, 3], B[44, 9], B[:, 11] = float("-inf"), 1e-40, 1e-42
    got = run_exact(env, EXACT_ASYNC, A, B, M, N, K)
    want = run_exact(env, CLASS_REFERENCE, A, B, M, N, K)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), "special values: bits differ"


def test_exact_async_batch_invariant_and_repeat(env):
    torch = env[0]
    N, K = 520, 333
    g = torch.Generator(device="cuda").manual_seed(21)
    A = torch.rand((1000, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
    full = run_exact(env, EXACT_ASYNC, A, B, 1000, N, K)
    for M in (1, 3, 17, 64, 256):
        part = run_exact(env, EXACT_ASYNC, A[:M].contiguous(), B, M, N, K)
        assert torch.equal(part.view(torch.int32), full[:M].view(torch.int32)), f"rows differ at M={M}"
    for _ in range(4):
        again = run_exact(env, EXACT_ASYNC, A, B, 1000, N, K)
        assert torch.equal(again.view(torch.int32), full.view(torch.int32)), "run differs"


def test_exact_async_negative_control(env):
    """The bitwise comparison above can fail: the TF32 rung's product of the same operands (NT, B transposed) is
    close to the chain's but not its bits."""
    torch = env[0]
    M, N, K = 256, 256, 256
    g = torch.Generator(device="cuda").manual_seed(22)
    A = torch.rand((M, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
    exact = run_exact(env, EXACT_ASYNC, A, B, M, N, K)
    tf32 = run_tf32(env, RUNGS[0], A, B.t().contiguous(), M, N, K)
    assert not torch.equal(exact.view(torch.int32), tf32.view(torch.int32))
    assert float((exact - tf32).abs().max()) < 0.1
