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

from gpu_support import kernels, load_cubin  # noqa: E402
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
    torch = pytest.importorskip("torch")
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context is current from here on
    k = kernels(TARGET)
    catalog = load_catalog(default_catalog_path())
    where = {s.name: (m, s) for m, s in k.manifest.symbols() if m.target == TARGET}
    return torch, k, catalog, where


def _fn(env, name):
    torch, k, catalog, where = env
    if name not in where:
        pytest.fail(f"{name} is not in the {TARGET} build")
    mod, sym = where[name]
    assert sym.verdict.status == "admitted", f"{name}: {sym.verdict.reason}"
    cubin = next(a for a in mod.artifacts if a.code == "cubin")
    return load_cubin(k.out / cubin.path).function(name), catalog.symbols[name]


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
    items = [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr())]
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


def test_exact_f32_symbols_agree_bitwise(env):
    torch, _, catalog, _ = env
    names = [n for n in _check_symbols() if "f32_n64" in n or "_fma_v1_fixed_nobias" in n]
    assert len(names) >= 5
    M, N, K = 150, 131, 77  # everything ragged
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
    M, N, K = 150, 131, 77
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
