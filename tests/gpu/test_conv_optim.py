"""GPU checks for the conv1d and training-step families of the Fixed module (run on the H200).

Symbols are launched from their catalog spec (mamba_forge.qualify.spec.evaluate: the grid, block and parameter
list the qualifier uses), with fresh random inputs per test (the seed is printed) and outputs poisoned with
0xFF bytes first. Checked:
  * conv1d: every symbol within tolerance of the float64 reference for widths 1..4, at the qualification shape
    and at odd shapes (L % 8 != 0, several tiles, d odd), uniform/logu/special corpora; the tiled forward's
    pre-activation equals the host walk of the contract (references.conv1d.conv1d_pre_kernel_walk) bit for bit;
    nosave == save; stepping token by token from a zero state == the forward, bit for bit; tiled backward dx ==
    serial backward dx bit for bit and dweight/dbias within 1e-6; five runs bitwise equal; batch invariance;
    misaligned pointers (scalar path) == aligned (vector path); width outside 1..4 writes nothing.
  * optim: every declared symbol vs its reference; inf/nan detection positive and negative; skip-on-overflow;
    partial sums independent of the launched grid; the clipping pipeline end to end; AdamW over several steps,
    capturable == plain bit for bit, eagerly and replayed from a CUDA graph; multi-tensor AdamW (descriptor
    array, which the declarative spec cannot express) == the plain kernel per tensor, bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import bits, empty_device, fixed_families, from_device, kernels, reference_outputs, to_device  # noqa: E402

from mamba_forge.core.vocab import DTYPE_SIZES  # noqa: E402
from mamba_forge.gpu import driver as cu  # noqa: E402
from mamba_forge.qualify import fills  # noqa: E402
from mamba_forge.qualify import spec as S  # noqa: E402
from mamba_forge.references import conv1d as rc  # noqa: E402
from mamba_forge.references import optim as ro  # noqa: E402

pytestmark = pytest.mark.gpu

OUR_FILES = ("fixed/conv1d.toml", "fixed/optim.toml")
DTYPES = ("f32", "bf16", "f16")
NP_T = {"f32": np.float32, "bf16": S.NP_DTYPES["bf16"], "f16": np.float16}


FAMILIES, _SYMBOLS = fixed_families(*OUR_FILES)
BY_NAME = {s.name: s for s in _SYMBOLS}
CONV_NAMES = sorted(n for n in BY_NAME if n.startswith("conv1d_"))
SPEC_NAMES = sorted(n for n in BY_NAME if not FAMILIES[BY_NAME[n].family].qualify.skip)
# Families whose inputs come from a prepare hook (the multi-tensor descriptor tables) are launched by their own
# test (test_adamw_multi, descriptors built by hand) and by the qualifier's generic path; launch() here has none.
OPTIM_SPEC_NAMES = [n for n in SPEC_NAMES if not n.startswith("conv1d_") and FAMILIES[BY_NAME[n].family].qualify.prepare is None]
SCALAR_NP = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64}


# ---- launching from the catalog spec ------------------------------------------------------------------------


def spec_of(name: str, dims: dict[str, int] | None = None) -> S.LaunchSpec:
    sym = BY_NAME[name]
    return S.evaluate(sym, FAMILIES[sym.family], dims)


def make_inputs(spec: S.LaunchSpec, rng, corpus: str = "uniform") -> dict[str, np.ndarray]:
    return {b.name: fills.make_input(b, corpus, rng, nonfinite=corpus == "special") for b in spec.buffers if b.needs_fill}


def _device(host, b: S.BufferSpec, offset: int):
    buf = empty_device(b.count + offset, b.dtype)  # 0xFF poison
    if host is not None:
        buf[offset:] = to_device(host, b.dtype)
    return buf[offset:] if offset else buf


def launch(name: str, dims, inputs, offset: int = 0, grid=None, scalars: dict | None = None) -> dict[str, bytes]:
    """Launch `name` at `dims`; every buffer starts `offset` elements into its allocation (offset 1 breaks the
    16-byte alignment: the scalar path). Returns each output's bytes."""
    spec = spec_of(name, dims)
    dev = {b.name: _device(inputs.get(b.name), b, offset) for b in spec.buffers}
    args: list = [None] * (len(spec.buffers) + len(spec.scalars))
    for b in spec.buffers:
        args[b.index] = dev[b.name]
    for s in spec.scalars:
        args[s.index] = SCALAR_NP[s.type]((scalars or {}).get(s.name, s.value))
    kernels().launch(name, grid=grid or spec.grid, block=spec.block, args=tuple(args), smem=spec.dynamic_smem)
    return {b.name: bits(dev[b.name]) for b in spec.outputs}


