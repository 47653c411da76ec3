"""Host emulation of transpose_rows (kernels/fixed/elementwise.cu): the whole-tile 32-bit word path (two 16-bit
elements a word) and the per-element path (edge tiles, odd strides or offsets) against the float64 reference, raw
bits, with out's padding poisoned and kept. elementwise.cu is compiled by g++ against the CUDA mock of
tests/host_emulation.py (one std::thread per CUDA thread); the GPU test (tests/gpu/test_training_gpu.py) runs the
same cases on the device."""

from __future__ import annotations

import numpy as np
import pytest
from test_reference_contracts_emulated import compile_fixed

from mamba_forge.references import elementwise as re_

_NAMES = ["transpose_rows_f32", "transpose_rows_bf16"]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return compile_fixed(tmp_path_factory.mktemp("transpose-emu"), "elementwise.cu", _NAMES)


def _run(lib, name, out, out_off, src, src_off, batch, rows, cols, ld_in, ld_out):
    import ctypes

    grid = ((cols + 63) // 64, (rows + 63) // 64, batch)
    keep, argv = [], (ctypes.c_void_p * 7)()
    vals = [ctypes.c_void_p(out.ctypes.data + out_off * out.itemsize),
            ctypes.c_void_p(src.ctypes.data + src_off * src.itemsize),
            *(ctypes.c_int64(v) for v in (batch, rows, cols, ld_in, ld_out))]
    for i, v in enumerate(vals):
        keep.append(v)
        argv[i] = ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
    assert lib.run(name.encode(), (ctypes.c_int * 3)(*grid), (ctypes.c_int * 3)(256, 1, 1), argv) == 0


# (batch, rows, cols, in_pad, out_pad, src offset, out offset): whole tiles in words; an odd out stride; an odd
# source offset (a column slice at an odd column); edge tiles only
CASES = [(2, 128, 64, 64, 64, 64, 0), (1, 130, 75, 75, 7, 0, 0), (2, 64, 64, 1, 0, 1, 0), (1, 17, 5, 0, 2, 0, 3)]


@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}r{c[1]}c{c[2]}p{c[3]}.{c[4]}o{c[5]}.{c[6]}" for c in CASES])
@pytest.mark.parametrize("name", _NAMES)
def test_transpose_rows_emulated_matches_the_reference(emu, name, case):
    batch, rows, cols, in_pad, out_pad, s_off, o_off = case
    ld_in, ld_out = cols + in_pad, rows + out_pad
    n_in, n_out = (batch * rows - 1) * ld_in + cols, (batch * cols - 1) * ld_out + rows
    rng = np.random.default_rng(sum(case))
    bits = np.uint16 if name.endswith("bf16") else np.uint32
    src = rng.integers(0, np.iinfo(bits).max, s_off + n_in + 5, dtype=np.uint64).astype(bits)
    out = np.full(o_off + n_out + 5, 0xFFFF, bits)  # poisoned: padding and past-the-end must keep it
    before = out.copy()
    _run(emu, name, out, o_off, src, s_off, batch, rows, cols, ld_in, ld_out)
    want = re_.transpose_rows({"src": src[s_off:].astype(np.float64), "out": before[o_off:].astype(np.float64),
                               "batch": batch, "rows": rows, "cols": cols, "ld_in": ld_in, "ld_out": ld_out}, {})["out"]
    assert np.array_equal(out[o_off:o_off + n_out].astype(np.float64), want)
    assert np.array_equal(out[:o_off], before[:o_off]) and np.array_equal(out[o_off + n_out:], before[o_off + n_out:])


def test_transpose_rows_emulated_comparison_catches_a_misplaced_element(emu):
    """The negative control: one element moved (the kernel's output with a swapped pair) fails the comparison."""
    batch, rows, cols = 1, 64, 64
    src = np.arange(rows * cols, dtype=np.uint16)
    out = np.zeros(rows * cols, np.uint16)
    _run(emu, "transpose_rows_bf16", out, 0, src, 0, batch, rows, cols, cols, rows)
    want = re_.transpose_rows({"src": src.astype(np.float64), "out": np.zeros(rows * cols), "batch": 1, "rows": rows,
                               "cols": cols, "ld_in": cols, "ld_out": rows}, {})["out"]
    assert np.array_equal(out.astype(np.float64), want)
    out[[0, 1]] = out[[1, 0]]
    assert not np.array_equal(out.astype(np.float64), want)
