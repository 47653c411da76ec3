"""Host side of the TMA GEMM kernels: CUtensorMap descriptors (cuTensorMapEncodeTiled).

Every wgmma GEMM symbol (kernels/sm90a/wgmma.cu) reads A and B through 2-D tiled tensor maps, one per matrix,
all of one format: a row-major matrix of 16-bit elements (bf16 or f16: the copy does not look at the values, and
out-of-bounds elements are filled with zero bits = +0.0 in both), a 64 x 64 element box, 128-byte swizzle. The
kernel receives each map by value as a 128-byte, 64-aligned parameter (``const __grid_constant__ mf::TmaDesc``):
launch with ``("bytes", map)`` entries of :class:`mamba_forge.gpu.driver.PackedParams`, aligned TMA_DESC_ALIGN.

What the TMA path supports, and what is refused here before the driver is asked:
* any M, N, K >= 1 with the matrices' contiguous extents a multiple of 8 elements (global row strides must be
  multiples of 16 bytes): NN (A: M x K, B: K x N) needs K % 8 == 0 and N % 8 == 0; NT (A: M x K, B: N x K) needs
  K % 8 == 0 and N % 8 == 0 (C's rows are stored in 4-byte pairs); TN (A: K x M, B: K x N) needs M % 8 == 0 and
  N % 8 == 0. Ragged edges inside those rules (M, N not multiples of the tile, K not a multiple of 64) are
  handled by the hardware's zero fill;
* base addresses 16-byte aligned; dimensions below 2**31 (the kernel's coordinates are 32-bit signed);
* A read through a row stride (``a_row_stride`` of the map helpers; the prepare hooks take it as
  ``dims["lda"]``, A_ROW_STRIDE): A as stored is a rows x cols view of a wider row-major matrix, lda elements
  apart, lda >= cols and lda * element bytes a multiple of 16 (below 2**40 bytes). Only the map's globalStrides
  changes: its dimensions stay A's (rows, cols), so the TMA reads only columns [0, cols) of each row (a box
  reaching past them is zero-filled, as at any edge) and the kernel's arithmetic and bits are the dense A's.
  Absent (None), the stride is the columns: every map is byte for byte what it is without the argument.

One exception to the 64 x 64 box: the skinny-M NN rungs with BN = 32 (gemm_bi_nn_sm90a_wgmma_skinny_m64n32_*) read
B through a 32 (columns) x 64 (rows) box with 64-byte swizzle (``box_cols=32``; ``b_box_cols`` of the GEMM helpers,
``skinny_b_box_cols(BN)`` picks it). Every other map keeps the default 64-wide, 128-byte-swizzled box.

Standard library + cuda-bindings only (the qualifier calls the prepare hooks; the driver is imported on use).
"""

from __future__ import annotations

import struct

from mamba_forge.core.vocab import LAYOUTS
from mamba_forge.gpu.core import bindings

TMA_DESC_BYTES = 128
TMA_DESC_ALIGN = 64
BOX = 64  # elements per box side: 64 16-bit elements = one 128-byte swizzle row
ELEMENT_BYTES = 2
MAX_DIM = 2**31 - 1
MAX_STRIDE_BYTES = 2**40  # cuTensorMapEncodeTiled: every global stride below 2**40 bytes
A_ROW_STRIDE = "lda"  # the prepare hooks' dims key for A's row stride in elements (absent: dense, the columns)


class TmaError(ValueError):
    """A matrix or GEMM shape the TMA path cannot describe; the message names the rule."""


def _check_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TmaError(f"{name} must be an integer, got {v!r}")
    return v


def check_matrix(ptr: int, rows: int, cols: int, name: str = "matrix", element_bytes: int = ELEMENT_BYTES,
                 row_stride: int | None = None) -> None:
    """Refuse a row-major matrix of 2-byte (default) or 4-byte elements a tensor map cannot describe; row_stride:
    elements from one row to the next (None: cols, a dense matrix)."""
    if element_bytes not in (2, 4):
        raise TmaError(f"{name}: {element_bytes}-byte elements not supported (2 or 4)")
    ptr, rows, cols = _check_int(f"{name} address", ptr), _check_int(f"{name} rows", rows), _check_int(f"{name} cols", cols)
    if ptr <= 0 or ptr % 16:
        raise TmaError(f"{name}: base address {ptr:#x} is not a 16-byte aligned device address")
    if not (1 <= rows <= MAX_DIM and 1 <= cols <= MAX_DIM):
        raise TmaError(f"{name}: shape {rows} x {cols} out of range (each dimension 1..{MAX_DIM})")
    if row_stride is None:
        if (cols * element_bytes) % 16:
            raise TmaError(
                f"{name}: row stride {cols} elements x {element_bytes} bytes is not a multiple of 16 bytes "
                f"(the contiguous extent must be a multiple of {16 // element_bytes})"
            )
        return
    lda = _check_int(f"{name} row stride", row_stride)
    if lda < cols:
        raise TmaError(f"{name}: row stride {lda} elements is below its {cols} columns (the rows would overlap)")
    if (lda * element_bytes) % 16 or lda * element_bytes >= MAX_STRIDE_BYTES:
        raise TmaError(f"{name}: row stride {lda} elements x {element_bytes} bytes is not a multiple of 16 bytes "
                       f"below 2**40 (lda must be a multiple of {16 // element_bytes})")