def reference(name: str, spec: S.LaunchSpec, inputs) -> dict[str, np.ndarray]:
    return reference_outputs(FAMILIES[BY_NAME[name].family], spec, inputs)


def values(raw: bytes, dtype: str) -> np.ndarray:
    arr = S.from_bytes(raw, dtype)
    return arr.astype(np.float64) if dtype in S.FLOAT_DTYPES else arr.astype(np.int64)


def unwritten(raw: bytes, dtype: str) -> np.ndarray:
    size = DTYPE_SIZES[dtype]
    return (np.frombuffer(raw, dtype=np.uint8).reshape(-1, size) == 0xFF).all(axis=1)


def assert_within(got: np.ndarray, want, rtol: float, atol: float, what: str) -> None:
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    assert got.shape == want.shape, f"{what}: {got.size} elements, reference {want.size}"
    gn, wn = np.isnan(got), np.isnan(want)
    assert (gn == wn).all(), f"{what}: NaN mismatch at {int(np.argmax(gn != wn))}"
    wi = np.isinf(want)
    assert (np.isinf(got) == wi).all() and (got[wi] == want[wi]).all(), f"{what}: infinity mismatch"
    fin = ~(wn | wi)
    err = np.abs(got[fin] - want[fin])
    lim = atol + rtol * np.abs(want[fin])
    if (err > lim).any():
        i = int(np.flatnonzero(fin)[np.argmax(err - lim)])
        raise AssertionError(f"{what}: {int((err > lim).sum())} elements out of tolerance; worst at {i}: "
                             f"{got[i]!r} vs {want[i]!r}")


def check_against_reference(name: str, dims, rng, corpus: str = "uniform"):
    spec = spec_of(name, dims)
    inputs = make_inputs(spec, rng, corpus)
    outs = launch(name, dims, inputs)
    ref = reference(name, spec, inputs)
    for b in spec.outputs:
        wanted = np.asarray(ref[b.name], dtype=np.float64) if b.name in ref else None
        unw = unwritten(outs[b.name], b.dtype)
        if wanted is not None and b.dtype in S.FLOAT_DTYPES:
            unw &= ~np.isnan(wanted)  # an expected NaN may hold the poison's NaN pattern
        assert not unw.any(), f"{name}.{b.name}: {int(unw.sum())} elements left unwritten"
        if wanted is not None:
            assert_within(values(outs[b.name], b.dtype), wanted, *spec.tolerance[b.name],
                          what=f"{name}.{b.name} at {dims} ({corpus})")
    return spec, inputs, outs


# ---- conv1d --------------------------------------------------------------------------------------------------

CONV_ODD = [{"batch": 3, "d": 37, "L": 2053}, {"batch": 2, "d": 5, "L": 4104}, {"batch": 1, "d": 3, "L": 3}]


def conv_dims(name: str, base: dict, width: int) -> dict:
    dims = dict(base, width=width)
    if "step" in name:
        dims.pop("L", None)
    return dims


def dtype_of(name: str) -> str:
    return name.rsplit("_", 1)[1]


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("name", CONV_NAMES)
def test_conv_matches_reference(name, width, rng):
    if "step" in name and width == 1:
        pytest.skip("conv_state is empty at width 1 (no spec buffer): covered by test_conv_step_reproduces_forward_bitwise")
    fam = FAMILIES[BY_NAME[name].family]
    q = dict(fam.qualify.dims)
    if "burnin_backward" in name:  # the serial oracle is slow by design: a smaller qualification shape
        q.update(d=256, L=1024)
    check_against_reference(name, conv_dims(name, q, width), rng)
    for corpus in ("logu", "special"):
        check_against_reference(name, conv_dims(name, CONV_ODD[0], width), rng, corpus)
    for odd in CONV_ODD[1:]:
        check_against_reference(name, conv_dims(name, odd, width), rng)


