"""GPU checks for the activation, norm and elementwise families of the Fixed module (run on the H200).

Every symbol is launched from its catalog spec (mamba_forge.qualify.spec.evaluate: the same grid, block and
parameter list the qualifier uses), with fresh random inputs each run (the seed is printed on failure) and
outputs poisoned with 0xFF bytes first. Checks per symbol:
  * fully written and within the family's tolerance of the float64 reference (f32 ~1e-5, bf16/f16 ~1e-2),
    at the qualification shape and at an odd shape (tails: n % 8 != 0, dim % 8 != 0);
  * five repeated launches give identical bytes;
  * batch invariance (families with a batch_dim): the leading rows of a smaller launch equal the full launch's
    bit for bit, for 1 row and about a third;
  * misaligned pointers (every buffer offset by one element: the scalar fallback) give the same bytes as the
    16-byte vector path;
  * scalar/vector siblings (gate_mul_silu vs gate_mul_silu_v, elementwise_mul vs elementwise_mul_v) agree bitwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import bits, empty_device, fixed_families, from_device, kernels, reference_outputs, to_device  # noqa: E402

from mamba_forge.core.vocab import DTYPE_SIZES  # noqa: E402
from mamba_forge.qualify import fills  # noqa: E402
from mamba_forge.qualify import spec as S  # noqa: E402

pytestmark = pytest.mark.gpu

OUR_FILES = ("fixed/activation.toml", "fixed/norm.toml", "fixed/elementwise.toml")


FAMILIES, SYMBOLS = fixed_families(*OUR_FILES)
BY_NAME = {s.name: s for s in SYMBOLS}
NAMES = [s.name for s in SYMBOLS]

# Odd shapes per dims signature: tails everywhere (not multiples of 8 or of 256*8, rows not a power of two).
ODD = {
    ("n",): {"n": 100_003},
    ("dim", "rows"): {"rows": 37, "dim": 4099},
    ("cols", "rows"): {"rows": 67, "cols": 1001},
    ("col0", "ld", "ncols", "rows"): {"rows": 33, "ncols": 517, "ld": 1201, "col0": 611},
    ("batch", "d_state", "dt_rank", "seqlen"): {"batch": 3, "seqlen": 301, "dt_rank": 13, "d_state": 35},
    ("batch", "dim", "seqlen"): {"batch": 5, "seqlen": 7, "dim": 1003},
    ("d_state", "dt_rank", "rows"): {"rows": 301, "dt_rank": 13, "d_state": 35},
    # transpose_rows: odd rows, columns and pads (the element path; the word path needs even extents), a
    # column slice of rows twice as wide
    ("batch", "cols", "in_pad", "out_pad", "rows"): {"batch": 3, "rows": 67, "cols": 1001, "in_pad": 1001, "out_pad": 5},
}


def odd_dims(fam) -> dict[str, int]:
    return dict(ODD[tuple(sorted(fam.qualify.dims))])


# ---- launching a symbol from its catalog spec -----------------------------------------------------------


def make_inputs(spec: S.LaunchSpec, rng, corpus: str = "uniform") -> dict[str, np.ndarray]:
    return {b.name: fills.make_input(b, corpus, rng) for b in spec.buffers if b.needs_fill}


def _device(host: np.ndarray | None, b: S.BufferSpec, offset: int):
    """A device buffer for b (poisoned when host is None), starting `offset` elements into its allocation."""
    if host is None:
        buf = empty_device(b.count + offset, b.dtype)
    else:
        buf = empty_device(b.count + offset, b.dtype, poison=True)
        src = to_device(host, b.dtype)
        buf[offset:] = src
    return buf[offset:] if offset else buf


SCALAR_NP = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "f32": np.float32, "f64": np.float64}


def launch(name: str, dims: dict[str, int], inputs: dict[str, np.ndarray], offset: int = 0) -> dict[str, bytes]:
    """Launch `name` at `dims` on `inputs`; return each output's bytes."""
    sym = BY_NAME[name]
    fam = FAMILIES[sym.family]
    spec = S.evaluate(sym, fam, dims)
    dev = {b.name: _device(inputs.get(b.name), b, offset) for b in spec.buffers}
    args: list = [None] * (len(spec.buffers) + len(spec.scalars))
    for b in spec.buffers:
        args[b.index] = dev[b.name]
    for s in spec.scalars:
        args[s.index] = SCALAR_NP[s.type](s.value)
    kernels().launch(name, grid=spec.grid, block=spec.block, args=tuple(args), smem=spec.dynamic_smem)
    return {b.name: bits(dev[b.name]) for b in spec.outputs}


