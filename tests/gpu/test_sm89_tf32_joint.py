"""GPU checks of the Ada TF32-joint named symbols (kernels/sm89/tf32.toml, mf/tile_tf32_joint.cuh) through the
TriadSm89Tf32Joint sm_90a check build, on fresh random inputs (the seed is printed):

* tn_pre_rna_transpose: At = tf32_rna(A)^T bit for bit against the host reference (references.gemm.tf32_rna),
  rounding to nearest (not truncation), writing exactly At;
* the TN pre-RNA GEMMs on At = transpose(A): float64 agreement with A^T B at the TF32 bound, and bit for bit the
  incumbent RNA tile (gemm_bi_nn_fixed_sm89_rna_tf32_v1) on A^T (same mma, same K order, same rounded values);
  on an unrounded A^T they differ from it (A really is taken as it is, not re-rounded);
* the NT A-ldmatrix GEMM: float64 agreement with A B^T, and bit for bit the incumbent on B^T (the ldmatrix
  fragments carry the same values as the scalar loads);
* the 3xTF32 add-half GEMMs (direct and baseline): float64 agreement at the split's bound (about f32 accuracy),
  which plain TF32 fails (negative case), and far more accurate than the incumbent;
* every GEMM: row i of C bit-identical for M in {1, 3, 17, 64, 1000} and M = 4096 (batch invariance), five
  runs bitwise equal, nothing written past C.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import admitted_function, torch_env  # noqa: E402
from gpu_support import launch as gpu_launch  # noqa: E402

from mamba_forge.references import gemm as R  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = "sm_90a"
GUARD = 256  # elements after the output that no launch may touch
INCUMBENT = "gemm_bi_nn_fixed_sm89_rna_tf32_v1_m128n96_bk32_s3"
TRANSPOSE = "tn_pre_rna_transpose_fixed_sm89_tf32_v1"
TN_PRE = ["gemm_bi_nn_fixed_sm89_tn_pre_rna_tf32_v1_m128n96_bk32_s3",
          "gemm_bi_nn_fixed_sm89_tn_pre_rna_tf32_v1_m64n64_bk32_s3",
          "gemm_bi_nn_fixed_sm89_tn_pre_rna_tf32_v1_m64n96_bk32_s2"]
ADD_HALF = ["gemm_bi_nn_fixed_sm89_add_half_direct_tf32_v1_m128n96_bk32_s3",
            "gemm_bi_nn_fixed_sm89_add_half_tf32_v1_m128n96_bk32_s3"]
NT_LDSM = "gemm_bi_nt_fixed_sm89_a_ldmatrix_tf32_v1_m128n96_bk32_s3"
GEMMS = TN_PRE + ADD_HALF + [NT_LDSM]
# (M, N, K): 16-byte paths with ragged tiles; K % 4 != 0 (A, and NT's B, element paths); everything odd; tiny
SHAPES = [(256, 384, 256), (263, 200, 100), (77, 131, 75), (1, 1, 1), (130, 9, 257), (1000, 96, 1032)]
IDS = ["x".join(map(str, s)) for s in SHAPES]


@pytest.fixture(scope="module")
def env():
    return torch_env(TARGET)


@pytest.fixture(scope="module")
def seed():
    s = int(np.random.SeedSequence().entropy % 2**31)
    print(f"seed {s}")
    return s


def _fn(env, name):
    return admitted_function(env, name)


def _out(torch, n):
    """n f32 elements of NaN followed by a NaN guard tail: unwritten elements show, and so do stray writes."""
    return torch.full((n + GUARD,), float("nan"), dtype=torch.float32, device="cuda")


def _checked(torch, buf, n, what):
    assert bool(torch.isnan(buf[n:]).all()), f"{what}: wrote past the output"
    out = buf[:n]
    assert bool(torch.isfinite(out).all()), f"{what}: unwritten or non-finite output"
    return out


def run_gemm(env, name, A, B, M, N, K):
    """C[M, N] of one symbol; A, B are contiguous f32 device tensors in the symbol's storage layout."""
    torch = env[0]
    fn, sym = _fn(env, name)
    buf = _out(torch, M * N)
    grid = math.ceil(M / sym.params_env["BM"]) * math.ceil(N / sym.params_env["BN"])
    args = [("ptr", buf.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()), ("i32", M), ("i32", N), ("i32", K)]
    gpu_launch(fn, (grid,), sym.block, args, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return _checked(torch, buf, M * N, f"{name} M={M} N={N} K={K}").view(M, N)


def run_transpose(env, A_km, M, K):
    """At[M, K] = tf32_rna(A)^T for A [K, M]."""
    torch = env[0]
    fn, sym = _fn(env, TRANSPOSE)
    buf = _out(torch, M * K)
    tile = sym.params_env["TILE"]
    grid = math.ceil(M / tile) * math.ceil(K / tile)
    args = [("ptr", buf.data_ptr()), ("ptr", A_km.data_ptr()), ("i32", M), ("i32", K)]
    gpu_launch(fn, (grid,), sym.block, args, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return _checked(torch, buf, M * K, f"transpose M={M} K={K}").view(M, K)


def _rand(torch, shape, seed, corpus="uniform"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(shape, generator=g, device="cuda", dtype=torch.float64) * 2 - 1
    if corpus == "logu":  # signs kept, magnitudes across six decades
        x = torch.sign(x) * 10.0 ** (-6 * torch.rand(shape, generator=g, device="cuda", dtype=torch.float64))
    return x.float().contiguous()


def _bitwise(torch, x, y):
    return torch.equal(x.contiguous().view(torch.int32), y.contiguous().view(torch.int32))


def _within(torch, C, ref, absprod, K, c_in, what):
    """|C - ref| <= 2^-23 |ref| + (c_in + max(K, 16) 2^-22) sum_k |a||b|: output rounding, input rounding (c_in per
    product) and the f32 accumulation of the mma chain (a worst-case linear bound)."""
    err = (C.double() - ref).abs()
    tol = 2.0**-23 * ref.abs() + (c_in + max(K, 16) * 2.0**-22) * absprod + 1e-30
    bad = err > tol
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} of {bad.numel()} elements outside the bound, worst "
                                 f"{float((err / tol).max()):.3g}x")


TF32_IN = 2.0**-10  # two operands rounded to nearest TF32 (2^-11 each)
SPLIT_IN = 2.0**-19  # 3xTF32: lo_A lo_B dropped (2^-22) and the lo halves' own rounding, with margin


def test_every_named_symbol_is_admitted(env):
    for name in [TRANSPOSE] + GEMMS + [INCUMBENT]:
        _fn(env, name)


@pytest.mark.parametrize("corpus", ["uniform", "logu"])
@pytest.mark.parametrize("M,K", [(263, 100), (1, 1), (33, 65), (4096, 768), (7, 1000)], ids=lambda v: str(v))
def test_transpose_rounds_to_nearest_bit_for_bit(env, seed, M, K, corpus):
    torch = env[0]
    A = _rand(torch, (K, M), seed + M + K, corpus)
    At = run_transpose(env, A, M, K)
    a_host = A.cpu().numpy()
    want = R.tf32_rna(a_host).T.astype(np.float32)
    got = At.cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
        f"{int((got != want).sum())} of {got.size} differ from tf32_rna(A)^T"
    if M * K >= 1024:  # negative control: truncation is a different answer, and the kernel is not it
        trunc = (a_host.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).T
        assert not np.array_equal(got, trunc)


@pytest.mark.parametrize("name", TN_PRE)
@pytest.mark.parametrize("M,N,K", SHAPES, ids=IDS)
def test_tn_pre_rna_pipeline(env, seed, name, M, N, K):
    torch = env[0]
    A = _rand(torch, (K, M), seed + 1)  # the TN operands: C = A^T B
    B = _rand(torch, (K, N), seed + 2)
    At = run_transpose(env, A, M, K).contiguous()
    C = run_gemm(env, name, At, B, M, N, K)
    ref = A.double().t() @ B.double()
    _within(torch, C, ref, A.double().abs().t() @ B.double().abs(), K, TF32_IN, f"{name} M={M} N={N} K={K}")
    raw_t = A.t().contiguous()  # unrounded A^T: the incumbent rounds it with cvt.rna, to At's values
    assert _bitwise(torch, C, run_gemm(env, INCUMBENT, raw_t, B, M, N, K)), f"{name} != the RNA tile on A^T"
    if M * K >= 4096:  # the pre-RNA GEMM takes A as it is: fed unrounded data it is not the RNA tile
        assert not _bitwise(torch, run_gemm(env, name, raw_t, B, M, N, K), C), f"{name} rounds A itself"


@pytest.mark.parametrize("M,N,K", SHAPES, ids=IDS)
def test_nt_a_ldmatrix(env, seed, M, N, K):
    torch = env[0]
    A = _rand(torch, (M, K), seed + 3)
    B = _rand(torch, (N, K), seed + 4)  # NT: C = A B^T
    C = run_gemm(env, NT_LDSM, A, B, M, N, K)
    ref = A.double() @ B.double().t()
    _within(torch, C, ref, A.double().abs() @ B.double().abs().t(), K, TF32_IN, f"nt M={M} N={N} K={K}")
    assert _bitwise(torch, C, run_gemm(env, INCUMBENT, A, B.t().contiguous(), M, N, K)), "nt != the RNA tile on B^T"


@pytest.mark.parametrize("name", ADD_HALF)
@pytest.mark.parametrize("M,N,K", SHAPES, ids=IDS)
def test_add_half_is_f32_accurate(env, seed, name, M, N, K):
    torch = env[0]
    for corpus in ("uniform", "logu"):
        A = _rand(torch, (M, K), seed + 5, corpus)
        B = _rand(torch, (K, N), seed + 6, corpus)
        C = run_gemm(env, name, A, B, M, N, K)
        ref = A.double() @ B.double()
        absprod = A.double().abs() @ B.double().abs()
        _within(torch, C, ref, absprod, K, SPLIT_IN, f"{name} {corpus} M={M} N={N} K={K}")
        if M * N * K >= 10**6:
            # far more accurate than plain TF32 (inputs 2^-11 off vs about 2^-22; the margin of 8 leaves room for
            # the mma's truncating internal adds, which the split does three times per k8 step)
            plain = run_gemm(env, INCUMBENT, A, B, M, N, K)
            e_split = float(((C.double() - ref).abs() / absprod.clamp_min(1e-30)).max())
            e_plain = float(((plain.double() - ref).abs() / absprod.clamp_min(1e-30)).max())
            assert e_split * 8 < e_plain, f"{name}: max relative error {e_split:.3g} vs plain TF32 {e_plain:.3g}"


def test_add_half_bound_rejects_plain_tf32(env, seed):
    """Negative case: the 3xTF32 bound fails the incumbent's plain TF32 result on the same operands."""
    torch = env[0]
    M, N, K = 256, 192, 64
    A = _rand(torch, (M, K), seed + 7)
    B = _rand(torch, (K, N), seed + 8)
    plain = run_gemm(env, INCUMBENT, A, B, M, N, K)
    ref = A.double() @ B.double()
    absprod = A.double().abs() @ B.double().abs()
    with pytest.raises(AssertionError, match="outside the bound"):
        _within(torch, plain, ref, absprod, K, SPLIT_IN, "plain TF32")
    _within(torch, plain, ref, absprod, K, TF32_IN, "plain TF32 at the TF32 bound")


def test_tf32_bound_rejects_a_wrong_layout(env, seed):
    """Negative case: the TF32 bound fails a product with the wrong operand (A B instead of A B^T)."""
    torch = env[0]
    M = N = K = 128
    A = _rand(torch, (M, K), seed + 9)
    B = _rand(torch, (N, K), seed + 10)
    wrong = run_gemm(env, INCUMBENT, A, B, M, N, K)  # treats B [N, K] as [K, N]
    ref = A.double() @ B.double().t()
    with pytest.raises(AssertionError, match="outside the bound"):
        _within(torch, wrong, ref, A.double().abs() @ B.double().abs().t(), K, TF32_IN, "wrong layout")


def _operands_for(torch, name, M, N, K, seed):
    """Storage-layout operands: A [M, K] (At for the TN pre-RNA GEMMs, pre-rounded), B [K, N] or [N, K] (NT)."""
    A = _rand(torch, (M, K), seed)
    if name in TN_PRE:
        A = torch.from_numpy(R.tf32_rna(A.cpu().numpy()).astype(np.float32)).cuda()
    B = _rand(torch, (N, K) if name == NT_LDSM else (K, N), seed + 1)
    return A, B


@pytest.mark.parametrize("name", GEMMS)
def test_batch_invariant(env, seed, name):
    torch = env[0]
    N, K = 200, 520
    A, B = _operands_for(torch, name, 4096, N, K, seed + 11)
    full = run_gemm(env, name, A, B, 4096, N, K)
    for M in (1, 3, 17, 64, 1000):
        part = run_gemm(env, name, A[:M].contiguous(), B, M, N, K)
        assert _bitwise(torch, part, full[:M]), f"{name}: rows of C differ between M={M} and M=4096"


@pytest.mark.parametrize("name", GEMMS + [TRANSPOSE])
def test_repeat_bitwise(env, seed, name):
    torch = env[0]
    M, N, K = 1031, 520, 777
    if name == TRANSPOSE:
        A = _rand(torch, (K, M), seed + 12)
        first = run_transpose(env, A, M, K).clone()
        again = [run_transpose(env, A, M, K) for _ in range(4)]
    else:
        A, B = _operands_for(torch, name, M, N, K, seed + 12)
        first = run_gemm(env, name, A, B, M, N, K).clone()
        again = [run_gemm(env, name, A, B, M, N, K) for _ in range(4)]
    for x in again:
        assert _bitwise(torch, x, first), f"{name}: a run differs"