def _conv_inputs(rng, dt: str, batch: int, d: int, L: int, width: int):
    x = rng.uniform(-2, 2, (batch, d, L)).astype(NP_T[dt])
    w = rng.uniform(-1, 1, (d, width)).astype(np.float32)
    b = rng.uniform(-1, 1, d).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("dt", DTYPES)
def test_conv_forward_is_the_serial_walk_bitwise(dt, width, rng):
    for batch, d, L in ((2, 9, 4096 + 24), (3, 7, 2053)):
        x, w, b = _conv_inputs(rng, dt, batch, d, L, width)
        dims = {"batch": batch, "d": d, "L": L, "width": width}
        inputs = {"x": x.ravel(), "weight": w.ravel(), "bias": b.ravel()}
        save = launch(f"conv1d_burnin_forward_tiled_{dt}", dims, inputs)
        nosave = launch(f"conv1d_burnin_forward_nosave_tiled_{dt}", dims, inputs)
        walk = rc.conv1d_pre_kernel_walk(x.astype(np.float32), w, b, width).astype(NP_T[dt])
        assert save["pre"] == walk.tobytes(), f"pre differs from the serial walk ({dt}, width {width}, L {L})"
        assert nosave["out"] == save["out"], "the nosave forward's out differs from the saving forward's"


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("dt", DTYPES)
def test_conv_step_reproduces_forward_bitwise(dt, width, rng):
    batch, d, L = 3, 257, 23
    x, w, b = _conv_inputs(rng, dt, batch, d, L, width)
    fwd = launch(f"conv1d_burnin_forward_nosave_tiled_{dt}", {"batch": batch, "d": d, "L": L, "width": width},
                 {"x": x.ravel(), "weight": w.ravel(), "bias": b.ravel()})
    want = S.from_bytes(fwd["out"], dt).reshape(batch, d, L)
    state = to_device(np.zeros(max(batch * d * (width - 1), 1)), dt)
    wd, bd = to_device(w.ravel(), "f32"), to_device(b.ravel(), "f32")
    k = kernels()
    # width 1 has an empty state, which a spec cannot hold; the launch shape does not depend on width
    spec = spec_of(f"conv1d_step_forward_silu_{dt}", {"batch": batch, "d": d, "width": max(width, 2)})
    for t in range(L):
        out = empty_device(batch * d, dt)
        xt = to_device(np.ascontiguousarray(x[:, :, t]).ravel(), dt)
        k.launch(f"conv1d_step_forward_silu_{dt}", grid=spec.grid, block=spec.block,
                 args=(out, state, xt, wd, bd, np.int64(batch), np.int64(d), np.int32(width)))
        got = S.from_bytes(bits(out), dt).reshape(batch, d)
        assert got.tobytes() == np.ascontiguousarray(want[:, :, t]).tobytes(), f"step {t} differs from the forward"
    if width > 1:
        st = S.from_bytes(bits(state), dt).reshape(batch, d, width - 1)
        assert st.tobytes() == np.ascontiguousarray(x[:, :, L - (width - 1):]).tobytes()
    cu.context_synchronize()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("dt", DTYPES)
def test_conv_tiled_backward_matches_serial(dt, width, rng):
    for dims in ({"batch": 2, "d": 33, "L": 4100, "width": width}, {"batch": 3, "d": 8, "L": 2048, "width": width}):
        spec = spec_of(f"conv1d_bwd_tiled_{dt}", dims)
        inputs = make_inputs(spec, rng)
        tiled = launch(f"conv1d_bwd_tiled_{dt}", dims, inputs)
        serial = launch(f"conv1d_burnin_backward_{dt}", dims, inputs)
        assert tiled["dx"] == serial["dx"], f"dx differs between tiled and serial ({dt}, width {width})"
        for out in ("dweight", "dbias"):
            a, s = values(tiled[out], "f32"), values(serial[out], "f32")
            np.testing.assert_allclose(a, s, rtol=1e-6, atol=1e-7, err_msg=f"{out} tiled vs serial")


