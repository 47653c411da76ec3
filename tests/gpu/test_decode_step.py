"""GPU checks for the decode-step candidates (family ssm_step_forward_fused_v, kernels/include/mf/decode.cuh); H200.

Built with the rest of the scan module (tests/gpu/test_scan.py's ScanOps: a one-module catalog over kernels/fixed,
capacity 64). Per candidate symbol:
  * fresh random inputs (the catalog fills), outputs poisoned with 0xFF, the state updated in place: every output
    element written and within tolerance of the float64 reference (f32 2e-5, bf16/f16 1e-2 normwise), at batch
    1, 3 and 256 and d_state 16, 32 (the vector path) and 10, 35 (the general path; 10 with an x_dbl row that is
    not 16-byte aligned);
  * five runs bitwise equal;
  * batch invariance: a row's out and state, launched alone (batch 1), equal that row in a batch-256 launch bit
    for bit, for the first, second, third and last rows (every position of a ROWS=2 row group);
  * the vector path and the general path give the same bits for the same values (x_dbl restrided);
  * within tolerance of the current kernel ssm_step_forward_fused_<dtype> on the same inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_scan (ScanOps)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from test_scan import ScanOps  # noqa: E402

from mamba_forge.catalog.model import default_catalog_path, load_catalog  # noqa: E402
from mamba_forge.qualify import fills  # noqa: E402
from mamba_forge.qualify import spec as S  # noqa: E402
from mamba_forge.references import scan as ref  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {"f32": 2e-5, "bf16": 1e-2, "f16": 1e-2}
FAMILY = "ssm_step_forward_fused_v"
ROW_BUFFERS = ("out", "state", "u", "dt", "x_dbl", "z")  # [batch, ...] buffers; the others are per channel


def _candidates() -> list[str]:
    fixed = load_catalog(default_catalog_path()).module("Fixed")
    return sorted(s.name for s in fixed.symbols if s.family == FAMILY)


CANDIDATES = _candidates()


@pytest.fixture(scope="module")
def ops():
    return ScanOps(64)


def _dims(batch, d_state, dt_rank=None, d_inner=256):
    return {"batch": batch, "d_inner": d_inner, "d_state": d_state,
            "dt_rank": dt_rank if dt_rank is not None else (16 if d_state % 16 == 0 else 13),
            "z_pad": d_inner if batch % 2 else 0}  # z in place in xz-like rows, or dense


def _inputs(spec, rng):
    return {b.name: fills.make_input(b, "uniform", rng) for b in spec.buffers if b.needs_fill}


def _want(spec, host):
    args = {b.name: S.as_f64(host[b.name], b.dtype) for b in spec.buffers if b.name in host}
    return ref.ssm_step_forward_fused(args, spec.dims)


def _close(got, want, dtype, what):
    assert np.all(np.isfinite(got)), f"{what}: unwritten or non-finite at {np.flatnonzero(~np.isfinite(got))[:8]}"
    err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
    assert err <= TOL[dtype], f"{what}: normwise error {err:.3e} > {TOL[dtype]:.0e}"


def _dtype(name):
    return name.rsplit("_", 1)[1]


def test_candidates_admitted(ops):
    v = ops.verdicts()
    assert CANDIDATES and all(n in v for n in CANDIDATES)
    bad = {n: v[n].reason for n in CANDIDATES if v[n].status != "admitted"}
    assert not bad


@pytest.mark.parametrize("d_state,dt_rank", [(16, 16), (32, 16), (10, 13), (35, 13)])
@pytest.mark.parametrize("batch", [1, 3, 256])
@pytest.mark.parametrize("name", CANDIDATES)
def test_candidate_matches_reference_and_repeats(ops, name, batch, d_state, dt_rank):
    seed = int.from_bytes(np.random.bytes(4), "little")
    rng = np.random.default_rng(seed)
    spec = ops.spec(name, _dims(batch, d_state, dt_rank))
    host = _inputs(spec, rng)
    got = ops.run_spec(spec, host)
    want = _want(spec, host)
    for b in spec.outputs:
        _close(got[b.name], want[b.name], b.dtype, f"{name} {b.name} (seed {seed}, dims {spec.dims})")
    first = {k: v.tobytes() for k, v in got.items()}
    for _ in range(4):
        assert ops.run_bits(spec, host) == first, f"{name}: a repeated run differs (seed {seed})"


def _row(host, spec, k):
    """Row k of a launch's inputs as a batch-1 launch's inputs."""
    nb = spec.dims["batch"]
    out = {}
    for b in spec.buffers:
        if b.name not in host:
            continue
        out[b.name] = host[b.name].reshape(nb, -1)[k].copy() if b.name in ROW_BUFFERS else host[b.name]
    return out


@pytest.mark.parametrize("d_state", [16, 35])
@pytest.mark.parametrize("name", CANDIDATES)
def test_a_row_alone_equals_the_row_in_a_full_batch(ops, name, d_state):
    rng = np.random.default_rng(17 + d_state)
    full = ops.spec(name, _dims(256, d_state))
    host = _inputs(full, rng)
    got = ops.run_spec(full, host)
    one = ops.spec(name, _dims(1, d_state))
    for k in (0, 1, 2, 255):
        alone = ops.run_spec(one, _row(host, full, k))
        for b in full.outputs:
            assert got[b.name].reshape(256, -1)[k].tobytes() == alone[b.name].tobytes(), \
                f"{name} {b.name}: row {k} alone differs from row {k} of batch 256"


@pytest.mark.parametrize("name", CANDIDATES)
def test_vector_and_general_paths_agree_bitwise(ops, name):
    """The same values through the vector path (x_dbl stride 16 + 2*32) and the general path (stride 17 + 2*32:
    B and C rows not aligned)."""
    rng = np.random.default_rng(5)
    vec = ops.spec(name, _dims(3, 32, 16))
    gen = ops.spec(name, _dims(3, 32, 17))
    host = _inputs(vec, rng)
    hg = dict(host)
    x = host["x_dbl"].reshape(3, 16 + 64)
    xg = np.zeros((3, 17 + 64), dtype=x.dtype)
    xg[:, 17:] = x[:, 16:]
    hg["x_dbl"] = xg.ravel()
    a, b = ops.run_spec(vec, host), ops.run_spec(gen, hg)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), f"{name} {k}: the general path differs from the vector path"


@pytest.mark.parametrize("name", CANDIDATES)
def test_candidate_close_to_the_current_kernel(ops, name):
    rng = np.random.default_rng(23)
    dims = _dims(64, 16, 128, d_inner=2048)
    spec = ops.spec(name, dims)
    cur = ops.spec(f"ssm_step_forward_fused_{_dtype(name)}", dims)
    host = _inputs(spec, rng)
    a, b = ops.run_spec(spec, host), ops.run_spec(cur, host)
    for buf in spec.outputs:
        _close(a[buf.name], b[buf.name], buf.dtype, f"{name} vs the current kernel: {buf.name}")
