// TriadSm80: the training GEMM layouts on tensor cores (mma.sync, sm_80+), f32 accumulate,
// f32 output. TF32 (f32 storage, cvt.rna to TF32), bf16 and f16 inputs.
//   NN: C = A B (A [M,K], B [K,N]);  TN: C = A^T B (A [K,M]);  NT: C = A B^T (B [N,K])
// One fixed tile per symbol, the whole K reduction in one CTA in a fixed order (mf/mma_sm80.cuh).
// Symbols: MF_GEMM_TC_KERNEL(NAME, TI, TO, L, BM, BN, BK, WM, WN, S, R) from the header, one line per instance of
// kernels/triad/sm80.toml (TO = f32 output; L names the layout: mf::Layout, mf/layout.cuh).
#include "mf/mma_sm80.cuh"
