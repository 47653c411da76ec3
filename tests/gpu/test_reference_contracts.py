"""GPU checks of the kernels that carry a reference-library name under that library's documented contract
(../shared/notes/reference-registry.rs; issue 16 item 5). Run on the H200.

Every test draws fresh random inputs (the seed is printed) and launches from the catalog spec
(mamba_forge.qualify.spec.evaluate: the grid, block and parameters the qualifier uses), with every buffer poisoned
and followed by a poisoned guard. Checked:
  * gradient norm: grad_sumsq_partial_f32, grad_region_sumsq_partial_f32 (stripe + vector) and
    grad_spans_sumsq_partial_f32 store exactly the fixed 512 f64 partials (all of them, whatever the poison:
    =-store; nothing past them), match float64, and give the same bits for any launched grid and for a misaligned
    arena (scalar loads) as for an aligned one (float4 loads);
  * grad_clip_coef_f32 is ONE ascending f64 chain: its norm and coefficient equal the host's sequential fold bit
    for bit, at 512 and 777 partials; negative control: partials where a tree fold gives another norm;
  * the region pipeline end to end: region partials -> coefficient -> grad_region_scale_dev_f32 scales exactly the
    stripe and the vector (bitwise g*coef), nothing else, and never touches elements past n;
  * ssm_reduce_d_BC_{T} / _tmajor_{T}: one fused launch writes both dB and dC [batch, L, d_state] f32 (=-store:
    identical under two poisons), within float64 tolerance; the t-major twin on transposed locals gives the same
    bits; the bf16/f16 variants equal the f32 variant on the promoted values bit for bit;
  * gemm_bi_f32_f32_s2 is a 64x64 tile (grid from the catalog) and, like gemm_bi_f32_f32_m128n64_s2, equals the
    exact FFMA chain (references.gemm.chain_f32) bit for bit at ragged M, N, K, writing C exactly.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import empty_device, from_device, kernels, to_device  # noqa: E402

from mamba_forge.catalog.model import default_catalog_path, load_catalog  # noqa: E402
from mamba_forge.qualify import fills  # noqa: E402
from mamba_forge.qualify import spec as S  # noqa: E402
from mamba_forge.references import gemm as R  # noqa: E402
from mamba_forge.references import optim as ro  # noqa: E402
from mamba_forge.references import scan as rs  # noqa: E402

pytestmark = pytest.mark.gpu

CAT = load_catalog(default_catalog_path())
GUARD = 64  # poisoned elements after every buffer
SCALAR_NP = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64}
HOST_DTYPE = {"f32": np.float32, "f64": np.float64, "bf16": np.uint16, "f16": np.float16, "i32": np.int32,
              "i64": np.int64, "u32": np.uint32}
SUMSQ = ("grad_sumsq_partial_f32", "grad_region_sumsq_partial_f32", "grad_spans_sumsq_partial_f32")
DTYPES = ("f32", "bf16", "f16")


def spec_of(name: str, dims: dict | None = None) -> S.LaunchSpec:
    sym = CAT.symbols[name]
    return S.evaluate(sym, CAT.module(sym.module).family(sym.family), dims)


def qual_dims(name: str) -> dict:
    sym = CAT.symbols[name]
    return dict(CAT.module(sym.module).family(sym.family).qualify.dims)


def make_inputs(spec: S.LaunchSpec, rng) -> dict[str, np.ndarray]:
    return {b.name: fills.make_input(b, "uniform", rng) for b in spec.buffers if b.needs_fill}


def run(name: str, dims: dict, host: dict, *, poison: int = 0xFF, offset: int = 0, grid=None,
        scalars: dict | None = None) -> dict[str, np.ndarray]:
    """Launch `name` at `dims`. Every buffer is poisoned (byte `poison`), starts `offset` elements into its
    allocation and is followed by GUARD poisoned elements; inputs are copied in. Returns each buffer's whole
    allocation (raw host dtype; bf16 as uint16) after the launch."""
    import cupy as cp

    spec = spec_of(name, dims)
    dev, args = {}, [None] * (len(spec.buffers) + len(spec.scalars))
    for b in spec.buffers:
        buf = cp.empty(offset + b.count + GUARD, dtype=HOST_DTYPE[b.dtype])
        buf.view(cp.uint8).fill(poison)
        if b.name in host:
            buf[offset:offset + b.count] = to_device(np.asarray(host[b.name]).ravel(), b.dtype)
        dev[b.name] = buf
        args[b.index] = buf[offset:]
    for s in spec.scalars:
        args[s.index] = SCALAR_NP[s.type]((scalars or {}).get(s.name, s.value))
    kernels().launch(name, grid=grid or spec.grid, block=spec.block, args=tuple(args), smem=spec.dynamic_smem)
    return {k: v.get() for k, v in dev.items()}


def body(raw: np.ndarray, spec: S.LaunchSpec, name: str, offset: int = 0) -> np.ndarray:
    b = next(x for x in spec.buffers if x.name == name)
    return raw[offset:offset + b.count]


def poisoned(raw: np.ndarray, poison: int) -> np.ndarray:
    """Per element: every byte still holds the poison."""
    return (raw.view(np.uint8).reshape(raw.size, -1) == poison).all(axis=1)


def assert_outputs_stored(out: dict, spec: S.LaunchSpec, poison: int, names=None):
    """=-store: every element of each output written, nothing after it."""
    for b in spec.outputs:
        if names is not None and b.name not in names:
            continue
        raw = out[b.name]
        assert not poisoned(raw[:b.count], poison).any(), \
            f"{spec.symbol}.{b.name}: {int(poisoned(raw[:b.count], poison).sum())} elements left unwritten"
        assert poisoned(raw[b.count:], poison).all(), f"{spec.symbol}.{b.name}: wrote past its {b.count} elements"


# ---- gradient norm: the fixed 512 partials ---------------------------------------------------------------


def _sumsq_reference(name: str, spec: S.LaunchSpec, host: dict) -> np.ndarray:
    args = {b.name: S.as_f64(host[b.name], b.dtype) for b in spec.buffers if b.name in host}
    args.update({s.name: s.value for s in spec.scalars})
    fn = {"grad_sumsq_partial_f32": ro.grad_sumsq_partial, "grad_region_sumsq_partial_f32": ro.grad_region_sumsq_partial,
          "grad_spans_sumsq_partial_f32": ro.grad_spans_sumsq_partial}[name]
    return fn(args, dict(spec.dims))["partials"]


@pytest.mark.parametrize("name", SUMSQ)
def test_partials_are_the_fixed_512_stored_whatever_the_poison(name, rng):
    spec = spec_of(name, qual_dims(name))
    assert [b.count for b in spec.outputs] == [512] and spec.grid[0] == 512 and spec.block[0] == 256
    host = make_inputs(spec, rng)
    first = None
    for poison in (0xFF, 0x3F):
        out = run(name, spec.dims, host, poison=poison)
        assert_outputs_stored(out, spec, poison)
        got = body(out["partials"], spec, "partials")
        if first is None:
            first = got.tobytes()
        assert got.tobytes() == first, f"{name}: the partials depend on the poison (read before written)"
    want = _sumsq_reference(name, spec, host)
    np.testing.assert_allclose(np.frombuffer(first, np.float64), want, rtol=1e-11, atol=1e-300)
    assert want.sum() > 0


@pytest.mark.parametrize("name", SUMSQ)
def test_partials_do_not_depend_on_the_grid_or_the_alignment(name, rng):
    dims = qual_dims(name)
    spec = spec_of(name, dims)
    host = make_inputs(spec, rng)
    base = body(run(name, dims, host)["partials"], spec, "partials").tobytes()
    for grid in ((1, 1, 1), (37, 1, 1), (4096, 1, 1)):
        got = body(run(name, dims, host, grid=grid)["partials"], spec, "partials").tobytes()
        assert got == base, f"{name}: grid {grid} gives other partials"
    # offset 1: every address shifts by one float, so float4 loads become scalar ones and back: same bits
    got = run(name, dims, host, offset=1)["partials"][1:1 + 512].tobytes()
    assert got == base, f"{name}: a misaligned arena gives other partials"


def _chain(parts: np.ndarray, max_norm: float, eps: float) -> tuple[np.float32, np.float32]:
    """The contract's fold on the host: one f64 chain in ascending order, then sqrt and the coefficient."""
    total = 0.0
    for v in parts.tolist():
        total += v
    nrm = math.sqrt(total) if total >= 0 else math.nan
    c = float(np.float32(max_norm)) / (nrm + float(np.float32(eps)))
    c = 1.0 if c > 1.0 else c
    return np.float32(c), np.float32(nrm)


