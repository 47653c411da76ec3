"""float64 references for the architecture-specific GEMM families (kernels/sm90a, sm89, sm120, sm100).

Layouts, all dense row-major (as kernels/include/mf/gemm_common.cuh): NN C = A[M,K] B[K,N]; NT C = A[M,K] B[N,K]^T;
TN C = A[K,M]^T B[K,N]. An optional ``bias`` [N] argument is added to every row after the product.
"""

from __future__ import annotations

import numpy as np


def _mm(a: np.ndarray, b: np.ndarray, args: dict, dims: dict) -> dict[str, np.ndarray]:
    c = np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)
    bias = args.get("bias")
    if isinstance(bias, np.ndarray) and bias.size == dims["N"]:
        c = c + bias.astype(np.float64)[None, :]
    return {"C": c.reshape(-1)}


def gemm_nn(args: dict, dims: dict) -> dict[str, np.ndarray]:
    M, N, K = dims["M"], dims["N"], dims["K"]
    return _mm(args["A"].reshape(M, K), args["B"].reshape(K, N), args, dims)


def gemm_nt(args: dict, dims: dict) -> dict[str, np.ndarray]:
    M, N, K = dims["M"], dims["N"], dims["K"]
    return _mm(args["A"].reshape(M, K), args["B"].reshape(N, K).T, args, dims)


def gemm_tn(args: dict, dims: dict) -> dict[str, np.ndarray]:
    M, N, K = dims["M"], dims["N"], dims["K"]
    return _mm(args["A"].reshape(K, M).T, args["B"].reshape(K, N), args, dims)
