"""gpu/tma.py's row stride for A (runtime/gemm.py's row-strided A) on the CPU: cuTensorMapEncodeTiled is replaced by a
recorder (the real cuda-bindings types, no driver) whose 128 bytes spell every argument it was given. A map built
with A's row stride differs from the dense map only in globalStrides (lda * element size); without one (or with the
stride equal to the columns) every hook builds exactly the dense map, whose stride is the columns' bytes, as before
the argument existed; a stride the TMA cannot take is refused before the driver is asked."""

from __future__ import annotations

import struct
import types

import pytest

from mamba_forge.gpu import core, tma

PTRS = {"A": 0x7000_0000, "B": 0x7100_0000, "C": 0x7200_0000}


@pytest.fixture
def driver(monkeypatch):
    """A copy of cuda.bindings.driver whose cuTensorMapEncodeTiled records its arguments as plain ints and returns
    an opaque map holding them: (address, dims, strides, box, element strides, dtype, interleave, swizzle, L2, fill,
    rank)."""
    real = core.bindings()
    drv = types.ModuleType("cuda.bindings.driver")
    drv.__dict__.update(real.__dict__)
    calls = []

    def encode(dtype, rank, ptr, dims, strides, box, elem, interleave, swizzle, l2, fill):
        args = {"ptr": ptr, "dims": [int(d) for d in dims], "strides": [int(s) for s in strides],
                "box": [int(b) for b in box], "elem": [int(e) for e in elem], "rest": [int(dtype), rank,
                int(interleave), int(swizzle), int(l2), int(fill)]}
        calls.append(args)
        flat = [ptr, *args["dims"], *args["strides"], *args["box"], *args["elem"], *args["rest"]]
        return real.CUresult.CUDA_SUCCESS, types.SimpleNamespace(opaque=flat + [0] * (16 - len(flat)))

    drv.cuTensorMapEncodeTiled = encode
    monkeypatch.setattr(tma, "bindings", lambda: drv)
    return calls


def test_a_dense_map_is_the_columns_stride_and_an_explicit_dense_stride_changes_nothing(driver):
    dense = tma.encode_2d(PTRS["A"], 5, 64, "A")
    (args,) = driver
    assert args["dims"] == [64, 5] and args["strides"] == [128] and args["box"] == [64, 64]
    assert tma.encode_2d(PTRS["A"], 5, 64, "A", row_stride=None) == dense
    assert tma.encode_2d(PTRS["A"], 5, 64, "A", row_stride=64) == dense  # lda = K: the dense map, byte for byte
    assert driver[1] == driver[2] == args
    assert struct.unpack("<16Q", dense)[:4] == (PTRS["A"], 64, 5, 128)  # the bytes are what the driver gave


@pytest.mark.parametrize("lda", [96, 192, 1 << 20])
def test_a_strided_map_differs_only_in_its_row_stride(driver, lda):
    dense = tma.encode_2d(PTRS["A"], 2048, 64, "A")
    strided = tma.encode_2d(PTRS["A"], 2048, 64, "A", row_stride=lda)
    d, s = driver
    assert s["strides"] == [lda * 2] and d["strides"] == [128]
    assert {k: v for k, v in s.items() if k != "strides"} == {k: v for k, v in d.items() if k != "strides"}
    assert s["dims"] == [64, 2048]  # the map keeps A's columns: the TMA reads only [0, K) of each row
    assert strided != dense
    f32 = tma.encode_2d_f32(PTRS["A"], 4, 64, "A", row_stride=lda)
    box = tma.encode_2d_box(PTRS["A"], 4, 64, 40, 128, 2, "A", row_stride=lda)
    assert driver[2]["strides"] == [lda * 4] and driver[3]["strides"] == [lda * 2]
    assert f32 != box


# every hook a signed record may name, at qualification-like dims; A's stored columns (K, or M for tn)
HOOK_DIMS = {
    "prepare_gemm_nn": ({"M": 5, "N": 64, "K": 64}, "K"),
    "prepare_gemm_nn_skinny": ({"M": 5, "N": 64, "K": 64, "BM": 64, "BN": 32}, "K"),
    "prepare_gemm_nt": ({"M": 5, "N": 64, "K": 64}, "K"),
    "prepare_gemm_tn": ({"M": 8, "N": 64, "K": 40}, "M"),
    "prepare_gemm_nn_tmastore": ({"M": 5, "N": 64, "K": 64}, "K"),
    "prepare_gemm_nt_tmastore": ({"M": 5, "N": 64, "K": 64}, "K"),
    "prepare_gemm_tn_tmastore": ({"M": 8, "N": 64, "K": 40}, "M"),
    "prepare_padded_tiles_16bit": ({"M": 5, "N": 64, "K": 64, "BM": 64, "BN": 64, "BK": 32}, "K"),
    "prepare_padded_tiles_f32": ({"M": 5, "N": 64, "K": 64, "BM": 64, "BN": 64, "BK": 32}, "K"),
    "prepare_gemm_nt_tf32": ({"M": 5, "N": 64, "K": 64}, "K"),
}


def test_the_table_covers_every_hook():
    assert set(HOOK_DIMS) == set(tma.TENSOR_MAP_HOOKS)


