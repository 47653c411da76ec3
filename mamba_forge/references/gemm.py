"""References for the GEMM and matvec families (kernels/fixed/gemm.toml, kernels/triad/*.toml).

Layouts (dense row-major, flat arrays as the kernel sees them):
    nn: A [M, K], B [K, N], C = A B          tn: A [K, M], B [K, N], C = A^T B          nt: A [M, K], B [N, K], C = A B^T
plus an optional bias [N] added once after the reduction (absent from `args`, or None: no bias).

Two kinds:
* ``gemm_<layout>``: float64 products and sums (for tensor-core, TF32 and matvec families, checked with tolerances);
* ``gemm_<layout>_f32_chain``: the exact f32 contract bit for bit: per output acc = 0; for k = 0..K-1:
  acc = fma_f32(a[m,k], b[k,n], acc); then acc + bias in f32. ``fma_f32`` is a correctly rounded single-precision
  fused multiply-add emulated in float64 with round-to-odd (exact product, TwoSum error, odd rounding, then one
  rounding to f32), so the reference does not depend on the host having an fma.
"""

from __future__ import annotations

import numpy as np

Args = dict  # parameter name -> flat array or scalar


def _dims(args: Args, dims: dict[str, int]) -> tuple[int, int, int]:
    m = int(args.get("M", dims.get("M")))
    n = int(args.get("N", dims.get("N")))
    k = int(args.get("K", dims.get("K")))
    return m, n, k


def _operands(args: Args, dims: dict[str, int], layout: str, dtype=np.float64):
    m, n, k = _dims(args, dims)
    a = np.asarray(args["A"], dtype=dtype).reshape(-1)[: m * k]
    b = np.asarray(args["B"], dtype=dtype).reshape(-1)[: k * n]
    if layout == "nn":
        a2, b2 = a.reshape(m, k), b.reshape(k, n)
    elif layout == "tn":
        a2, b2 = a.reshape(k, m).T, b.reshape(k, n)
    elif layout == "nt":
        a2, b2 = a.reshape(m, k), b.reshape(n, k).T
    else:
        raise ValueError(f"unknown layout {layout!r} (nn, tn, nt)")
    bias = args.get("bias")
    if bias is not None:
        bias = np.asarray(bias, dtype=dtype).reshape(-1)[:n]
    return a2, b2, bias


