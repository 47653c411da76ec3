"""GPU checks of the registry's named Ada Triad symbols through their sm_90a check builds (the H200 runs the
Ada arithmetic; Ada speed is not measured here):

* exact f32 (TriadSm89ExactF32: d768 fused in-projection, d768 raw out-projection, prism raw;
  TriadSm89ExactF32D128: d128 in, d128 out): bit for bit the FFMA chain oracle
  (mamba_forge.references.gemm.chain_f32, then + bias[n]) at their model widths and on a ragged off-width
  shape, within float64's error bound, bitwise equal to the module's copy-plan symbol (plus the same f32 bias add);
* the TF32 finalist (TriadSm89Finalist): within the f32-accumulation bound of a float64 product of the
  cvt.rna-rounded inputs, rounding ties away from zero (1 + 2^-11 -> 1 + 2^-10) and dropping bits below TF32
  (1 + 2^-12 -> 1), bitwise equal to the Ada RNA TF32 tile (same k8 order);
* every symbol: five runs bitwise equal, rows of C bit-identical when 1000 rows are launched (batch
  invariance), and nothing written outside C.
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

from mamba_forge.references.gemm import chain_f32  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = "sm_90a"
D768_IN = "gemm_bi_nn_fixed_sm89_f32_d768_in_fused_v1"
D768_OUT = "gemm_bi_nn_fixed_sm89_f32_d768_out_raw_v1"
PRISM = "gemm_bi_nn_fixed_sm89_f32_prism_raw_v1"
D128_IN = "gemm_bi_nn_fixed_sm89_f32_d128_in_v1"
D128_OUT = "gemm_bi_nn_fixed_sm89_f32_d128_out_v1"
FINALIST = "gemm_bi_nn_fixed_sm89_tf32_finalist_v1_m128n128_bk32_s2"
COPYPLAN = "gemm_bi_nn_fixed_sm89_f32_n64_copyplan_v1"  # the exact-f32 module's existing symbol: same chain
ADA_RNA = "gemm_bi_nn_fixed_sm89_rna_tf32_v1_m128n96_bk32_s3"  # the Ada TF32 tile: same k8 order
EXACT = [D768_IN, D768_OUT, PRISM, D128_IN, D128_OUT]
NAMED = EXACT + [FINALIST]
# (M, N, K) at each symbol's model width, ragged elsewhere (M never a tile multiple)
AT_WIDTH = {D768_IN: (77, 392, 768), D768_OUT: (77, 768, 200), PRISM: (150, 131, 77), D128_IN: (150, 200, 128),
            D128_OUT: (150, 128, 100), FINALIST: (263, 200, 100)}
OFF_WIDTH = (150, 131, 77)  # every symbol is correct at any shape; routes only serve the widths


@pytest.fixture(scope="module")
def env():
    return torch_env(TARGET)


def _fn(env, name):
    return admitted_function(env, name, role="check")


def has_bias(env, name) -> bool:
    sym = env[2].symbols[name]
    fam = env[2].module(sym.module).family(sym.family)
    return any(p.name == "bias" for p in fam.params)


def run(env, name, A, B, M, N, K, bias=None, C=None):
    """Launch one symbol (C, A, B, [bias], M, N, K; grid ceil(M/BM) * ceil(N/BN)); returns C [M, N] f32."""
    torch = env[0]
    fn, sym = _fn(env, name)
    if C is None:
        C = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    items = [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr())]
    if has_bias(env, name):
        assert bias is not None, f"{name} takes a bias"
        items.append(("ptr", bias.data_ptr()))
    items += [("i32", M), ("i32", N), ("i32", K)]
    grid = math.ceil(M / sym.params_env["BM"]) * math.ceil(N / sym.params_env["BN"])
    gpu_launch(fn, (grid,), sym.block, items, smem=sym.dynamic_smem, stream=torch.cuda.current_stream(), sync=False)
    torch.cuda.synchronize()
    return C


def operands(torch, M, N, K, seed, rows=None):
    """A [rows or M, K], B [K, N], bias [N]: fresh uniform(-1, 1) f32 on the device."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.rand((rows or M, K), generator=g, device="cuda") * 2 - 1
    B = torch.rand((K, N), generator=g, device="cuda") * 2 - 1
    bias = torch.rand((N,), generator=g, device="cuda") * 2 - 1
    return A, B, bias


def tf32_rna(torch, x):
    """cvt.rna.tf32.f32 on finite f32: round the magnitude to 10 mantissa bits, ties away from zero."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def bits_equal(torch, x, y) -> bool:
    return torch.equal(x.contiguous().view(torch.int32), y.contiguous().view(torch.int32))


# ---- exact f32 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["width", "off"])
@pytest.mark.parametrize("name", EXACT)
def test_exact_named_equal_the_chain_bit_for_bit(env, name, shape):
    torch = env[0]
    M, N, K = AT_WIDTH[name] if shape == "width" else OFF_WIDTH
    A, B, bias = operands(torch, M, N, K, seed=11)
    C = run(env, name, A, B, M, N, K, bias)
    b = bias.cpu().numpy() if has_bias(env, name) else None
    want = torch.from_numpy(chain_f32(A.cpu().numpy(), B.cpu().numpy(), b)).cuda()
    diff = int((C.view(torch.int32) != want.view(torch.int32)).sum())
    assert diff == 0, f"{name} at {M}x{N}x{K}: {diff} elements differ from the FFMA chain"
    # and the chain is within float64's bound (guards the oracle itself: K roundings of at most 2^-24 each)
    ref = A.double() @ B.double() + (bias.double()[None, :] if b is not None else 0)
    absprod = A.double().abs() @ B.double().abs() + (bias.double().abs()[None, :] if b is not None else 0)
    assert bool(((C.double() - ref).abs() <= 1.01 * (K + 2) * 2.0**-24 * absprod + 1e-30).all()), name


@pytest.mark.parametrize("name", EXACT)
def test_exact_named_equal_the_copyplan_symbol(env, name):
    """Same chain, another tile: the module's existing copy-plan symbol gives the same bits (+ the same bias add)."""
    torch = env[0]
    M, N, K = AT_WIDTH[name]
    A, B, bias = operands(torch, M, N, K, seed=12)
    want = run(env, COPYPLAN, A, B, M, N, K)
    if has_bias(env, name):
        want = want + bias[None, :]
    assert bits_equal(torch, run(env, name, A, B, M, N, K, bias), want), f"{name} differs from {COPYPLAN}"


