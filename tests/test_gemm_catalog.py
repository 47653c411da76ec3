"""The portable GEMM / matvec families on CPU: the catalog declares every required symbol with one ABI and a
contract, the declared shared memory matches the kernel's own formula, every symbol compiles and is admitted
for sm_80 and sm_90a, and the references agree with literal loops (the exact f32 one bit for bit, including a
case where rounding the float64 sum twice would be wrong)."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import Catalog, default_catalog_path, load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.references import gemm as R

MINE = ("Fixed", "TriadScalar", "TriadSm80")

FIXED_GEMM = [
    "gemm_bi_bf16_bf16", "gemm_bi_bf16_f32", "gemm_bi_f16_f16", "gemm_bi_f16_f32",
    "gemm_bi_f32_f32", "gemm_bi_f32_f32_s2", "gemm_bi_f32_f32_m128n64_s2", "gemm_bi_f32_f32_n128_s2",
    "gemm_bi_nn_tf32_v1_m128n64_bk32_s2", "gemm_bi_nn_tf32_v1_m128n64_bk32_s3", "gemm_bi_nn_tf32_v1_m16n32_bk32_s4",
    "gemm_bi_nn_tf32_v1_m64n64_bk32_s2", "gemm_bi_nn_tf32_v1_m64n64_bk32_s3",
    "gemm_bi_nn_fixed_rna_wide_tf32_v1_m128n128_bk32_s3",
    *[f"gemm_bi_nn_{t}_{d}" for t in ("tc16", "tc64", "tc128") for d in ("bf16", "f16")],
    *[f"gemm_bi_nn_{t}_f32out_{d}" for t in ("tc16", "tc64", "tc128") for d in ("bf16", "f16")],
    *[f"gemm_bi_nn_{t}_{d}" for t in ("tcw64", "tcwn64") for d in ("bf16", "f16")],
    "matvec_bi_bf16_bf16", "matvec_bi_bf16_f32", "matvec_bi_f16_f16", "matvec_bi_f16_f32", "matvec_bi_f32_f32",
]
TRIAD_SCALAR = [f"triad_scalar_{lay}_f32" for lay in ("nn", "tn", "nt")]
TRIAD_SM80 = ["gemm_bi_nn_sm80_mma_tf32_v1_m128n128_bk32_s3"] + [
    f"triad_sm80_{lay}_{dt}" for lay in ("nn", "tn", "nt") for dt in ("tf32", "bf16", "f16")
]
REQUIRED = {"Fixed": FIXED_GEMM, "TriadScalar": TRIAD_SCALAR, "TriadSm80": TRIAD_SM80}
ABI = ["C", "A", "B", "bias", "M", "N", "K"]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(default_catalog_path())


def _mine(cat: Catalog):
    for m in cat.modules:
        if m.kind in MINE:
            for s in m.symbols:
                if s.name in REQUIRED[m.kind]:
                    yield m, s


def test_catalog_declares_every_required_symbol_in_its_module(catalog):
    for kind, names in REQUIRED.items():
        declared = {s.name for s in catalog.module(kind).symbols}
        missing = [n for n in names if n not in declared]
        assert not missing, f"{kind} lacks {missing}"
    assert catalog.module("TriadScalar").module.mandatory and catalog.module("TriadSm80").module.mandatory


def test_every_symbol_has_a_contract_the_common_abi_and_a_reference(catalog):
    for m, s in _mine(catalog):
        fam = m.family(s.family)
        assert fam.contract and "writes C" in fam.contract, s.name
        assert [p.name for p in fam.params] == ABI, s.name
        assert [p.type for p in fam.params] == ["ptr"] * 4 + ["i32"] * 3, s.name
        assert fam.params[0].role == "out" and all(p.role == "in" for p in fam.params[1:4]), s.name
        assert fam.qualify.reference and fam.qualify.reference.startswith("mamba_forge.references.gemm:"), s.name
        fn = getattr(R, fam.qualify.reference.split(":")[1])
        assert callable(fn)
        assert s.deterministic, s.name


def test_exact_families_claim_exactness_and_the_others_do_not(catalog):
    exact = {"gemm_bi_f32_f32", "gemm_bi_f32_f32_s2", "gemm_bi_f32_f32_m128n64_s2", "gemm_bi_f32_f32_n128_s2",
             *TRIAD_SCALAR}
    for m, s in _mine(catalog):
        fam = m.family(s.family)
        assert fam.qualify.exact == (s.name in exact), s.name
        if s.name in exact:
            assert fam.qualify.reference.endswith("_f32_chain"), s.name


def _tc_smem(env: dict, sizeof_t: int) -> int:
    """mf::tc::TileGemm::SMEM, written out again: the catalog's expression must agree with the kernel."""
    p = 8
    bm, bn, bk, s = env["BM"], env["BN"], env["BK"], env["S"]
    pipe = s * ((bm + p) * (bk + p) + (bk + p) * (bn + p)) * sizeof_t
    return max(pipe, bm * (bn + 4) * 4)