def matmul_f64(a2: np.ndarray, b2: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """C = A B (+ bias) in float64; A [M, K], B [K, N] as 2-D arrays."""
    c = np.asarray(a2, dtype=np.float64) @ np.asarray(b2, dtype=np.float64)
    if bias is not None:
        c = c + np.asarray(bias, dtype=np.float64)[None, :]
    return c


def _reference(layout: str, product, dtype, name: str, doc: str):
    """A family's reference for one layout: C = product(op(A), op(B), bias) of the operands read as `dtype`,
    returned flat in float64."""
    def ref(args: Args, dims: dict[str, int]) -> dict[str, np.ndarray]:
        a2, b2, bias = _operands(args, dims, layout, dtype=dtype)
        return {"C": np.asarray(product(a2, b2, bias), dtype=np.float64).reshape(-1)}

    ref.__name__, ref.__doc__ = name, doc
    return ref


gemm_nn, gemm_tn, gemm_nt = (_reference(x, matmul_f64, np.float64, f"gemm_{x}",
                                        f"float64 reference for layout {x}: C[M,N] (+ bias), flat.")
                             for x in ("nn", "tn", "nt"))


# ---- exact f32 -------------------------------------------------------------------------------------------------


def _round_odd_sum(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c (float64 arrays) rounded to odd: exact when representable, else the neighbour with an odd last bit.
    TwoSum gives the rounding error exactly; an inexact sum that ended on an even bit moves one ulp towards it."""
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    bits = s.view(np.int64)
    nudge = (err != 0) & ((bits & 1) == 0) & np.isfinite(err)
    if nudge.any():
        # one ulp towards err: +1 on the bit pattern when err has the sign of s, else -1 (s != 0 here: a sum
        # that rounds to zero is exact)
        step = np.where((err > 0) == (s > 0), 1, -1).astype(np.int64)
        bits = bits + np.where(nudge, step, 0)
        s = bits.view(np.float64)
    return s


def fma_f32(a, b, c) -> np.ndarray:
    """Correctly rounded f32 fma(a, b, c), elementwise with broadcasting (IEEE 754 round-to-nearest-even).

    a*b of two f32 values is exact in float64 (48 significant bits); s = a*b + c is rounded to float64 and
    TwoSum recovers the rounding error exactly; rounding s to odd (nudging an inexact, even-ending s one ulp
    towards the error) and then to f32 gives the correctly rounded result, since 53 >= 24 + 2.
    Inf and NaN propagate as in IEEE arithmetic.
    """
    a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
    c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        p, c64 = np.broadcast_arrays(a64 * b64, c64)
        s = _round_odd_sum(np.ascontiguousarray(p), np.ascontiguousarray(c64))
        return s.astype(np.float32)


def chain_f32(a2: np.ndarray, b2: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """The exact f32 contract: per output acc = +0; acc = fma_f32(a[m,k], b[k,n], acc) for k = 0..K-1 in order;
    then acc + bias[n] in f32. A [M, K], B [K, N] as 2-D arrays; returns float32 [M, N]."""
    a64 = np.asarray(a2, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b2, dtype=np.float32).astype(np.float64)
    m, k = a64.shape
    n = b64.shape[1]
    acc = np.zeros((m, n), dtype=np.float64)  # always holds f32 values
    p = np.empty((m, n), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        for kk in range(k):
            np.multiply(a64[:, kk : kk + 1], b64[kk : kk + 1, :], out=p)  # exact
            acc = _round_odd_sum(p, acc).astype(np.float32).astype(np.float64)
        out = acc.astype(np.float32)
        if bias is not None:
            out = out + np.asarray(bias, dtype=np.float32)[None, :]
    return out


gemm_nn_f32_chain, gemm_tn_f32_chain, gemm_nt_f32_chain = (
    _reference(x, chain_f32, np.float32, f"gemm_{x}_f32_chain",
               f"exact f32 FFMA-chain reference for layout {x} (bit for bit): C[M,N] (+ bias), flat.")
    for x in ("nn", "tn", "nt"))


# ---- TF32 rounding (the Ada TF32-joint pre-RNA pass, kernels/sm89/tf32.toml) ----------------------------------


def tf32_rna(x: np.ndarray) -> np.ndarray:
    """x rounded to TF32 as cvt.rna.tf32.f32 does (round to nearest, ties away from zero; the low 13 of the 32
    bits zero) and returned as float64: on the magnitude's bits, add half a TF32 ulp (0x1000) and clear the 13
    low bits (a carry into the exponent is the correct rounding, up to infinity); NaN stays NaN."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32)
    mag = u & np.uint32(0x7FFFFFFF)
    r = ((mag + np.uint32(0x1000)) & np.uint32(0xFFFFE000)) | (u & np.uint32(0x80000000))
    out = r.view(np.float32).astype(np.float64)
    return np.where(np.isnan(f), np.nan, out)


def tf32_rna_transpose(args: Args, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """At[M, K] = tf32_rna(A)^T for A [K, M] (flat): exact (the rounding is bit-defined)."""
    m, k = int(args.get("M", dims.get("M"))), int(args.get("K", dims.get("K")))
    a = np.asarray(args["A"], dtype=np.float32).reshape(-1)[: k * m].reshape(k, m)
    return {"At": tf32_rna(a).T.reshape(-1)}


__all__ = [
    "chain_f32", "fma_f32", "gemm_nn", "gemm_nn_f32_chain", "gemm_nt", "gemm_nt_f32_chain", "gemm_tn",
    "gemm_tn_f32_chain", "matmul_f64", "tf32_rna", "tf32_rna_transpose",
]
