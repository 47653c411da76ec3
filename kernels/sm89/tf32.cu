// Ada (sm_89) TF32 GEMM module: every symbol is MF_TILE_TF32_NN from the portable TF32 tile GEMM,
// instantiated by kernels/sm89/tf32.toml.
#include "mf/tile_tf32.cuh"
