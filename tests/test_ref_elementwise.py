"""CPU checks for the activation, norm and elementwise families of the Fixed module.

* the catalog declares every symbol these families owe (names from the reference library's export list);
* every family's launch spec evaluates through the qualifier's own code and its reference returns exactly the
  outputs the spec declares, at the declared sizes (so the qualifier can launch and check each symbol);
* each float64 reference equals a literal step-by-step loop on tiny shapes, and each contract detail holds
  (softplus threshold 20, RMSNorm eps, gradients equal finite differences of the forwards).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mamba_forge.catalog import wrappers
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.qualify import fills
from mamba_forge.qualify import spec as S
from mamba_forge.references import activation as ra
from mamba_forge.references import elementwise as re_
from mamba_forge.references import norm as rn

# ---- the symbols these families owe -----------------------------------------------------------------------


def _with_dtypes(*names: str) -> list[str]:
    """ "(+dtypes)": the bare f32 name plus _f32/_bf16/_f16."""
    return [f"{n}{s}" for n in names for s in ("", "_f32", "_bf16", "_f16")]


def _typed(*names: str, dtypes=("f32", "bf16", "f16")) -> list[str]:
    return [f"{n}_{d}" for n in names for d in dtypes]


OWED = sorted(
    _with_dtypes("softplus_forward", "softplus_backward", "rmsnorm_backward", "bias_broadcast", "gather_cols",
                 "gather_bc_cols", "gather_bc_cols_tmajor", "gather_bc_cols_tmajor_tiled", "gather_last_timestep",
                 "gate_mul_silu", "gating_backward", "residual_add")
    + _typed("softplus_copy", "rmsnorm_forward_resadd_f32in", "gate_mul_silu_v", "elementwise_mul", "elementwise_mul_v",
             "vec_cast_zplus", "concat_halves", "scatter_add_cols", "reduce_bias", "pack_xdbl_cols")
    + _typed("rmsnorm_forward_f32in", "rmsnorm_backward_f32in", "residual_add_f32", dtypes=("bf16", "f16"))
    + ["rmsnorm_forward", "colsum_accumulate", "reduce_sum_axis0", "cast_bf16_to_f32", "cast_f16_to_f32",
       "cast_f32_to_bf16", "cast_f32_to_f16", "exp_negate", "exp_negate2", "vec_add_inplace"]
)
OUR_FILES = {"activation.toml", "norm.toml", "elementwise.toml"}


@pytest.fixture(scope="module")
def fixed():
    return load_catalog(default_catalog_path()).module("Fixed")


def missing(owed: list[str], declared: set[str]) -> list[str]:
    return [n for n in owed if n not in declared]


def test_catalog_declares_every_owed_symbol(fixed):
    declared = {s.name for s in fixed.symbols}
    assert missing(OWED, declared) == []
    assert missing(OWED + ["softplus_forward_f64"], declared) == ["softplus_forward_f64"]  # the check can fail
    assert len(OWED) == len(set(OWED)) == 94
    # every owed name is in the reference library's export list (no typo can hide a missing kernel)
    from pathlib import Path

    reference = set((Path(__file__).parent / "data" / "reference-fixed-symbols.txt").read_text().split())
    assert missing(OWED, reference) == []
    # the bare names are the f32 instantiation: their _f32 twins' entry point (catalog/wrappers.py) but for the name
    sym = {s.name: s for s in fixed.symbols}

    def entry(name: str) -> str | None:
        return wrappers.entry_point(fixed.family(sym[name].family), sym[name])

    for bare in ("softplus_forward", "rmsnorm_backward", "gate_mul_silu", "residual_add"):
        assert entry(bare) == entry(f"{bare}_f32").replace(f"{bare}_f32", bare)
        assert sym[bare].params_env == sym[f"{bare}_f32"].params_env == {"T": "f32"}
    assert sym["rmsnorm_forward"].params_env == sym["reduce_sum_axis0"].params_env == {"T": "f32"}
    assert sym["cast_f32_to_bf16"].params_env == {"S": "f32", "D": "bf16"}
    assert sym["exp_negate2"].macro_args == []


def our_families(fixed):
    from pathlib import Path

    names = set()
    for rel in fixed.module.families:
        if Path(rel).name in OUR_FILES:
            import tomllib

            names |= {f["name"] for f in tomllib.loads((fixed.root / rel).read_text())["family"]}
    return [f for f in fixed.families if f.name in names]


# Tiny dims per family (the qualification dims are realistic and too large for a 2-core CI machine).
TINY = {
    "n": {"n": 37},
    "rows_dim": {"rows": 5, "dim": 20},
    "rows_cols": {"rows": 6, "cols": 13},
    "gather": {"rows": 4, "ncols": 5, "ld": 11, "col0": 3},
    "bc": {"batch": 3, "seqlen": 7, "dt_rank": 4, "d_state": 5},
    "last": {"batch": 3, "seqlen": 4, "dim": 6},
    "transpose": {"batch": 2, "rows": 5, "cols": 3, "in_pad": 4, "out_pad": 2},
    "concat": {"rows": 4, "dim": 6},
    "pack": {"rows": 5, "dt_rank": 4, "d_state": 3},
}


def tiny_dims(fam) -> dict[str, int]:
    keys = set(fam.qualify.dims)
    for dims in TINY.values():
        if set(dims) == keys:
            return dims
    raise AssertionError(f"no tiny dims for {fam.name} (qualify dims {sorted(keys)})")


def test_every_family_spec_and_reference_agree(fixed):
    fams = our_families(fixed)
    assert {f.name for f in fams} >= {"softplus_forward", "rmsnorm_backward", "cast", "gather_bc_cols_tmajor_tiled"}
    rng = np.random.default_rng(7)
    for fam in fams:
        assert fam.contract and fam.qualify.reference and fam.deterministic is not False, fam.name
        for sym in (s for s in fixed.symbols if s.family == fam.name):
            S.evaluate(sym, fam)  # the realistic qualification shape evaluates too (sizes, grid limits)
            spec = S.evaluate(sym, fam, tiny_dims(fam))
            inputs = {b.name: fills.make_input(b, "uniform", rng) for b in spec.buffers if b.needs_fill}
            args = {b.name: S.as_f64(inputs[b.name], b.dtype) if b.name in inputs else np.full(b.count, np.nan)
                    for b in spec.buffers}
            args.update({s.name: s.value for s in spec.scalars})
            ref = S_load(fam.qualify.reference)(args, dict(spec.dims))
            outs = {b.name: b for b in spec.outputs}
            assert set(ref) == set(outs), (sym.name, sorted(ref), sorted(outs))
            for name, b in outs.items():
                arr = np.asarray(ref[name])
                assert arr.size == b.count and np.isfinite(arr).all(), (sym.name, name)
            if fam.qualify.batch_dim:  # the batch check needs every buffer to shrink as a leading slice
                small = S.evaluate(sym, fam, {**spec.dims, fam.qualify.batch_dim: 1})
                for full_b, small_b in zip(spec.buffers, small.buffers, strict=True):
                    S.batch_axis(full_b, small_b)


def S_load(path: str):
    import importlib

    mod, fn = path.split(":")
    return getattr(importlib.import_module(mod), fn)


# ---- activation -------------------------------------------------------------------------------------------


def loop_softplus(x: float) -> float:
    return x if x > 20.0 else math.log1p(math.exp(x))


def test_softplus_references_match_loops():
    x = np.array([-30.0, -3.5, -0.25, 0.0, 0.5, 7.0, 19.5, 20.0, 20.5, 33.0])
    dy = np.linspace(-1.0, 1.5, x.size)
    y = ra.softplus_forward({"x": x, "n": x.size}, {})["y"]
    dx = ra.softplus_backward({"x": x, "dy": dy, "n": x.size}, {})["dx"]
    cp = ra.softplus_copy({"x": x, "n": x.size}, {})
    for i, v in enumerate(x):
        assert y[i] == pytest.approx(loop_softplus(v), rel=1e-15, abs=0)
        sig = 1.0 / (1.0 + math.exp(-v))
        assert dx[i] == pytest.approx(dy[i] * (1.0 if v > 20.0 else sig), rel=1e-15)
    assert np.array_equal(cp["y"], y) and np.array_equal(cp["x_saved"], x)


def test_softplus_threshold_is_20():
    y = ra.softplus(np.array([20.0, 20.0001, 40.0, 100.0, 1000.0]))
    assert y[0] == math.log1p(math.exp(20.0)) and y[0] != 20.0  # at 20 itself: still the smooth branch
    assert list(y[1:]) == [20.0001, 40.0, 100.0, 1000.0]  # above: the identity, exactly (no overflow)
    g = ra.softplus_grad(np.array([20.0, 20.5, 800.0]))
    assert g[0] == pytest.approx(1.0 / (1.0 + math.exp(-20.0)), rel=1e-15) and g[0] < 1.0
    assert list(g[1:]) == [1.0, 1.0]


def test_softplus_backward_is_the_derivative():
    x = np.array([-6.0, -1.0, 0.3, 4.0, 15.0, 25.0])
    h = 1e-6
    fd = (ra.softplus(x + h) - ra.softplus(x - h)) / (2 * h)
    assert np.allclose(ra.softplus_grad(x), fd, rtol=1e-7, atol=1e-9)


# ---- norm -------------------------------------------------------------------------------------------------


def loop_rmsnorm(x, w, eps):
    rows, dim = len(x), len(w)
    y, rstd = [[0.0] * dim for _ in range(rows)], [0.0] * rows
    for r in range(rows):
        ss = 0.0
        for j in range(dim):
            ss += x[r][j] * x[r][j]
        rstd[r] = 1.0 / math.sqrt(ss / dim + eps)
        for j in range(dim):
            y[r][j] = x[r][j] * rstd[r] * w[j]
    return y, rstd


def test_rmsnorm_forward_matches_loop():
    rng = np.random.default_rng(1)
    rows, dim, eps = 3, 7, 1e-5
    x, w = rng.uniform(-2, 2, (rows, dim)), rng.uniform(0.5, 1.5, dim)
    out = rn.rmsnorm_forward({"x": x.ravel(), "w": w, "rows": rows, "dim": dim, "eps": eps}, {})
    y, rstd = loop_rmsnorm(x.tolist(), w.tolist(), eps)
    assert np.allclose(out["y"], np.ravel(y), rtol=1e-14, atol=0) and np.allclose(out["rstd"], rstd, rtol=1e-14)


def test_rmsnorm_eps_is_inside_the_square_root():
    dim = 8
    zero = {"x": np.zeros(2 * dim), "w": np.ones(dim), "rows": 2, "dim": dim, "eps": 1e-5}
    out = rn.rmsnorm_forward(zero, {})
    assert np.allclose(out["rstd"], 1.0 / math.sqrt(1e-5)) and not out["y"].any()  # a zero row stays finite
    x = np.full(dim, 1e-3)
    a = rn.rmsnorm_forward({**zero, "x": x, "rows": 1, "eps": 1e-6}, {})["rstd"][0]
    b = rn.rmsnorm_forward({**zero, "x": x, "rows": 1, "eps": 1e-2}, {})["rstd"][0]
    assert a == pytest.approx(1.0 / math.sqrt(1e-6 + 1e-6)) and b == pytest.approx(1.0 / math.sqrt(1e-6 + 1e-2))


def test_rmsnorm_resadd_adds_then_normalizes():
    rng = np.random.default_rng(2)
    rows, dim, eps = 2, 5, 1e-5
    res, x, w = rng.uniform(-2, 2, (rows, dim)), rng.uniform(-1, 1, (rows, dim)), rng.uniform(0.5, 1.5, dim)
    out = rn.rmsnorm_forward_resadd({"residual": res.ravel(), "x": x.ravel(), "w": w, "rows": rows, "dim": dim,
                                     "eps": eps}, {})
    h = [[res[r][j] + x[r][j] for j in range(dim)] for r in range(rows)]
    y, rstd = loop_rmsnorm(h, w.tolist(), eps)
    assert np.allclose(out["residual"], np.ravel(h), rtol=1e-15)
    assert np.allclose(out["y"], np.ravel(y), rtol=1e-14) and np.allclose(out["rstd"], rstd, rtol=1e-14)


def test_rmsnorm_backward_equals_finite_differences():
    rng = np.random.default_rng(3)
    rows, dim, eps = 3, 6, 1e-5
    x, w, dy = rng.uniform(-2, 2, (rows, dim)), rng.uniform(0.5, 1.5, dim), rng.uniform(-1, 1, (rows, dim))

    def loss(xx, ww):
        y, _ = rn.rmsnorm(xx, ww, eps)
        return float(np.sum(y * dy))

    _, rstd = rn.rmsnorm(x, w, eps)
    out = rn.rmsnorm_backward({"x": x.ravel(), "w": w, "dy": dy.ravel(), "rstd": rstd, "rows": rows, "dim": dim}, {})
    h = 1e-6
    fd_x = np.zeros_like(x)
    for r in range(rows):
        for j in range(dim):
            e = np.zeros_like(x)
            e[r, j] = h
            fd_x[r, j] = (loss(x + e, w) - loss(x - e, w)) / (2 * h)
    fd_w = np.array([(loss(x, w + h * np.eye(dim)[j]) - loss(x, w - h * np.eye(dim)[j])) / (2 * h) for j in range(dim)])
    assert np.allclose(out["dx"], fd_x.ravel(), rtol=1e-6, atol=1e-8)
    # the per-row weight contributions fold (reduce_sum_axis0) into the weight gradient
    dw = re_.reduce_sum_axis0({"in": out["dw_rows"], "rows": rows, "cols": dim}, {})["out"]
    assert np.allclose(dw, fd_w, rtol=1e-6, atol=1e-8)


# ---- elementwise ------------------------------------------------------------------------------------------


def sig(z):
    return 1.0 / (1.0 + math.exp(-z))


def test_gating_references_match_loops_and_finite_differences():
    y = np.array([-2.0, -0.5, 0.0, 1.0, 3.0])
    z = np.array([-8.0, -1.0, 0.5, 2.0, 9.0])
    g = np.array([0.5, -1.0, 2.0, 0.25, -0.75])
    out = re_.gate_mul_silu({"y": y, "z": z}, {})["out"]
    back = re_.gating_backward({"dout": g, "y": y, "z": z}, {})
    h = 1e-6
    for i in range(y.size):
        assert out[i] == pytest.approx(y[i] * z[i] * sig(z[i]), rel=1e-15)
        fd_y = ((y[i] + h) * z[i] * sig(z[i]) - (y[i] - h) * z[i] * sig(z[i])) / (2 * h)
        fd_z = (y[i] * (z[i] + h) * sig(z[i] + h) - y[i] * (z[i] - h) * sig(z[i] - h)) / (2 * h)
        assert back["dy"][i] == pytest.approx(g[i] * fd_y, rel=1e-7, abs=1e-10)
        assert back["dz"][i] == pytest.approx(g[i] * fd_z, rel=1e-6, abs=1e-9)


def test_pointwise_references_match_loops():
    a = np.array([1.5, -2.0, 0.0, 3.25, -0.125])
    b = np.array([-0.5, 4.0, 7.0, 0.5, 8.0])
    assert list(re_.elementwise_mul({"a": a, "b": b}, {})["c"]) == [a[i] * b[i] for i in range(5)]
    assert list(re_.residual_add({"residual": a, "x": b}, {})["residual"]) == [a[i] + b[i] for i in range(5)]
    assert list(re_.vec_add_inplace({"a": a, "b": b}, {})["a"]) == [a[i] + b[i] for i in range(5)]
    assert list(re_.vec_cast_zplus({"x": a, "z": b}, {})["out"]) == [a[i] + b[i] for i in range(5)]
    assert list(re_.cast({"in": a}, {})["out"]) == list(a)
    A = re_.exp_negate({"A_log": b}, {})["A"]
    assert list(A) == [-math.exp(v) for v in b]
    two = re_.exp_negate2({"A_log": b}, {})
    assert list(two["A"]) == list(A) and two["A_log2e"] == pytest.approx([v * math.log2(math.e) for v in A], rel=1e-15)


def test_bias_and_column_sums_match_loops():
    rows, cols = 4, 3
    x = np.arange(rows * cols, dtype=np.float64) * 0.5 - 2.0
    bias = np.array([0.25, -1.0, 3.0])
    y = re_.bias_broadcast({"y": x, "bias": bias, "rows": rows, "cols": cols}, {})["y"]
    assert list(y) == [x[r * cols + c] + bias[c] for r in range(rows) for c in range(cols)]
    sums = [sum(x[r * cols + c] for r in range(rows)) for c in range(cols)]
    assert list(re_.reduce_sum_axis0({"in": x, "rows": rows, "cols": cols}, {})["out"]) == sums
    assert list(re_.reduce_bias({"dy": x, "rows": rows, "cols": cols}, {})["db"]) == sums
    acc = re_.colsum_accumulate({"out": bias, "in": x, "rows": rows, "cols": cols}, {})["out"]
    assert list(acc) == [bias[c] + sums[c] for c in range(cols)]


def test_gather_scatter_concat_pack_match_loops():
    rows, ncols, ld, col0 = 3, 2, 6, 3
    src = np.arange(rows * ld, dtype=np.float64)
    out = re_.gather_cols({"in": src, "rows": rows, "ncols": ncols, "ld": ld, "col0": col0}, {})["out"]
    assert list(out) == [src[r * ld + col0 + j] for r in range(rows) for j in range(ncols)]
    add = np.arange(rows * ncols, dtype=np.float64) * 10
    dst = re_.scatter_add_cols({"dst": src, "src": add, "rows": rows, "ncols": ncols, "ld": ld, "col0": col0}, {})["dst"]
    want = src.copy()
    for r in range(rows):
        for j in range(ncols):
            want[r * ld + col0 + j] += add[r * ncols + j]
    assert list(dst) == list(want) and dst[0] == src[0] and dst[col0 - 1] == src[col0 - 1]

    a, b = np.arange(6.0), -np.arange(6.0) - 1
    cat = re_.concat_halves({"a": a, "b": b, "rows": 2, "dim": 3}, {})["out"]
    assert list(cat) == [0.0, 1.0, 2.0, -1.0, -2.0, -3.0, 3.0, 4.0, 5.0, -4.0, -5.0, -6.0]

    r_, R, N = 2, 2, 3
    dt, B, C = np.arange(r_ * R) + 100.0, np.arange(r_ * N) + 200.0, np.arange(r_ * N) + 300.0
    xd = re_.pack_xdbl_cols({"dt": dt, "B": B, "C": C, "rows": r_, "dt_rank": R, "d_state": N}, {})["x_dbl"]
    assert list(xd) == [100, 101, 200, 201, 202, 300, 301, 302, 102, 103, 203, 204, 205, 303, 304, 305]


def test_bc_gathers_and_last_timestep_match_loops():
    batch, seqlen, R, N = 2, 3, 2, 3
    ld = R + 2 * N
    x = np.arange(batch * seqlen * ld, dtype=np.float64)
    args = {"x_dbl": x, "batch": batch, "seqlen": seqlen, "dt_rank": R, "d_state": N}
    rowmajor, tmajor = re_.gather_bc_cols(args, {}), re_.gather_bc_cols_tmajor(args, {})
    for b in range(batch):
        for t in range(seqlen):
            for s in range(N):
                row = b * seqlen + t
                assert rowmajor["B"][row * N + s] == x[row * ld + R + s]
                assert rowmajor["C"][row * N + s] == x[row * ld + R + N + s]
                assert tmajor["B"][(b * N + s) * seqlen + t] == x[row * ld + R + s]
                assert tmajor["C"][(b * N + s) * seqlen + t] == x[row * ld + R + N + s]
    dim = 4
    seq = np.arange(batch * seqlen * dim, dtype=np.float64)
    last = re_.gather_last_timestep({"in": seq, "batch": batch, "seqlen": seqlen, "dim": dim}, {})["out"]
    assert list(last) == [seq[(b * seqlen + seqlen - 1) * dim + d] for b in range(batch) for d in range(dim)]


def test_transpose_rows_reference_matches_loops():
    """out[b, c, r] = src[b, r, c] with padded rows both sides; the padding of out keeps what it held, and a src or
    out longer than the launch touches is read and returned only up to the touched count."""
    batch, rows, cols, ld_in, ld_out = 2, 3, 4, 6, 5
    n_in, n_out = (batch * rows - 1) * ld_in + cols, (batch * cols - 1) * ld_out + rows
    src = np.arange(n_in + 9, dtype=np.float64)  # 9 elements past the last touched one
    out0 = -np.arange(n_out + 4, dtype=np.float64) - 1
    args = {"src": src, "out": out0, "batch": batch, "rows": rows, "cols": cols, "ld_in": ld_in, "ld_out": ld_out}
    got = re_.transpose_rows(args, {})["out"]
    assert got.size == n_out
    written = set()
    for b in range(batch):
        for r in range(rows):
            for c in range(cols):
                i = (b * cols + c) * ld_out + r
                assert got[i] == src[(b * rows + r) * ld_in + c]
                written.add(i)
    assert all(got[i] == out0[i] for i in range(n_out) if i not in written)  # the padding kept
    assert len(written) == batch * rows * cols
