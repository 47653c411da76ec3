"""GPU checks for the conv1d candidates (families conv1d_fwd_v, conv1d_fwd_nosave_v, conv1d_fwd_acc32_v,
conv1d_fwd_nosave_acc32_v, conv1d_bwd_v and conv1d_bwd_dpre32_v in kernels/fixed/conv1d.toml; templates conv1d_fwd_v / conv1d_bwd_v in conv1d.cu); H200.

The candidates exist so that a production family (conv1d_burnin_forward_tiled, ..._nosave_tiled, conv1d_bwd_tiled)
can switch to the fastest layout without changing a bit. Launched from their catalog spec through
tests/gpu/test_conv_optim.py's helpers (fresh random inputs, the seed printed; outputs poisoned with 0xFF). Checked
per candidate symbol, every dtype, widths 1..4:
  * within tolerance of the float64 reference, every element written, at the qualification shape (d = 64) and at edges
    (L % 8 != 0, L < one chunk, L a multiple of the tile, d odd), uniform / logu / special corpora;
  * forwards: out (and pre) bit for bit those of the production forward, at the declared grid, at a small grid
    (3 blocks: every block walks many jobs, so the pipelined path runs) and with misaligned pointers (scalar
    path); pre == the host walk of the contract;
  * backward (f64 dpre): dx bit for bit the production backward's; at BLOCK 128 dweight/dbias too, at other
    blocks within 1e-6 (another per-thread partition of the same f64 sums);
  * backward (f32 dpre): within the family's tolerance of the float64 reference and dx within the dtype's
    tolerance of production; its dweight NOT bitwise production's (negative control: the bitwise check sees a
    difference when there is one);
  * f32-accumulating forwards (conv1d_fwd_acc32_v, conv1d_fwd_nosave_acc32_v): within tolerance of the float64
    reference; nosave out == save out; grid and alignment independent; NOT the f64 contract's pre (negative control);
  * five runs bitwise equal; the result does not depend on the grid (grid-stride walks).
The generic conv1d checks of tests/gpu/test_conv_optim.py (batch invariance, width outside 1..4 writes nothing,
misaligned == aligned) run on these symbols too: they are conv1d_* symbols of conv1d.toml.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_conv_optim (launch helpers)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import kernels  # noqa: E402
from test_conv_optim import (  # noqa: E402
    BY_NAME,
    FAMILIES,
    check_against_reference,
    launch,
    make_inputs,
    rng,  # noqa: F401  (the seeded-rng fixture)
    spec_of,
    values,
)

from mamba_forge.qualify import spec as S  # noqa: E402
from mamba_forge.references import conv1d as rc  # noqa: E402

pytestmark = pytest.mark.gpu

FWD = {"conv1d_fwd_v": "conv1d_burnin_forward_tiled", "conv1d_fwd_nosave_v": "conv1d_burnin_forward_nosave_tiled"}
BWD64, BWD32 = "conv1d_bwd_v", "conv1d_bwd_dpre32_v"
ACC32 = {"conv1d_fwd_acc32_v": "conv1d_fwd_nosave_acc32_v"}  # f32-accumulating forwards: save -> nosave family
CANDIDATES = sorted(n for n, s in BY_NAME.items() if s.family in (*FWD, BWD64, BWD32, *ACC32, *ACC32.values()))
ACC32_SAVE_NAMES = sorted(n for n, s in BY_NAME.items() if s.family in ACC32)
FWD_NAMES = [n for n in CANDIDATES if BY_NAME[n].family in FWD]
BWD64_NAMES = [n for n in CANDIDATES if BY_NAME[n].family == BWD64]
BWD32_NAMES = [n for n in CANDIDATES if BY_NAME[n].family == BWD32]
NP_T = {"f32": np.float32, "bf16": S.NP_DTYPES["bf16"], "f16": np.float16}
# (batch, d, L): several tiles with a ragged end, L < one 16-byte chunk, a multiple of every tile, d odd
EDGES = [(3, 7, 2053), (1, 3, 3), (2, 5, 6144), (2, 9, 4096 + 24), (1, 2, 8 * 1024 + 7)]


def dtype_of(name: str) -> str:
    return name.rsplit("_", 1)[1]


def production(name: str) -> str:
    fam = BY_NAME[name].family
    base = FWD.get(fam, "conv1d_bwd_tiled")
    return f"{base}_{dtype_of(name)}"


def block_of(name: str) -> int:
    return BY_NAME[name].block[0]


def test_there_are_candidates_and_all_are_admitted():
    assert len(FWD_NAMES) >= 6 and BWD64_NAMES and BWD32_NAMES
    k = kernels()
    bad = {n: k.verdict(n).reason for n in CANDIDATES if k.verdict(n).status != "admitted"}
    assert not bad, bad


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("name", CANDIDATES)
def test_candidate_matches_float64_reference(name, width, rng):  # noqa: F811
    # (the qualification shape, widths 1..4, runs in test_conv_optim.py's test_conv_matches_reference)
    q = dict(FAMILIES[BY_NAME[name].family].qualify.dims, width=width, d=64)
    check_against_reference(name, q, rng)
    for corpus in ("logu", "special"):
        b, d, L = EDGES[0]
        check_against_reference(name, {"batch": b, "d": d, "L": L, "width": width}, rng, corpus)
    for b, d, L in EDGES[1:]:
        check_against_reference(name, {"batch": b, "d": d, "L": L, "width": width}, rng)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("name", FWD_NAMES)
def test_forward_candidate_is_production_bitwise(name, width, rng):  # noqa: F811
    prod = production(name)
    for b, d, L in EDGES + [(2, 64, 6144)]:
        dims = {"batch": b, "d": d, "L": L, "width": width}
        for corpus in ("uniform", "special"):
            inputs = make_inputs(spec_of(prod, dims), rng, corpus)
            want = launch(prod, dims, inputs)
            assert launch(name, dims, inputs) == want, f"{name} != {prod} at {dims} ({corpus})"
            assert launch(name, dims, inputs, grid=(3,)) == want, f"{name} on 3 blocks != {prod} at {dims}"
            assert launch(name, dims, inputs, offset=1) == want, f"{name} misaligned != {prod} at {dims}"
        if "pre" in want:  # the saving forward: pre is the contract's host walk
            x = inputs["x"].reshape(b, d, L).astype(np.float32)
            walk = rc.conv1d_pre_kernel_walk(x, inputs["weight"], inputs["bias"], width).astype(NP_T[dtype_of(name)])
            assert want["pre"] == walk.tobytes()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("name", BWD64_NAMES)
def test_backward_candidate_is_production(name, width, rng):  # noqa: F811
    prod = production(name)
    for b, d, L in [(2, 33, 4100), (3, 8, 2048), (1, 3, 3), (2, 5, 8 * 512 * 3 + 5)]:
        dims = {"batch": b, "d": d, "L": L, "width": width}
        for corpus in ("uniform", "special"):
            inputs = make_inputs(spec_of(prod, dims), rng, corpus)
            want = launch(prod, dims, inputs)
            for got in (launch(name, dims, inputs), launch(name, dims, inputs, grid=(3,)),
                        launch(name, dims, inputs, offset=1)):
                assert got["dx"] == want["dx"], f"{name} dx != {prod} at {dims} ({corpus})"
                if block_of(name) == 128:  # the same per-thread partition: the same sums
                    assert got["dweight"] == want["dweight"] and got["dbias"] == want["dbias"]
                elif corpus == "uniform":
                    for out in ("dweight", "dbias"):
                        np.testing.assert_allclose(values(got[out], "f32"), values(want[out], "f32"), rtol=1e-6,
                                                   atol=1e-7, err_msg=f"{name}.{out} vs {prod} at {dims}")


@pytest.mark.parametrize("name", BWD32_NAMES)
def test_f32_dpre_backward_is_close_to_production_and_not_bitwise(name, rng):  # noqa: F811
    prod = production(name)
    dt = dtype_of(name)
    dims = {"batch": 2, "d": 256, "L": 2048, "width": 4}
    inputs = make_inputs(spec_of(prod, dims), rng)
    got, want = launch(name, dims, inputs), launch(prod, dims, inputs)
    rt, at = S.TOLERANCES[dt]
    np.testing.assert_allclose(values(got["dx"], dt), values(want["dx"], dt), rtol=rt, atol=at)
    assert got["dweight"] != want["dweight"], "f32 dpre gave production's f64-dpre dweight bit for bit"


@pytest.mark.parametrize("name", ACC32_SAVE_NAMES)
def test_f32_accumulating_forward_nosave_equals_save_and_differs_from_f64(name, rng):  # noqa: F811
    nosave = name.replace("conv1d_fwd_acc32_v", "conv1d_fwd_nosave_acc32_v")
    prod = f"conv1d_burnin_forward_tiled_{dtype_of(name)}"
    for b, d, L in EDGES + [(2, 64, 6144)]:
        dims = {"batch": b, "d": d, "L": L, "width": 4}
        inputs = make_inputs(spec_of(name, dims), rng)
        save = launch(name, dims, inputs)
        assert launch(nosave, dims, inputs)["out"] == save["out"], f"{nosave} out != {name} out at {dims}"
        assert launch(name, dims, inputs, grid=(3,)) == save and launch(name, dims, inputs, offset=1) == save
    # negative control (786k outputs): f32 accumulation is not the f64 contract's bits
    assert save["pre"] != launch(prod, dims, inputs)["pre"], f"{name}: f32 accumulation gave the f64 bits"


@pytest.mark.parametrize("name", CANDIDATES)
def test_candidate_five_runs_and_any_grid_bitwise_equal(name, rng):  # noqa: F811
    b, d, L = EDGES[0]
    dims = {"batch": b, "d": d, "L": L, "width": 4}
    inputs = make_inputs(spec_of(name, dims), rng)
    first = launch(name, dims, inputs)
    for run in range(4):
        assert launch(name, dims, inputs) == first, f"{name}: run {run + 2} differs from run 1"
    for grid in ((1,), (2,), (5,)):
        assert launch(name, dims, inputs, grid=grid) == first, f"{name}: grid {grid} differs from the declared grid"