@pytest.mark.parametrize("hook", sorted(HOOK_DIMS))
def test_every_hook_takes_a_row_stride_for_a_and_builds_the_dense_maps_without_one(driver, hook):
    dims, a_cols = HOOK_DIMS[hook]
    fn = tma.TENSOR_MAP_HOOKS[hook]
    eb = 4 if hook.endswith(("_f32", "_tf32")) else 2
    dense = fn(PTRS, {}, dims)
    first = list(driver)
    # the qualifier's maps: every matrix dense, each row stride its columns' bytes (the code before lda existed)
    assert all(c["strides"] == [c["dims"][0] * eb] for c in first), first
    assert fn(PTRS, {}, {**dims, tma.A_ROW_STRIDE: dims[a_cols]}) == dense  # lda = A's columns: the same bytes
    del driver[:]
    lda = dims[a_cols] + 32
    strided = fn(PTRS, {}, {**dims, tma.A_ROW_STRIDE: lda})
    assert set(strided) == set(dense)
    for name in dense:
        if name != "tmA":
            assert strided[name] == dense[name], name  # B's and C's maps untouched
    (a_dense,) = [c for c in first if c["ptr"] == PTRS["A"]]
    (a_strided,) = [c for c in driver if c["ptr"] == PTRS["A"]]
    assert a_strided["strides"] == [lda * eb] and strided["tmA"] != dense["tmA"]
    assert {k: v for k, v in a_strided.items() if k != "strides"} == {k: v for k, v in a_dense.items() if k != "strides"}


@pytest.mark.parametrize("lda,match", [
    (32, "row stride 32 elements is below its 64 columns"),
    (68, "row stride 68 elements x 2 bytes is not a multiple of 16"),
    (1 << 39, "below 2\\*\\*40"),
    (96.0, "row stride must be an integer"),
    (True, "row stride must be an integer"),
])
def test_a_row_stride_the_tma_cannot_take_is_refused_before_the_driver(driver, lda, match):
    with pytest.raises(tma.TmaError, match=match):
        tma.encode_2d(PTRS["A"], 4, 64, "A", row_stride=lda)
    with pytest.raises(tma.TmaError, match="^A.*" + match):  # A's map, named
        tma.prepare_gemm_nn(PTRS, {}, {"M": 4, "N": 64, "K": 64, tma.A_ROW_STRIDE: lda})
    assert driver == []  # nothing reached the driver (the hook refuses A before it encodes B)


def test_an_f32_row_stride_is_a_multiple_of_four_elements(driver):
    with pytest.raises(tma.TmaError, match="row stride 66 elements x 4 bytes is not a multiple of 16"):
        tma.encode_2d_f32(PTRS["A"], 4, 64, "A", row_stride=66)
    tma.encode_2d_f32(PTRS["A"], 4, 64, "A", row_stride=68)
    assert driver[0]["strides"] == [272]


def test_a_strided_matrix_needs_only_its_stride_aligned():
    """With a row stride, the columns need not fill 16 bytes (the stride is the TMA's rule); the GEMM's own
    K % 8 rule (check_gemm) still holds for every rung."""
    tma.check_matrix(PTRS["A"], 4, 13, "A", 2, row_stride=16)
    with pytest.raises(tma.TmaError, match="contiguous extent"):
        tma.check_matrix(PTRS["A"], 4, 13, "A", 2)
    with pytest.raises(tma.TmaError, match="K = 13"):
        tma.gemm_tensor_maps("nn", PTRS["A"], PTRS["B"], 4, 64, 13, a_row_stride=16)


# ---- the short A box of the SHORT_A decode rungs (kernels/sm90a/wgmma.cu, mf::short_a_rows) ----


@pytest.mark.parametrize("m,rows", [(1, 8), (7, 8), (8, 8), (9, 16), (17, 24), (63, 64), (64, 64), (65, 64),
                                    (1000, 64)])
def test_short_a_box_rows_are_m_rounded_up_to_8_below_64(m, rows):
    assert tma.skinny_a_box_rows(m) == rows


def test_the_skinny_hook_builds_a_short_a_box_only_for_a_short_a_instance(driver):
    dims = {"M": 3, "N": 256, "K": 128, "BN": 128}
    plain = tma.prepare_gemm_nn_skinny(PTRS, {}, dims)
    short = tma.prepare_gemm_nn_skinny(PTRS, {}, {**dims, "SHORT_A": 1})
    a_plain, b_plain, a_short, b_short = driver
    assert a_plain["box"] == [64, 64] and a_short["box"] == [64, 8]  # (columns, rows): only the rows differ
    assert {k: v for k, v in a_short.items() if k != "box"} == {k: v for k, v in a_plain.items() if k != "box"}
    assert b_short == b_plain and short["tmB"] == plain["tmB"] and short["tmA"] != plain["tmA"]
    tma.prepare_gemm_nn_skinny(PTRS, {}, {**dims, "M": 64, "SHORT_A": 1})  # a whole tile of rows: the 64-row box
    assert driver[-2]["box"] == [64, 64]


@pytest.mark.parametrize("rows", [0, 4, 12, 72, 64.0, True])
def test_an_a_box_height_the_kernels_do_not_count_is_refused(driver, rows):
    with pytest.raises(tma.TmaError, match="rows not supported"):
        tma.encode_2d(PTRS["A"], 5, 64, "A", box_rows=rows)
    assert driver == []


def test_a_short_a_box_is_for_the_nn_layout_only(driver):
    with pytest.raises(tma.TmaError, match="NN layout only"):
        tma.gemm_tensor_maps("tn", PTRS["A"], PTRS["B"], 8, 64, 64, a_box_rows=8)
    assert driver == []