def test_declared_dynamic_smem_matches_the_tensor_core_kernel_formula(catalog):
    sizes = {"f32": 4, "bf16": 2, "f16": 2}
    checked = 0
    for _m, s in _mine(catalog):
        if "S" in s.params_env and "WM" in s.params_env:
            assert s.dynamic_smem == _tc_smem(s.params_env, sizes[s.params_env["T"]]), s.name
            assert s.threads == s.params_env["WM"] * s.params_env["WN"] * 32
            checked += 1
        else:
            assert s.dynamic_smem == 0, s.name  # exact and matvec kernels use static shared memory only
    assert checked >= 30


def test_the_smem_check_sees_a_wrong_stage_count():
    # negative case: a symbol declared with one stage fewer than its kernel would use is told apart
    env = {"BM": 128, "BN": 128, "BK": 32, "S": 3}
    assert _tc_smem(env, 4) == 130560 and _tc_smem({**env, "S": 2}, 4) == 87040


@pytest.fixture(scope="module")
def my_build(catalog, tmp_path_factory):
    env = os.environ.get("MAMBA_FORGE_CACHE")
    if env and env not in ("0", "off") and os.path.isabs(env):
        cache = Path(env)
    else:
        cache = tmp_path_factory.mktemp("cache") / "c"
        cache.mkdir(mode=0o700)
    mine = Catalog(path=catalog.path, name=catalog.name, modules=tuple(m for m in catalog.modules if m.kind in MINE))
    req = BuildRequest(mine, [get_target("sm_80"), get_target("sm_90a")], tmp_path_factory.mktemp("gemm-build"),
                       cache_location=cache)
    return build(req)


@pytest.mark.slow
def test_every_symbol_compiles_and_is_admitted_for_sm80_and_sm90a(my_build):
    verdicts = {(mod.kind, mod.target, s.name): s for mod in my_build.modules for s in mod.symbols}
    bad = []
    for kind, names in REQUIRED.items():
        for target in ("sm_80", "sm_90a"):
            for n in names:
                s = verdicts.get((kind, target, n))
                if s is None:
                    bad.append(f"{n} on {target}: not built")
                elif s.verdict.status != "admitted":
                    bad.append(s.verdict.reason)
                else:
                    r = s.resources
                    assert r.spill_stores == r.spill_loads == r.stack_frame == 0, n
                    assert r.param_layout == [[0, 8], [8, 8], [16, 8], [24, 8], [32, 4], [36, 4], [40, 4]], n
    assert not bad, "\n".join(bad)


# ---- references ------------------------------------------------------------------------------------------