def _clip(parts: np.ndarray, max_norm: float = 1.0, eps: float = 1e-6):
    dims = {"partials": parts.size}
    out = run("grad_clip_coef_f32", dims, {"partials": parts},
              scalars={"max_norm": max_norm, "eps": eps})
    spec = spec_of("grad_clip_coef_f32", dims)
    assert_outputs_stored(out, spec, 0xFF)
    return out["coef"][0], out["norm"][0]


@pytest.mark.parametrize("count", [512, 777])
def test_clip_coef_is_one_ascending_chain(count, rng):
    parts = np.exp(rng.uniform(np.log(1e-6), np.log(1e2), count))
    for max_norm in (0.5, 1e9):
        coef, norm = _clip(parts, max_norm)
        want_coef, want_norm = _chain(parts, max_norm, 1e-6)
        assert norm.tobytes() == want_norm.tobytes(), f"norm {norm!r} != chain {want_norm!r}"
        assert coef.tobytes() == want_coef.tobytes(), f"coef {coef!r} != chain {want_coef!r}"
    assert _clip(parts, 1e9)[0] == np.float32(1.0)


def test_clip_coef_negative_control_a_tree_fold_differs():
    """2^60, then 510 threes, then -2^60: the ascending chain absorbs every 3 into 2^60 and ends at 0; a pairwise
    or lane-strided tree (the fold this kernel had before) sums the threes first and ends at 1152."""
    parts = np.array([2.0**60] + [3.0] * 510 + [-(2.0**60)])
    assert float(np.sum(parts)) != 0.0  # numpy's pairwise sum: the fold the contract rules out
    coef, norm = _clip(parts)
    assert norm == np.float32(0.0) and coef == np.float32(1.0), f"norm {norm!r}: not the ascending chain"


