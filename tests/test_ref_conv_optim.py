"""CPU tests of the conv1d and training-step references (mamba_forge/references/{conv1d,optim}.py) against
literal loops on tiny shapes, and of the catalog declarations of both families (kernels/fixed/{conv1d,optim}.toml)."""

from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pytest

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.core import expr
from mamba_forge.core.vocab import DTYPES
from mamba_forge.references import conv1d as rc
from mamba_forge.references import optim as ro

CONV_SYMBOLS = [
    f"{fam}_{dt}"
    for fam in ("conv1d_burnin_forward_tiled", "conv1d_burnin_forward_nosave_tiled", "conv1d_bwd_tiled",
                "conv1d_burnin_backward", "conv1d_step_forward_silu")
    for dt in ("f32", "bf16", "f16")
]
OPTIM_SYMBOLS = [
    "check_inf_nan_f32", "scale_grads_f32", "scale_grads_dev_f32", "scale_grads_skip_f32",
    "grad_sumsq_partial_f32", "grad_region_sumsq_partial_f32", "grad_clip_coef_f32", "grad_region_scale_dev_f32",
    "grad_spans_sumsq_partial_f32", "grad_spans_scale_dev_f32",
    "adamw_step_f32", "adamw_step_f32_capturable",
    "adamw_step_multi_f32", "adamw_step_multi_bf16", "adamw_step_multi_f16",
]
OUR_FAMILY_FILES = ("fixed/conv1d.toml", "fixed/optim.toml")


# ---------------------------------------------------------------------------------------------------- conv1d


def _silu_scalar(z: float) -> float:
    return z / (1.0 + math.exp(-z))