def test_the_chain_oracle_sees_a_wrong_order(env):
    """Negative case: summing the same products in another order changes bits, so the bitwise checks above can
    fail (reversing k on these inputs must differ somewhere)."""
    torch = env[0]
    M, N, K = 64, 64, 768
    A, B, _ = operands(torch, M, N, K, seed=13)
    a, b = A.cpu().numpy(), B.cpu().numpy()
    forward = chain_f32(a, b)
    backward = chain_f32(a[:, ::-1].copy(), b[::-1, :].copy())
    assert (forward.view(np.int32) != backward.view(np.int32)).any()


# ---- the TF32 finalist ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("N", [200, 131])  # even N: paired 8-byte stores; odd N: the scalar epilogue
def test_finalist_within_the_tf32_bound(env, N):
    torch = env[0]
    M, K = 263, 100
    A, B, _ = operands(torch, M, N, K, seed=21)
    C = run(env, FINALIST, A, B, M, N, K)
    assert bool(torch.isfinite(C).all()), "unwritten or non-finite output"
    Ar, Br = tf32_rna(torch, A).double(), tf32_rna(torch, B).double()
    ref, absprod = Ar @ Br, Ar.abs() @ Br.abs()  # TF32 x TF32 products are exact in f32: only the sums round
    err = (C.double() - ref).abs()
    tol = (K + 8) * 2.0**-23 * absprod + 1e-30
    assert not (err > tol).any(), f"{int((err > tol).sum())} elements beyond the f32-accumulation bound"
    # against the unrounded float64 product: TF32's input rounding (2^-11 relative per operand)
    raw = A.double() @ B.double()
    assert bool(((C.double() - raw).abs() <= 2.0**-9 * (A.double().abs() @ B.double().abs()) + 1e-6).all())


def test_finalist_rounds_inputs_to_tf32_ties_away(env):
    """A = 1 + 2^-11 (a TF32 tie: rna gives 1 + 2^-10, round-to-even would give 1), A = 1 + 2^-12 (below TF32:
    gives 1); B = 1. C = K * rounded(A) exactly, so an exact-f32 or a round-to-even kernel fails here."""
    torch = env[0]
    M, N, K = 130, 136, 64
    A = torch.full((M, K), 1.0 + 2.0**-11, device="cuda")
    A[M // 2 :] = 1.0 + 2.0**-12
    B = torch.ones((K, N), device="cuda")
    C = run(env, FINALIST, A, B, M, N, K)
    assert bool((C[: M // 2] == K * (1.0 + 2.0**-10)).all()), "ties not rounded away from zero"
    assert bool((C[M // 2 :] == float(K)).all()), "bits below TF32 not dropped"


def test_finalist_equals_the_ada_rna_tile(env):
    torch = env[0]
    if ADA_RNA not in env[3]:
        pytest.skip(f"{ADA_RNA} is not in this build")
    M, N, K = 263, 200, 100
    A, B, _ = operands(torch, M, N, K, seed=22)
    assert bits_equal(torch, run(env, FINALIST, A, B, M, N, K), run(env, ADA_RNA, A, B, M, N, K))


# ---- every named symbol: repeats, batch invariance, bounds -----------------------------------------------------
@pytest.mark.parametrize("name", NAMED)
def test_named_repeat_bitwise(env, name):
    torch = env[0]
    M, N, K = AT_WIDTH[name]
    A, B, bias = operands(torch, M, N, K, seed=31)
    first = run(env, name, A, B, M, N, K, bias).clone()
    for _ in range(4):
        assert bits_equal(torch, run(env, name, A, B, M, N, K, bias), first), f"{name}: a run differs"


@pytest.mark.parametrize("name", NAMED)
def test_named_batch_invariant(env, name):
    """Row i of C is the same bits whether M rows or 1000 rows are launched (and for M = 1, 3, 17)."""
    torch = env[0]
    _, N, K = AT_WIDTH[name]
    A, B, bias = operands(torch, 1000, N, K, seed=32)
    full = run(env, name, A, B, 1000, N, K, bias)
    for M in (1, 3, 17, 150):
        part = run(env, name, A[:M].contiguous(), B, M, N, K, bias)
        assert bits_equal(torch, part, full[:M]), f"{name}: rows differ at M = {M}"


@pytest.mark.parametrize("name", NAMED)
def test_named_write_only_c(env, name):
    torch = env[0]
    M, N, K = OFF_WIDTH
    A, B, bias = operands(torch, M, N, K, seed=33)
    pad = 4096
    buf = torch.full((M * N + 2 * pad,), 7.0, device="cuda")
    C = buf[pad : pad + M * N].view(M, N)
    run(env, name, A, B, M, N, K, bias, C=C)
    assert bool((buf[:pad] == 7.0).all()) and bool((buf[pad + M * N :] == 7.0).all()), f"{name}: wrote outside C"
    assert bool(torch.isfinite(C).all()), f"{name}: left part of C unwritten"