@pytest.mark.parametrize("name", CONV_NAMES)
def test_conv_five_runs_bitwise_equal(name, rng):
    dims = conv_dims(name, CONV_ODD[0], 4)
    inputs = make_inputs(spec_of(name, dims), rng)
    first = launch(name, dims, inputs)
    for run in range(4):
        assert launch(name, dims, inputs) == first, f"{name}: run {run + 2} differs from run 1"


@pytest.mark.parametrize("name", [n for n in CONV_NAMES if FAMILIES[BY_NAME[n].family].qualify.batch_dim])
def test_conv_batch_invariance(name, rng):
    for base in (FAMILIES[BY_NAME[name].family].qualify.dims, {"batch": 5, "d": 37, "L": 2053}):
        dims = conv_dims(name, base, 4)
        full = spec_of(name, dims)
        inputs = make_inputs(full, rng)
        outs = launch(name, dims, inputs)
        for size in S.batch_sizes(dims["batch"]):
            small = spec_of(name, {**dims, "batch": size})
            fb = {b.name: b for b in full.buffers}
            small_inputs = {b.name: S.leading_rows(inputs[b.name], fb[b.name], b) for b in small.buffers
                            if b.name in inputs}
            got = launch(name, small.dims, small_inputs)
            for b in small.outputs:
                want = S.leading_rows(S.from_bytes(outs[b.name], b.dtype), fb[b.name], b)
                assert got[b.name] == want.tobytes(), f"{name}.{b.name}: batch {size} differs from the full batch"


@pytest.mark.parametrize("name", CONV_NAMES)
def test_conv_misaligned_equals_aligned(name, rng):
    dims = conv_dims(name, {"batch": 2, "d": 6, "L": 2048 + 64}, 4)
    inputs = make_inputs(spec_of(name, dims), rng)
    assert launch(name, dims, inputs, offset=1) == launch(name, dims, inputs)


@pytest.mark.parametrize("name", CONV_NAMES)
def test_conv_bad_width_writes_nothing(name, rng):
    dims = conv_dims(name, {"batch": 2, "d": 6, "L": 64}, 4)
    inputs = make_inputs(spec_of(name, dims), rng)
    for width in (0, 5):
        outs = launch(name, dims, inputs, scalars={"width": width})
        spec = spec_of(name, dims)
        for b in spec.outputs:
            if b.role == "out":
                assert unwritten(outs[b.name], b.dtype).all(), f"{name}: width {width} wrote {b.name}"
            else:  # the in/out state is left as it was
                assert outs[b.name] == np.ascontiguousarray(inputs[b.name]).tobytes()


# ---- optim ---------------------------------------------------------------------------------------------------

# odd shapes; the region geometry: a 77 x 33 stripe of a 1013-wide matrix, then a vector whose last element is
# past n (absent: never read, never written)
OPT_ODD = {"n": 100_003, "spans": 5, "partials": 777, "stripe_off": 5, "rows": 77, "cols": 33, "ld": 1013,
           "vec_off": 90_001, "vec_len": 10_003}


@pytest.mark.parametrize("name", OPTIM_SPEC_NAMES)
def test_optim_matches_reference(name, rng):
    fam = FAMILIES[BY_NAME[name].family]
    q = dict(fam.qualify.dims)
    for corpus in ("uniform", "logu", "special"):
        check_against_reference(name, q, rng, corpus)
    odd = {k: OPT_ODD.get(k, v) for k, v in q.items()}
    if name == "grad_spans_scale_dev_f32":
        odd["spans"] = 1
    if "spans" in name:
        odd["n"] = 1_000_003  # the declared offsets reach 900000
    check_against_reference(name, odd, rng)


@pytest.mark.parametrize("name", OPTIM_SPEC_NAMES)
def test_optim_five_runs_bitwise_equal(name, rng):
    fam = FAMILIES[BY_NAME[name].family]
    dims = dict(fam.qualify.dims)
    inputs = make_inputs(spec_of(name, dims), rng)
    first = launch(name, dims, inputs)
    for run in range(4):
        assert launch(name, dims, inputs) == first, f"{name}: run {run + 2} differs from run 1"


