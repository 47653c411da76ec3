// TriadScalar: the training GEMM layouts in exact f32 (the last fallback and the qualification oracle).
//   NN: C = A B (A [M,K], B [K,N]);  TN: C = A^T B (A [K,M]: dW = X^T dY);  NT: C = A B^T (B [N,K]: dX = dY W^T)
// Every output is the fixed FFMA chain over k = 0..K-1 (mf/gemm_common.cuh), so the three layouts agree bit for
// bit with each other on transposed inputs and with gemm_bi_f32_f32 in the Fixed module.
// Symbols: MF_GEMM_EXACT_F32_KERNEL(NAME, L, BM, BN, BK, TM, TN, NBUF) from the header, one line per instance of
// kernels/triad/scalar.toml (L names the layout: mf::Layout, mf/layout.cuh).
#include "mf/gemm_common.cuh"
