// Ada (sm_89) f16/bf16 GEMM module: every symbol is MF_TILE_MMA_NN from the portable tensor-core tile GEMM,
// instantiated by kernels/sm89/half.toml; nothing module-specific is needed here.
#include "mf/tile_mma.cuh"