def reference(name: str, spec: S.LaunchSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return reference_outputs(FAMILIES[BY_NAME[name].family], spec, inputs)


def as_values(raw: bytes, dtype: str) -> np.ndarray:
    return S.from_bytes(raw, dtype).astype(np.float64)


def unwritten(raw: bytes, dtype: str) -> np.ndarray:
    """Elements still holding the 0xFF poison pattern."""
    size = DTYPE_SIZES[dtype]
    return (np.frombuffer(raw, dtype=np.uint8).reshape(-1, size) == 0xFF).all(axis=1)


def within(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[bool, str]:
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return False, f"{got.size} elements, reference {want.size}"
    if (np.isnan(got) != np.isnan(want)).any():
        return False, f"NaN mismatch at {int(np.argmax(np.isnan(got) != np.isnan(want)))}"
    fin = np.isfinite(want)
    if (got[~fin] != want[~fin]).any() and not np.isnan(want[~fin]).all():
        return False, "infinity mismatch"
    err = np.abs(got[fin] - want[fin])
    bad = err > atol + rtol * np.abs(want[fin])
    if bad.any():
        i = int(np.flatnonzero(fin)[np.argmax(err - (atol + rtol * np.abs(want[fin])))])
        return False, f"{int(bad.sum())} elements out of tolerance; worst at {i}: {got[i]!r} vs {want[i]!r}"
    return True, ""


def check_against_reference(name: str, dims: dict[str, int], rng, corpus: str = "uniform"):
    sym = BY_NAME[name]
    spec = S.evaluate(sym, FAMILIES[sym.family], dims)
    inputs = make_inputs(spec, rng, corpus)
    outs = launch(name, dims, inputs)
    ref = reference(name, spec, inputs)
    for b in spec.outputs:
        assert not unwritten(outs[b.name], b.dtype).any(), f"{name}.{b.name}: elements left unwritten"
        got = as_values(outs[b.name], b.dtype)
        if spec.exact:  # exact oracle: the reference rounded to the output dtype, bit for bit
            want = np.asarray(ref[b.name], dtype=np.float64).astype(S.NP_DTYPES[b.dtype]).astype(np.float64)
            assert np.array_equal(got, want, equal_nan=True), f"{name}.{b.name} at {dims} ({corpus}): not exact"
            continue
        ok, why = within(got, ref[b.name], *spec.tolerance[b.name])
        assert ok, f"{name}.{b.name} at {dims} ({corpus}): {why}"
    return spec, inputs, outs


# ---- the checks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_matches_reference_at_qualification_shape(name, rng):
    fam = FAMILIES[BY_NAME[name].family]
    check_against_reference(name, dict(fam.qualify.dims), rng)
    check_against_reference(name, dict(fam.qualify.dims), rng, corpus="logu")


@pytest.mark.parametrize("name", NAMES)
def test_matches_reference_at_odd_shape(name, rng):
    check_against_reference(name, odd_dims(FAMILIES[BY_NAME[name].family]), rng)


@pytest.mark.parametrize("name", NAMES)
def test_five_runs_are_bitwise_equal(name, rng):
    fam = FAMILIES[BY_NAME[name].family]
    dims = odd_dims(fam)
    spec = S.evaluate(BY_NAME[name], fam, dims)
    inputs = make_inputs(spec, rng)
    first = launch(name, dims, inputs)
    for run in range(4):
        assert launch(name, dims, inputs) == first, f"{name}: run {run + 2} differs from run 1"


@pytest.mark.parametrize("name", [n for n in NAMES if FAMILIES[BY_NAME[n].family].qualify.batch_dim])
def test_batch_invariance(name, rng):
    fam = FAMILIES[BY_NAME[name].family]
    bd = fam.qualify.batch_dim
    for dims in (dict(fam.qualify.dims), odd_dims(fam)):
        full = S.evaluate(BY_NAME[name], fam, dims)
        inputs = make_inputs(full, rng)
        outs = launch(name, dims, inputs)
        for size in S.batch_sizes(dims[bd]):
            small_dims = {**dims, bd: size}
            small = S.evaluate(BY_NAME[name], fam, small_dims)
            by_name = {b.name: b for b in small.buffers}
            small_in = {k: S.leading_rows(v, next(b for b in full.buffers if b.name == k), by_name[k])
                        for k, v in inputs.items()}
            small_out = launch(name, small_dims, small_in)
            for b in full.outputs:
                lead = S.leading_rows(np.frombuffer(outs[b.name], dtype=S.NP_DTYPES[b.dtype]), b, by_name[b.name])
                assert small_out[b.name] == lead.tobytes(), f"{name}.{b.name}: {bd}={size} differs from {bd}={dims[bd]}"


@pytest.mark.parametrize("name", NAMES)
def test_misaligned_pointers_take_the_scalar_path_with_the_same_bits(name, rng):
    fam = FAMILIES[BY_NAME[name].family]
    dims = dict(fam.qualify.dims)
    spec = S.evaluate(BY_NAME[name], fam, dims)
    inputs = make_inputs(spec, rng)
    assert launch(name, dims, inputs, offset=1) == launch(name, dims, inputs), name


@pytest.mark.parametrize("pair", [("gate_mul_silu", "gate_mul_silu_v"), ("elementwise_mul", "elementwise_mul_v")])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_scalar_and_vector_siblings_agree_bitwise(pair, dtype, rng):
    scalar, vector = (f"{p}_{dtype}" for p in pair)
    fam = FAMILIES[BY_NAME[vector].family]
    for dims in (dict(fam.qualify.dims), odd_dims(fam)):
        spec = S.evaluate(BY_NAME[vector], fam, dims)
        inputs = make_inputs(spec, rng)
        assert launch(scalar, dims, inputs) == launch(vector, dims, inputs)


def test_rmsnorm_weight_gradient_pipeline(rng):
    """rmsnorm_backward's dw_rows folded by reduce_sum_axis0 equals the float64 weight gradient."""
    dims = {"rows": 513, "dim": 2560}
    fam = FAMILIES["rmsnorm_backward"]
    spec = S.evaluate(BY_NAME["rmsnorm_backward_bf16"], fam, dims)
    inputs = make_inputs(spec, rng)
    outs = launch("rmsnorm_backward_bf16", dims, inputs)
    dw_rows = np.frombuffer(outs["dw_rows"], dtype=np.float32)
    folded = launch("reduce_sum_axis0", {"rows": dims["rows"], "cols": dims["dim"]}, {"in": dw_rows})
    ref = reference("rmsnorm_backward_bf16", spec, inputs)["dw_rows"].reshape(dims["rows"], dims["dim"]).sum(axis=0)
    ok, why = within(as_values(folded["out"], "f32"), ref, 1e-5, 1e-4)
    assert ok, why


def test_the_checks_can_fail(rng):
    """Negative controls: an unlaunched output is reported unwritten; a perturbed output leaves tolerance."""
    raw = bits(empty_device(64, "bf16"))
    assert unwritten(raw, "bf16").all()
    name = "softplus_forward_bf16"
    fam = FAMILIES["softplus_forward"]
    spec, inputs, outs = check_against_reference(name, {"n": 4097}, rng)
    got = as_values(outs["y"], "bf16")
    got[100] = got[100] * 1.05 + 0.05
    ok, _ = within(got, reference(name, spec, inputs)["y"], *spec.tolerance["y"])
    assert not ok
    assert fam.qualify.batch_dim == "n"


def test_launches_see_device_values(rng):
    """A round trip through the helpers: what the kernels read is what the host rounded (bf16 bit patterns)."""
    x = rng.uniform(-3, 3, 1000)
    assert np.array_equal(from_device(to_device(x, "bf16"), "bf16"), S.as_f64(x.astype(S.NP_DTYPES["bf16"]), "bf16"))