# ---- the per-layer region: a strided column stripe plus a contiguous vector --------------------------------


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_region_pipeline_scales_exactly_the_stripe_and_the_vector(max_norm, rng):
    """Arena of n elements followed by NaN; the vector runs 10 elements past n (absent: never read, never
    written). partials -> coefficient -> scaled region, all from device memory."""
    import cupy as cp

    n = 2_000_003
    geo = {"stripe_off": 12_345, "stripe_rows": 257, "stripe_cols": 1_027, "stripe_ld": 4_099,
           "vec_off": n - 50_000, "vec_len": 50_010}
    addr = ro.region_addresses(n, *geo.values())
    assert addr.max() >= n and len(np.unique(addr[addr < n])) == int((addr < n).sum())  # disjoint stripe, vector
    g = rng.uniform(-1, 1, n).astype(np.float32)
    gd = cp.empty(n + GUARD, dtype=np.float32)
    gd[n:] = np.nan
    gd[:n] = cp.asarray(g)
    k = kernels()
    parts = empty_device(512, "f64")
    scal = (np.int64(geo["stripe_off"]), np.int32(geo["stripe_rows"]), np.int32(geo["stripe_cols"]),
            np.int64(geo["stripe_ld"]), np.int64(geo["vec_off"]), np.int64(geo["vec_len"]))
    k.launch("grad_region_sumsq_partial_f32", grid=(512,), block=(256,), args=(parts, gd, np.int64(n), *scal))
    coef, norm = empty_device(1, "f32"), empty_device(1, "f32")
    k.launch("grad_clip_coef_f32", grid=(1,), block=(256,),
             args=(coef, norm, parts, np.int32(512), np.float32(max_norm), np.float32(1e-6)))
    grid = spec_of("grad_region_scale_dev_f32", {"n": n, "stripe_off": geo["stripe_off"], "rows": geo["stripe_rows"],
                                                 "cols": geo["stripe_cols"], "ld": geo["stripe_ld"],
                                                 "vec_off": geo["vec_off"], "vec_len": geo["vec_len"]}).grid
    k.launch("grad_region_scale_dev_f32", grid=grid, block=(256,), args=(gd, np.int64(n), *scal, coef))

    inside = addr[addr < n]
    sel = g[inside].astype(np.float64)
    np.testing.assert_allclose(from_device(parts, "f64"), ro.sumsq_partials(ro.region_values(g, addr)), rtol=1e-11,
                               atol=1e-300)
    want_norm = float(np.linalg.norm(sel))
    assert abs(from_device(norm, "f32")[0] - want_norm) <= 1.2e-7 * want_norm
    c = np.float32(from_device(coef, "f32")[0])
    want = g.copy()
    want[inside] = want[inside] * c
    out = gd.get()
    assert out[:n].tobytes() == want.tobytes(), "the region was not scaled exactly (or something else was)"
    assert np.isnan(out[n:]).all(), "an element past n was written"
    if max_norm > 1e6:
        assert c == 1.0 and out[:n].tobytes() == g.tobytes()
    else:
        assert c < 1.0