def _encode_tiled(ptr: int, rows: int, cols: int, element_bytes: int, dtype: str, box: tuple[int, int],
                  swizzle: str, l2: str, name: str, row_stride: int | None = None) -> bytes:
    """The one cuTensorMapEncodeTiled call (callers check the matrix first): a 2-D row-major matrix whose rows are
    row_stride elements apart (None: cols, dense), box = (columns, rows), zero fill outside the matrix; the map's
    128 bytes."""
    drv = bindings()
    err, tmap = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{dtype}"),
        2,
        ptr,
        [drv.cuuint64_t(cols), drv.cuuint64_t(rows)],  # innermost dimension first
        [drv.cuuint64_t((cols if row_stride is None else row_stride) * element_bytes)],  # dimension 1's, in bytes
        [drv.cuuint32_t(box[0]), drv.cuuint32_t(box[1])],
        [drv.cuuint32_t(1), drv.cuuint32_t(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
        getattr(drv.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_L2_{l2}"),
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # NONE = zero fill
    )
    if err != drv.CUresult.CUDA_SUCCESS:
        raise TmaError(f"{name}: cuTensorMapEncodeTiled failed with {err!r} for {rows} x {cols} {dtype} at "
                       f"{ptr:#x}, box {box[0]} x {box[1]}")
    raw = struct.pack("<16Q", *(int(v) for v in tmap.opaque))
    assert len(raw) == TMA_DESC_BYTES
    return raw


def operand_shapes(layout: str, M: int, N: int, K: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, cols) of A and B as stored, row-major, for a layout of C[M,N] = op(A) op(B)."""
    if layout not in LAYOUTS:
        raise TmaError(f"unknown GEMM layout {layout!r} (known: {', '.join(LAYOUTS)})")
    a = (M, K) if layout in ("nn", "nt") else (K, M)
    b = (K, N) if layout in ("nn", "tn") else (N, K)
    return a, b


def check_gemm(layout: str, M: int, N: int, K: int) -> None:
    """Refuse a GEMM shape the TMA kernels do not support (see the module docstring)."""
    for n, v in (("M", M), ("N", N), ("K", K)):
        if _check_int(n, v) < 1 or v > MAX_DIM:
            raise TmaError(f"{n} = {v} out of range (1..{MAX_DIM}); an empty GEMM needs no launch")
    if N % 8:
        raise TmaError(f"N = {N} is not a multiple of 8 (C's rows are written as 4-byte pairs, B's rows by TMA)")
    (_, a_cols), (_, b_cols) = operand_shapes(layout, M, N, K)
    if a_cols % 8:
        which = "K" if layout in ("nn", "nt") else "M"
        raise TmaError(f"{layout.upper()}: {which} = {a_cols} is not a multiple of 8 (A's row stride must be 16-byte aligned)")
    if b_cols % 8:
        raise TmaError(f"{layout.upper()}: K = {b_cols} is not a multiple of 8 (B's row stride must be 16-byte aligned)")


SWIZZLE_BYTES = {64: 128, 32: 64}  # box columns (16-bit elements) -> swizzle span in bytes (one box row)


def encode_2d(ptr: int, rows: int, cols: int, name: str = "matrix", box_cols: int = BOX,
              row_stride: int | None = None, box_rows: int = BOX) -> bytes:
    """The 128 bytes of a CUtensorMap for a row-major rows x cols 16-bit matrix (rows row_stride elements apart;
    None: dense): a box of box_cols x box_rows with the swizzle one box row spans (64 columns: 128-byte swizzle, the
    default; 32 columns: 64-byte swizzle). box_rows: 64 (the default), or a multiple of 8 below it (whole swizzle
    atoms: the rows land where a 64-row box puts its first ones)."""
    check_matrix(ptr, rows, cols, name, row_stride=row_stride)
    if box_cols not in SWIZZLE_BYTES:
        raise TmaError(f"{name}: box of {box_cols} columns not supported (known: {sorted(SWIZZLE_BYTES)})")
    if type(box_rows) is not int or not 8 <= box_rows <= BOX or box_rows % 8:
        raise TmaError(f"{name}: box of {box_rows!r} rows not supported (8, 16, ..., {BOX})")
    return _encode_tiled(ptr, rows, cols, ELEMENT_BYTES, "UINT16", (box_cols, box_rows),
                         f"{SWIZZLE_BYTES[box_cols]}B", "256B", name, row_stride)


def gemm_tensor_maps(layout: str, a_ptr: int, b_ptr: int, M: int, N: int, K: int, *,
                     b_box_cols: int = BOX, a_row_stride: int | None = None,
                     a_box_rows: int = BOX) -> dict[str, bytes]:
    """{"tmA": ..., "tmB": ...} for a wgmma GEMM launch; refuses unsupported shapes first. b_box_cols = 32 only
    for the NN skinny rungs with BN = 32 (B read through a 32 x 64 box, 64-byte swizzle); a_row_stride: A's rows
    that many elements apart (None: dense); a_box_rows below 64 only for the NN rungs built with SHORT_A
    (skinny_a_box_rows)."""
    check_gemm(layout, M, N, K)
    if b_box_cols != BOX and layout != "nn":
        raise TmaError(f"a {b_box_cols}-column B box is for the NN layout only, not {layout.upper()}")
    if a_box_rows != BOX and layout != "nn":
        raise TmaError(f"a {a_box_rows}-row A box is for the NN layout only, not {layout.upper()}")
    (ar, ac), (br, bc) = operand_shapes(layout, M, N, K)
    return {"tmA": encode_2d(a_ptr, ar, ac, "A", row_stride=a_row_stride, box_rows=a_box_rows),
            "tmB": encode_2d(b_ptr, br, bc, "B", box_cols=b_box_cols)}


def skinny_b_box_cols(bn: int) -> int:
    """The B box width a skinny NN rung of tile width BN reads: BN itself below 64 (32), else 64."""
    return bn if bn < BOX else BOX


def skinny_a_box_rows(m: int) -> int:
    """The A box height of an NN rung built with SHORT_A (kernels/sm90a/wgmma.cu, whose mf::short_a_rows computes
    the same from M to count the stage's bytes): M rounded up to 8 below 64 rows, else 64."""
    return BOX if m >= BOX else -(-m // 8) * 8


def gemm_tensor_maps_with_c(layout: str, a_ptr: int, b_ptr: int, c_ptr: int, M: int, N: int, K: int, *,
                            a_row_stride: int | None = None) -> dict[str, bytes]:
    """As gemm_tensor_maps, plus "tmC" for the symbols that store C through TMA (C: M x N row-major)."""
    maps = gemm_tensor_maps(layout, a_ptr, b_ptr, M, N, K, a_row_stride=a_row_stride)
    maps["tmC"] = encode_2d(c_ptr, M, N, "C")
    return maps


# QualifySpec.prepare hooks: prepare(pointers, scalars, dims) -> {param name: bytes}; dims may carry A's row stride
# (A_ROW_STRIDE: runtime/gemm.py's strided A), absent when A is dense (the qualifier's buffers).
def prepare_gemm_nn(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps("nn", pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                            a_row_stride=dims.get(A_ROW_STRIDE))


def prepare_gemm_nn_skinny(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    """The skinny NN rungs: as prepare_gemm_nn, the B box as wide as the instance's BN (dims carries it) up to 64;
    an instance with SHORT_A = 1 reads A through a box of skinny_a_box_rows(M) rows."""
    a_rows = skinny_a_box_rows(dims["M"]) if int(dims.get("SHORT_A", 0)) else BOX
    return gemm_tensor_maps("nn", pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                            b_box_cols=skinny_b_box_cols(int(dims.get("BN", BOX))), a_row_stride=dims.get(A_ROW_STRIDE),
                            a_box_rows=a_rows)


def prepare_gemm_nt(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps("nt", pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                            a_row_stride=dims.get(A_ROW_STRIDE))


def prepare_gemm_tn(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps("tn", pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                            a_row_stride=dims.get(A_ROW_STRIDE))


def prepare_gemm_nn_tmastore(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps_with_c("nn", pointers["A"], pointers["B"], pointers["C"], dims["M"], dims["N"],
                                   dims["K"], a_row_stride=dims.get(A_ROW_STRIDE))


def prepare_gemm_nt_tmastore(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps_with_c("nt", pointers["A"], pointers["B"], pointers["C"], dims["M"], dims["N"],
                                   dims["K"], a_row_stride=dims.get(A_ROW_STRIDE))


def prepare_gemm_tn_tmastore(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps_with_c("tn", pointers["A"], pointers["B"], pointers["C"], dims["M"], dims["N"],
                                   dims["K"], a_row_stride=dims.get(A_ROW_STRIDE))


# ---- CC 12.x tiles (kernels/sm120, mf/tile_tma.cuh): unswizzled, padded boxes -------------------------------------
# The gemm_bi_nn_sm120_tma_* tiles keep the cp.async tiles' padded shared-memory rows, so TMA writes them as one
# unswizzled box per matrix and stage, one 16-byte chunk wider than the tile along the contiguous dimension:
# A (M x K) through a (BK + pad) x BM box, B (K x N) through a (BN + pad) x BK box, pad = 16 bytes of elements
# (8 for bf16/f16, 4 for f32). The extra columns are neighbours or the hardware's zero fill, never read by the math.
# Elements are copied as raw bits (UINT16 / UINT32): NaN payloads and -0.0 arrive unchanged.
PAD_BYTES = 16
MAX_BOX = 256  # elements per box side


def encode_2d_box(ptr: int, rows: int, cols: int, box_cols: int, box_rows: int, element_bytes: int,
                  name: str = "matrix", row_stride: int | None = None) -> bytes:
    """The 128 bytes of an unswizzled CUtensorMap for a row-major rows x cols matrix (rows row_stride elements
    apart; None: dense), box of box_cols x box_rows."""
    check_matrix(ptr, rows, cols, name, element_bytes, row_stride)
    for what, v in (("columns", box_cols), ("rows", box_rows)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_BOX:
            raise TmaError(f"{name}: box {what} = {v!r} out of range (1..{MAX_BOX})")
    if (box_cols * element_bytes) % 16:
        raise TmaError(f"{name}: box row of {box_cols} x {element_bytes} bytes is not a multiple of 16 bytes")
    return _encode_tiled(ptr, rows, cols, element_bytes, {2: "UINT16", 4: "UINT32"}[element_bytes],
                         (box_cols, box_rows), "NONE", "128B", name, row_stride)


def padded_tile_maps(a_ptr: int, b_ptr: int, M: int, N: int, K: int, BM: int, BN: int, BK: int,
                     element_bytes: int, *, a_row_stride: int | None = None) -> dict[str, bytes]:
    """{"tmA": ..., "tmB": ...} for a gemm_bi_nn_sm120_tma_* launch (NN, A: M x K, B: K x N, row-major; A's rows
    a_row_stride elements apart, None: dense) of tile BM x BN x BK; element_bytes 2 (bf16/f16) or 4 (f32, TF32
    math). Refuses unsupported shapes first."""
    for n, v in (("M", M), ("N", N), ("K", K)):
        if _check_int(n, v) < 1 or v > MAX_DIM:
            raise TmaError(f"{n} = {v} out of range (1..{MAX_DIM}); an empty GEMM needs no launch")
    if element_bytes not in (2, 4):
        raise TmaError(f"{element_bytes}-byte elements not supported (2 or 4)")
    per = PAD_BYTES // element_bytes
    for n, v in (("K", K), ("N", N)):
        if v % per:
            raise TmaError(f"NN: {n} = {v} is not a multiple of {per} (the row strides of A and B must be "
                           "16-byte aligned)")
    pad = PAD_BYTES // element_bytes
    return {"tmA": encode_2d_box(a_ptr, M, K, BK + pad, BM, element_bytes, "A", a_row_stride),
            "tmB": encode_2d_box(b_ptr, K, N, BN + pad, BK, element_bytes, "B")}


def prepare_padded_tiles_16bit(pointers: dict[str, int], scalars: dict[str, int | float],
                               dims: dict[str, int]) -> dict[str, bytes]:
    """QualifySpec.prepare for the bf16/f16 CC 12.x tiles: dims carries M, N, K and the instance's BM, BN, BK."""
    return padded_tile_maps(pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                            int(dims["BM"]), int(dims["BN"]), int(dims["BK"]), 2, a_row_stride=dims.get(A_ROW_STRIDE))


def prepare_padded_tiles_f32(pointers: dict[str, int], scalars: dict[str, int | float],
                             dims: dict[str, int]) -> dict[str, bytes]:
    """QualifySpec.prepare for the f32 (TF32 and exact FFMA) CC 12.x tiles."""
    return padded_tile_maps(pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                            int(dims["BM"]), int(dims["BN"]), int(dims["BK"]), 4, a_row_stride=dims.get(A_ROW_STRIDE))


def padded_tile_maps_for(constants: dict[str, int], a_ptr: int, b_ptr: int, M: int, N: int, K: int, *,
                         a_row_stride: int | None = None) -> dict[str, bytes]:
    """padded_tile_maps for one CC 12.x tile from its symbol's constants (a runtime Kernel's ``symbol.constants``, or
    a catalog Symbol's ``params_env``): BM, BN, BK, and sizeof_T (2 for the bf16/f16 tiles; absent for the f32 ones)."""
    missing = [k for k in ("BM", "BN", "BK") if k not in constants]
    if missing:
        raise TmaError(f"constants lack {missing}: not a gemm_bi_nn_sm120_tma_* tile")
    return padded_tile_maps(a_ptr, b_ptr, M, N, K, int(constants["BM"]), int(constants["BN"]), int(constants["BK"]),
                            int(constants.get("sizeof_T", 4)), a_row_stride=a_row_stride)


# ---- TF32 wgmma GEMM (kernels/sm90a/wgmma_tf32.cu): f32 matrices, 32 x 64 boxes, 128-byte swizzle ------------------
# wgmma with .tf32 operands reads A and B K-major only, so the TF32 rungs serve layout NT (A: M x K, B: N x K, both
# K-contiguous). One box row = 32 f32 = 128 bytes (one swizzle row); 64 rows per box (8 KB), as the 16-bit maps.
F32_BYTES = 4
F32_BOX_COLS = 32
TF32_LAYOUTS = ("nt",)


def check_gemm_tf32(layout: str, M: int, N: int, K: int) -> None:
    """Refuse a GEMM shape the TF32 wgmma rungs do not support: layout NT only, K % 4 == 0, any M, N >= 1."""
    if layout not in TF32_LAYOUTS:
        raise TmaError(f"the TF32 wgmma rungs serve layout NT only (tf32 wgmma reads B K-major), not {layout!r}: "
                       "store B as [N, K] and use NT")
    for n, v in (("M", M), ("N", N), ("K", K)):
        if _check_int(n, v) < 1 or v > MAX_DIM:
            raise TmaError(f"{n} = {v} out of range (1..{MAX_DIM}); an empty GEMM needs no launch")
    if K % 4:
        raise TmaError(f"NT: K = {K} is not a multiple of 4 (A's and B's f32 row strides must be 16-byte aligned)")


def encode_2d_f32(ptr: int, rows: int, cols: int, name: str = "matrix", row_stride: int | None = None) -> bytes:
    """The 128 bytes of a CUtensorMap for a row-major rows x cols f32 matrix (rows row_stride elements apart; None:
    dense): a 32-column x 64-row box, 128-byte swizzle, zero fill outside the matrix (+0.0 bits)."""
    check_matrix(ptr, rows, cols, name, F32_BYTES, row_stride)
    return _encode_tiled(ptr, rows, cols, F32_BYTES, "FLOAT32", (F32_BOX_COLS, BOX), "128B", "256B", name, row_stride)


def gemm_tensor_maps_tf32(layout: str, a_ptr: int, b_ptr: int, M: int, N: int, K: int, *,
                          a_row_stride: int | None = None) -> dict[str, bytes]:
    """{"tmA": ..., "tmB": ...} for a TF32 wgmma GEMM launch (f32 A: M x K, B: N x K); refuses unsupported shapes
    first."""
    check_gemm_tf32(layout, M, N, K)
    return {"tmA": encode_2d_f32(a_ptr, M, K, "A", a_row_stride), "tmB": encode_2d_f32(b_ptr, N, K, "B")}


def prepare_gemm_nt_tf32(pointers: dict[str, int], scalars: dict[str, int | float], dims: dict[str, int]) -> dict[str, bytes]:
    return gemm_tensor_maps_tf32("nt", pointers["A"], pointers["B"], dims["M"], dims["N"], dims["K"],
                                 a_row_stride=dims.get(A_ROW_STRIDE))


# The hooks a signed record may name in `tensor_maps` (runtime/gemm.py): by name, so a record cannot reach any
# other attribute of this module.
TENSOR_MAP_HOOKS = {f.__name__: f for f in (
    prepare_gemm_nn, prepare_gemm_nn_skinny, prepare_gemm_nt, prepare_gemm_tn, prepare_gemm_nn_tmastore,
    prepare_gemm_nt_tmastore, prepare_gemm_tn_tmastore, prepare_padded_tiles_16bit, prepare_padded_tiles_f32,
    prepare_gemm_nt_tf32)}