def _triple_loop(a2, b2, bias):
    m, k = len(a2), len(a2[0])
    n = len(b2[0])
    out = [[0.0] * n for _ in range(m)]
    for i in range(m):
        for j in range(n):
            s = 0.0
            for kk in range(k):
                s += float(a2[i][kk]) * float(b2[kk][j])
            out[i][j] = s + (float(bias[j]) if bias is not None else 0.0)
    return np.array(out)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_float64_references_equal_a_literal_triple_loop(layout, with_bias):
    rng = np.random.default_rng(7)
    m, n, k = 5, 7, 9
    a2 = rng.uniform(-1, 1, (m, k))
    b2 = rng.uniform(-1, 1, (k, n))
    bias = rng.uniform(-1, 1, n) if with_bias else None
    flat_a = {"nn": a2, "tn": a2.T, "nt": a2}[layout].reshape(-1)
    flat_b = {"nn": b2, "tn": b2, "nt": b2.T}[layout].reshape(-1)
    args = {"A": flat_a, "B": flat_b, "M": m, "N": n, "K": k, "C": np.full(m * n, np.nan)}
    if with_bias:
        args["bias"] = bias
    got = getattr(R, f"gemm_{layout}")(args, {"M": m, "N": n, "K": k})["C"].reshape(m, n)
    np.testing.assert_allclose(got, _triple_loop(a2, b2, bias), rtol=1e-13, atol=1e-13)