def test_region_reads_nothing_past_n(rng):
    """Negative control for the bounds: NaN after the arena; a region reaching past n must still give finite
    partials equal to the region without those elements."""
    dims = qual_dims("grad_region_sumsq_partial_f32")
    n = dims["n"]
    dims.update(vec_off=n - 100, vec_len=1_000)  # 900 elements past n
    spec = spec_of("grad_region_sumsq_partial_f32", dims)
    host = make_inputs(spec, rng)
    out = run("grad_region_sumsq_partial_f32", dims, host, poison=0xFF)  # g's guard is NaN (0xFF bytes)
    got = body(out["partials"], spec, "partials").astype(np.float64)
    assert np.isfinite(got).all(), "a partial read past the arena (NaN guard)"
    np.testing.assert_allclose(got, _sumsq_reference("grad_region_sumsq_partial_f32", spec, host), rtol=1e-11,
                               atol=1e-300)


# ---- the fused dB + dC reduction -------------------------------------------------------------------------


DBC_DIMS = {"batch": 2, "L": 523, "d_inner": 24, "d_state": 35}  # L and d_state tails of the 32x32 tiles


def _locals(rng, t: str, dims: dict) -> dict[str, np.ndarray]:
    b, L, d, n = dims["batch"], dims["L"], dims["d_inner"], dims["d_state"]
    return {k: rng.uniform(-1, 1, (b, L, d, n)).astype(S.NP_DTYPES[t]) for k in ("dB_local", "dC_local")}


def _reduce(name: str, dims: dict, host: dict, poison: int = 0xFF) -> dict[str, bytes]:
    spec = spec_of(name, dims)
    out = run(name, dims, host, poison=poison)
    assert_outputs_stored(out, spec, poison)
    return {k: body(out[k], spec, k).tobytes() for k in ("dB", "dC")}


