// Exact f32 FFMA-chain GEMM (NN) with B streamed through a cp.async ring: a faster tiling of the chain every
// gemm_bi_f32_f32* symbol runs, bit-identical to them (the implementation and why: mf/exact_f32_async.cuh).
#include "mf/exact_f32_async.cuh"

#define MF_GEMM_BI_EXACT_F32_ASYNC(NAME, BM, BN, BK, TM, TN, STAGES) \
  MF_GEMM_EXACT_F32_ASYNC_KERNEL(NAME, BM, BN, BK, TM, TN, STAGES)