def _flag(x: np.ndarray, offset: int = 0) -> int:
    out = launch("check_inf_nan_f32", {"n": x.size}, {"x": x.astype(np.float32), "found": np.zeros(1, np.int32)},
                 offset=offset)
    return int(S.from_bytes(out["found"], "i32")[0])


@pytest.mark.parametrize("offset", [0, 1])
def test_check_inf_nan_positive_and_negative(offset, rng):
    n = 1_000_003
    clean = rng.uniform(-1, 1, n).astype(np.float32)
    clean[[5, 77, n - 1]] = [3.0e38, -3.0e38, 1e-45]  # large finite and denormal: not flagged
    assert _flag(clean, offset) == 0
    for bad in (np.inf, -np.inf, np.nan):
        for pos in (0, 12345, n - 1):  # first element, middle, the ragged tail
            x = clean.copy()
            x[pos] = bad
            assert _flag(x, offset) == 1, f"{bad} at {pos} not detected"


def test_scale_grads_skip_on_overflow(rng):
    n = 100_003
    g = rng.uniform(-1, 1, n).astype(np.float32)
    scale = np.array([0.5], np.float32)
    skipped = launch("scale_grads_skip_f32", {"n": n}, {"g": g, "scale": scale, "found": np.ones(1, np.int32)})
    assert skipped["g"] == g.tobytes(), "gradients changed although the overflow flag was set"
    done = launch("scale_grads_skip_f32", {"n": n}, {"g": g, "scale": scale, "found": np.zeros(1, np.int32)})
    assert done["g"] == (g * np.float32(0.5)).tobytes()


def test_sumsq_partials_do_not_depend_on_the_launched_grid(rng):
    n = 4 * 1024 * 256 * 2 + 1001
    g = rng.uniform(-1, 1, n).astype(np.float32)
    base = launch("grad_sumsq_partial_f32", {"n": n}, {"g": g})
    for grid in ((37, 1, 1), (1, 1, 1), (4096, 1, 1)):
        assert launch("grad_sumsq_partial_f32", {"n": n}, {"g": g}, grid=grid) == base, f"grid {grid} differs"
    parts = values(base["partials"], "f64")
    np.testing.assert_allclose(parts, ro.sumsq_partials(g.astype(np.float64)), rtol=1e-12)
    np.testing.assert_allclose(np.sqrt(parts.sum()), np.linalg.norm(g.astype(np.float64)), rtol=1e-12)


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_clipping_pipeline(max_norm, rng):
    """Several non-overlapping spans of one flat gradient: partials -> coefficient -> scaled spans."""
    import cupy as cp  # device arrays only (gpu_support launches)

    n = 3_000_001
    g = rng.uniform(-1, 1, n).astype(np.float32)
    offsets = np.array([0, 1_000_003, 2_500_001, 2_999_990], np.int64)
    lengths = np.array([999_999, 1_000_000, 3, 100], np.int64)  # the last one is clamped at n
    k = kernels()
    gd, od, ld = to_device(g, "f32"), cp.asarray(offsets), cp.asarray(lengths)
    parts = empty_device(ro.GRAD_PARTIALS, "f64")
    k.launch("grad_spans_sumsq_partial_f32", grid=(ro.GRAD_PARTIALS,), block=(256,),
             args=(parts, gd, np.int64(n), od, ld, np.int32(4)))
    coef, norm = empty_device(1, "f32"), empty_device(1, "f32")
    k.launch("grad_clip_coef_f32", grid=(1,), block=(256,),
             args=(coef, norm, parts, np.int32(ro.GRAD_PARTIALS), np.float32(max_norm), np.float32(1e-6)))
    k.launch("grad_spans_scale_dev_f32", grid=(1024,), block=(256,),
             args=(gd, np.int64(n), od, ld, np.int32(4), coef))
    bounds = ro.span_bounds(offsets, lengths, n)
    sel = np.concatenate([g[lo:hi].astype(np.float64) for lo, hi in bounds])
    want_norm = float(np.linalg.norm(sel))
    want_coef = min(1.0, float(np.float32(max_norm)) / (want_norm + float(np.float32(1e-6))))
    assert abs(from_device(norm, "f32")[0] - want_norm) <= 1.2e-7 * want_norm
    assert abs(from_device(coef, "f32")[0] - want_coef) <= 2e-7 * want_coef
    out = S.from_bytes(bits(gd), "f32")
    c = np.float32(from_device(coef, "f32")[0])
    want = g.copy()
    for lo, hi in bounds:
        want[lo:hi] = want[lo:hi] * c
    assert out.tobytes() == want.tobytes()
    if max_norm > 1e6:
        assert c == 1.0 and out.tobytes() == g.tobytes()


ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