@pytest.mark.parametrize("t", DTYPES)
def test_fused_dbc_writes_both_outputs_and_the_tmajor_twin_gives_the_same_bits(t, rng):
    dims = dict(DBC_DIMS)
    loc = _locals(rng, t, dims)
    rows = _reduce(f"ssm_reduce_d_BC_{t}", dims, loc)
    again = _reduce(f"ssm_reduce_d_BC_{t}", dims, loc, poison=0x3F)
    assert rows == again, "the outputs depend on the poison: not an =-store"
    want = rs.ssm_reduce_d_BC({k: S.as_f64(v.ravel(), t) for k, v in loc.items()}, dims)
    for k in ("dB", "dC"):
        got = np.frombuffer(rows[k], np.float32).astype(np.float64)
        err = np.max(np.abs(got - want[k])) / np.max(np.abs(want[k]))
        assert err <= 2e-6, f"{k}: normwise error {err:.2e}"
    assert rows["dB"] != rows["dC"]
    tmaj = {k: np.ascontiguousarray(v.transpose(0, 3, 2, 1)) for k, v in loc.items()}  # [b][n][d][t]
    tm = _reduce(f"ssm_reduce_d_BC_tmajor_{t}", dims, tmaj)
    assert _reduce(f"ssm_reduce_d_BC_tmajor_{t}", dims, tmaj, poison=0x3F) == tm
    for k in ("dB", "dC"):
        assert tm[k] == rows[k], f"ssm_reduce_d_BC_tmajor_{t}.{k} differs from the [b][t][d][n] reduction"


@pytest.mark.parametrize("t", ["bf16", "f16"])
def test_fused_dbc_promotes_the_inputs(t, rng):
    """The 16-bit variants read T and sum in f32: the same bits as the f32 variant on the promoted values."""
    dims = dict(DBC_DIMS)
    loc = _locals(rng, t, dims)
    promoted = {k: S.as_f64(v.ravel(), t).astype(np.float32) for k, v in loc.items()}
    for tm in ("", "tmajor_"):
        src = loc if not tm else {k: np.ascontiguousarray(v.transpose(0, 3, 2, 1)) for k, v in loc.items()}
        pro = promoted if not tm else {k: np.ascontiguousarray(v.reshape(loc[k].shape).transpose(0, 3, 2, 1))
                                       for k, v in promoted.items()}
        assert _reduce(f"ssm_reduce_d_BC_{tm}{t}", dims, src) == _reduce(f"ssm_reduce_d_BC_{tm}f32", dims, pro)


# ---- gemm_bi_f32_f32_s2: the 64x64 two-stage tile ----------------------------------------------------------


def test_s2_is_the_64x64_tile():
    spec = spec_of("gemm_bi_f32_f32_s2", {"M": 1000, "N": 264, "K": 200})
    assert tuple(spec.grid[:2]) == (5, 16) and spec.block[0] == 256
    wide = spec_of("gemm_bi_f32_f32_m128n64_s2", {"M": 1000, "N": 264, "K": 200})
    assert tuple(wide.grid[:2]) == (5, 8)


@pytest.mark.parametrize("mnk", [(1, 264, 200), (63, 131, 77), (64, 64, 64), (65, 200, 33), (129, 67, 300),
                                 (1000, 264, 200)])
def test_s2_tiles_equal_the_chain_bitwise(mnk, rng):
    m, n, k = mnk
    a2 = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b2 = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    want = R.chain_f32(a2, b2, bias).reshape(-1)
    dims = {"M": m, "N": n, "K": k}
    for name in ("gemm_bi_f32_f32_s2", "gemm_bi_f32_f32_m128n64_s2", "gemm_bi_f32_f32"):
        spec = spec_of(name, dims)
        out = run(name, dims, {"A": a2, "B": b2, "bias": bias})
        assert_outputs_stored(out, spec, 0xFF)
        got = body(out["C"], spec, "C")
        assert got.view(np.uint32).tobytes() == want.astype(np.float32).view(np.uint32).tobytes(), \
            f"{name} M={m} N={n} K={k}: differs from the FFMA chain"