def _conv_literal(x, w, b, width):
    batch, d, L = x.shape
    pre = np.zeros_like(x)
    for bi in range(batch):
        for c in range(d):
            for t in range(L):
                acc = b[c]
                for k in range(width):
                    s = t - (width - 1) + k
                    acc += w[c, k] * (x[bi, c, s] if s >= 0 else 0.0)
                pre[bi, c, t] = acc
    return pre


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_conv_forward_matches_literal_loop(width):
    rng = np.random.default_rng(width)
    x = rng.uniform(-2, 2, (2, 3, 7))
    w, b = rng.uniform(-1, 1, (3, width)), rng.uniform(-1, 1, 3)
    want = _conv_literal(x, w, b, width)
    got = rc.conv1d_pre(x, w, b, width)
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(rc.silu(got), np.vectorize(_silu_scalar)(want), rtol=1e-14, atol=1e-15)
    # the first outputs see only the padding: the result depends on x[0..t] alone (causality)
    x2 = x.copy()
    x2[:, :, 4:] = 99.0
    np.testing.assert_array_equal(rc.conv1d_pre(x2, w, b, width)[:, :, :4], got[:, :, :4])


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_conv_kernel_walk_is_the_serial_loop(width):
    rng = np.random.default_rng(10 + width)
    x = rng.uniform(-2, 2, (2, 2, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (2, width)).astype(np.float32)
    b = rng.uniform(-1, 1, 2).astype(np.float32)
    walk = rc.conv1d_pre_kernel_walk(x, w, b, width)
    assert walk.dtype == np.float32
    for bi in range(2):
        for c in range(2):
            for t in range(9):
                acc = float(b[c])  # Python floats are IEEE doubles: the kernel's f64 accumulator
                for k in range(width):
                    s = t - (width - 1) + k
                    acc = acc + float(w[c, k]) * (float(x[bi, c, s]) if s >= 0 else 0.0)
                assert walk[bi, c, t].tobytes() == np.float32(acc).tobytes()
    # within one float32 rounding of the float64 reference, even where the sum cancels
    ref = rc.conv1d_pre(x, w, b, width)
    assert np.all(np.abs(walk - ref) <= np.abs(ref) * 2.0**-24 * 1.001 + 1e-300)


def test_conv_padding_multiplies_zero():
    # an infinite weight meets the zero padding as NaN, exactly where the padding is read
    x = np.ones((1, 1, 4))
    w = np.array([[np.inf, 1.0, 1.0]])
    pre = rc.conv1d_pre(x, w, np.zeros(1), 3)
    assert np.isnan(pre[0, 0, 0]) and np.isnan(pre[0, 0, 1]) and np.isinf(pre[0, 0, 2])


def test_conv_rejects_bad_width():
    with pytest.raises(ValueError):
        rc.conv1d_pre(np.zeros((1, 1, 4)), np.zeros((1, 5)), np.zeros(1), 5)
    with pytest.raises(ValueError):
        rc.conv1d_step(np.zeros((1, 1, 0)), np.zeros((1, 1)), np.zeros((1, 0)), np.zeros(1), 0)


def _conv_inputs(rng, batch: int, d: int, L: int, width: int):
    """(x, weight, bias) of a depthwise conv1d, drawn from `rng` in that order (x in [-2, 2), the rest in [-1, 1))."""
    return rng.uniform(-2, 2, (batch, d, L)), rng.uniform(-1, 1, (d, width)), rng.uniform(-1, 1, d)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_conv_backward_matches_literal_loop_and_finite_differences(width):
    rng, (batch, d, L) = np.random.default_rng(20 + width), (2, 2, 6)
    x, w, b = _conv_inputs(rng, batch, d, L, width)
    dout = rng.uniform(-1, 1, (batch, d, L))
    pre = rc.conv1d_pre(x, w, b, width)
    dx, dw, db = rc.conv1d_backward(x, w, pre, dout, width)

    # literal loops
    dpre = np.vectorize(lambda g, z: g * (1 / (1 + math.exp(-z))) * (1 + z * (1 - 1 / (1 + math.exp(-z)))))(dout, pre)
    dx_l, dw_l, db_l = np.zeros_like(x), np.zeros((d, width)), np.zeros(d)
    for bi in range(batch):
        for c in range(d):
            for t in range(L):
                db_l[c] += dpre[bi, c, t]
                for k in range(width):
                    s = t - (width - 1) + k
                    if s >= 0:
                        dx_l[bi, c, s] += w[c, k] * dpre[bi, c, t]
                        dw_l[c, k] += dpre[bi, c, t] * x[bi, c, s]
    np.testing.assert_allclose(dx, dx_l, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dw, dw_l, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(db, db_l, rtol=1e-12, atol=1e-14)

    # central differences of loss = sum(dout * silu(pre(x, w, b)))
    def loss(x_, w_, b_):
        return float(np.sum(dout * rc.silu(rc.conv1d_pre(x_, w_, b_, width))))

    h = 1e-6
    for idx in [(0, 0, 0), (1, 1, L - 1), (0, 1, 3)]:
        e = np.zeros_like(x)
        e[idx] = h
        assert abs((loss(x + e, w, b) - loss(x - e, w, b)) / (2 * h) - dx[idx]) < 1e-6
    for idx in [(0, 0), (1, width - 1)]:
        e = np.zeros_like(w)
        e[idx] = h
        assert abs((loss(x, w + e, b) - loss(x, w - e, b)) / (2 * h) - dw[idx]) < 1e-6
    e = np.zeros(d)
    e[1] = h
    assert abs((loss(x, w, b + e) - loss(x, w, b - e)) / (2 * h) - db[1]) < 1e-6


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_conv_step_reproduces_forward(width):
    batch, d, L = 3, 4, 8
    x, w, b = _conv_inputs(np.random.default_rng(30 + width), batch, d, L, width)
    want = rc.silu(rc.conv1d_pre(x, w, b, width))
    state = np.zeros((batch, d, width - 1))
    for t in range(L):
        out, state = rc.conv1d_step(state, x[:, :, t], w, b, width)
        np.testing.assert_allclose(out, want[:, :, t], rtol=1e-14, atol=1e-15)
    # the state holds the last width-1 inputs, oldest first
    np.testing.assert_array_equal(state, x[:, :, L - (width - 1):] if width > 1 else np.zeros((batch, d, 0)))


def test_conv_entry_points_shapes_and_consistency():
    rng = np.random.default_rng(5)
    batch, d, L, width = 2, 3, 10, 4
    args = {"x": rng.uniform(-2, 2, batch * d * L), "weight": rng.uniform(-1, 1, d * width),
            "bias": rng.uniform(-1, 1, d), "batch": batch, "d": d, "L": L, "width": width}
    fwd = rc.forward_tiled(args, {})
    assert fwd["out"].shape == fwd["pre"].shape == (batch * d * L,)
    np.testing.assert_array_equal(rc.forward_nosave_tiled(args, {})["out"], fwd["out"])
    bwd = rc.backward({**args, "pre": fwd["pre"], "dout": rng.uniform(-1, 1, batch * d * L)}, {})
    assert bwd["dx"].shape == (batch * d * L,) and bwd["dweight"].shape == (d * width,) and bwd["dbias"].shape == (d,)


# ---------------------------------------------------------------------------------------------------- optim


def test_check_inf_nan_positive_and_negative():
    base = {"x": np.array([0.0, -1e30, 1e-40, 3.0]), "found": np.array([0])}
    assert ro.check_inf_nan(base, {})["found"][0] == 0
    for bad in (np.inf, -np.inf, np.nan):
        x = base["x"].copy()
        x[2] = bad
        assert ro.check_inf_nan({**base, "x": x}, {})["found"][0] == 1
    # a flag already set stays set (the kernel never clears it)
    assert ro.check_inf_nan({**base, "found": np.array([1])}, {})["found"][0] == 1


def test_scale_and_skip_on_overflow():
    g = np.array([1.0, -2.0, 0.5])
    np.testing.assert_array_equal(ro.scale_grads({"g": g, "scale": 0.25}, {})["g"], g * 0.25)
    # the host scalar is an f32: 0.1 arrives rounded
    assert ro.scale_grads({"g": np.array([1.0]), "scale": 0.1}, {})["g"][0] == float(np.float32(0.1))
    args = {"g": g, "scale": np.array([0.5]), "found": np.array([0])}
    np.testing.assert_array_equal(ro.scale_grads_skip(args, {})["g"], g * 0.5)
    np.testing.assert_array_equal(ro.scale_grads_skip({**args, "found": np.array([1])}, {})["g"], g)


def test_sumsq_partials_follow_the_fixed_assignment():
    rng = np.random.default_rng(7)
    n = ro.GRAD_PARTIALS * ro.GRAD_BLOCK * ro.CHUNK + 4 * 300 + 3  # wraps around the fixed grid, ragged tail
    g = rng.uniform(-1, 1, n)
    parts = ro.sumsq_partials(g)
    assert parts.shape == (ro.GRAD_PARTIALS,)
    np.testing.assert_allclose(parts.sum(), np.sum(g * g), rtol=1e-12)
    # literal assignment for the wrapped chunks: chunk c -> partial (c // 256) % 512
    first = ro.GRAD_PARTIALS * ro.GRAD_BLOCK
    want = {}
    for c in range(first, -(-n // 4)):
        p = (c // ro.GRAD_BLOCK) % ro.GRAD_PARTIALS
        want[p] = want.get(p, 0.0) + float(np.sum(g[4 * c: 4 * c + 4] ** 2))
    for p, extra in want.items():
        c0 = p * ro.GRAD_BLOCK
        base = float(np.sum(g[4 * c0: 4 * (c0 + ro.GRAD_BLOCK)] ** 2))
        assert parts[p] == pytest.approx(base + extra, rel=1e-12)
    assert set(want) == {0, 1}  # 300 wrapped chunks + tail land in partials 0 and 1
    np.testing.assert_allclose(parts[2], np.sum(g[4 * 512: 4 * 768] ** 2), rtol=1e-12)


def test_partials_grid_is_the_reference_libraries_512():
    assert ro.GRAD_PARTIALS == 512
    cat = load_catalog(default_catalog_path())
    for name in ("grad_sumsq_partial_f32", "grad_region_sumsq_partial_f32", "grad_spans_sumsq_partial_f32"):
        sym = cat.symbols[name]
        fam = cat.module(sym.module).family(sym.family)
        assert fam.launch.grid == ["512"] or fam.launch.grid == [512], name
        assert [p.shape for p in fam.params if p.name == "partials"] in ([["512"]], [[512]]), name


def _region_literal(g, n, stripe_off, rows, cols, ld, vec_off, vec_len):
    vals = []
    for r in range(rows):
        for c in range(cols):
            a = stripe_off + r * ld + c
            vals.append(g[a] if 0 <= a < n else 0.0)
    for i in range(vec_len):
        a = vec_off + i
        vals.append(g[a] if 0 <= a < n else 0.0)
    return np.array(vals)


def test_region_is_a_stripe_then_a_vector():
    rng = np.random.default_rng(9)
    n = 5000
    g = rng.uniform(-1, 1, n)
    geo = {"stripe_off": 7, "stripe_rows": 13, "stripe_cols": 21, "stripe_ld": 97, "vec_off": 4900, "vec_len": 150}
    args = {"g": g, "n": n, **geo}
    addr = ro.region_addresses(n, 7, 13, 21, 97, 4900, 150)
    lit = _region_literal(g, n, 7, 13, 21, 97, 4900, 150)  # the vector runs 50 elements past n: absent
    np.testing.assert_array_equal(ro.region_values(g, addr), lit)
    parts = ro.grad_region_sumsq_partial(args, {})["partials"]
    np.testing.assert_array_equal(parts, ro.sumsq_partials(lit))
    np.testing.assert_allclose(parts.sum(), np.sum(lit * lit), rtol=1e-12)
    out = ro.grad_region_scale_dev({**args, "coef": np.array([0.5])}, {})["g"]
    mask = np.zeros(n, bool)
    mask[addr[addr < n]] = True
    assert mask.sum() == 13 * 21 + 100
    np.testing.assert_array_equal(out[mask], g[mask] * 0.5)
    np.testing.assert_array_equal(out[~mask], g[~mask])
    # empty stripe, negative lengths: nothing
    empty = {**args, "stripe_rows": 0, "vec_len": -3}
    assert not ro.grad_region_sumsq_partial(empty, {})["partials"].any()


def test_spans_clamp_and_sum():
    rng = np.random.default_rng(8)
    g = rng.uniform(-1, 1, 5000)
    offsets, lengths = np.array([-10, 100, 4990, 6000]), np.array([20, 50, 100, 5])
    assert ro.span_bounds(offsets, lengths, g.size) == [(0, 10), (100, 150), (4990, 5000), (5000, 5000)]
    parts = ro.spans_sumsq_partials(g, offsets, lengths)
    want = np.sum(g[0:10] ** 2) + np.sum(g[100:150] ** 2) + np.sum(g[4990:5000] ** 2)
    np.testing.assert_allclose(parts.sum(), want, rtol=1e-12)
    out = ro.grad_spans_scale_dev({"g": g, "n": g.size, "offsets": offsets, "lengths": lengths,
                                   "num_spans": 4, "coef": np.array([0.5])}, {})["g"]
    mask = np.zeros(g.size, bool)
    mask[0:10] = mask[100:150] = mask[4990:5000] = True
    np.testing.assert_array_equal(out[mask], g[mask] * 0.5)
    np.testing.assert_array_equal(out[~mask], g[~mask])


def test_clip_coefficient():
    # small norm: coefficient 1 (never scales up)
    coef, norm = ro.clip_coef(np.array([0.25, 0.0]), 1.0, 1e-6)
    assert coef == 1.0 and norm == 0.5
    # large norm: max_norm / (norm + eps), as torch.nn.utils.clip_grad_norm_
    coef, norm = ro.clip_coef(np.array([9.0, 16.0]), 1.0, 1e-6)
    assert norm == 5.0 and coef == pytest.approx(1.0 / (5.0 + float(np.float32(1e-6))), rel=1e-15)
    # non-finite norms propagate NaN/0 instead of silently leaving gradients alone
    coef, _ = ro.clip_coef(np.array([np.nan]), 1.0, 1e-6)
    assert math.isnan(coef)
    coef, _ = ro.clip_coef(np.array([np.inf]), 1.0, 1e-6)
    assert coef == 0.0
    out = ro.grad_clip_coef({"partials": np.array([9.0, 16.0, 1e9]), "num_partials": 2, "max_norm": 2.0,
                             "eps": 0.0}, {})
    assert out["norm"][0] == 5.0 and out["coef"][0] == 0.4


def _torch_adamw_loop(params, grads, ms, vs, lr, beta1, beta2, eps, wd, step):
    """torch.optim.adamw._single_tensor_adamw written out per element (amsgrad=False, maximize=False)."""
    out_p, out_m, out_v = [], [], []
    for p, g, m, v in zip(params, grads, ms, vs, strict=True):
        p = p * (1 - lr * wd)
        w = 1 - beta1  # exp_avg.lerp_(grad, 1 - beta1)
        m = m + w * (g - m) if abs(w) < 0.5 else g - (g - m) * (1 - w)
        v = v * beta2 + (1 - beta2) * g * g
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        denom = math.sqrt(v) / math.sqrt(bias_correction2) + eps
        p = p - step_size * (m / denom)
        out_p.append(p), out_m.append(m), out_v.append(v)
    return np.array(out_p), np.array(out_m), np.array(out_v)


@pytest.mark.parametrize("wd", [0.0, 0.125])
def test_adamw_matches_torch_algorithm_over_steps(wd):
    rng = np.random.default_rng(9)
    # values exactly representable in f32, so the reference's f32 rounding of scalars changes nothing here
    lr, beta1, beta2, eps = 2.0**-10, 0.875, 0.9990234375, 2.0**-26
    p = rng.uniform(-1, 1, 16)
    m, v = np.zeros(16), np.zeros(16)
    lp, lm, lv = p.copy(), m.copy(), v.copy()
    for step in range(1, 6):
        g = rng.uniform(-1, 1, 16)
        p, m, v = ro.adamw(p, g, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd, step=step)
        lp, lm, lv = _torch_adamw_loop(lp, g, lm, lv, lr, beta1, beta2, eps, wd, step)
        np.testing.assert_allclose(p, lp, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(m, lm, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(v, lv, rtol=1e-13, atol=1e-15)
    # the first step moves each parameter by about lr against the gradient's sign
    p0 = rng.uniform(-1, 1, 8)
    g0 = rng.uniform(0.1, 1, 8) * rng.choice([-1, 1], 8)
    p1, _, _ = ro.adamw(p0, g0, np.zeros(8), np.zeros(8), lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=0.0,
                        step=1)
    np.testing.assert_allclose(p0 - p1, lr * np.sign(g0), rtol=1e-6)


def test_adamw_capturable_reads_and_increments_step():
    rng = np.random.default_rng(11)
    args = {"p": rng.uniform(-1, 1, 8), "g": rng.uniform(-1, 1, 8), "m": np.zeros(8), "v": np.zeros(8), "n": 8,
            "lr": np.array([1e-3]), "step": np.array([4]), "arrivals": np.array([0]),
            "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}
    out = ro.adamw_step_capturable(args, {})
    assert out["step"][0] == 5 and out["arrivals"][0] == 0
    plain = ro.adamw_step({**args, "lr": 1e-3, "step": 5}, {})
    np.testing.assert_array_equal(out["p"], plain["p"])
    assert not np.array_equal(ro.adamw_step({**args, "lr": 1e-3, "step": 4}, {})["p"], plain["p"])


# ---------------------------------------------------------------------------------------------------- catalog


@pytest.fixture(scope="module")
def our_families():
    cat = load_catalog(default_catalog_path())
    fixed = cat.module("Fixed")
    assert all(f in fixed.module.families for f in OUR_FAMILY_FILES)
    names = {s.name for s in fixed.symbols}
    fams = [f for f in fixed.families if any(s.family == f.name for s in fixed.symbols if s.name in
                                                   CONV_SYMBOLS + OPTIM_SYMBOLS)]
    return cat, names, fams


def test_every_listed_symbol_is_declared(our_families):
    _, names, _ = our_families
    missing = sorted(set(CONV_SYMBOLS + OPTIM_SYMBOLS) - names)
    assert not missing, f"not declared in the catalog: {missing}"


def test_wrapper_bodies_exist_in_sources(our_families):
    """Each family's extern "C" wrapper is generated (catalog/wrappers.py); the body it calls is in the sources."""
    cat, _, fams = our_families
    root = cat.path.parent
    text = (root / "fixed/conv1d.cu").read_text() + (root / "fixed/optim.cu").read_text()
    for fam in fams:
        assert fam.body and fam.instantiate is None, f"{fam.name}: not a generated wrapper"
        name = fam.body.split("<")[0].removeprefix("mf::")
        assert re.search(rf"MF_DEVICE void {name}\(", text), f"{fam.name}: body {fam.body} not defined"
        assert fam.contract, f"{fam.name}: no contract"


def _fill(rng, fill, size, dtype):
    m = re.match(r"(\w+)(?:\((.*)\))?$", fill)
    kind, a = m.group(1), [float(s) for s in m.group(2).split(",")] if m.group(2) else []
    if kind == "randint":
        return rng.integers(int(a[0]), int(a[1]), size)
    if kind == "const":
        return np.full(size, a[0])
    if kind == "positive":
        return np.exp(rng.uniform(np.log(a[0]), np.log(a[1]), size))
    if kind in ("uniform", "normal"):
        return rng.uniform(a[0], a[1], size) if kind == "uniform" else rng.normal(a[0], a[1], size)
    raise AssertionError(f"fill {fill} not handled here")


def test_launch_specs_are_complete_and_references_run(our_families):
    """Every family either names a reference that accepts its declared parameters and returns its outputs at
    their declared sizes, or says why it is skipped. Dims are shrunk so this stays fast."""
    _, _, fams = our_families
    rng = np.random.default_rng(0)
    small = {"batch": 2, "d": 3, "L": 37, "width": 3, "n": 4099, "spans": 3, "partials": 10, "tensors": 2, "total": 5003}
    for fam in fams:
        q = fam.qualify
        assert q.dims, f"{fam.name}: no qualification dims"
        if q.skip:
            assert q.reference is None and len(q.skip) > 20
            continue
        assert q.reference, f"{fam.name}: neither reference nor skip"
        dims = {k: small.get(k, v) for k, v in q.dims.items()}
        for g in fam.launch.grid:
            for size in (2, 4):  # sizeof_T of the 16-bit and f32 variants (the spec's environment names it)
                assert int(expr.evaluate(g, {**dims, "sizeof_T": size})) >= 1
        if q.batch_dim:
            assert q.batch_dim in dims
        mod, fn = q.reference.split(":")
        ref = getattr(importlib.import_module(mod), fn)
        args, outs = {}, {}
        for p in [*fam.params, *q.aux]:  # aux: buffers the qualifier allocates beside the params
            if p.type != "ptr":
                assert p.value is not None, f"{fam.name}.{p.name}: scalar without a value"
                args[p.name] = expr.evaluate(p.value, dims)
                continue
            size = 1
            for s in p.shape:
                size *= int(expr.evaluate(s, dims))
            dt = "f32" if p.dtype == "T" else p.dtype
            assert dt in DTYPES
            if p.role in ("in", "inout") and not p.fill and q.prepare and p in fam.params:
                args[p.name] = np.zeros(size)  # built by qualify.prepare from device pointers (e.g. descs)
            elif p.role in ("in", "inout"):
                assert p.fill, f"{fam.name}.{p.name}: input without a fill"
                args[p.name] = _fill(rng, p.fill, size, dt)
            else:
                args[p.name] = np.zeros(size)
            if p.role in ("out", "inout"):
                outs[p.name] = size
        result = ref(args, dims)
        assert set(result) <= set(outs), f"{fam.name}: reference returns non-outputs {set(result) - set(outs)}"
        assert {k for k, _ in outs.items() if k in result}, f"{fam.name}: reference checks no output"
        for k, v in result.items():
            assert np.asarray(v).size == outs[k], f"{fam.name}.{k}: {np.asarray(v).size} != {outs[k]}"