def _adam_state(rng, n):
    return (rng.uniform(-1, 1, n).astype(np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32))


def test_adamw_steps_match_reference_and_capturable_is_plain(rng):
    import cupy as cp  # device arrays only (gpu_support launches)

    n, wd, steps = 1_000_003, 0.1, 3
    p0, m0, v0 = _adam_state(rng, n)
    grads = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(steps)]
    k = kernels()
    grid = (min(-(-n // 1024), 8192),)
    plain = [to_device(a, "f32") for a in (p0, m0, v0)]
    capt = [to_device(a, "f32") for a in (p0, m0, v0)]
    lr_dev, step_dev, arrivals = to_device(np.array([ADAM["lr"]]), "f32"), cp.zeros(1, cp.int32), cp.zeros(1, cp.uint32)
    rp, rm, rv = p0.astype(np.float64), m0.astype(np.float64), v0.astype(np.float64)
    hyper = tuple(np.float32(ADAM[a]) for a in ("beta1", "beta2", "eps"))
    for t in range(1, steps + 1):
        gd = to_device(grads[t - 1], "f32")
        k.launch("adamw_step_f32", grid=grid, block=(256,),
                 args=(*plain[:1], gd, *plain[1:], np.int64(n), np.float32(ADAM["lr"]), *hyper, np.float32(wd),
                       np.int32(t)))
        k.launch("adamw_step_f32_capturable", grid=grid, block=(256,),
                 args=(capt[0], gd, capt[1], capt[2], np.int64(n), lr_dev, step_dev, arrivals, *hyper, np.float32(wd)))
        rp, rm, rv = ro.adamw(rp, grads[t - 1], rm, rv, weight_decay=wd, step=t, **ADAM)
        assert int(step_dev.get()[0]) == t and int(arrivals.get()[0]) == 0
        for a, b in zip(plain, capt, strict=True):
            assert bits(a) == bits(b), f"capturable differs from plain at step {t}"
    for got, want, what in zip(plain, (rp, rm, rv), ("p", "m", "v"), strict=True):
        assert_within(from_device(got, "f32"), want, 1e-5, 1e-6, what=f"adamw {what} after {steps} steps")


def test_adamw_capturable_graph_replay_equals_eager(rng):
    import cupy as cp  # device arrays only (gpu_support launches, cu.Graph captures)

    n, steps = 300_007, 3
    p0, m0, v0 = _adam_state(rng, n)
    g = to_device(rng.uniform(-1, 1, n).astype(np.float32), "f32")
    hyper = tuple(np.float32(ADAM[a]) for a in ("beta1", "beta2", "eps")) + (np.float32(0.01),)
    grid = (min(-(-n // 1024), 8192),)
    k = kernels()

    def state():
        return ([to_device(a, "f32") for a in (p0, m0, v0)], to_device(np.array([ADAM["lr"]]), "f32"),
                cp.zeros(1, cp.int32), cp.zeros(1, cp.uint32))

    (pe, me, ve), lr_e, st_e, ar_e = state()
    for _ in range(steps):
        k.launch("adamw_step_f32_capturable", grid=grid, block=(256,),
                 args=(pe, g, me, ve, np.int64(n), lr_e, st_e, ar_e, *hyper))
    (pg, mg, vg), lr_g, st_g, ar_g = state()
    cu.context_synchronize()  # the fresh state's copies and fills (legacy stream) land before the other stream runs
    stream = cu.Stream()
    graph = cu.Graph.capture(stream, lambda: k.launch("adamw_step_f32_capturable", grid=grid, block=(256,),
                             args=(pg, g, mg, vg, np.int64(n), lr_g, st_g, ar_g, *hyper), stream=stream, sync=False))
    for _ in range(steps):
        graph.launch(stream)
    stream.synchronize()
    graph.destroy()
    stream.destroy()
    assert int(st_g.get()[0]) == steps and int(ar_g.get()[0]) == 0
    for a, b in ((pe, pg), (me, mg), (ve, vg)):
        assert bits(a) == bits(b), "graph replay differs from eager launches"


DESC = np.dtype([("param", "<u8"), ("grad", "<u8"), ("exp_avg", "<u8"), ("exp_avg_sq", "<u8"), ("numel", "<i8"),
                 ("weight_decay", "<f4"), ("reserved", "<u4")])


def test_descriptor_layout_is_48_bytes():
    assert DESC.itemsize == 48
    assert [DESC.fields[f][1] for f in DESC.names] == [0, 8, 16, 24, 32, 40, 44]


@pytest.mark.parametrize("dt", DTYPES)
def test_adamw_multi(dt, rng):
    import cupy as cp  # device arrays only (gpu_support launches)

    sizes = [1_000_000, 2048, 1, 0, 4099, 777_777, 8, 65_536 + 3]
    wds = [0.1, 0.0, 0.1, 0.1, 0.05, 0.0, 0.1, 0.2]
    step = 7
    host = []
    for n in sizes:
        host.append((rng.uniform(-1, 1, n).astype(NP_T[dt]), rng.uniform(-1, 1, n).astype(NP_T[dt]),
                     rng.uniform(-0.1, 0.1, n).astype(np.float32), rng.uniform(1e-6, 1e-2, n).astype(np.float32)))

    def run(grid):
        dev = [(to_device(p, dt), to_device(g, dt), to_device(m, "f32"), to_device(v, "f32")) for p, g, m, v in host]
        desc = np.zeros(len(sizes), DESC)
        for i, ((p, g, m, v), n, wd) in enumerate(zip(dev, sizes, wds, strict=True)):
            desc[i] = (p.data.ptr, g.data.ptr, m.data.ptr, v.data.ptr, n, wd, 0)
        dd = cp.asarray(desc.view(np.uint8))
        kernels().launch(f"adamw_step_multi_{dt}", grid=grid, block=(256,),
                         args=(dd, np.int32(len(sizes)), np.float32(ADAM["lr"]), np.float32(ADAM["beta1"]),
                               np.float32(ADAM["beta2"]), np.float32(ADAM["eps"]), np.int32(step)))
        return [[bits(a) for a in t] for t in dev]

    first = run((1056,))
    for grid in ((1056,), (7,), (5000,)):
        assert run(grid) == first, f"grid {grid} or a repeat changed the result"
    for (p, g, m, v), n, wd, got in zip(host, sizes, wds, first, strict=True):
        rp, rm, rv = ro.adamw(p.astype(np.float64), g.astype(np.float64), m, v, weight_decay=wd, step=step, **ADAM)
        tol = S.TOLERANCES[dt]
        assert_within(S.from_bytes(got[0], dt).astype(np.float64), rp, *tol, what=f"multi {dt} p (n={n})")
        assert_within(S.from_bytes(got[2], "f32").astype(np.float64), rm, 1e-5, 1e-6, what=f"multi {dt} m (n={n})")
        assert_within(S.from_bytes(got[3], "f32").astype(np.float64), rv, 1e-5, 1e-6, what=f"multi {dt} v (n={n})")
        assert got[1] == np.ascontiguousarray(g).tobytes(), "gradients must not change"
        if dt == "f32" and n > 0:  # the same element arithmetic as the plain kernel: bit for bit
            out = launch("adamw_step_f32", {"n": n}, {"p": p, "g": g, "m": m, "v": v},
                         scalars={"weight_decay": wd, "step": step, **ADAM})
            assert (out["p"], out["m"], out["v"]) == (got[0], got[2], got[3]), f"multi != plain for n={n}"