def _fma_exact(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """Correct rounding of a*b + c to f32 by exact rational arithmetic (the oracle for fma_f32)."""
    q = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    x = np.float32(float(q))
    best = None
    for cand in (np.nextafter(x, np.float32(-np.inf)), x, np.nextafter(x, np.float32(np.inf))):
        if not np.isfinite(cand):
            continue
        d = abs(Fraction(float(cand)) - q)
        even = (int(np.array(cand).view(np.uint32)) & 1) == 0
        if best is None or d < best[0] or (d == best[0] and even):
            best = (d, cand)
    return best[1]


def _naive_fma(a, b, c):
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


def test_fma_f32_is_correctly_rounded_where_double_rounding_is_not():
    # a*b = 2^-24 - 2^-70, c = 1 + 2^-23: the float64 sum lands exactly on an f32 midpoint, so rounding it again
    # goes to even (1 + 2^-22) while the exact value lies below the midpoint (1 + 2^-23).
    a = np.float32(2.0**-12 * (1 + 2.0**-23))
    b = np.float32(2.0**-12 * (1 - 2.0**-23))
    c = np.float32(1 + 2.0**-23)
    assert _naive_fma(a, b, c) != _fma_exact(a, b, c)  # the trap is real
    assert R.fma_f32(a, b, c) == _fma_exact(a, b, c) == np.float32(1 + 2.0**-23)
    # and its mirror image above the midpoint
    assert R.fma_f32(-a, b, -c) == _fma_exact(-a, b, -c)


def test_fma_f32_matches_exact_rounding_on_random_and_cancelling_inputs():
    rng = np.random.default_rng(3)
    a = (rng.uniform(-2, 2, 400) * 2.0 ** rng.integers(-30, 30, 400)).astype(np.float32)
    b = (rng.uniform(-2, 2, 400) * 2.0 ** rng.integers(-30, 30, 400)).astype(np.float32)
    c = (rng.uniform(-2, 2, 400) * 2.0 ** rng.integers(-30, 30, 400)).astype(np.float32)
    c[:150] = -(a[:150].astype(np.float64) * b[:150]).astype(np.float32)  # heavy cancellation
    got = R.fma_f32(a, b, c)
    want = np.array([_fma_exact(x, y, z) for x, y, z in zip(a, b, c, strict=True)], dtype=np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_fma_f32_special_values():
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    assert np.isnan(R.fma_f32(inf, np.float32(0), np.float32(1)))
    assert R.fma_f32(inf, np.float32(2), np.float32(1)) == inf
    assert np.isnan(R.fma_f32(np.float32(1), np.float32(1), nan))
    assert R.fma_f32(np.float32(3e38), np.float32(10), np.float32(0)) == inf  # overflow
    # signed zero: (-0) * 0 + (-0) stays -0; -0 + +0 is +0
    z = R.fma_f32(np.float32(-0.0), np.float32(0.0), np.float32(-0.0))
    assert z == 0 and np.signbit(z)
    assert not np.signbit(R.fma_f32(np.float32(-0.0), np.float32(0.0), np.float32(0.0)))


@pytest.mark.parametrize("layout", ["nn", "tn", "nt"])
def test_exact_chain_reference_equals_a_literal_fma_loop(layout):
    rng = np.random.default_rng(11)
    m, n, k = 4, 5, 13
    a2 = (rng.uniform(-1, 1, (m, k)) * 2.0 ** rng.integers(-8, 8, (m, k))).astype(np.float32)
    b2 = (rng.uniform(-1, 1, (k, n)) * 2.0 ** rng.integers(-8, 8, (k, n))).astype(np.float32)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    want = np.zeros((m, n), dtype=np.float32)
    for i in range(m):
        for j in range(n):
            acc = np.float32(0.0)
            for kk in range(k):
                acc = _fma_exact(a2[i, kk], b2[kk, j], acc)
            want[i, j] = np.float32(acc + bias[j])
    flat_a = {"nn": a2, "tn": a2.T, "nt": a2}[layout].reshape(-1).astype(np.float64)
    flat_b = {"nn": b2, "tn": b2, "nt": b2.T}[layout].reshape(-1).astype(np.float64)
    args = {"A": flat_a, "B": flat_b, "bias": bias.astype(np.float64), "M": m, "N": n, "K": k}
    got = getattr(R, f"gemm_{layout}_f32_chain")(args, {"M": m, "N": n, "K": k})["C"].reshape(m, n)
    assert np.array_equal(got.astype(np.float32).view(np.uint32), want.view(np.uint32))
    # the float64 reference differs from the chain in the last bits somewhere: the chain is not a re-label of it
    f64 = getattr(R, f"gemm_{layout}")(args, {"M": m, "N": n, "K": k})["C"].reshape(m, n)
    np.testing.assert_allclose(got, f64, rtol=1e-5, atol=1e-5)


def test_reference_refuses_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        R._operands({"A": np.zeros(4), "B": np.zeros(4)}, {"M": 2, "N": 2, "K": 2}, "tt")


def test_the_qualifier_can_evaluate_every_family_and_run_its_reference(catalog):
    """The harness's own path on CPU: launch spec from the catalog, inputs per corpus, reference outputs."""
    from mamba_forge.qualify import checks as QC
    from mamba_forge.qualify import spec as QS

    rng = np.random.default_rng(1)
    seen = set()
    for m, s in _mine(catalog):
        fam = m.family(s.family)
        if fam.name in seen:
            continue
        seen.add(fam.name)
        spec = QS.evaluate(s, fam)  # at the catalog's qualification shape
        assert spec.dims == fam.qualify.dims
        spec = QS.evaluate(s, fam, {"M": 37, "N": 41, "K": 29})  # the same path at a CPU-sized shape
        dims = spec.dims
        gx, gy, _ = spec.grid
        e = s.params_env
        if "COLS" in e:  # matvec: x = row groups, y = column slabs
            assert gx * e["R"] >= dims["M"] > (gx - 1) * e["R"] and gy * e["COLS"] >= dims["N"], s.name
        else:  # GEMM: x = N tiles, y = M tiles, each exactly covering
            assert gx * e["BN"] >= dims["N"] > (gx - 1) * e["BN"], s.name
            assert gy * e["BM"] >= dims["M"] > (gy - 1) * e["BM"], s.name
        assert spec.exact == fam.qualify.exact
        for corpus in spec.corpora:
            inputs = QC.make_inputs(spec, corpus, rng, nonfinite=False)
            assert set(inputs) == {"A", "B", "bias"}, s.name
            ref = QC.reference_outputs(fam, spec, inputs)
            c = ref["C"]
            assert c.shape == (dims["M"] * dims["N"],) and np.isfinite(c).all(), (s.name, corpus)
    assert len(seen) >= 17
